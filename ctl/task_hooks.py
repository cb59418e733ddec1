"""The task class a config names (`config.task`), found and checked: a
built-in one (ctl/builtin_tasks/) or a user's `package.module:Class`
(`resolve`); and the hooks ctl calls on a task, each with the arguments it
passes, checked when the class is found, before anything is written.

A hook whose signature changed keeps its old form for one release, with a
warning naming the new one (ctl calls it the old way); any other hook that
cannot take ctl's arguments stops the run at start (exit 2), naming the
signature ctl calls and the release that gave it. CHANGELOG.md says which
changed when.
"""

from collections.abc import Callable, Mapping
import dataclasses
import inspect
from typing import Any

from ctl import config_checks
from ctl import errors
from ctl import task as task_lib


# A form of ctl's API that still works (ctl/errors.py).
CtlDeprecationWarning = errors.CtlDeprecationWarning


@dataclasses.dataclass(frozen=True)
class Hook:
  """What ctl passes to a hook, positionally after self."""

  args: tuple[str, ...] = ()
  since: str = '0.1.0'  # The release that gave the hook these args.
  # The form before `since`, still called (without the new arguments) until
  # the release `removed_in`.
  old_args: tuple[str, ...] | None = None
  old_since: str = ''
  removed_in: str = ''


HOOKS = {
    'build': Hook(),
    'train_data': Hook(('context',)),
    'train_steps_per_epoch': Hook(),
    'eval_data': Hook(('context',)),
    'train_step': Hook(('batch', 'ctx')),
    'eval_step': Hook(('batch', 'ctx')),
    'eval_end': Hook(('name', 'outputs', 'results'), since='0.2.0',
                     old_args=('name', 'outputs'), old_since='0.1.0',
                     removed_in='0.3.0'),
    'loop_logs': Hook(),
    'actions': Hook(since='0.2.0'),
    'metric_writers': Hook(since='0.3.0'),
    'serving_signature': Hook(),
    'models': Hook(),
}

CURRENT, OLD = 'current', 'old'


# Each imported only when a config names it: the default run
# (classification) imports no TFRecord, TFDS or Keras-model task code.
BUILT_IN = {
    'classification': 'ctl.builtin_tasks.classification:Classification',
    'keras_model': 'ctl.builtin_tasks.keras_model:KerasModelTask',
    'tfrecord_classification':
        'ctl.builtin_tasks.tfrecord_classification:TFRecordClassification',
    'tfds_classification':
        'ctl.builtin_tasks.tfds_classification:TFDSClassification',
}


def resolve(name: str) -> type[task_lib.Task]:
  """The task class named by config.task, checked to have every hook, each
  of a signature ctl can call (an old one warned of).

  Raises:
    ConfigError: when it cannot be imported, is not a ctl.Task, lacks a
      hook, or has one ctl cannot call.
  """
  task_class = config_checks.resolve_builder(name, BUILT_IN, 'task')
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
  check(task_class)
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


def check(task_class: type) -> None:
  """Checks every hook of task_class against what ctl passes it; warns
  (CtlDeprecationWarning) of each old form that still works.

  Raises:
    ConfigError: naming each hook that cannot take ctl's arguments and
      the signature to write.
  """
  refused = []
  for name, hook in HOOKS.items():
    form = accepted_form(task_class, name)
    if form is None:
      refused.append(_refusal(task_class, name, hook))
    elif form == OLD:
      _warn(task_class, name, hook)
  if refused:
    raise errors.ConfigError(' '.join(refused) + ' (CHANGELOG.md says what '
                             'changed in each release.)')


def accepted_form(task_class: type, name: str) -> str | None:
  """CURRENT when task_class's hook `name` takes what ctl passes (or cannot
  be inspected), OLD when only the old form's arguments, else None."""
  hook = HOOKS[name]
  signature, bound = _signature(task_class, name)
  if signature is None or _binds(signature, bound + len(hook.args)):
    return CURRENT
  if hook.old_args is not None and _binds(signature,
                                          bound + len(hook.old_args)):
    return OLD
  return None


def eval_end_of(task) -> Callable[[str, Mapping, Mapping], Mapping[str, Any]]:
  """task.eval_end as ctl calls it, (name, outputs, results): the 0.1.0
  form, eval_end(name, outputs), is called without the results, and only
  when there are per-example outputs (0.1.0 called it only then)."""
  if accepted_form(type(task), 'eval_end') == OLD:
    return lambda name, outputs, results: (
        task.eval_end(name, outputs) if outputs else {})
  return task.eval_end


def _signature(task_class: type, name: str
               ) -> tuple[inspect.Signature | None, int]:
  """The signature of the function behind the hook, and how many
  arguments Python binds before ctl's (1: self or cls); (None, 0) when it
  cannot be read (a builtin, an object of another kind)."""
  function, bound = _function(task_class, name)
  if function is None:
    return None, 0
  try:
    return inspect.signature(function), bound
  except (TypeError, ValueError):
    return None, 0


def _function(task_class: type, name: str) -> tuple[Any, int]:
  """The Python function behind the hook (None if it is not one) and the
  arguments Python binds before ctl's."""
  value = inspect.getattr_static(task_class, name)
  bound = 1
  if isinstance(value, staticmethod):
    value, bound = value.__func__, 0
  elif isinstance(value, classmethod):
    value = value.__func__
  # A method wrapped in tf.function: the Python function it traces.
  value = getattr(value, 'python_function', value)
  if not inspect.isfunction(inspect.unwrap(value)):
    return None, 0
  return value, bound


def _binds(signature: inspect.Signature, count: int) -> bool:
  """Whether the signature takes `count` positional arguments."""
  try:
    signature.bind(*[None] * count)
  except TypeError:
    return False
  return True


def _written(task_class: type, name: str) -> str:
  """The hook as its task writes it: 'MyTask.eval_end(self, name, outputs)'."""
  signature, _ = _signature(task_class, name)
  return f'{task_class.__name__}.{name}{signature}'


def _form(name: str, args: tuple[str, ...]) -> str:
  """'eval_end(self, name, outputs)'."""
  return f'{name}({", ".join(("self",) + args)})'


def _refusal(task_class: type, name: str, hook: Hook) -> str:
  """One sentence: the hook found, and the signature to write."""
  old = (f'; {_form(name, hook.old_args)} in ctl {hook.old_since}'
         if hook.old_args is not None else '')
  return (f'{_written(task_class, name)} cannot take what ctl passes: write '
          f'`def {_form(name, hook.args)}` (its form since ctl {hook.since}'
          f'{old}).')


def _warn(task_class: type, name: str, hook: Hook) -> None:
  """Warns once per process of an old form, at the hook's own line."""
  message = (
      f'{_written(task_class, name)} is the form of ctl {hook.old_since}: '
      f'write `def {_form(name, hook.args)}` (since ctl {hook.since}). ctl '
      f'calls the old form without {", ".join(hook.args[len(hook.old_args):])}'
      f' until ctl {hook.removed_in}, which refuses it.')
  code = inspect.unwrap(_function(task_class, name)[0]).__code__
  errors.warn_deprecated(message, code.co_filename, code.co_firstlineno,
                         task_class.__module__)
