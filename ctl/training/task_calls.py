"""How ctl calls a task's step hooks inside its tf.functions (converted
by AutoGraph when asked, their logs checked and weighted by examples), and
reads its Keras metrics and sums across replicas and workers.

ctl/training/steps.py (training) and ctl/training/evaluation.py
(evaluation) call the task through these.

Metrics built inside `strategy.scope()` hold sync-on-read variables: each
replica updates its own copy and a read reduces them across replicas and
workers. A read is therefore a collective under MultiWorkerMirroredStrategy:
every worker must read at the same step (`MetricReader`, `WorkerSum`).
"""

from collections.abc import Callable, Mapping, Sequence
import inspect
import types
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ctl import errors
from ctl.cluster import distribution

# ctl's own tasks and Task's default hooks (not converted by AutoGraph).
_BUILT_IN_TASKS = ('ctl.builtin_tasks.', 'ctl.task')
# The key under which a step's log sums carry its number of examples.
EXAMPLES = '__examples__'


def task_function(function: Callable, autograph: bool) -> Callable:
  """A task's hook as ctl's (AutoGraph-less) tf.functions call it: with its
  Python control flow on tensors converted by AutoGraph, when asked."""
  # ctl's built-in tasks have no Python control flow on tensors: their
  # steps are traced as written, saving the conversion's start-up time.
  if not autograph or function.__module__.startswith(_BUILT_IN_TASKS):
    return function
  # A hook its author wrapped in @tf.function converts itself (its own
  # autograph argument) when ctl's function traces it.
  if isinstance(function, tf.types.experimental.PolymorphicFunction):
    return function
  if inspect.ismethod(function):  # to_graph converts the unbound function.
    return types.MethodType(tf.autograph.to_graph(function.__func__),
                            function.__self__)
  return tf.autograph.to_graph(function)


def call_step(step: Callable, batch: Any, ctx, hook: str):
  """Calls a task's step; an error from a batch it cannot take is explained.

  Raises:
    CtlError: when the step fails on the batch's structure (TypeError,
      ValueError, KeyError, IndexError while tracing), naming the structure.
      Or Python control flow on a tensor without AutoGraph.
  """
  try:
    return step(batch, ctx)
  except tf.errors.OperatorNotAllowedInGraphError as error:
    raise errors.CtlError(
        f'The task\'s {hook} uses a tensor as a Python bool ({error}), and '
        'config.autograph=False traces it as written: set '
        'config.autograph=True, or use tf.cond.') from error
  except (TypeError, ValueError, KeyError, IndexError) as error:
    raise errors.CtlError(
        f'The task\'s {hook} failed on a batch of structure '
        f'{describe(batch)}: {type(error).__name__}: {error}. Make the data '
        f'hook return elements that {hook} unpacks as it expects.'
    ) from error


def describe(batch: Any) -> str:
  """A batch's structure: its nesting, each tensor's dtype and shape."""
  return str(tf.nest.map_structure(
      lambda tensor: f'{tensor.dtype.name}{list(tensor.shape)}', batch))


def weighted_logs(logs: Mapping[str, tf.Tensor], batch: Any,
                  hook: str) -> dict[str, tf.Tensor]:
  """{name: value * examples} and the examples, to average over replicas.

  With batch None, each replica counts as one example: a plain mean. A
  replica without data (the end of an eval pass) has 0 examples; its logs
  (the mean of nothing is NaN) then count for nothing.

  Raises:
    CtlError: when the logs are not a dict of scalars.
  """
  logs = check_logs(logs, hook, scalars_only=True)
  if batch is None:
    weighted = {name: tf.cast(value, tf.float32)
                for name, value in logs.items()}
    weighted[EXAMPLES] = tf.constant(1.0)
    return weighted
  examples = tf.cast(batch_size(batch), tf.float32)
  weighted = {EXAMPLES: examples}
  for name, value in logs.items():
    value = tf.cast(value, tf.float32)
    weighted[name] = tf.where(examples > 0, value * examples, 0.0)
  return weighted


