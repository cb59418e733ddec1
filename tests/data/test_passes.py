"""A task's finite tf.data pipeline, read pass after pass (ctl/data/passes.py):
a position saved anywhere, near a pass's end included, resumes that pass
and every later one in the order an uninterrupted reader sees."""

import pytest
import tensorflow as tf

from ctl.checkpoints import data_positions
from ctl.data import passes

PASS = 8  # Batches in a pass.


def _reshuffled(prefetch: bool = True) -> tf.data.Dataset:
  """The usual pipeline: reshuffled each pass, batched, prefetched."""
  dataset = tf.data.Dataset.range(64).shuffle(64, seed=1).batch(8)
  return dataset.prefetch(2) if prefetch else dataset


def _read(get_next, num_batches: int) -> list[int]:
  """The elements of the next num_batches batches."""
  return [int(x) for _ in range(num_batches) for x in get_next().numpy()]


def _reader() -> tuple[passes.Passes, object]:
  reader = passes.Passes(_reshuffled())
  return reader, tf.function(reader.get_next)


def test_passes_are_the_orders_repeat_reads():
  _, get_next = _reader()
  repeated = [int(x) for batch in _reshuffled().repeat().take(4 * PASS)
              for x in batch.numpy()]
  assert _read(get_next, 4 * PASS) == repeated
  first, second = repeated[:64], repeated[64:128]
  assert sorted(first) == list(range(64)) and first != second


def _positions(reader: passes.Passes, directory, renamed: bool):
  """reader's DataPositions; renamed: under names a checkpoint restores in
  the other order (its next pass first), which read_last must put right."""
  names = {'iterator': 'z_iterator', 'next_pass': 'a_next_pass'}
  if not renamed:
    names = {name: name for name in names}
  return data_positions.DataPositions(
      {names[key]: value for key, value in reader.checkpointable.items()},
      str(directory), max_to_keep=1,
      read_last=tuple(names[key] for key in reader.read_last))


@pytest.mark.parametrize('renamed', [False, True])
def test_a_position_saved_anywhere_resumes_every_later_pass(tmp_path,
                                                            renamed):
  _, reference_next = _reader()
  reference = _read(reference_next, 6 * PASS)
  # Every stop in the first three passes; near a pass's end the prefetch
  # has read that pass to its end (plain repeat() then loses the next
  # pass's seeds: tests/runtime/test_tf_internals.py).
  for stop in range(1, 3 * PASS + 1):
    reader, get_next = _reader()
    _read(get_next, stop)
    _positions(reader, tmp_path / str(stop), renamed).save(stop)

    resumed, resumed_next = _reader()
    _positions(resumed, tmp_path / str(stop), renamed).restore(stop)
    batches = 6 * PASS - stop
    assert _read(resumed_next, batches) == reference[8 * stop:], (
        f'resumed after batch {stop}')


def test_a_reshuffled_pass_below_a_repeat_or_a_shuffle_is_refused(tmp_path):
  from ctl import errors  # pylint: disable=g-import-not-at-top

  def refusal(dataset):
    positions = data_positions.DataPositions(
        {'iterator': iter(dataset)}, str(tmp_path), max_to_keep=1)
    try:
      positions.check_savable(dataset)
    except errors.CtlError as error:
      return str(error)
    return None

  assert 'below a repeat (RepeatDataset)' in refusal(_reshuffled().repeat())
  assert 'below another shuffle' in refusal(
      tf.data.Dataset.range(64).shuffle(8, seed=1).shuffle(64, seed=2))
  assert 'Dataset.random' in refusal(
      tf.data.Dataset.random(seed=1, rerandomize_each_iteration=True)
      .take(8).repeat())
  # One pass (ctl repeats it), an inner shuffle of fixed order, or a
  # repeat below the shuffle: resumable, not refused.
  assert refusal(_reshuffled()) is None
  assert refusal(tf.data.Dataset.range(64).shuffle(
      8, seed=1, reshuffle_each_iteration=False).shuffle(64, seed=2)) is None
  assert refusal(tf.data.Dataset.range(64).repeat().shuffle(64, seed=1)
                 .batch(8)) is None
  assert not list(tmp_path.iterdir())
