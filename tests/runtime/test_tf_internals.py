"""Each private TensorFlow/Keras/Python API ctl uses still behaves as relied
on. A failure here means upstream changed: revisit ctl/runtime/tf_internals.py
(or tf_cluster_internals.py).
"""

import re
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from ctl.checkpoints import data_positions
from ctl.runtime import tf_cluster_internals
from ctl.runtime import tf_internals
import helpers

# Each script runs in a fresh process: the fix changes a Keras class for the
# process, an untaken write error shows only at exit, and running this
# process's exit handlers would end TensorFlow. The checks that can share a
# process do (a TensorFlow start is most of each one's time).
_TWO_ASYNC_SAVES = '''
import keras, tensorflow as tf
{fix}
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
checkpoint = tf.train.Checkpoint(model=model)
options = tf.train.CheckpointOptions(enable_async=True)
for number in range(2):
  checkpoint.save('{directory}/ckpt', options=options)
checkpoint.sync()
print('saved twice')
'''

_FAILED_ASYNC_WRITE = '''
import tensorflow as tf
from ctl.runtime import tf_internals
checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
options = tf.train.CheckpointOptions(enable_async=True)
checkpoint.write('{directory}/ckpt', options=options)  # Its folder exists.
# A file where its folder would be: the background write fails.
checkpoint.write('{directory}/file/ckpt', options=options)
checkpoint.sync()
print('sync did not raise')
if {take}:
  error = tf_internals.take_async_checkpoint_error(checkpoint)
  print('taken:', type(error).__name__)
'''

# Last in its process: the handlers run once, now, not again at exit.
_EXIT_HANDLERS = '''
import atexit
from ctl.runtime import tf_internals
atexit.register(print, 'handler ran')
tf_internals.run_exit_handlers()
print('after')
'''


def _run(code: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-c', code], capture_output=True,
                        env=helpers.env_with(), text=True, timeout=300)


def _failed_async_write(directory, take: bool) -> str:
  """The script of a failed background write, its error taken or not."""
  directory.mkdir()
  (directory / 'file').write_text('not a folder')
  return _FAILED_ASYNC_WRITE.format(directory=directory, take=take)


@pytest.fixture(scope='module')
def fixed(tmp_path_factory):
  """One process: two async saves with the fix, a failed background
  write whose error is taken, then the exit handlers run by hand."""
  directory = tmp_path_factory.mktemp('fixed')
  return _run(_TWO_ASYNC_SAVES.format(
      directory=directory / 'saves',
      fix=('from ctl.runtime import tf_internals\n'
           'tf_internals.fix_keras_async_checkpoint_copy()')) +
              _failed_async_write(directory / 'taken', take=True) +
              _EXIT_HANDLERS)


@pytest.mark.slow
def test_async_checkpoints_of_keras_variables_need_the_fix(tmp_path, fixed):
  broken = _run(_TWO_ASYNC_SAVES.format(directory=tmp_path, fix=''))
  assert 'saved twice' not in broken.stdout, (
      'Keras now saves asynchronously by itself: drop '
      'fix_keras_async_checkpoint_copy.')
  assert 'singleton tf.Variables' in broken.stderr
  assert 'saved twice' in fixed.stdout, fixed.stderr[-2000:]


@pytest.mark.slow
def test_a_failed_async_write_is_raised_at_exit_unless_taken(tmp_path, fixed):
  # TensorFlow raises a background write's error at the next write or in
  # its exit handler, not at sync(); Checkpointer.wait() takes it.
  untaken = _run(_failed_async_write(tmp_path / 'untaken', take=False))
  assert 'sync did not raise' in untaken.stdout, untaken.stderr[-2000:]
  assert 'Exception ignored in atexit callback' in untaken.stderr
  assert 'FailedPreconditionError' in untaken.stderr
  assert 'taken: FailedPreconditionError' in fixed.stdout, fixed.stderr[-2000:]
  assert 'Exception ignored' not in fixed.stderr, fixed.stderr[-2000:]


@pytest.mark.slow
def test_run_exit_handlers_runs_registered_handlers(fixed):
  # Run once, now, not again at exit.
  assert fixed.stdout.splitlines()[-2:] == ['handler ran', 'after'], (
      fixed.stderr[-2000:])
  assert fixed.stdout.count('handler ran') == 1


