"""The framework's checks of a built task, run by assembly after `build`.

A task's class is checked when it is found by name (its hooks:
ctl/builtin_tasks/__init__.py and ctl/task_hooks.py); these check what
`build` made of it, before anything is written.
"""

import keras
import ml_collections

from ctl import errors
from ctl import task as task_lib


# What a task sets that Task declares too: everything else Task (and
# tf.Module) defines is what ctl calls or reads, and must not be shadowed.
SETTABLE = ('train_metrics', 'eval_metrics', 'auto_xla')


def check_nothing_shadowed(task: task_lib.Task,
                           config: ml_collections.ConfigDict) -> None:
  """Fails if the task set an attribute that hides what ctl reads of it.

  `self.models = [...]` in build would hide `Task.models()`, which ctl
  calls to find the models to checkpoint; `self.config = ...` the config
  ctl gave it.

  Raises:
    CtlError: naming the attributes and what they hide.
  """
  hidden = sorted(name for name in task_lib.own_attribute_names(task)
                  if not name.startswith('_') and name not in SETTABLE
                  and hasattr(task_lib.Task, name))
  if vars(task).get('config', config) is not config:
    hidden.append('config')
  if hidden:
    raise errors.CtlError(
        f'{type(task).__name__} sets attribute(s) {", ".join(hidden)}, which '
        'hide ctl.Task\'s own of that name (ctl reads them): rename them, '
        'e.g. self.model or self.networks instead of self.models.')


def check_no_keras_accumulation(task: task_lib.Task) -> None:
  """Fails if an optimizer accumulates gradients itself, which Keras 3
  cannot do on more than one replica (a merge_call inside a tf.cond).

  Raises:
    CtlError: saying to use config.accumulate_steps or ctx.accumulate.
  """
  for value in task_lib.attribute_values(task):
    inner = getattr(value, 'inner_optimizer', value)  # LossScaleOptimizer.
    if (isinstance(inner, keras.optimizers.Optimizer) and
        (inner.gradient_accumulation_steps or 0) > 1):
      raise errors.CtlError(
          f'An optimizer of {type(task).__name__} has gradient_accumulation'
          f'_steps={inner.gradient_accumulation_steps}, which Keras cannot '
          'run on more than one replica: leave it out, and set '
          'config.accumulate_steps (built-in tasks) or call ctx.accumulate '
          'in train_step.')
