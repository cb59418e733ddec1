"""Datasets held in memory as NumPy arrays: the built-in ones and users' own.

A dataset function takes the `data` config section and returns `Data` (or
Keras's `((x_train, y_train), (x_eval, y_eval))`). Name your own in the
config as `--config.data.name=package.module:function`. Nothing here touches
the network.
"""

import dataclasses
import importlib.util
import os
import zipfile

from absl import logging
import ml_collections
import numpy as np

from ctl import errors
from ctl import config_checks
from ctl import storage

# The train/eval split of datasets that ship without one is fixed, so that
# changing config.seed changes the training order but never the eval set.
_SPLIT_SEED = 0


@dataclasses.dataclass(frozen=True)
class Split:
  """Examples of one split: features[i] has label labels[i]."""

  features: np.ndarray
  labels: np.ndarray

  def __post_init__(self):
    if len(self.features) != len(self.labels):
      raise errors.CtlError(
          f'A split has {len(self.features)} feature rows but '
          f'{len(self.labels)} labels.')
    if not len(self.labels):
      raise errors.CtlError('A split has no examples.')

  def __len__(self) -> int:
    return len(self.labels)


@dataclasses.dataclass(frozen=True)
class Data:
  """A dataset's splits and what the model needs to know about them."""

  train: Split
  eval: Split
  num_classes: int
  # The input pipeline casts features to float32 and multiplies them by this,
  # so that images can stay uint8 in memory.
  feature_scale: float = 1.0

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.train.features.shape[1:])


def load(config: ml_collections.ConfigDict) -> Data:
  """Loads the dataset named by config.name (the `data` config section)."""
  loader = config_checks.resolve_builder(config.name, _LOADERS, 'dataset')
  return _as_data(loader(config), config.name)


def load_digits(config: ml_collections.ConfigDict) -> Data:
  """scikit-learn's 1,797 8x8 handwritten digits (values 0..16).

  Read from the file scikit-learn ships, as `sklearn.datasets.load_digits`
  reads it, without importing scikit-learn: that import takes over half a
  second, a tenth of the time to the first training step.
  """
  path = _digits_file()
  try:
    rows = np.loadtxt(path, delimiter=',', dtype=np.float32)
  except (OSError, ValueError) as error:
    raise errors.CtlError(
        f'Cannot read the digits that scikit-learn ships ({path}): '
        f'{error}. Reinstall scikit-learn.') from error
  images = rows[:, :-1].reshape(-1, 8, 8).astype(np.uint8)
  labels = rows[:, -1].astype(np.int32)
  order = np.random.default_rng(_SPLIT_SEED).permutation(len(labels))
  num_eval = int(round(len(labels) * config.eval_fraction))
  eval_rows, train_rows = order[:num_eval], order[num_eval:]
  return Data(
      train=Split(images[train_rows], labels[train_rows]),
      eval=Split(images[eval_rows], labels[eval_rows]),
      num_classes=10,
      feature_scale=1 / 16)


def load_mnist(config: ml_collections.ConfigDict) -> Data:
  """MNIST from the `mnist.npz` that `keras.datasets.mnist.load_data()` saves.

  Reads config.path, or else the file in Keras's cache
  (`$KERAS_HOME/datasets/mnist.npz`, `~/.keras/datasets/mnist.npz` by
  default). Unlike Keras's loader this never downloads: Keras re-downloads a
  cached file whose checksum differs, which fails without a network.
  """
  path = config.path or os.path.join(_keras_home(), 'datasets', 'mnist.npz')
  if not storage.exists(path):
    raise errors.CtlError(
        f'MNIST file not found: {path}. ctl never downloads at run time. On a '
        'machine with network access run `python -c "import keras; '
        'keras.datasets.mnist.load_data()"` to put it in the Keras cache, or '
        'pass --config.data.path=/path/to/mnist.npz.')
  try:
    with storage.open_binary(path) as file, np.load(
        file, allow_pickle=False) as arrays:
      train = Split(arrays['x_train'], arrays['y_train'].astype(np.int32))
      test = Split(arrays['x_test'], arrays['y_test'].astype(np.int32))
  except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
    raise errors.CtlError(
        f'{path} is not a readable MNIST file (an .npz with x_train, y_train, '
        f'x_test, y_test): {error}') from error
  return Data(train=train, eval=test, num_classes=10, feature_scale=1 / 255)


def load_mnist_standin(config: ml_collections.ConfigDict) -> Data:
  """Random images of MNIST's shapes and classes, for smoke runs offline."""
  del config
  logging.warning('data.name=mnist_standin: generated random images of '
                  "MNIST's shapes (28x28 uint8, 10 classes), NOT MNIST: a "
                  'smoke run of the pipeline, not of the model.')
  rng = np.random.default_rng(_SPLIT_SEED)

  def split(num_examples):
    return Split(rng.integers(0, 256, (num_examples, 28, 28), np.uint8),
                 rng.integers(0, 10, num_examples).astype(np.int32))

  return Data(train=split(2048), eval=split(512), num_classes=10,
              feature_scale=1 / 255)


_LOADERS = {'digits': load_digits, 'mnist': load_mnist,
            'mnist_standin': load_mnist_standin}


def _digits_file() -> str:
  """Where scikit-learn keeps its copy of the digits (found, not imported)."""
  spec = importlib.util.find_spec('sklearn')
  if spec is None or not spec.submodule_search_locations:
    raise errors.CtlError(
        'The digits dataset ships with scikit-learn, which is not installed: '
        'pip install scikit-learn.')
  return os.path.join(spec.submodule_search_locations[0], 'datasets', 'data',
                      'digits.csv.gz')


def _keras_home() -> str:
  """Keras's cache directory, found as Keras finds it."""
  return os.environ.get('KERAS_HOME',
                        os.path.join(os.path.expanduser('~'), '.keras'))


def _as_data(loaded, name: str) -> Data:
  """Accepts a Data, or Keras's ((x_train, y_train), (x_eval, y_eval))."""
  if isinstance(loaded, Data):
    data = loaded
  else:
    try:
      (x_train, y_train), (x_eval, y_eval) = loaded
    except (TypeError, ValueError) as error:
      raise errors.CtlError(
          f'Dataset {name!r} returned {type(loaded).__name__}; expected '
          'ctl.datasets.Data or ((x_train, y_train), (x_eval, y_eval)).'
      ) from error
    train = Split(np.asarray(x_train), np.asarray(y_train).astype(np.int32))
    eval_split = Split(np.asarray(x_eval), np.asarray(y_eval).astype(np.int32))
    data = Data(train=train, eval=eval_split,
                num_classes=int(max(train.labels.max(), eval_split.labels.max())) + 1)
  if data.train.features.shape[1:] != data.eval.features.shape[1:]:
    raise errors.CtlError(
        f'Dataset {name!r}: train features have shape '
        f'{data.train.features.shape[1:]} but eval features '
        f'{data.eval.features.shape[1:]}.')
  return data
