"""A user's own dataset, model and loss, named in configs as module:function."""

import keras
import numpy as np
import tensorflow as tf


def blobs(config):
  """Two Gaussian blobs in 4-D, returned the way Keras's loaders do."""
  del config
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, size=400)
  features = rng.normal(size=(400, 4)) + 3.0 * labels[:, None]
  return ((features[:320].astype(np.float32), labels[:320]),
          (features[320:].astype(np.float32), labels[320:]))


def linear(config, *, input_shape, num_classes):
  """A linear classifier; config.width is ignored."""
  del config
  return keras.Sequential([keras.Input(input_shape),
                           keras.layers.Dense(num_classes)])


def nan_loss(labels, logits):
  """A loss that is NaN from the first step: training diverges at once."""
  return tf.reduce_sum(logits, axis=-1) * np.nan + tf.cast(labels, tf.float32)


class _PythonRelu(keras.layers.Layer):
  """A ReLU run by the Python interpreter: an op XLA cannot compile."""

  def call(self, inputs):
    outputs = tf.py_function(tf.nn.relu, [inputs], inputs.dtype)
    outputs.set_shape(inputs.shape)
    return outputs


def not_xla(config, *, input_shape, num_classes):
  """A model with an op XLA cannot compile (tf.py_function)."""
  del config
  return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                           keras.layers.Dense(16), _PythonRelu(),
                           keras.layers.Dense(num_classes)])