def test_keras_optimizers_sum_gradients_over_replicas_in_a_method_we_skip():
  optimizer = keras.optimizers.SGD(1.0)
  assert callable(getattr(optimizer, '_all_reduce_sum_gradients', None))
  variable = tf.Variable([1.0, 1.0])
  optimizer.build([variable])
  with tf_internals.keras_gradients_already_reduced(optimizer):
    assert optimizer._all_reduce_sum_gradients([(1, 2)]) == [(1, 2)]  # pylint: disable=protected-access
    optimizer.apply_gradients([(tf.constant([0.5, 0.0]), variable)])
  np.testing.assert_allclose(variable.numpy(), [0.5, 1.0])
  # Nothing of the optimizer itself changed.
  assert '_all_reduce_sum_gradients' not in vars(optimizer)


def test_gradients_already_reduced_holds_for_the_calling_thread_only():
  # MirroredStrategy traces each replica's step in a thread of its own: one
  # replica inside the context must not change what another traces.
  optimizer = keras.optimizers.SGD(1.0)
  strategy = tf.distribute.MirroredStrategy(['/cpu:0'])
  inside, leave = threading.Event(), threading.Event()
  seen = {}

  def in_context():
    with tf_internals.keras_gradients_already_reduced(optimizer):
      inside.set()
      leave.wait(60)
      seen['inside'] = optimizer._all_reduce_sum_gradients([(1, 2)])  # pylint: disable=protected-access

  thread = threading.Thread(target=in_context)
  thread.start()
  assert inside.wait(60)
  # In replica context, this thread's call sums over the replicas: the
  # result is the all-reduced tensor, not the value given.
  gradient = tf.constant(3.0)
  summed = strategy.run(lambda: optimizer._all_reduce_sum_gradients(  # pylint: disable=protected-access
      [(gradient, tf.Variable(0.0))]))
  leave.set()
  thread.join(60)
  assert seen['inside'] == [(1, 2)]
  assert summed[0][0] is not gradient


def test_all_layers_finds_nested_layers():
  inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  outer = keras.Sequential([keras.Input((3,)), inner, keras.layers.Dense(1)])
  layers = tf_internals.all_layers(outer)
  assert inner.layers[0] in layers and inner in layers


def test_the_coordination_service_client_has_what_leave_together_uses():
  client = tf_cluster_internals.coordination_service()
  for method in ('wait_at_barrier', 'set_config_key_value',
                 'get_config_key_value'):
    assert callable(getattr(client, method))


# A parameter-server cluster in one process (its servers cannot be shut
# down, so in a process of its own): each worker's iterator reports the
# InputContext it was made with.
_PER_WORKER_CONTEXTS = '''
import collections, portpicker, tensorflow as tf
from ctl.runtime import tf_cluster_internals
ports = [portpicker.pick_unused_port() for _ in range(3)]
cluster = tf.train.ClusterSpec({{
    'worker': [f'localhost:{{port}}' for port in ports[:2]],
    'ps': [f'localhost:{{ports[2]}}']}})
# Four inter-op threads: with one, an in-process cluster hangs (TF_NOTES).
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
for job, index in (('worker', 0), ('worker', 1), ('ps', 0)):
  tf.distribute.Server(cluster, job_name=job, task_index=index,
                       protocol='grpc', config=config, start=True)
strategy = tf.distribute.experimental.ParameterServerStrategy(
    tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer='grpc'))
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
iterator = tf_cluster_internals.per_worker_iterator(
    coordinator, lambda context: tf.data.Dataset.from_tensors(
        [context.input_pipeline_id, context.num_input_pipelines]).repeat())
take = tf.function(
    lambda iterator: strategy.run(tf.identity, args=(next(iterator),)))
values = [coordinator.schedule(take, args=(iterator,)) for _ in range(60)]
coordinator.join()
print('seen', sorted(collections.Counter(
    tuple(value.fetch().tolist()) for value in values)))
'''


@pytest.mark.slow
def test_each_worker_of_a_parameter_server_job_gets_its_own_input_context():
  # TensorFlow's create_per_worker_dataset gives both workers input
  # pipeline 0 of 1; per_worker_iterator gives worker i pipeline i of 2.
  result = _run(_PER_WORKER_CONTEXTS.format())
  assert result.returncode == 0, result.stderr[-3000:]
  seen = [line for line in result.stdout.splitlines()
          if line.startswith('seen')]
  assert seen, result.stdout
  pairs = {pair for pair in re.findall(r'\((\d+), (\d+)\)', seen[0])}
  assert pairs == {('0', '2'), ('1', '2')}, seen[0]


