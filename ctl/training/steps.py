"""Runs a task's steps on every replica, many per tf.function call.

`train_loop` runs a loop of steps inside one tf.function (a graph loop
whose count is a tensor, so it never retraces) and returns the loop's mean
logs and the workers' agreed requests, in one all-reduce, and, when a
report is due after the loop, the train metrics, read and reset. The
Python loop in ctl/training/loop.py owns everything else. ctl's own code
is traced without AutoGraph: it has no Python control flow on tensors, and
converting it cost most of the first step's tracing time. The task's own
hooks are converted (`task_calls.task_function`, config.autograph), as a tf.function
would convert them. What XLA compiles (config.jit_compile, 'auto' decided
per task) is chosen here too: `resolve_xla`.
"""

import contextlib
import dataclasses
from typing import Any

import keras
import tensorflow as tf

from ctl import errors
from ctl import task as task_lib
from ctl.cluster import distribution
from ctl.cluster import input_wait as input_wait_lib
from ctl.data import inputs
from ctl.runtime import tf_internals
from ctl.training import state as state_lib
from ctl.training import task_calls



@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How each training step runs.

  Attributes:
    global_batch_size: the examples of a step, over every replica.
    seed: the run's seed (the step context's).
    steps_per_epoch: the steps of an epoch.
    jit_compile: what XLA compiles ('off', 'step', 'loop'), as
      resolve_xla decided.
    all_reduce_dtype: the gradients' all-reduce dtype (the step context's).
    summary_steps: steps between the tf.summary records of a task's step.
    autograph: convert the task's Python control flow (config.autograph).
    accumulate_steps: micro-batches per update, for ctx.accumulate.
  """

  global_batch_size: int
  seed: int
  steps_per_epoch: int
  jit_compile: str = 'off'
  all_reduce_dtype: str = 'float32'
  summary_steps: int = 0
  autograph: bool = True
  accumulate_steps: int = 1

  @classmethod
  def from_config(cls, config: Any, length: state_lib.TrainingLength,
                  jit_compile: str) -> 'StepOptions':
    """The options a run's config and length give, XLA as resolved."""
    return cls(
        global_batch_size=length.global_batch_size, seed=config.seed,
        steps_per_epoch=length.steps_per_epoch, jit_compile=jit_compile,
        all_reduce_dtype=config.distribution.all_reduce_dtype,
        summary_steps=config.intervals.summary_steps,
        autograph=config.autograph, accumulate_steps=config.accumulate_steps)


