"""Model builders: built-in ones and users' own, chosen by config.model.name.

A builder is `build(config, input_shape, num_classes) -> keras.Model`, taking
the `model` config section. Its model maps a batch of float32 features to
logits. Name your own as `--config.model.name=package.module:function`.
"""

import keras
import ml_collections
import tensorflow as tf

from ctl import config_checks


def build_model(config: ml_collections.ConfigDict,
                input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Builds the model named by config.name (the `model` config section).

  Its layers get config.dtype_policy (Keras's global policy is set while
  the builder runs, then restored).
  """
  builder = config_checks.resolve_builder(config.name, _BUILDERS, 'model')
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(config.dtype_policy)
  try:
    return builder(config, input_shape=input_shape, num_classes=num_classes)
  finally:
    keras.config.set_dtype_policy(previous)


def cnn(config: ml_collections.ConfigDict, *, input_shape: tuple[int, ...],
        num_classes: int) -> keras.Model:
  """The CNN of TensorFlow's multi-worker tutorials, for any image size.

  Conv2D(filters, 3x3, relu), Flatten, Dense(width, relu), Dense(classes),
  each kernel L2-regularised. Grey images of shape (height, width) get a
  channel axis first.
  """
  regularizer = L2(config.l2) if config.l2 else None
  image_shape = input_shape if len(input_shape) == 3 else (*input_shape, 1)
  return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Reshape(image_shape),
      keras.layers.Conv2D(config.filters, 3, activation='relu',
                          kernel_regularizer=regularizer),
      keras.layers.Flatten(),
      keras.layers.Dense(config.width, activation='relu',
                         kernel_regularizer=regularizer),
      keras.layers.Dropout(config.dropout),
      keras.layers.Dense(num_classes, kernel_regularizer=regularizer),
  ], name='cnn')


def mlp(config: ml_collections.ConfigDict, *, input_shape: tuple[int, ...],
        num_classes: int) -> keras.Model:
  """Flatten, then `depth` Dense(width, relu) layers, then Dense(classes)."""
  regularizer = L2(config.l2) if config.l2 else None
  hidden = [
      keras.layers.Dense(config.width, activation='relu',
                         kernel_regularizer=regularizer)
      for _ in range(config.depth)
  ]
  return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Flatten(),
      *hidden,
      keras.layers.Dropout(config.dropout),
      keras.layers.Dense(num_classes, kernel_regularizer=regularizer),
  ], name='mlp')


_BUILDERS = {'cnn': cnn, 'mlp': mlp}


@keras.saving.register_keras_serializable(package='ctl')
class L2(keras.regularizers.Regularizer):
  """keras.regularizers.L2's penalty, l2 * sum(x ** 2), summed in parts.

  The training loss a step logs holds this sum of every kernel's squares.
  Compiled by XLA for a CPU, one reduction runs on one thread: 1.8 ms a
  step for the CNN's 11 MB dense kernel, about a sixth of its step. Summed
  as independent parts, XLA's CPU runtime reduces them side by side
  (0.7 ms; BENCHMARKS.md, "Compute-bound speed"). The gradient is
  Keras's, bit for bit; the penalty the same up to the order of the sum.
  """

  # Elements per part: kernels of fewer than two parts are summed whole.
  PART = 1 << 20

  def __init__(self, l2: float = 0.01):
    self.l2 = float(l2)

  def __call__(self, x):
    l2 = self.l2

    @tf.custom_gradient
    def penalty(x):
      flat = tf.reshape(x, [-1])
      size = flat.shape[0] or 0  # Kernels' shapes are known.
      parts = min(8, size // self.PART)
      if parts < 2:
        total = tf.reduce_sum(tf.square(flat))
      else:
        total = tf.add_n([tf.reduce_sum(tf.square(part))
                          for part in tf.split(flat, _cuts(size, parts))])

      def gradient(upstream):  # As the gradient of l2 * sum(square(x)).
        return (upstream * l2) * (2.0 * x)

      return l2 * total, gradient

    return penalty(tf.convert_to_tensor(x))

  def get_config(self):
    return {'l2': self.l2}


def _cuts(size: int, parts: int) -> list[int]:
  """size split into `parts` sizes that differ by at most one."""
  return [size // parts + (1 if index < size % parts else 0)
          for index in range(parts)]
