"""Parameter-server training: the chief's loop of steps, run on the workers.

With distribution.strategy='parameter_server' the chief coordinates
(ctl/cluster/ps_cluster.py): `ParameterServerRunner.train_loop` is the
step runner behind the TrainLoop (ctl/training/loop.py), as
steps.StepRunner is for the other strategies. A loop of n steps is split
over the workers, one closure each (`coordinator.schedule`), each closure
running its share of the task's own `train_step` from the worker's own
dataset (ctl/training/worker_input.py) and returning how many steps it
ran. The run's step advances by the sum of what the closures returned,
once every closure of the loop is done (`coordinator.join`): a closure
lost with its worker is run again on another worker, and only the
closures that finished are counted, so the step is exact whatever the
workers do.

The Keras optimizer's own step counter (`optimizer.iterations`, which its
learning-rate schedule and Adam's bias correction read) loses increments
when workers update it at once: it is set from the run's step at each
loop's start and end (`_set_iterations`; BUILD.md, "Parameter servers").
The task's train metrics count with the same racy increment: their
variables' `assign_add` and `assign_sub` are routed to the servers' own
atomic ops before the first step is traced (`make_increments_atomic`).
"""

from collections.abc import Iterator, Sequence
import dataclasses
import functools
import time
from typing import Any

import keras
import tensorflow as tf

from ctl import errors
from ctl import task as task_lib
from ctl.runtime import tf_process
from ctl.training import job as job_lib
from ctl.training import state as state_lib
from ctl.training import steps as steps_lib
from ctl.training import task_calls


def evaluation_job(job: job_lib.Job) -> job_lib.Job:
  """The job evaluation runs in: the chief evaluates on its own device,
  reading the servers' variables (the workers only train)."""
  return dataclasses.replace(job, strategy=tf.distribute.get_strategy())


# How often the chief looks whether a loop's closures are done, and how long
# a loop in flight may still take once SIGTERM came (Kubernetes' and
# Slurm's default grace periods are 30 s: the save needs some of it).
_POLL_SECONDS = 0.05
_SIGTERM_GRACE_SECONDS = 20.0
# A loop's steps go out as this many closures a worker, taken by whichever
# worker is free: a slow worker does fewer, and holds the loop's end by one
# small closure, not by a 1/N share.
_CLOSURES_PER_WORKER = 4


class ParameterServerRunner:
  """A loop of the task's train_step, split over the workers; has
  steps.StepRunner's train_loop."""

  def __init__(self, strategy: tf.distribute.Strategy, task: task_lib.Task,
               state: state_lib.TrainState, options: steps_lib.StepOptions,
               train_metrics: task_calls.MetricReader,
               stop_signal: tf_process.StopSignal, timeout_seconds: float):
    """Args as for steps.StepRunner; stop_signal: SIGTERM's request, which
    shortens the wait for a loop (_join); timeout_seconds: the longest a
    loop may wait for its workers (distribution.timeout_seconds)."""
    self._strategy = strategy
    self._stop_signal = stop_signal
    self._timeout_seconds = timeout_seconds
    self._coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    self._task = task
    self._state = state
    self._options = options
    self._train_metrics = train_metrics
    make_increments_atomic(task.train_metrics)  # Before the first trace.
    # The workers the loop's steps are split over.
    self._num_workers = strategy.extended._num_workers  # pylint: disable=protected-access
    self._optimizers = _optimizers(task)
    self._worker_steps = tf.function(self._steps_on_worker, autograph=False)
    self._loop_logs = tf.function(
        task_calls.task_function(task.loop_logs, options.autograph),
        autograph=False)

  def train_loop(self, iterator, num_steps: tf.Tensor, requests: tf.Tensor,
                 read_metrics: bool = False) -> dict[str, Any]:
    """Runs num_steps steps on the workers; as steps.StepRunner.train_loop
    (the requests are this process's alone: the chief is the one worker
    that runs the loop). A parameter server lost raises TensorFlow's error,
    which run.py names (ps_cluster.lost_server_failure, exit 43)."""
    count = int(num_steps)
    first_step = int(self._state.step.numpy())
    _set_iterations(self._optimizers, first_step)
    scheduled, offset = [], first_step
    for size in _shares(count, self._num_workers * _CLOSURES_PER_WORKER):
      scheduled.append(self._coordinator.schedule(
          self._worker_steps, args=(iterator, tf.constant(size),
                                    tf.constant(offset, tf.int64))))
      offset += size
    self._join()
    done, sums = 0, {}
    for remote in scheduled:
      steps, logs = remote.fetch()
      done += int(steps)
      for name, value in logs.items():
        sums[name] = sums.get(name, 0.0) + float(value)
    if done != count:  # What the loop planned is what is counted.
      raise errors.CtlError(f'The workers ran {done} steps of a loop of '
                            f'{count}: a ctl bug, please report it.')
    self._state.advance(done, self._options.steps_per_epoch)
    _set_iterations(self._optimizers, first_step + done)
    examples = sums.pop(task_calls.EXAMPLES)
    outputs = {
        'logs': {name: value / examples for name, value in sums.items()},
        'loop_logs': self._loop_logs(),
        'requests': requests}
    if read_metrics:
      outputs['metrics'] = self._train_metrics.read_and_reset_in_graph()
    return outputs

  def _join(self) -> None:
    """coordinator.join, bounded. TensorFlow waits up to an hour for a lost
    worker to come back (cluster_coordinator.py's
    _WORKER_MAXIMUM_RECOVERY_SEC), so with every worker gone join() never
    returns: ctl waits for the loop at most timeout_seconds, and at most
    _SIGTERM_GRACE_SECONDS once SIGTERM asked it to stop.

    Raises:
      PeerFailure: the loop did not finish in timeout_seconds.
      Preempted: SIGTERM, and the loop did not finish in the grace period.
    """
    deadline = time.monotonic() + self._timeout_seconds
    graced = False
    while not self._coordinator.done():  # Raises what a closure raised.
      if self._stop_signal.requested and not graced:
        graced = True
        deadline = min(deadline, time.monotonic() + _SIGTERM_GRACE_SECONDS)
      if time.monotonic() > deadline:
        raise self._unfinished_loop()
      time.sleep(_POLL_SECONDS)

  def _unfinished_loop(self) -> errors.CtlError:
    """The error of a loop the workers did not finish in time."""
    saved = ('Nothing was saved after the latest checkpoint; the same '
             'command resumes from it once workers are running.')
    if self._stop_signal.requested:
      return errors.Preempted(
          f'{self._stop_signal.received}: the loop in flight did not finish '
          f'within {_SIGTERM_GRACE_SECONDS:.0f} s (no worker is running '
          f'it?). {saved}')
    return errors.PeerFailure(
        'No worker finished the loop in flight within '
        f'distribution.timeout_seconds={self._timeout_seconds:g}: every '
        f'worker is gone or hung. {saved}')

  def trace_step(self, iterator) -> None:
    """Nothing to trace before the run: config_checks refuses what the
    other runners' trace checks (accumulate_steps)."""
    del iterator

  def _steps_on_worker(self, iterator, num_steps: tf.Tensor,
                       first_step: tf.Tensor) -> tuple[tf.Tensor, dict]:
    """A closure: num_steps steps on one worker; (num_steps, log sums).

    The first step is run before the graph loop, which takes the sums'
    structure from it. A task's own tf.summary calls record nothing: the
    workers have no summary writer.
    """
    with tf.summary.record_if(False):
      sums = self._step(iterator, first_step)

      def body(i, sums):
        logs = self._step(iterator, first_step + tf.cast(i, tf.int64))
        return i + 1, {name: sums[name] + logs[name] for name in sums}

      _, sums = tf.while_loop(lambda i, _: i < num_steps, body,
                              [tf.constant(1), sums])
    return num_steps, sums

  def _step(self, iterator, step: tf.Tensor) -> dict[str, tf.Tensor]:
    """One step of the task's on the worker's next batch; weighted logs."""
    outputs = self._strategy.run(self._train_on_batch,
                                 args=(next(iterator), step))
    return {name: tf.add_n(self._strategy.experimental_local_results(value))
            for name, value in outputs.items()}

  def _train_on_batch(self, batch, step) -> dict[str, tf.Tensor]:
    """The task's train_step with its step context."""
    options = self._options
    ctx = task_lib.StepContext(
        global_batch_size=options.global_batch_size, step=step,
        seed=options.seed, training=True,
        all_reduce_dtype=options.all_reduce_dtype)
    logs = task_calls.call_step(
        task_calls.task_function(self._task.train_step, options.autograph),
        batch, ctx, 'train_step')
    return task_calls.weighted_logs(logs, None, 'train_step')


