"""Tasks: the built-in ones, and finding a user's by name."""

from ctl import errors
from ctl import registry
from ctl import task as task_lib
from ctl import task_hooks
from ctl.builtin_tasks import classification
from ctl.builtin_tasks import keras_model
from ctl.builtin_tasks import tfds_classification
from ctl.builtin_tasks import tfrecord_classification

_BUILT_IN = {
    'classification': classification.Classification,
    'keras_model': keras_model.KerasModelTask,
    'tfrecord_classification': tfrecord_classification.TFRecordClassification,
    'tfds_classification': tfds_classification.TFDSClassification,
}


def resolve(name: str) -> type[task_lib.Task]:
  """The task class named by config.task, checked to have every hook, each
  of a signature ctl can call (an old one warned of: ctl/task_hooks.py).

  Raises:
    ConfigError: when it cannot be imported, is not a ctl.Task, lacks a
      hook, or has one ctl cannot call.
  """
  task_class = registry.resolve(name, _BUILT_IN, 'task')
  if not (isinstance(task_class, type) and
          issubclass(task_class, task_lib.Task)):
    raise errors.ConfigError(
        f'config.task={name!r} is not a subclass of ctl.Task: write '
        f'`class {getattr(task_class, "__name__", "MyTask")}(ctl.Task)`.')
  missing = task_lib.missing_hooks(task_class)
  if missing:
    raise errors.ConfigError(
        f'Task {name!r} lacks {", ".join(missing)}: write '
        f'{"it" if len(missing) == 1 else "them"} as a method of '
        f'{task_class.__name__} (see ctl/task.py).')
  task_hooks.check(task_class)
  return task_class
