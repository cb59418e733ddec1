"""ctl's model builders' parts."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from ctl.builtin_tasks import classification


@pytest.mark.parametrize('shape', [(3, 3, 1, 32), (21632, 128)],
                         ids=['one_sum', 'in_parts'])
def test_l2_is_keras_l2_with_the_same_gradient(shape):
  # (21632, 128) is the CNN's dense kernel on 28x28 images: summed in parts.
  kernel = tf.Variable(np.random.default_rng(0).normal(size=shape),
                       dtype=tf.float32)
  values = {}
  for name, regularizer in (('keras', keras.regularizers.L2(1e-3)),
                            ('ctl', classification.L2(1e-3))):
    for jit_compile in (False, True):
      @tf.function(jit_compile=jit_compile)
      def penalty_and_gradient(regularizer=regularizer):
        with tf.GradientTape() as tape:
          penalty = regularizer(kernel)
        return penalty, tape.gradient(penalty, kernel)
      values[name, jit_compile] = penalty_and_gradient()
  for jit_compile in (False, True):
    keras_penalty, keras_gradient = values['keras', jit_compile]
    ctl_penalty, ctl_gradient = values['ctl', jit_compile]
    np.testing.assert_allclose(ctl_penalty, keras_penalty, rtol=1e-6)
    np.testing.assert_array_equal(ctl_gradient, keras_gradient)


def test_l2_saves_and_loads_with_the_model(tmp_path):
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
      2, kernel_regularizer=classification.L2(0.25))])
  model.save(tmp_path / 'model.keras')
  loaded = keras.saving.load_model(tmp_path / 'model.keras')
  regularizer = loaded.layers[0].kernel_regularizer
  assert isinstance(regularizer, classification.L2) and regularizer.l2 == 0.25
