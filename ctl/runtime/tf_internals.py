"""Every private TensorFlow, Keras or Python API ctl uses, in two modules:
here, and those of the cluster machinery in tf_cluster_internals.py.

Each was checked on TensorFlow 2.21, Keras 3.15 and Python 3.11, and each is
covered by tests/runtime/test_tf_internals.py, which fails when the upstream
behaviour it relies on or works around changes. Nothing here is applied
as a side effect of importing or constructing something: `apply_fixes()` is
called once at start-up (ctl.training.run), the rest where named.
"""

import atexit
from collections.abc import Callable
import contextlib
import re
import threading
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.framework import op_def_registry  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import ops as tf_ops  # pylint: disable=g-direct-tensorflow-import


def apply_fixes() -> None:
  """Applies the process-wide fixes below; idempotent."""
  fix_keras_async_checkpoint_copy()


def fix_keras_async_checkpoint_copy() -> None:
  """Lets TensorFlow's async checkpointing copy Keras 3 variables.

  keras.src.backend.tensorflow.core.Variable._copy_trackable_to_cpu creates a
  new tf.Variable on every save, which the tf.function doing the copy
  refuses from the second save on ("tf.function only supports singleton
  tf.Variables created on the first call"; Keras 3.15). The CPU copy that
  TensorFlow already makes of the wrapped tf.Variable serves as the Keras
  variable's copy: both save the same tensors.
  """
  from keras.src.backend.tensorflow import core as keras_tf_core  # pylint: disable=g-import-not-at-top
  variable_class = keras_tf_core.Variable
  if getattr(variable_class._copy_trackable_to_cpu, 'ctl_fixed', False):  # pylint: disable=protected-access
    return

  def copy_trackable_to_cpu(self, object_map):
    self.value._copy_trackable_to_cpu(object_map)  # pylint: disable=protected-access
    object_map[self] = object_map[self.value]

  copy_trackable_to_cpu.ctl_fixed = True
  variable_class._copy_trackable_to_cpu = copy_trackable_to_cpu  # pylint: disable=protected-access


@contextlib.contextmanager
def keras_gradients_already_reduced(optimizer: keras.optimizers.Optimizer):
  """Within it, `optimizer.apply_gradients` applies gradients as given.

  Keras 3's TensorFlow optimizers sum gradients over the replicas in
  `_all_reduce_sum_gradients`, in replica context. A step that summed them
  itself (to clip the sum, or send 16 bits) must skip that. The change is
  in effect while the step is traced, so it is baked into that graph
  alone. MirroredStrategy traces each replica's step in a thread of its
  own, all on one optimizer, so nothing is changed on the optimizer: the
  Keras optimizer class skips the sum while a flag of the calling thread
  is set (the optimizer a LossScaleOptimizer wraps is of that class too).
  """
  del optimizer  # Every Keras TensorFlow optimizer honours the flag.
  flag = _install_already_reduced_flag()
  previous = getattr(flag, 'on', False)
  flag.on = True
  try:
    yield
  finally:
    flag.on = previous


def _install_already_reduced_flag() -> threading.local:
  """Makes Keras's TensorFlow optimizers skip their gradient sum while the
  calling thread's flag is on; returns the flag (once per process)."""
  from keras.src.backend.tensorflow import optimizer as keras_tf_optimizer  # pylint: disable=g-import-not-at-top
  optimizer_class = keras_tf_optimizer.TFOptimizer
  with _INSTALL_LOCK:
    flag = vars(optimizer_class).get('_ctl_already_reduced')
    if flag is not None:
      return flag
    flag = threading.local()
    all_reduce_sum_gradients = optimizer_class._all_reduce_sum_gradients  # pylint: disable=protected-access

    def maybe_all_reduce_sum_gradients(self, grads_and_vars):
      if getattr(flag, 'on', False):
        return grads_and_vars
      return all_reduce_sum_gradients(self, grads_and_vars)

    optimizer_class._all_reduce_sum_gradients = maybe_all_reduce_sum_gradients  # pylint: disable=protected-access
    optimizer_class._ctl_already_reduced = flag  # pylint: disable=protected-access
    return flag


# Guards the one-time class change above against replica threads that
# trace their first step at once.
_INSTALL_LOCK = threading.Lock()


def all_layers(model: keras.Model) -> list[keras.layers.Layer]:
  """Every layer of a model, nested ones included (Keras's own walk)."""
  return list(model._flatten_layers(include_self=False))  # pylint: disable=protected-access


def flat_caller(function, *args) -> Callable[..., Any]:
  """`function` (a tf.function) traced for args, as a callable of args'
  tensors alone, in their order: args' other values (Python values) select
  the trace and are left out of the call.

  A tf.function call binds its arguments to the traced signature on every
  call, about 160 microseconds in TensorFlow 2.21 (a 4 ms loop of the MLP
  spends 4% there: BENCHMARKS.md, "Per-loop costs"). The traced concrete
  function's `_call_flat` runs it on the flat tensors, as the public call
  does after binding, with the same outputs. Where it is missing, or the
  trace takes other inputs than args' tensors, the public call of the
  concrete function is used.
  """
  concrete = function.get_concrete_function(*args)
  tensors = [arg for arg in args if isinstance(arg, tf.Tensor)]
  call_flat = getattr(concrete, '_call_flat', None)
  if call_flat is None or len(concrete.inputs) != len(tensors) + len(
      concrete.captured_inputs):
    return concrete
  return lambda *tensors: call_flat(list(tensors), concrete.captured_inputs)


