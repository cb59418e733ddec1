"""Tasks: the built-in ones, and finding a user's by name."""

from ctl import errors
from ctl import config_checks
from ctl import task as task_lib
from ctl import task_hooks

# Each imported only when a config names it: the default run
# (classification) imports no TFRecord, TFDS or Keras-model task code.
_BUILT_IN = {
    'classification': 'ctl.builtin_tasks.classification:Classification',
    'keras_model': 'ctl.builtin_tasks.keras_model:KerasModelTask',
    'tfrecord_classification':
        'ctl.builtin_tasks.tfrecord_classification:TFRecordClassification',
    'tfds_classification':
        'ctl.builtin_tasks.tfds_classification:TFDSClassification',
}


def resolve(name: str) -> type[task_lib.Task]:
  """The task class named by config.task, checked to have every hook, each
  of a signature ctl can call (an old one warned of: ctl/task_hooks.py).

  Raises:
    ConfigError: when it cannot be imported, is not a ctl.Task, lacks a
      hook, or has one ctl cannot call.
  """
  task_class = config_checks.resolve_builder(name, _BUILT_IN, 'task')
  if not (isinstance(task_class, type) and
          issubclass(task_class, task_lib.Task)):
    raise errors.ConfigError(
        f'config.task={name!r} is not a subclass of ctl.Task: write '
        f'`class {getattr(task_class, "__name__", "MyTask")}(ctl.Task)`.')
  missing = _missing_hooks(task_class)
  if missing:
    raise errors.ConfigError(
        f'Task {name!r} lacks {", ".join(missing)}: write '
        f'{"it" if len(missing) == 1 else "them"} as a method of '
        f'{task_class.__name__} (see ctl/task.py).')
  task_hooks.check(task_class)
  return task_class


_REQUIRED_HOOKS = ('build', 'train_data', 'train_step')


def _missing_hooks(task_class: type) -> list[str]:
  """The hooks a task class must write but does not."""
  missing = [hook for hook in _REQUIRED_HOOKS
             if getattr(task_class, hook) is getattr(task_lib.Task, hook)]
  if (task_class.eval_data is not task_lib.Task.eval_data and
      task_class.eval_step is task_lib.Task.eval_step):
    missing.append('eval_step (it has eval_data)')
  return missing
