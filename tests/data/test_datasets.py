"""Built-in datasets load offline; bad files and names give clear errors."""

import hashlib

import numpy as np
import pytest

from ctl import config as config_lib
from ctl.data import datasets
from ctl import errors


def _data_config(**fields):
  config = config_lib.classification_config().data
  config.update(fields)
  return config


def _write_mnist(path, num_train=30, num_test=10):
  rng = np.random.default_rng(0)
  np.savez(path,
           x_train=rng.integers(0, 256, (num_train, 28, 28), dtype=np.uint8),
           y_train=rng.integers(0, 10, num_train, dtype=np.uint8),
           x_test=rng.integers(0, 256, (num_test, 28, 28), dtype=np.uint8),
           y_test=rng.integers(0, 10, num_test, dtype=np.uint8))


def test_digits_split_is_fixed_and_complete():
  data = datasets.load(_data_config(name='digits'))
  assert (len(data.train), len(data.eval)) == (1438, 359)
  assert data.input_shape == (8, 8) and data.num_classes == 10
  assert data.train.features.max() * data.feature_scale == 1.0
  again = datasets.load(_data_config(name='digits'))
  np.testing.assert_array_equal(data.eval.labels, again.eval.labels)
  np.testing.assert_array_equal(data.eval.features, again.eval.features)


# sklearn.datasets.load_digits()'s data (float64) and target (int64), each
# sorted by the images' pixels, as SHA-256 (scikit-learn 1.x): importing
# scikit-learn itself takes up to a minute on a fresh install.
SKLEARN_DIGITS_SHA256 = (
    'ea9d2d904607684e083c110234a6894d8cf3869543462e28eee779d04f5a6844',
    '2351ad3fc0bc43adb7aafa5ba98665423160dd5c231e9da7ab00850d21d32c09')


def test_digits_are_scikit_learns_digits():
  data = datasets.load(_data_config(name='digits'))
  features = np.concatenate([data.train.features, data.eval.features])
  features = features.reshape(len(features), -1).astype(np.float64)
  labels = np.concatenate([data.train.labels, data.eval.labels])
  # The same examples, in the split's order.
  order = np.lexsort(features.T[::-1])
  assert (_sha256(features[order]), _sha256(labels[order].astype(np.int64))
          ) == SKLEARN_DIGITS_SHA256


def _sha256(array: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def test_mnist_reads_the_file_in_the_keras_cache(tmp_path, monkeypatch):
  (tmp_path / 'datasets').mkdir()
  _write_mnist(tmp_path / 'datasets' / 'mnist.npz')
  monkeypatch.setenv('KERAS_HOME', str(tmp_path))
  data = datasets.load(_data_config(name='mnist'))
  assert (len(data.train), len(data.eval)) == (30, 10)
  assert data.input_shape == (28, 28) and data.feature_scale == 1 / 255
  assert data.train.labels.dtype == np.int32


def test_mnist_reads_an_explicit_path(tmp_path):
  _write_mnist(tmp_path / 'my.npz', num_train=12)
  data = datasets.load(_data_config(name='mnist', path=str(tmp_path / 'my.npz')))
  assert len(data.train) == 12


def test_missing_mnist_says_where_it_looked_and_what_to_do(tmp_path,
                                                          monkeypatch):
  monkeypatch.setenv('KERAS_HOME', str(tmp_path))
  with pytest.raises(errors.CtlError) as raised:
    datasets.load(_data_config(name='mnist'))
  message = str(raised.value)
  assert str(tmp_path / 'datasets' / 'mnist.npz') in message
  assert 'never downloads' in message and '--config.data.path' in message


@pytest.mark.parametrize('content', [b'not a zip file', None])
def test_unreadable_mnist_is_a_clear_error(tmp_path, content):
  path = tmp_path / 'mnist.npz'
  if content is None:
    np.savez(path, x_train=np.zeros((2, 28, 28)))  # No labels, no test split.
  else:
    path.write_bytes(content)
  with pytest.raises(errors.CtlError, match='not a readable MNIST file'):
    datasets.load(_data_config(name='mnist', path=str(path)))


def test_a_users_function_may_return_keras_style_tuples():
  data = datasets.load(_data_config(name='user_modules:blobs'))
  assert (len(data.train), len(data.eval)) == (320, 80)
  assert data.num_classes == 2 and data.input_shape == (4,)


@pytest.mark.parametrize('name, message', [
    ('imagenet', "Unknown dataset 'imagenet'"),
    ('no_such_module:load', "Cannot import module 'no_such_module'"),
    ('user_modules:no_such_function', "has no function 'no_such_function'"),
])
def test_unknown_dataset_names_are_config_errors(name, message):
  with pytest.raises(errors.ConfigError, match=message):
    datasets.load(_data_config(name=name))


def test_mismatched_split_is_an_error():
  with pytest.raises(errors.CtlError, match='3 feature rows but 2 labels'):
    datasets.Split(np.zeros((3, 2)), np.zeros(2))
