"""What a checkpoint holds: the task (models, optimizers, metrics), random
layers' states, the step and epoch, the actions' states; and a warm start
that reads only the models' weights from another run."""

from collections.abc import Sequence
import os
import re

from absl import logging
import keras
import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl import task as task_lib


def checkpoint_of(task: task_lib.Task, state,
                  **more: tf.Variable) -> tf.train.Checkpoint:
  """Everything a run needs to continue exactly where it stopped.

  Keras 3 keeps the state of random layers (Dropout's seed generator) in
  variables that tf.train.Checkpoint does not find through a model; they
  are added explicitly so that a resumed run draws the same random numbers.
  `more`: other variables to save, by name (the actions' states).
  """
  return tf.train.Checkpoint(task=task, rng=_rng_states(task),
                             **state.checkpointable(), **more)


# What a checkpoint holds since ctl 0.2.0 that one of 0.1.0 lacks: read
# from such a checkpoint, they keep their initial values (0 workers: not
# known; no action has a state yet).
SINCE_0_2_0 = ('num_workers', 'actions')
# And what one written before 0.2.0 lacks: read from it, they keep their initial values
# (0 partitions: the global order before 0.2.0, ctl/training/state.py).
AFTER_0_2_0 = ('data_partitions',)


def readable_part(checkpoint: tf.train.Checkpoint,
                  path: str) -> tf.train.Checkpoint:
  """checkpoint, less its parts of SINCE_0_2_0 and AFTER_0_2_0 that
  checkpoint `path` lacks (an earlier ctl wrote it), so that reading it
  checks everything else."""
  saved = _saved_parts(path)
  parts = {name: value for name, value in vars(checkpoint).items()
           if not name.startswith('_')}  # The constructor's keywords.
  absent = [name for name in SINCE_0_2_0 + AFTER_0_2_0 if name in parts and
            name not in saved]
  if not absent:
    return checkpoint
  return tf.train.Checkpoint(**{name: value for name, value in parts.items()
                                if name not in absent})


def written_by_0_1_0(path: str) -> bool:
  """Whether ctl 0.1.0 wrote checkpoint `path` (it lacks SINCE_0_2_0);
  False when there is none."""
  return (storage.exists(f'{path}.index') and
          not set(SINCE_0_2_0) & _saved_parts(path))


def _saved_parts(path: str) -> set[str]:
  """The names of the parts checkpoint `path` holds (task, step, ...)."""
  return {name.split('/', 1)[0] for name, _ in tf.train.list_variables(path)}


def weights_checkpoint(task: task_lib.Task) -> tf.train.Checkpoint:
  """The part of checkpoint_of that is the task's: models, optimizers,
  metrics and random layers' states, not the step (for a rollback)."""
  return tf.train.Checkpoint(task=task, rng=_rng_states(task))


def _rng_states(task: task_lib.Task) -> list[tf.Variable]:
  rng_states = []
  for model in task.models():
    weights = {id(weight) for weight in model.weights}
    rng_states += [v for v in model.variables if id(v) not in weights]
  return rng_states


def models_by_name(task: task_lib.Task) -> dict[str, keras.Model]:
  """The task's Keras models by attribute name (for a warm start)."""
  return {name: value for name, value in vars(task).items()
          if isinstance(value, keras.Model)}