class StepRunner:
  """A task's train_step looped inside tf.functions, with the step context."""

  def __init__(self, *, strategy: tf.distribute.Strategy,
               task: task_lib.Task, train_input: inputs.TrainInput,
               state: state_lib.TrainState, options: StepOptions,
               train_metrics: task_calls.MetricReader | None = None,
               steps_done: tf.Variable | None = None,
               input_wait: input_wait_lib.InputWait | None = None):
    """Args as named.

    Args:
      train_input: the task's training data as the loop reads it.
      options: how each step runs.
      train_metrics: the task's train metrics, read at a loop's end when
        asked (`train_loop`'s read_metrics).
      steps_done: an int64 variable to count each step in, as it is done
        (the watchdog's progress, ctl/cluster/watchdog.py).
      input_wait: times each read of the input (the status file's
        input_wait); not with jit_compile 'loop' (XLA has no clock op).
    """
    self._strategy = strategy
    self._task = task
    self._input = train_input
    self._state = state
    self._global_batch_size = options.global_batch_size
    self._seed = options.seed
    self._steps_per_epoch = options.steps_per_epoch
    self._all_reduce_dtype = options.all_reduce_dtype
    self._summary_steps = options.summary_steps
    self._autograph = options.autograph
    self._accumulate_steps = options.accumulate_steps
    self._local_replicas = distribution.local_replicas(strategy)
    self._train_metrics = train_metrics or task_calls.MetricReader([])
    self._steps_done = steps_done
    self._read_input = (input_wait.timed
                        if input_wait is not None and
                        options.jit_compile != 'loop' else
                        lambda read: read())
    # The step, traced once and called by every trace of the loop (one with
    # the metrics' read, one without).
    self._step_function = tf.function(self._run_step, autograph=False)
    self._iterator = None
    self._loop_function = None
    self._calls = {}  # {read_metrics: the traced loop, called flat}
    self._compile(options.jit_compile)

  def _compile(self, jit_compile: str) -> None:
    """What XLA compiles: a step takes the loop's indices and its number,
    a loop its indices padded to steps_per_loop (one program per input
    shape)."""
    self._step_on_batch = self._train_on_batch
    self._run_steps = self._loop_steps
    if jit_compile == 'step':
      # Compiled from the batch on: its shape is fixed (the loop's rows of
      # in-memory data are not), and XLA compiles once per input shape.
      self._step_on_batch = tf.function(self._train_on_batch,
                                        jit_compile=True, autograph=False)
    elif jit_compile == 'loop':
      self._run_steps = tf.function(self._loop_steps, jit_compile=True,
                                    autograph=False)

  def train_loop(self, iterator, num_steps: tf.Tensor, requests: tf.Tensor,
                 read_metrics: bool = False) -> dict[str, Any]:
    """Runs num_steps training steps, then agrees on what to do next.

    Args:
      iterator: from train_input.make_iterator; the same one for a run's
        loops. The tf.function closes over it, and is called on its flat
        tensors (`tf_internals.flat_caller`): binding an iterator and the
        other arguments cost each call about 0.3 ms (BENCHMARKS.md,
        "Per-loop costs").
      num_steps: a scalar int32 tensor, at least 1.
      requests: this worker's int32 flags, e.g. [stop, save].
      read_metrics: also read and reset the train metrics after the steps
        (when a report is due after the loop): one call less a report.

    Returns:
      'logs': the task's logs averaged over the loop's steps and replicas;
      'loop_logs': the task's loop_logs after the loop;
      'requests': `requests` summed over every replica of every worker: an
        entry > 0 means some worker asked for it, and every worker gets the
        same answer after the same step;
      'metrics' (with read_metrics): {name: result} of the train metrics,
        read after the steps, then reset.
    """
    if iterator is not self._iterator:
      self._iterator = iterator
      self._loop_function = tf.function(
          lambda num_steps, requests, read_metrics: self._train_loop(
              iterator, num_steps, requests, read_metrics), autograph=False)
      self._calls = {}
    if read_metrics not in self._calls:
      self._calls[read_metrics] = tf_internals.flat_caller(
          self._loop_function, num_steps, requests, read_metrics)
    return self._calls[read_metrics](num_steps, requests)

  def trace_step(self, iterator) -> None:
    """Traces a step on the iterator's data without running it, so that a
    step ctl refuses fails before the run writes anything.

    Raises:
      ConfigError: config.accumulate_steps > 1 and the step does not call
        ctx.accumulate.
    """
    one = tf.constant(1)
    tf.function(lambda: self._loop_steps(
        self._input.loop_data(iterator, one), one),
                autograph=False).get_concrete_function()

  def _train_loop(self, iterator, num_steps: tf.Tensor, requests: tf.Tensor,
                  read_metrics: bool) -> dict[str, Any]:
    loop_data = self._read_input(
        lambda: self._input.loop_data(iterator, num_steps))
    sums = self._run_steps(loop_data, num_steps)
    self._state.advance(num_steps, self._steps_per_epoch)
    # One all-reduce for both, in one dtype (a collective takes one): each
    # worker's local sums, spread over its replicas so that the sum over
    # all replicas counts them once, then its requests.
    names = sorted(sums)
    local = tf.concat([
        tf.stack([sums[name] for name in names]) / self._local_replicas,
        tf.cast(requests, tf.float32)], axis=0)
    totals = self._strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        # tf.identity: each replica's own copy, a distributed value.
        self._strategy.run(lambda: tf.identity(local)), axis=None)
    by_name = dict(zip(names, tf.unstack(totals[:len(names)])))
    examples = by_name.pop(task_calls.EXAMPLES)
    logs = {name: value / examples for name, value in by_name.items()}
    loop_logs = {name: tf.cast(value, tf.float32)
                 for name, value in
                 task_calls.task_function(self._task.loop_logs, self._autograph)().items()}
    outputs = {'logs': logs, 'loop_logs': loop_logs,
               'requests': tf.cast(tf.round(totals[len(names):]), tf.int32)}
    if read_metrics:  # After the steps: automatic control dependencies.
      outputs['metrics'] = self._train_metrics.read_and_reset_in_graph()
    return outputs

  def _loop_steps(self, loop_data, num_steps: tf.Tensor) -> dict:
    """The first num_steps steps; this worker's example-weighted log sums.

    The step is traced once, as a function the graph loop's body calls:
    every step then runs the same program whichever loop it falls in (XLA
    compiles a loop whole, and loops differ in length), and the
    sums the loop carries take the logs' structure from that trace.
    """
    first_step = self._state.step.read_value()
    zero = tf.constant(0)
    run_step = self._step_function.get_concrete_function(
        loop_data, zero, first_step)
    sums = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype),
                                 run_step.structured_outputs)

    def body(i, sums):
      logs = run_step(loop_data, i, first_step)
      if self._steps_done is not None:
        with tf.control_dependencies(list(logs.values())):
          self._steps_done.assign_add(1)
      return i + 1, {name: sums[name] + logs[name] for name in sums}

    _, sums = tf.while_loop(lambda i, _: i < num_steps, body, [zero, sums])
    return sums

  def _run_step(self, loop_data, step_in_loop, first_step) -> dict:
    """One step on every replica; this worker's weighted log sums."""
    batches = self._read_input(
        lambda: self._input.batches(loop_data, step_in_loop))
    step = first_step + tf.cast(step_in_loop, tf.int64)
    with self._summaries_due(step):
      outputs = self._strategy.run(self._step_on_batch, args=(batches, step))
    return {name: tf.add_n(self._strategy.experimental_local_results(value))
            for name, value in outputs.items()}

  def _train_on_batch(self, batch, step) -> dict[str, tf.Tensor]:
    ctx = task_lib.StepContext(
        global_batch_size=self._global_batch_size, step=step, seed=self._seed,
        training=True, all_reduce_dtype=self._all_reduce_dtype,
        accumulate_steps=self._accumulate_steps)
    # Out of the graph loop's name scope: a task's tf.summary('x') is 'x'.
    with tf.compat.v1.name_scope(None):
      logs = task_calls.call_step(task_calls.task_function(self._task.train_step, self._autograph),
                       batch, ctx, 'train_step')
    if self._accumulate_steps > 1 and not ctx.accumulated:
      raise errors.ConfigError(
          f'config.accumulate_steps={self._accumulate_steps}, but the task\'s '
          'train_step does not call ctx.accumulate, so it would train on '
          'whole batches: call it (see ctl.StepContext.accumulate), or '
          'set config.accumulate_steps=1.')
    # Every replica's training batch has the same size: a plain mean.
    return task_calls.weighted_logs(logs, None, 'train_step')

  @contextlib.contextmanager
  def _summaries_due(self, step: tf.Tensor):
    """Records a task's own tf.summary calls at the summary interval only,
    on the first replica, under the number of steps done after this one."""
    def due():
      first_replica = tf.equal(
          tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
      return tf.logical_and(
          first_replica, tf.equal((step + 1) % self._summary_steps, 0))

    if not self._summary_steps:
      with tf.summary.record_if(False):
        yield
      return
    tf.summary.experimental.set_step(step + 1)
    try:
      with tf.summary.record_if(due):
        yield
    finally:
      tf.summary.experimental.set_step(None)


# Keras layers whose XLA CPU kernels run several times slower inside a
# compiled loop than in a compiled step (BENCHMARKS.md, levers).
_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
                 keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
                 keras.layers.Conv3DTranspose, keras.layers.DepthwiseConv1D,
                 keras.layers.DepthwiseConv2D, keras.layers.SeparableConv1D,
                 keras.layers.SeparableConv2D)