def end_async_checkpoint_thread(checkpoint: tf.train.Checkpoint) -> None:
  """Ends the thread of `checkpoint`'s asynchronous writes and forgets it
  (after `checkpoint.sync()`); a later write starts another.

  TensorFlow's AsyncCheckpointHelper registers an exit handler that holds
  it, so its thread and every object of the checkpoint (the model, the
  optimizer's slots) lived until the process ended: one more of each per
  run in a process that runs run after run (a sweep's warm slot).
  """
  helper = getattr(checkpoint, '_async_checkpointer_impl', None)
  if helper is None:
    return
  helper._join_async_save_thread()  # pylint: disable=protected-access
  atexit.unregister(helper._join_async_save_thread)  # pylint: disable=protected-access
  checkpoint._async_checkpointer_impl = None  # pylint: disable=protected-access


def take_async_checkpoint_error(
    checkpoint: tf.train.Checkpoint) -> Exception | None:
  """The error of the last asynchronous write of `checkpoint` that failed,
  taken from it; None if none failed. Call after `checkpoint.sync()`.

  TensorFlow's AsyncCheckpointHelper keeps the error of its write thread
  in `_async_error`; `sync()` does not raise it, the next write does, and
  otherwise its exit handler, printed as "Exception ignored in atexit
  callback" after the process's own error.
  """
  helper = getattr(checkpoint, '_async_checkpointer_impl', None)
  error = getattr(helper, '_async_error', None)
  if error is not None:
    helper._async_error = None  # pylint: disable=protected-access
  return error


def run_exit_handlers() -> None:
  """Runs the atexit handlers now, before an os._exit that skips them."""
  atexit._run_exitfuncs()  # pylint: disable=protected-access


def check_dataset_serializable(dataset: tf.data.Dataset) -> None:
  """Serializes the dataset's whole graph as an iterator save would.

  Raises FailedPreconditionError naming a stateful op anywhere in it
  (`tf.random.uniform`, `tf.py_function`, a Keras random layer's variable
  read, `from_generator`). Saving an iterator meets such an op only once
  the iterator has run through it (an op before a shuffle: once the buffer
  filled), so a save before training cannot tell; the graph can, at once
  and without reading data.
  """
  dataset._as_serialized_graph(  # pylint: disable=protected-access
      external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL)


# Stateful by their op definitions, yet let into a saved pipeline by
# TensorFlow: a function's assertions and calls (their bodies are read
# apart) and a lookup table's reads (ALLOW_STATEFUL_OP_FOR_DATASET_FUNCTIONS).
_STATEFUL_BUT_SAVED = ('Assert', 'If', 'While', 'Case', 'PartitionedCall',
                       'StatefulPartitionedCall', 'LookupTableFindV2',
                       'LookupFind', '_Retval', '_Arg')


def stateful_ops(dataset: tf.data.Dataset) -> list[str]:
  """The stateful ops in the functions of the dataset's pipeline (its
  maps, filters, interleaves), each once, sorted: where
  check_dataset_serializable stops at the first, these are all of them.
  Datasets inside those functions save their own state and are left out.
  """
  graph = _graph_def(dataset)
  found = []
  for function in graph.library.function:
    for node in function.node_def:
      definition = op_def_registry.get(node.op)
      if (definition is None or not definition.is_stateful or
          node.op in _STATEFUL_BUT_SAVED or
          re.search(r'Dataset(V\d+)?$', node.op) or node.op in found):
        continue
      found.append(node.op)
  return sorted(found)


def symbolic_checkpoint_hazard(dataset: tf.data.Dataset) -> str | None:
  """Why saving this pipeline's position could crash the process; None
  when it cannot.

  With `tf.data.Options.experimental_symbolic_checkpoint`, TF 2.21 saves
  a parallel interleave's state (`ParallelInterleaveIterator::
  WriteElement`) at every element it yields, on tf.data's own thread, not
  only when asked to save. An element that failed to start (cancelled
  when the iterator is dropped while that thread reads, or any error)
  has no inputs, which that save dereferences: a segfault (BUILD.md;
  tests/data/test_tfrecord.py drops iterators so). An ordinary iterator
  checkpoint saves only when asked, and skips such an element.
  """
  if not dataset.options().experimental_symbolic_checkpoint:
    return None
  graph = _graph_def(dataset)
  # Nested pipelines (interleave, flat_map) are functions of the library.
  ops = {node.op for node in graph.node} | {
      node.op for function in graph.library.function
      for node in function.node_def}
  if not any(op.startswith('ParallelInterleaveDataset') for op in ops):
    return None
  return ('The training pipeline sets tf.data.Options.'
          'experimental_symbolic_checkpoint and reads through a parallel '
          'interleave (Dataset.interleave with num_parallel_calls): '
          'TensorFlow 2.21 can then crash with a segmentation fault when '
          'the iterator is dropped or an interleaved dataset fails to '
          'start. Remove that option (ctl saves the position as an '
          'ordinary iterator checkpoint), or interleave without '
          'num_parallel_calls. Nothing was written.')


