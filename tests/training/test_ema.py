"""An optimizer's moving average of the weights (use_ema): evaluation,
ctl.load and export use it; checkpoints and training keep the trained
weights, so a resumed run is bit-identical."""

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.training import run
import helpers

# A constant learning rate and a slow average: it lags well behind.
EMA = {'optimizer.ema_momentum': 0.99, 'optimizer.schedule': 'constant',
       'deterministic': True}


def _accuracy(model, data) -> float:
  images, labels = data.preprocess(data.arrays)
  predicted = np.argmax(model(images, training=False).numpy(), axis=-1)
  return float(np.mean(predicted == labels))


@pytest.mark.slow
def test_evaluation_uses_the_average_and_training_resumes_on_the_weights(
    tmp_path):
  whole = run.train_and_evaluate(helpers.digits(2, **EMA),
                                 str(tmp_path / 'whole'))
  # Stopped at the end of epoch 1, after its evaluation, then resumed.
  run.train_and_evaluate(helpers.digits(1, **EMA), str(tmp_path / 'resumed'))
  resumed = run.train_and_evaluate(helpers.digits(2, **EMA),
                                   str(tmp_path / 'resumed'))
  assert resumed['weights_sha256'] == whole['weights_sha256']

  # The checkpoint holds the trained weights in the model ...
  reader = tf.train.load_checkpoint(str(tmp_path / 'whole' / 'checkpoints' /
                                        'ckpt-88'))
  loaded = ctl.load(str(tmp_path / 'whole'), 'latest')
  optimizer = loaded.task.optimizer
  trained = [reader.get_tensor(
      f'task/optimizer/_trainable_variables/{index}/.ATTRIBUTES/'
      'VARIABLE_VALUE') for index in range(len(optimizer._trainable_variables))]  # pylint: disable=protected-access
  # ... and ctl.load (as export and the side-car) puts the averages in.
  for weight, average, trained_value in zip(
      loaded.model.trainable_variables,
      optimizer._model_variables_moving_average, trained):  # pylint: disable=protected-access
    assert np.array_equal(average.numpy(), trained_value)
    assert not np.array_equal(weight.numpy(), trained_value)
  eval_data = loaded.task.eval_data(tf.distribute.InputContext())
  with_average = _accuracy(loaded.model, eval_data)
  # The in-loop metric is a float32 mean of the same 359 examples.
  assert whole['eval']['accuracy'] == pytest.approx(with_average, abs=1e-6)
  for weight, trained_value in zip(loaded.model.trainable_variables,
                                   trained):
    weight.assign(trained_value)
  # At least one of the 359 examples is told apart otherwise.
  assert abs(_accuracy(loaded.model, eval_data) - with_average) > 1e-3