def resolve_xla(setting: str, *, num_replicas: int, task: task_lib.Task,
                in_memory: bool) -> str:
  """'off', 'step' (each replica's step one program) or 'loop' (a whole loop).

  'auto' is 'off' for a task's own steps (they may hold ops XLA cannot
  compile, tf.summary among them), with several replicas, or with GPUs or
  TPUs (not measured here). For a task that allows it (`Task.auto_xla`, the
  built-in ones), on one CPU replica, from measurements (BENCHMARKS.md,
  levers): 'loop' over in-memory data, since one XLA program per loop
  removes the cost of dispatching each op; but 'step' for models with
  convolutions, which XLA runs several times slower inside a loop, and for
  tf.data input, whose iterator XLA cannot compile.

  Raises:
    ConfigError: for 'loop' or 'step' where they cannot work.
  """
  if setting in ('loop', 'step') and num_replicas > 1:
    raise errors.ConfigError(
        f'config.jit_compile={setting!r} needs a single replica; this job has '
        f"{num_replicas} (the step's all-reduce cannot be compiled on every "
        "device). Use 'off' or 'auto'.")
  if setting == 'loop' and not in_memory:
    raise errors.ConfigError(
        "config.jit_compile='loop' needs in-memory training data (ctl.InMemory"
        "): XLA cannot compile a tf.data iterator. Use 'step', 'off' or "
        "'auto'.")
  if setting != 'auto':
    return setting
  accelerators = [device for device in tf.config.list_physical_devices()
                  if device.device_type != 'CPU']
  if not task.auto_xla or num_replicas > 1 or accelerators:
    return 'off'
  layers = [layer for model in task.models()
            for layer in tf_internals.all_layers(model)]
  if not in_memory or any(isinstance(layer, _CONVOLUTIONS)
                          for layer in layers):
    return 'step'
  return 'loop'