def check_logs(logs, hook: str, scalars_only: bool) -> dict[str, tf.Tensor]:
  """The logs as a dict of tensors; raises CtlError naming the bad one."""
  if not isinstance(logs, Mapping):
    raise errors.CtlError(
        f'The task\'s {hook} returned {type(logs).__name__}; it must return a '
        "dict of scalar logs, e.g. {'loss': loss}.")
  checked = {}
  for name, value in logs.items():
    value = tf.convert_to_tensor(value)
    if scalars_only and value.shape.rank != 0:
      raise errors.CtlError(
          f'The task\'s {hook} returned log {name!r} of shape {value.shape}; '
          'logs must be scalars (reduce it, e.g. tf.reduce_mean).')
    checked[name] = value
  return checked


def batch_size(batch: Any) -> tf.Tensor:
  """The number of examples in a batch of any structure: its first
  component's rows."""
  first = tf.nest.flatten(batch, expand_composites=False)[0]
  if isinstance(first, tf.RaggedTensor):
    return first.nrows()
  if isinstance(first, tf.SparseTensor):
    return first.dense_shape[0]
  return tf.shape(first)[0]


class MetricReader:
  """Reads and resets a list of Keras metrics in one tf.function call each."""

  def __init__(self, metrics: Sequence[keras.metrics.Metric]):
    self._metrics = list(metrics)
    names = [metric.name for metric in self._metrics]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
      raise ValueError(f'Metrics share the names {sorted(duplicates)}: give '
                       'each a distinct name=.')

  def read(self) -> dict[str, float | np.ndarray]:
    """{name: result}: floats for scalars, arrays for the rest."""
    if not self._metrics:
      return {}
    return as_python(self._read())

  def read_and_reset(self) -> dict[str, float | np.ndarray]:
    """read(), then reset(), in one tf.function call."""
    if not self._metrics:
      return {}
    return as_python(self._read_and_reset())

  def reset(self) -> None:
    if self._metrics:
      self._reset()

  def _results(self) -> dict[str, tf.Tensor]:
    results = {}
    for metric in self._metrics:
      result = metric.result()
      # A metric holding others (Keras's compiled metrics) gives a dict.
      results.update(result if isinstance(result, dict) else
                     {metric.name: result})
    return results

  def _reset_all(self) -> None:
    for metric in self._metrics:
      metric.reset_state()

  # One tf.function call each: an eager op per metric would cost a dispatch
  # on the training thread.
  @tf.function(autograph=False)
  def _read(self):
    return self._results()

  @tf.function(autograph=False)
  def _reset(self):
    self._reset_all()

  @tf.function(autograph=False)
  def _read_and_reset(self):
    return self.read_and_reset_in_graph()

  def read_and_reset_in_graph(self) -> dict[str, tf.Tensor]:
    """read_and_reset's ops, in the tf.function being traced (the training
    loop's, at the end of a loop after which a report is due)."""
    results = self._results()
    with tf.control_dependencies(tf.nest.flatten(results)):
      self._reset_all()
    return results


def as_python(results) -> dict[str, float | np.ndarray]:
  return {name: (float(value) if value.shape.rank == 0 else value.numpy())
          for name, value in results.items()}


class WorkerSum:
  """Sums a vector that each worker holds over every worker; one traced
  function, reused."""

  def __init__(self, strategy: tf.distribute.Strategy):
    self._strategy = strategy
    self._one_worker = (strategy.num_replicas_in_sync ==
                        distribution.local_replicas(strategy))
    self._local_replicas = distribution.local_replicas(strategy)

  def __call__(self, local: np.ndarray) -> np.ndarray:
    if self._one_worker:
      return local
    return self._total(tf.constant(local / self._local_replicas,
                                   tf.float64)).numpy()

  @tf.function(autograph=False)
  def _total(self, value):
    return self._strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        self._strategy.run(lambda: tf.identity(value)), axis=None)