def _shares(count: int, num_closures: int) -> Iterator[int]:
  """count steps split into at most num_closures closures, sizes differing
  by at most one."""
  closures = min(count, num_closures)
  for index in range(closures):
    yield count // closures + (1 if index < count % closures else 0)


def _optimizers(task: task_lib.Task) -> list[keras.optimizers.Optimizer]:
  """The task's Keras optimizers, each once (a LossScaleOptimizer's inner
  one has its own counter too)."""
  found = []
  for value in vars(task).values():
    while isinstance(value, keras.optimizers.Optimizer):
      if all(value is not known for known in found):
        found.append(value)
      value = getattr(value, 'inner_optimizer', None)
  return found


def make_increments_atomic(metrics: Sequence[keras.metrics.Metric]) -> None:
  """Routes each metric variable's assign_add and assign_sub to its
  tf.Variable's own op, atomic on its server.

  A Keras variable's `assign_add` is `self.assign(self + value)`
  (keras/src/backend/common/variables.py, lines 300-304; the TensorFlow
  backend's Variable does not override it): a read, then a write, so two
  workers that read the same total both write total + their value, and one
  update is lost. Keras's Mean and Sum, and every metric built on them
  (the accuracies, MeanMetricWrapper), update with it
  (keras/src/metrics/reduction_metrics.py, lines 87, 142, 149). The
  routing is an attribute of each variable, read when a step is traced:
  it must be set before. Metrics that write a sum they read themselves
  (`var.assign(var + x)`: Keras's confusion-matrix metrics, IoU, R2Score)
  are not changed.
  """
  for metric in metrics:
    for variable in metric.variables:
      held = variable.value  # Its tf.Variable: no autocast scope here.
      if isinstance(held, tf.Variable):
        variable.assign_add = functools.partial(_assign_add, held)
        variable.assign_sub = functools.partial(_assign_sub, held)


def _assign_add(variable: tf.Variable, value) -> tf.Tensor:
  """variable.assign_add(value), value cast to its dtype as Keras casts."""
  return variable.assign_add(tf.cast(value, variable.dtype))


def _assign_sub(variable: tf.Variable, value) -> tf.Tensor:
  """variable.assign_sub(value), value cast to its dtype as Keras casts."""
  return variable.assign_sub(tf.cast(value, variable.dtype))


def _set_iterations(optimizers: list[keras.optimizers.Optimizer],
                    step: int) -> None:
  """Sets each optimizer's step counter to the run's step: what schedules
  and bias corrections read (they lose increments when workers update at
  once)."""
  for optimizer in optimizers:
    optimizer.iterations.assign(step)