def test_a_dataset_graph_serializes_unless_a_stateful_op_is_anywhere():
  savable = tf.data.Dataset.range(8).shuffle(4, seed=1).interleave(
      lambda i: tf.data.Dataset.range(i), cycle_length=2,
      num_parallel_calls=2).map(lambda x: x + tf.random.stateless_uniform(
          [], seed=[1, 2], maxval=3, dtype=tf.int64))
  tf_internals.check_dataset_serializable(savable)
  stateful = tf.data.Dataset.range(8).map(
      lambda x: tf.cast(x, tf.float32) + tf.random.uniform([])).shuffle(4)
  with pytest.raises(tf.errors.FailedPreconditionError,
                     match='RandomUniform is stateful'):
    tf_internals.check_dataset_serializable(stateful)


def _symbolic(dataset):
  options = tf.data.Options()
  options.experimental_symbolic_checkpoint = True
  return dataset.with_options(options)


def _parallel_interleave_per_epoch():
  """A parallel interleave inside flat_map, as ctl's TFRecord pipeline has
  it (a function of the graph's library)."""
  return tf.data.Dataset.range(3).flat_map(
      lambda epoch: tf.data.Dataset.range(4).interleave(
          tf.data.Dataset.range, cycle_length=2, num_parallel_calls=2)
  ).batch(2).prefetch(1)


def test_a_symbolic_checkpoint_of_a_parallel_interleave_is_a_hazard():
  assert tf_internals.symbolic_checkpoint_hazard(
      _symbolic(_parallel_interleave_per_epoch())).startswith(
          'The training pipeline sets tf.data.Options.'
          'experimental_symbolic_checkpoint')
  # The option set upstream still counts (Dataset.options merges inputs').
  assert tf_internals.symbolic_checkpoint_hazard(_symbolic(
      tf.data.Dataset.range(4)).interleave(
          tf.data.Dataset.range, num_parallel_calls=2).batch(2)) is not None
  # Ordinary checkpoints, or no parallel interleave: no hazard.
  assert tf_internals.symbolic_checkpoint_hazard(
      _parallel_interleave_per_epoch()) is None
  assert tf_internals.symbolic_checkpoint_hazard(_symbolic(
      tf.data.Dataset.range(4).interleave(tf.data.Dataset.range,
                                          cycle_length=2))) is None


def test_a_pipeline_whose_saves_could_segfault_is_refused_before_training(
    tmp_path):
  from ctl import errors  # pylint: disable=g-import-not-at-top
  dataset = _symbolic(_parallel_interleave_per_epoch())
  positions = data_positions.DataPositions(
      {'iterator': iter(dataset)}, str(tmp_path), max_to_keep=1)
  with pytest.raises(errors.CtlError, match='segmentation fault'):
    positions.check_savable(dataset)
  assert not list(tmp_path.iterdir())


def _epochs(iterator, num_epochs: int) -> list[list[int]]:
  return [[int(x) for _ in range(8) for x in next(iterator).numpy()]
          for _ in range(num_epochs)]


def test_repeat_still_loses_a_reshuffled_pass_saved_near_its_end(tmp_path):
  """Why ctl reads a task's pipeline through ctl/data/resumable.py: TF 2.21
  restores such a position with other seeds for the next pass. When this
  fails, TensorFlow fixed it."""

  def repeated():
    return (tf.data.Dataset.range(64).shuffle(64, seed=1).batch(8)
            .prefetch(2).repeat())

  reference = _epochs(iter(repeated()), 2)
  wrong = 0
  # The prefetch reaches the end on its thread, in most attempts (fewer on
  # a loaded machine): tried until it did once.
  for attempt in range(100):
    if wrong:
      break
    iterator = iter(repeated())
    for _ in range(7):
      next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(
        str(tmp_path / f'{attempt}' / 'position'))
    restored = iter(repeated())
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    assert [int(x) for x in next(restored).numpy()] == reference[0][56:]
    wrong += _epochs(restored, 1)[0] != reference[1]
  assert wrong > 0


