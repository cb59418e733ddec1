"""What a checkpoint holds: the task (models, optimizers, metrics), random
layers' states, the step and epoch, the actions' states; and a warm start
that reads only the models' weights from another run."""

import os

from absl import logging
import keras
import tensorflow as tf

from ctl import errors
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


def warm_start(models: dict[str, keras.Model], source: str) -> str:
  """Loads model weights (nothing else) from a checkpoint or a workdir.

  Args:
    models: the task's freshly built Keras models by attribute name, as the
      source's task named them.
    source: a checkpoint path prefix, a checkpoint directory, or a workdir.

  Returns:
    The checkpoint path read.

  Raises:
    CtlError: when no checkpoint is found or it does not fit the models.
  """
  path = source
  for directory in (source, os.path.join(source, 'checkpoints')):
    if tf.io.gfile.isdir(directory) and tf.train.latest_checkpoint(directory):
      path = tf.train.latest_checkpoint(directory)
      break
  holder = tf.Module()
  for name, model in models.items():
    setattr(holder, name, model)
  try:
    status = tf.train.Checkpoint(task=holder).read(path)
    status.expect_partial().assert_existing_objects_matched()
  except Exception as error:  # pylint: disable=broad-except
    raise errors.CtlError(
        f'Cannot warm-start from config.init_from={source!r}: '
        f'{errors.summary(error)}') from error
  logging.info('Warm start: model weights from %s', path)
  return path
