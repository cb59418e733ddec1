"""What XLA compiles: config.jit_compile, with 'auto' decided per task."""

import keras
import tensorflow as tf

from ctl import errors
from ctl import task as task_lib
from ctl.runtime import tf_internals

# Keras layers whose XLA CPU kernels run several times slower inside a
# compiled loop than in a compiled step (BENCHMARKS.md, levers).
_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
                 keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
                 keras.layers.Conv3DTranspose, keras.layers.DepthwiseConv1D,
                 keras.layers.DepthwiseConv2D, keras.layers.SeparableConv1D,
                 keras.layers.SeparableConv2D)


def resolve(setting: str, *, num_replicas: int, task: task_lib.Task,
            in_memory: bool) -> str:
  """'off', 'step' (each replica's step one program) or 'loop' (a whole loop).

  'auto' is 'off' for a task's own steps (they may hold ops XLA cannot
  compile, tf.summary among them), with several replicas, or with GPUs or
  TPUs (not measured here). For a task that allows it (`Task.auto_xla`, the
  built-in ones), on one CPU replica, from measurements (BENCHMARKS.md,
  levers): 'loop' over in-memory data, since one XLA program per loop
  removes the cost of dispatching each op; but 'step' for models with
  convolutions, which XLA runs several times slower inside a loop, and for
  tf.data input, whose iterator XLA cannot compile.

  Raises:
    ConfigError: for 'loop' or 'step' where they cannot work.
  """
  if setting in ('loop', 'step') and num_replicas > 1:
    raise errors.ConfigError(
        f'config.jit_compile={setting!r} needs a single replica; this job has '
        f"{num_replicas} (the step's all-reduce cannot be compiled on every "
        "device). Use 'off' or 'auto'.")
  if setting == 'loop' and not in_memory:
    raise errors.ConfigError(
        "config.jit_compile='loop' needs in-memory training data (ctl.InMemory"
        "): XLA cannot compile a tf.data iterator. Use 'step', 'off' or "
        "'auto'.")
  if setting != 'auto':
    return setting
  accelerators = [device for device in tf.config.list_physical_devices()
                  if device.device_type != 'CPU']
  if not task.auto_xla or num_replicas > 1 or accelerators:
    return 'off'
  layers = [layer for model in task.models()
            for layer in tf_internals.all_layers(model)]
  if not in_memory or any(isinstance(layer, _CONVOLUTIONS)
                          for layer in layers):
    return 'step'
  return 'loop'

