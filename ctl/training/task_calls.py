"""How ctl calls a task's step hooks inside its tf.functions: converted
by AutoGraph when asked, their logs checked and weighted by examples.

ctl/training/steps.py (training) and ctl/training/evaluation.py
(evaluation) call the task through these.
"""

from collections.abc import Callable, Mapping
import inspect
import types
from typing import Any

import tensorflow as tf

from ctl import errors

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
