"""Model builders: built-in ones and users' own, chosen by config.model.name.

A builder is `build(config, input_shape, num_classes) -> keras.Model`, taking
the `model` config section. Its model maps a batch of float32 features to
logits. Name your own as `--config.model.name=package.module:function`.
"""

import keras
import ml_collections

from ctl import registry


def build_model(config: ml_collections.ConfigDict,
                input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Builds the model named by config.name (the `model` config section).

  Its layers get config.dtype_policy (Keras's global policy is set while
  the builder runs, then restored).
  """
  builder = registry.resolve(config.name, _BUILDERS, 'model')
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
  regularizer = keras.regularizers.L2(config.l2) if config.l2 else None
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
  regularizer = keras.regularizers.L2(config.l2) if config.l2 else None
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