def warm_start(task: task_lib.Task, source: str,
               select: Sequence[str] = ()) -> str:
  """Loads model weights (nothing else) from a checkpoint or a workdir.

  Args:
    task: the freshly built task; its Keras models are named by attribute,
      as the source's task named them.
    source: a checkpoint path prefix, a checkpoint directory, or a workdir.
    select: attribute paths from the task of what to restore, each whole
      ('backbone', 'model.backbone'); () restores every model.

  Returns:
    The checkpoint path read.

  Raises:
    CtlError: no checkpoint is found, a checkpoint state file is not
      text, or something selected does not fit
      (a variable missing from the checkpoint, or of another shape).
    ConfigError: a selected path names nothing trackable of the task.
  """
  try:
    path = _checkpoint_path(source)
  except UnicodeError as error:  # TensorFlow's, reading a binary state file.
    raise errors.CtlError(
        f'Cannot warm-start from config.init_from={source!r}: a checkpoint '
        f'state file there ("checkpoint") is not a text file '
        f'({errors.summary(error, 200)}). Point init_from at a checkpoint '
        'path prefix (.../checkpoints/ckpt-N) or a workdir whose '
        'checkpoints are whole.') from error
  selected = ({name: _attribute(task, name) for name in select} if select
              else models_by_name(task))
  for name, value in selected.items():  # One by one: an error names it.
    root = tf.Module()
    _attach(root, name.split('.'), value)
    try:
      status = tf.train.Checkpoint(task=root).read(path)
      status.expect_partial().assert_existing_objects_matched()
    except Exception as error:  # pylint: disable=broad-except
      raise errors.CtlError(
          f'Cannot warm-start {name!r} from config.init_from={source!r} '
          f'({path}): {_mismatch(error)}.'
          f'{"" if select else _select_advice(name, selected)}') from error
  left = sorted(name for name, model in models_by_name(task).items()
                if not any(_contains(value, model) for value in
                           selected.values()))
  logging.info('Warm start from %s: restored %s (%d variables)%s', path,
               ', '.join(sorted(selected)),
               sum(len(_variables(value)) for value in selected.values()),
               f'; left as initialised: {", ".join(left)}' if left else '')
  return path


def _mismatch(error: Exception) -> str:
  """What did not fit, by variable name: never the variables' values
  (TensorFlow's message on unmatched objects prints them all)."""
  unmatched = re.findall(r"<tf\.Variable '([^']+)'|<Variable path=([^,]+),",
                         str(error))
  unmatched = [tf_name or keras_path for tf_name, keras_path in unmatched]
  if unmatched:
    shown = ', '.join(unmatched[:6]) + (', ...' if len(unmatched) > 6 else '')
    return (f'the checkpoint has no values for {len(unmatched)} of its '
            f'variables ({shown})')
  return errors.summary(re.sub(r'numpy=array\(.*?\)(?=>)', 'numpy=...',
                               str(error), flags=re.DOTALL)).rstrip('.')


def _select_advice(name: str, models: dict) -> str:
  """How to leave what does not fit (a new head) out of a warm start."""
  others = [other for other in sorted(models) if other != name]
  example = ','.join(others) if others else f'{name}.<part>'
  return (' Every model is restored unless config.init_select names what to '
          f'restore: to leave {name!r} as initialised (a new head), '
          f'--config.init_select={example} (the task\'s models: '
          f'{", ".join(sorted(models))}).')


def _checkpoint_path(source: str) -> str:
  for directory in (source, os.path.join(source, 'checkpoints')):
    if storage.isdir(directory) and tf.train.latest_checkpoint(directory):
      return tf.train.latest_checkpoint(directory)
  return source


def _attribute(task: task_lib.Task, dotted: str):
  """The object at a dotted attribute path from the task."""
  value = task
  for part in dotted.split('.'):
    value = getattr(value, part, None)
    if not isinstance(value, (keras.layers.Layer, tf.Module, tf.Variable)):
      raise errors.ConfigError(
          f'config.init_select names {dotted!r}, but the task has no '
          f'trackable (a Keras model, layer or variable) at {part!r}. The '
          f'task\'s models: {sorted(models_by_name(task))}.')
  return value


def _attach(root: tf.Module, path: list[str], value) -> None:
  """Sets value at root.path[0].path[1]..., making the parents as needed,
  so that the checkpoint finds it by the same attribute names."""
  for part in path[:-1]:
    if not hasattr(root, part):
      setattr(root, part, tf.Module())
    root = getattr(root, part)
  setattr(root, path[-1], value)


def _variables(value) -> list:
  return list(getattr(value, 'variables', None) or [value])


def _contains(value, model) -> bool:
  """Whether model is value, or all of model's variables are value's."""
  inside = {id(variable) for variable in _variables(value)}
  return value is model or all(id(variable) in inside
                               for variable in model.variables)
