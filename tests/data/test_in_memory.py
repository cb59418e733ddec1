"""In-memory data: a pure function of (seed, step), shared exactly across
replicas; eval passes cover each example once."""

import numpy as np
import pytest
import tensorflow as tf

from ctl import errors
from ctl.data import in_memory
from ctl.training import loop_plan

NUM_EXAMPLES = 50
# Features are the example's own index, so batches show which rows they hold.
FEATURES = np.arange(NUM_EXAMPLES, dtype=np.float32)[:, None]
LABELS = np.arange(NUM_EXAMPLES, dtype=np.int32)


def _context(pipelines=1, pipeline_id=0, replicas=1):
  return tf.distribute.InputContext(num_input_pipelines=pipelines,
                                    input_pipeline_id=pipeline_id,
                                    num_replicas_in_sync=replicas)


def _loops(start_step, total_steps, steps_per_epoch, loop_length=3):
  """Loops of loop_length steps, also ending at each epoch end."""
  return loop_plan.LoopPlan(start_step, total_steps, steps_per_epoch,
                           loop_length)


def _train_rows(start_step=0, total_steps=12, seed=0, steps_per_epoch=5,
                global_batch_size=8, context=None, loop_length=3):
  """The example indices of each step, in order (one array per step)."""
  loops = _loops(start_step, total_steps, steps_per_epoch, loop_length)
  dataset = in_memory.train_chunks(
      NUM_EXAMPLES, seed=seed, global_batch_size=global_batch_size,
      steps_per_epoch=steps_per_epoch, loops=loops,
      context=context or _context())
  chunks = [chunk.numpy() for chunk in dataset]
  assert [len(chunk) for chunk in chunks] == [end - start
                                              for start, end in list(loops)]
  return [rows for chunk in chunks for rows in chunk]


def test_covers_exactly_the_training_steps():
  batches = _train_rows(total_steps=12)
  assert len(batches) == 12
  assert all(batch.shape == (8,) and batch.dtype == np.int32
             for batch in batches)


def test_loop_lengths_do_not_change_the_batches():
  for loop_length in (1, 2, 7):
    for expected, got in zip(_train_rows(),
                             _train_rows(loop_length=loop_length)):
      np.testing.assert_array_equal(expected, got)


def test_resuming_at_a_step_gives_the_same_batches_from_that_step():
  everything = _train_rows()
  for start in (1, 4, 5, 7, 11):
    resumed = _train_rows(start_step=start)
    assert len(resumed) == len(everything) - start
    for expected, got in zip(everything[start:], resumed):
      np.testing.assert_array_equal(expected, got)


def test_an_epoch_never_repeats_an_example():
  batches = _train_rows(total_steps=10, steps_per_epoch=5)
  for epoch in range(2):
    rows = np.concatenate(batches[epoch * 5:(epoch + 1) * 5])
    assert len(set(rows)) == len(rows) == 40


def test_epochs_longer_than_the_data_use_every_example_evenly():
  # 10 steps of 8 = 80 rows from 50 examples: one whole pass, then 30 more.
  rows = np.concatenate(_train_rows(total_steps=10, steps_per_epoch=10))
  counts = np.bincount(rows, minlength=NUM_EXAMPLES)
  assert counts.min() >= 1 and counts.max() <= 2
  assert len(set(rows[:NUM_EXAMPLES])) == NUM_EXAMPLES


def test_seed_and_epoch_change_the_order():
  first = _train_rows(seed=0)
  other_seed = _train_rows(seed=1)
  assert not np.array_equal(first[0], other_seed[0])
  assert not np.array_equal(first[0], first[5])  # Epoch 2 reshuffles.
  np.testing.assert_array_equal(first[0], _train_rows(seed=0)[0])


@pytest.mark.parametrize('pipelines, replicas', [(2, 2), (1, 2), (2, 4)])
def test_replicas_split_the_same_global_batches(pipelines, replicas):
  loops = _loops(3, 12, 5)
  global_batches = _train_rows(start_step=3)
  # Each pipeline yields, per loop, one element per local replica.
  local_replicas = replicas // pipelines
  per_pipeline = [
      [chunk.numpy() for chunk in in_memory.train_chunks(
          NUM_EXAMPLES, seed=0, global_batch_size=8, steps_per_epoch=5,
          loops=loops, context=_context(pipelines, pipeline_id, replicas))]
      for pipeline_id in range(pipelines)]
  step = 0
  for loop, (start, end) in enumerate(list(loops)):
    for in_loop in range(end - start):
      got = np.concatenate([
          chunks[loop * local_replicas + replica][in_loop]
          for chunks in per_pipeline for replica in range(local_replicas)])
      np.testing.assert_array_equal(global_batches[step], got)
      step += 1
  assert step == len(global_batches)


@pytest.mark.parametrize('replicas,batch_size', [(1, 16), (2, 16), (4, 8),
                                                 (1, 10), (2, 50), (4, 64)])
def test_eval_covers_each_example_once_in_order(replicas, batch_size):
  data = in_memory.InMemory((FEATURES, LABELS))
  passed = []
  for index, full in data.eval_batches(batch_size):
    for replica in range(replicas):
      rows = in_memory.eval_rows(
          tf.constant(index), global_batch_size=batch_size, replica=replica,
          num_replicas=replicas, num_examples=NUM_EXAMPLES, full=full)
      assert len(rows) <= batch_size // replicas
      _, labels = data.gather(rows)
      passed.extend(labels.numpy())
  # Gathered in replica order: the examples' own order, each once.
  np.testing.assert_array_equal(passed, LABELS)


def test_a_full_eval_batch_has_a_static_size():
  rows = tf.function(lambda index: in_memory.eval_rows(
      index, global_batch_size=16, replica=1, num_replicas=2,
      num_examples=NUM_EXAMPLES, full=True)).get_concrete_function(
          tf.TensorSpec([], tf.int64)).structured_outputs
  assert rows.shape == [8]


def test_in_memory_batches_are_gathered_and_preprocessed():
  data = in_memory.InMemory(
      {'image': np.full((4, 2), 255, np.uint8), 'label': np.arange(4)},
      preprocess=lambda batch: {**batch, 'image': tf.cast(
          batch['image'], tf.float32) / 255})
  batch = data.gather(tf.constant([3, 1]))
  assert batch['image'].dtype == tf.float32
  np.testing.assert_allclose(batch['image'].numpy(), 1.0)
  np.testing.assert_array_equal(batch['label'].numpy(), [3, 1])


def test_arrays_of_different_lengths_are_an_error():
  with pytest.raises(errors.CtlError, match='different numbers of rows'):
    in_memory.InMemory((np.zeros(3), np.zeros(4)))
