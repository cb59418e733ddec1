# my_project/parts.py
"""README's "Your own model, data and loss" of this release: `my_model`
and `my_data` as README writes them (its `...` filled with the digits, as
a user would fill it), and the `compiled_model` its "Keras models with
their own train_step" names without writing it."""
import keras
from sklearn.datasets import load_digits


def my_model(config, *, input_shape, num_classes):   # config: the `model` section
  return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                           keras.layers.Dense(num_classes)])


def my_data(config):                                  # config: the `data` section
  digits = load_digits()
  x, y = digits.images / 16, digits.target
  x_train, y_train, x_eval, y_eval = x[:1400], y[:1400], x[1400:], y[1400:]
  return (x_train, y_train), (x_eval, y_eval)         # NumPy arrays, as Keras's loaders return


def compiled_model(config, *, input_shape, num_classes):
  model = my_model(config, input_shape=input_shape, num_classes=num_classes)
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=['accuracy'])
  return model
