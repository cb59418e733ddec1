"""`ctl.load(workdir)`: a finished (or running) run's task, restored.

    run = ctl.load('/tmp/ctl/digits')           # the best checkpoint, else the latest
    run.model.predict(scaled_features)          # the Keras model(s) as trained
    run.serve(raw_features)                      # the exported signature's outputs

The task is rebuilt from the run's saved config (workdir/config.json) on
this process's devices, and the checkpoint restored into it.
"""

import dataclasses
import os

import keras
import ml_collections
import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl import task as task_lib
from ctl.checkpoints import contents as checkpoint_contents
from ctl.checkpoints import lookup
from ctl.cluster import distribution
from ctl.runtime import workdir as workdir_lib
from ctl.training import assemble as assemble_lib


@dataclasses.dataclass
class LoadedRun:
  """A run's task with a checkpoint restored into it."""

  config: ml_collections.ConfigDict
  task: task_lib.Task
  step: int
  checkpoint: str  # The checkpoint read (a path prefix).

  @property
  def models(self) -> dict[str, keras.Model]:
    """The task's Keras models by attribute name."""
    return checkpoint_contents.models_by_name(self.task)

  @property
  def model(self) -> keras.Model:
    """The task's model, when it has exactly one."""
    models = self.models
    if len(models) != 1:
      raise AttributeError(f'The task has {len(models)} models: use '
                           f'.models[name], one of {sorted(models)}.')
    return next(iter(models.values()))

  def serve(self, *inputs):
    """The task's serving signature (what an export serves) on raw inputs."""
    signature = self.task.serving_signature()
    if signature is None:
      raise errors.CtlError(
          f'Task {self.config.task!r} serves nothing: '
          f'{task_lib.missing_signature(self.task)}; or call its models.')
    return signature(*inputs)


def load(workdir: str, checkpoint: str = 'best') -> LoadedRun:
  """Rebuilds a run's task from its saved config and restores a checkpoint.

  Args:
    workdir: the run's workdir.
    checkpoint: 'best' (the best checkpoint, else the latest), 'latest', or
      a checkpoint path prefix.

  Raises:
    CtlError: the workdir has no config or no such checkpoint, or the
      checkpoint does not fit the task.
  """
  config = saved_config(workdir)
  path, _ = lookup.find(workdir, checkpoint)
  return restore(config, path)


def saved_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run was trained with (workdir/config.json)."""
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  saved = storage.read_json(path)
  if saved is None:
    raise errors.CtlError(f'{path} does not exist: {workdir} is not the '
                          'workdir of a ctl run.')
  return ml_collections.ConfigDict(saved)


def restore(config: ml_collections.ConfigDict, path: str,
            strategy: tf.distribute.Strategy | None = None) -> LoadedRun:
  """Builds config's task on this process's devices and restores `path`."""
  assembled = assemble_lib.assemble_locally(
      config, strategy or distribution.local_strategy(config.distribution))
  assembled.restore(path)
  return LoadedRun(config, assembled.task,
                   int(assembled.train_state.step.numpy()), path)