def test_a_reshuffling_op_below_a_shuffle_is_found_in_the_graph():
  range_ = tf.data.Dataset.range
  assert tf_internals.reseeding_below_shuffle(
      range_(8).shuffle(8, seed=1).map(lambda x: x + 1).shuffle(8, seed=2)
      .batch(2)) == ('ShuffleDatasetV3', 'ShuffleDatasetV3')
  assert tf_internals.reseeding_below_shuffle(tf.data.Dataset.zip(
      (range_(8), range_(8).shuffle(8, seed=1))).shuffle(8, seed=2)) == (
          'ShuffleDatasetV3', 'ShuffleDatasetV3')
  assert tf_internals.reseeding_below_shuffle(
      range_(8).shuffle(8, seed=1).batch(2).prefetch(2).repeat()) is None
  assert tf_internals.reseeding_below_shuffle(
      range_(8).shuffle(8, seed=1, reshuffle_each_iteration=False)
      .shuffle(8, seed=2)) is None


def test_a_flat_call_runs_the_trace_as_the_public_call_does():
  variable = tf.Variable(1.0)

  @tf.function(autograph=False)
  def loop(num_steps, requests, read: bool):
    variable.assign_add(tf.cast(num_steps, tf.float32))
    outputs = {'logs': {'total': variable.read_value()}, 'requests': requests}
    if read:
      outputs['read'] = variable * 2
    return outputs

  for read in (False, True):
    call = tf_internals.flat_caller(loop, tf.constant(3), tf.constant([0, 1]),
                                    read)
    # The private call was taken, not the fallback (a TensorFlow change).
    assert not isinstance(call, type(loop.get_concrete_function(
        tf.constant(3), tf.constant([0, 1]), read)))
    before = variable.numpy()
    flat = call(tf.constant(2), tf.constant([1, 0]))
    public = loop(tf.constant(2), tf.constant([1, 0]), read)
    assert flat['logs']['total'].numpy() == before + 2
    assert public['logs']['total'].numpy() == before + 4
    assert flat['requests'].numpy().tolist() == [1, 0]
    assert sorted(flat) == sorted(public)
  # One trace per Python value, none for the flat calls.
  assert loop.experimental_get_tracing_count() == 2


def test_stateful_ops_lists_every_one_tensorflow_would_refuse():
  # TensorFlow's serialization names only the first stateful op it meets;
  # stateful_ops names each, and leaves out what TensorFlow saves: a
  # lookup table's reads, datasets inside an interleave's function.
  table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
      tf.constant([1, 2], tf.int64), tf.constant([3, 4], tf.int64)), -1)
  saved = tf.data.Dataset.range(8).map(table.lookup).interleave(
      tf.data.Dataset.range, cycle_length=2)
  tf_internals.check_dataset_serializable(saved)
  assert tf_internals.stateful_ops(saved) == []
  unsaved = saved.map(
      lambda x: tf.cast(x, tf.float32) + tf.random.uniform([])).map(
          lambda x: tf.py_function(tf.identity, [x], tf.float32))
  with pytest.raises(tf.errors.FailedPreconditionError,
                     match='EagerPyFunc is stateful'):
    tf_internals.check_dataset_serializable(unsaved)
  assert tf_internals.stateful_ops(unsaved) == ['EagerPyFunc',
                                                'RandomUniform']


def test_op_determinism_turns_off_again():
  # A warm process (ctl/warm.py) turns off what a run turned on.
  before = tf_internals.op_determinism_enabled()
  try:
    tf_internals.set_op_determinism(True)
    assert tf_internals.op_determinism_enabled()
    tf_internals.set_op_determinism(False)
    assert not tf_internals.op_determinism_enabled()
  finally:
    tf_internals.set_op_determinism(before)


def test_the_next_mirrored_strategy_numbers_its_collectives_past_the_last():
  # The fix for a warm process's next run (tests/runtime/test_warm.py):
  # TensorFlow still reads the class attribute where it numbers groups.
  def first_group_key():
    keys = tf.distribute.MirroredStrategy(['/cpu:0']).extended._collective_keys  # pylint: disable=protected-access
    return keys.get_group_key(['/job:localhost/replica:0/task:0/device:CPU:0'])

  before = first_group_key()
  tf_internals.move_past_used_collective_keys()
  assert first_group_key() == before + tf_internals._COLLECTIVE_KEY_STRIDE  # pylint: disable=protected-access