# Ops that draw new seeds each time an iterator over them starts, from a
# generator their dataset shares between iterators.
_RESEEDING = {'ShuffleDataset': 'reshuffle_each_iteration',
              'ShuffleDatasetV2': None,  # Always reshuffles.
              'ShuffleDatasetV3': 'reshuffle_each_iteration',
              'RandomDatasetV2': 'rerandomize_each_iteration'}
_SHUFFLES = ('ShuffleDataset', 'ShuffleDatasetV2', 'ShuffleDatasetV3')


def reseeding_below_shuffle(dataset: tf.data.Dataset) -> tuple[str, str] | None:
  """(a reshuffling op, the shuffle above it), or None.

  A shuffle that reshuffles each pass draws each pass's seeds from a
  generator whose count an iterator checkpoint holds only in that shuffle's
  own state (ctl/data/resumable.py keeps it for the main chain). Below
  another shuffle, its iterator starts only when the outer buffer fills,
  and once the outer buffer holds the rest of a pass its state is left out
  of the checkpoint: a restored run draws other seeds (TF 2.21: 48 of 48
  restores of `shuffle(16, seed=1).shuffle(64, seed=2).batch(8)
  .prefetch(2)` at each batch of three passes read another order, through
  ctl's resumable reading too). Only the main chain is read: pipelines
  inside interleave or flat_map functions are new datasets, and
  generators, per element.
  """
  graph = _graph_def(dataset)
  nodes = {node.name: node for node in graph.node}

  def inputs(node):
    names = (name.lstrip('^').split(':')[0] for name in node.input)
    return [nodes[name] for name in names if name in nodes]

  def reseeds(node) -> bool:
    if node.op not in _RESEEDING:
      return False
    attr = _RESEEDING[node.op]
    return attr is None or node.attr[attr].b

  def below(node, shuffle):
    for source in inputs(node):
      if shuffle is not None and reseeds(source):
        return source.op, shuffle.op
      found = below(source, source if source.op in _SHUFFLES else shuffle)
      if found:
        return found
    return None

  [output] = [node for node in graph.node if node.op == '_Retval']
  return below(output, None)


def _graph_def(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
  """The dataset's graph as an iterator save serializes it."""
  return tf.compat.v1.GraphDef.FromString(
      dataset._as_serialized_graph(  # pylint: disable=protected-access
          external_state_policy=(
              tf.data.experimental.ExternalStatePolicy.IGNORE)).numpy())


def op_determinism_enabled() -> bool:
  """Whether `tf.config.experimental.enable_op_determinism()` is in force."""
  from tensorflow.python.framework import config as tf_config  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  return tf_config.is_op_determinism_enabled()


def set_op_determinism(enabled: bool) -> None:
  """Turns op determinism on or off: TensorFlow's public API only turns it
  on; a process running one run after another must turn it off again."""
  from tensorflow.python.framework import config as tf_config  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  if enabled:
    tf_config.enable_op_determinism()
  else:
    tf_config.disable_op_determinism()


# Each MirroredStrategy numbers its collective groups from 1 + this class
# attribute (mirrored_strategy.py, MirroredExtended), and the collective
# runtime keeps every (group, instance) it has run for the process's life:
# the next run's strategy in a warm process (ctl/warm.py) reuses the keys,
# and fails ("Shape mismatch in the collective instance 101") where its
# tensors differ. TensorFlow's own tests raise it by this much per strategy
# (distribute/strategy_combinations.py).
_COLLECTIVE_KEY_STRIDE = 100_000


def move_past_used_collective_keys() -> None:
  """Makes the next MirroredStrategy of this process use collective keys
  no earlier strategy used."""
  from tensorflow.python.distribute import mirrored_strategy  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  mirrored_strategy.MirroredStrategy._collective_key_base += (  # pylint: disable=protected-access
      _COLLECTIVE_KEY_STRIDE)


# Each trace of a tf.custom_gradient (ctl's L2 penalty) registers its gradient
# function, holding the graph, in a global registry that nothing empties.
_CUSTOM_GRADIENT = 'CustomGradient-'


def registered_gradients() -> set[str]:
  """The op names TensorFlow's gradient registry holds."""
  return set(tf_ops.gradient_registry.list())


def forget_gradients(before: set[str], kept: Callable[[Any], bool]) -> None:
  """Drops the gradients registered since `before` by tf.custom_gradient
  traces (graphs and all) or by functions `kept` refuses (a user's)."""
  registry = tf_ops.gradient_registry._registry  # pylint: disable=protected-access
  for name in registered_gradients() - before:
    function = tf_ops.gradient_registry.lookup(name)
    if name.startswith(_CUSTOM_GRADIENT) or not kept(function):
      del registry[name]
