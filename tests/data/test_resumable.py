"""A task's tf.data pipeline as ctl reads it (ctl/data/resumable.py): a
position saved at any batch, near a pass's end included, resumes that pass
and every later one in the order an uninterrupted run reads, for the usual
reshuffled pipelines (plain `repeat()` does not:
tests/runtime/test_tf_internals.py)."""

import pytest
import tensorflow as tf

from ctl import errors
from ctl.checkpoints import data_positions
from ctl.data import resumable

R = tf.data.Dataset.range
PIPELINES = {  # Each pass is 8 batches of 8 (of 64 elements).
    'shuffle_batch_prefetch': lambda: R(64).shuffle(64, seed=1).batch(8)
                                           .prefetch(2),
    'parallel_map_and_batch': lambda: R(64).shuffle(64, seed=1).map(
        lambda x: x * 2, num_parallel_calls=8).batch(
            8, num_parallel_calls=4).prefetch(8),
    'its_own_repeat': lambda: R(64).shuffle(64, seed=1).batch(8).prefetch(2)
                                   .repeat(),
    'dataset_random': lambda: tf.data.Dataset.random(
        seed=1, rerandomize_each_iteration=True).take(64).batch(8)
                              .prefetch(2),
}


def _read(iterator, num_batches: int) -> list[int]:
  return [int(x) for _ in range(num_batches) for x in next(iterator).numpy()]


@pytest.mark.parametrize('pipeline', PIPELINES)
def test_a_position_saved_at_any_batch_resumes_every_later_pass(tmp_path,
                                                                pipeline):
  make = PIPELINES[pipeline]
  reference = _read(iter(resumable.resumable(make())), 5 * 8)
  passes = [reference[i:i + 64] for i in range(0, 5 * 64, 64)]
  assert len({tuple(order) for order in passes}) == 5  # Reshuffled.
  for stop in range(1, 3 * 8 + 1):  # Every batch of three passes.
    iterator = iter(resumable.resumable(make()))
    _read(iterator, stop)
    directory = tmp_path / str(stop)
    data_positions.DataPositions({'iterator': iterator}, str(directory),
                                 max_to_keep=1).save(stop)
    resumed = iter(resumable.resumable(make()))
    data_positions.DataPositions({'iterator': resumed}, str(directory),
                                 max_to_keep=1).restore(stop)
    assert _read(resumed, 5 * 8 - stop) == reference[8 * stop:], (
        f'{pipeline} resumed after batch {stop}')


def _refusal(dataset, directory) -> str | None:
  """Why ctl refuses to train on dataset (check_savable); None if it does
  not."""
  positions = data_positions.DataPositions(
      {'iterator': iter(dataset)}, str(directory), max_to_keep=1)
  try:
    positions.check_savable(dataset)
  except errors.CtlError as error:
    return str(error)
  return None


def test_a_reshuffling_op_below_another_shuffle_is_refused(tmp_path):

  def refusal(dataset):
    return _refusal(dataset, tmp_path)

  shuffled_files = R(8).shuffle(8, seed=3).interleave(
      lambda file: R(8).map(lambda x: x + 8 * file), cycle_length=2)
  assert 'below another shuffle (ShuffleDatasetV3)' in refusal(
      shuffled_files.shuffle(16, seed=4).batch(8))
  assert 'Dataset.random' in refusal(
      tf.data.Dataset.random(seed=1, rerandomize_each_iteration=True)
      .shuffle(8, seed=2))
  # A fixed inner order, one shuffle, or a repeat: resumable, not refused.
  assert refusal(R(8).shuffle(8, seed=3, reshuffle_each_iteration=False)
                 .shuffle(16, seed=4)) is None
  assert refusal(PIPELINES['its_own_repeat']()) is None
  assert refusal(R(64).repeat().shuffle(64, seed=1).batch(8)) is None
  assert not list(tmp_path.iterdir())


def test_a_generator_is_refused_with_what_to_do_instead(tmp_path):
  generator = tf.data.Dataset.from_generator(
      lambda: iter(range(8)),
      output_signature=tf.TensorSpec([], tf.int64)).batch(4)
  refusal = _refusal(generator, tmp_path)
  assert refusal.startswith("The training pipeline's position cannot be "
                            'saved: PyFunc is stateful (Python code in the '
                            'tf.data pipeline: Dataset.from_generator'), refusal
  assert 'ctl.InMemory(arrays)' in refusal
  assert 'random numbers' not in refusal  # Not the advice for random ops.
  assert refusal.endswith('Nothing was written.')  # Before training.


def test_a_shuffled_csv_dataset_is_refused_with_what_to_do_instead(tmp_path):
  csv = tmp_path / 'rows.csv'
  csv.write_text('x,y\n' + ''.join(f'{i},{2 * i}\n' for i in range(32)))
  make_csv = tf.data.experimental.make_csv_dataset
  refusal = _refusal(make_csv(str(csv), batch_size=4, shuffle=True,
                              num_epochs=1), tmp_path / 'positions')
  assert 'make_csv_dataset(shuffle=True) builds such a pipeline' in refusal
  # What it advises trains.
  assert _refusal(make_csv(str(csv), batch_size=4, shuffle=False,
                           num_epochs=1).unbatch().shuffle(16, seed=1)
                  .batch(4), tmp_path / 'positions') is None


def test_later_passes_are_those_of_repeat_one_pass_on():
  # The order CHANGELOG.md states under 0.2.0 (other weights than 0.1.0's
  # for a task's own reshuffled pipeline): the first pass as `repeat()`
  # reads it, then each pass k as repeat()'s pass k+1. A change to it
  # changes users' weights again, and needs its own CHANGELOG entry.
  make = lambda: R(8).shuffle(8, seed=1)
  plain = [int(x) for x in make().repeat().take(5 * 8)]
  ctl_reads = [int(x) for x in resumable.resumable(make()).take(4 * 8)]
  assert ctl_reads[:8] == plain[:8]
  assert ctl_reads[8:] == plain[16:]
