"""EMA weights for evaluation and serving, as Keras's SwapEMAWeights does.

A Keras optimizer built with `use_ema=True` keeps a moving average of the
variables it trains. Checkpoints always hold the training (raw) weights
in the model and the averages in the optimizer. In-loop evaluation swaps
the averages in and back out (`EmaWeights.swapped`), exactly (an
exchange, not Keras's sums and differences, which round): training
resumes on the raw weights, bit for bit. A task restored to evaluate or
serve (the side-car, export, `ctl.load`: `Assembled.restore`) gets the
averages in its models for good (`EmaWeights.swap`).
"""

import contextlib

import keras
import tensorflow as tf

from ctl import task as task_lib


class EmaWeights:
  """Swaps a task's trained variables with their moving averages."""

  def __init__(self, task: task_lib.Task, strategy: tf.distribute.Strategy):
    self._strategy = strategy
    self._pairs = _pairs(task)
    self._swap = tf.function(self._swap_all, autograph=False)

  def swap(self) -> None:
    """Exchanges the variables with their averages (again: back)."""
    if self._pairs:
      with self._strategy.scope():
        self._swap()

  @contextlib.contextmanager
  def swapped(self):
    """Within it, the task's models hold the averages."""
    self.swap()
    try:
      yield
    finally:
      self.swap()

  def _swap_all(self) -> None:
    for variable, average in self._pairs:
      self._strategy.extended.update(variable, _exchange, args=(average,))


def _exchange(variable: tf.Variable, average: tf.Variable) -> None:
  old = tf.identity(variable)
  variable.assign(average)
  average.assign(old)


def _pairs(task: task_lib.Task) -> list[tuple[tf.Variable, tf.Variable]]:
  """(trained variable, its average) of every optimizer that keeps an EMA."""
  pairs, seen = [], set()
  for value in task_lib.attribute_values(task):
    if (not isinstance(value, keras.optimizers.Optimizer) or
        id(value) in seen):
      continue
    seen.add(id(value))
    value = getattr(value, 'inner_optimizer', value)  # LossScaleOptimizer.
    averages = getattr(value, '_model_variables_moving_average', None)
    if not value.use_ema or not averages:
      continue
    trained = value._trainable_variables  # pylint: disable=protected-access
    for variable, average in zip(trained, averages):
      pairs.append((_tf_variable(variable), _tf_variable(average)))
  return pairs


def _tf_variable(variable):
  return variable.value if isinstance(variable, keras.Variable) else variable
