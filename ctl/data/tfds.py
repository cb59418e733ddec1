"""Training and eval data from a dataset that TensorFlow Datasets prepared.

    builder = tfds.load_builder('mnist', '~/tensorflow_datasets')
    source = tfds.TFDSSource(builder, 'train', keys=('image', 'label'))
    dataset = source.train_dataset(context, per_replica_batch_size=16,
                                   seed=config.seed, decode=decode)

`tensorflow-datasets` is an optional extra (`pip install -e ".[tfds]"`),
imported only here, and only when a config asks for TFDS. ctl never
downloads: it reads a dataset that TFDS's `download_and_prepare` wrote to
a data directory, found by name as `tfds.builder` finds it there (no
builder class is needed: TFDS reads the directory's dataset_info.json),
or the prepared version directory itself.

The records are the prepared split's own TFRecord files, read by
ctl.data.tfrecord's pipeline (TFDSSource is a TFRecordSource): sharded by
file across workers, file order, record order and augmentation seeds drawn
per (seed, epoch) without state, so the data position ctl saves beside
each checkpoint resumes exactly. TFDS's own `as_dataset(shuffle_files=
True)` draws its orders from random state that a restored iterator does
not replay (TF_NOTES.md), so it is not used. Each record is parsed for the
features asked for only, and decoded by TFDS's own feature decoders (PNG
or JPEG images, class labels).
"""

from collections.abc import Sequence
import importlib
import json
import os
import shlex
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl.data import tfrecord
from ctl.data import tfrecord_files

# The command that installs the TFDS extra.
INSTALL = 'pip install -e ".[tfds]"'


def import_tfds() -> Any:
  """The tensorflow_datasets module, imported on first use only.

  Raises:
    CtlError: when it is not installed.
  """
  try:
    return importlib.import_module('tensorflow_datasets')
  except ImportError as error:
    raise errors.CtlError(
        'Reading a TFDS dataset needs tensorflow-datasets, which is not '
        f'installed ({error}): install the extra with `{INSTALL}` (or `pip '
        'install tensorflow-datasets`).') from error


def prepare_command(name: str, data_dir: str) -> str:
  """The command that prepares dataset `name` in data_dir (with network)."""
  # Double-quoted Python strings, so that the shell's quotes stay single.
  code = ('import tensorflow_datasets as tfds; '
          f'tfds.builder({json.dumps(name)}, data_dir={json.dumps(data_dir)})'
          '.download_and_prepare()')
  return f'python -c {shlex.quote(code)}'


def load_builder(name: str, data_dir: str) -> Any:
  """The prepared TFDS dataset, never downloaded.

  Args:
    name: as tfds.builder takes it: 'mnist', 'name/config', 'name:1.*.*'.
      Not used when data_dir is itself a prepared version directory.
    data_dir: the directory TFDS prepared datasets in (`~` expanded), or
      one dataset's prepared version directory (it holds
      dataset_info.json).

  Returns:
    The tfds.core.DatasetBuilder, prepared.

  Raises:
    CtlError: when tensorflow-datasets is missing, or the dataset is not
      prepared there; the message gives the command that prepares it.
  """
  tfds = import_tfds()
  data_dir = os.path.expanduser(data_dir)
  if name == STANDIN:
    return _prepared_standin(tfds, data_dir)
  if storage.exists(os.path.join(data_dir, 'dataset_info.json')):
    return tfds.builder_from_directory(data_dir)
  if not name:
    raise errors.ConfigError(
        f'{data_dir} is not a prepared TFDS directory (it has no '
        'dataset_info.json) and config.data.tfds.name is empty: name the '
        'dataset, or point config.data.tfds.data_dir at its prepared '
        'version directory.')
  prepare = (f'ctl never downloads: prepare it where the network is '
             f'reachable with `{prepare_command(name, data_dir)}` (then copy '
             f'{data_dir} here if that was another machine), or point '
             'config.data.tfds.data_dir at the directory that holds it.')
  if not storage.isdir(data_dir):
    raise errors.CtlError(
        f'The TFDS data directory {data_dir} does not exist, so dataset '
        f'{name!r} is not prepared there. {prepare}')
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    builder = None  # Neither in data_dir nor a builder class TFDS knows.
  except ValueError as error:  # A malformed name, an unknown config.
    raise errors.ConfigError(
        f'config.data.tfds.name={name!r}: {_first_line(error)}') from error
  if builder is None or not builder.is_prepared():
    raise errors.CtlError(
        f'TFDS dataset {name!r} is not prepared in {data_dir} (it holds '
        f'{sorted(storage.listdir(data_dir))[:10]}). {prepare}')
  return builder


# A dataset of MNIST's shapes that ctl prepares itself, offline: random
# images, for smoke runs of the TFDS path (configs/tfds_mnist.py:smoke).
STANDIN = 'ctl_mnist_standin'


def _prepared_standin(tfds: Any, data_dir: str) -> Any:
  """The stand-in dataset, prepared in data_dir the first time (offline)."""
  logging.warning('data.tfds.name=%s: generated random images of MNIST\'s '
                  'shapes (28x28 uint8, 10 classes), NOT MNIST: a smoke run '
                  'of the TFDS pipeline, not of the model.', STANDIN)
  version_dir = os.path.join(data_dir, STANDIN, '1.0.0')
  if storage.exists(os.path.join(version_dir, 'dataset_info.json')):
    return tfds.builder_from_directory(version_dir)

  def generate(num_examples: int, seed: int):
    rng = np.random.default_rng(seed)
    for index in range(num_examples):
      yield index, {'image': rng.integers(0, 256, (28, 28, 1), np.uint8),
                    'label': int(rng.integers(0, 10))}

  # Its class is made here: TFDS registers every builder class by name.
  builder_class = type('CtlMnistStandin', (tfds.core.GeneratorBasedBuilder,), {
      'VERSION': tfds.core.Version('1.0.0'),
      '_info': lambda self: tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({
              'image': tfds.features.Image(shape=(28, 28, 1)),
              'label': tfds.features.ClassLabel(num_classes=10)})),
      '_split_generators': lambda self, dl_manager: {
          'train': generate(2048, 0), 'test': generate(512, 1)},
      '_generate_examples': None,
  }, skip_registration=True)
  builder = builder_class(data_dir=data_dir)
  tfds.display_progress_bar(False)  # Bars of a few seconds' work.
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      num_shards=4, try_download_gcs=False))
  return tfds.builder_from_directory(builder.data_dir)


class TFDSSource(tfrecord.TFRecordSource):
  """A prepared TFDS split's TFRecord files, read by TFRecordSource.

  decode (train_dataset, eval_dataset) gets TFDS's decoded features
  {key: tensor} (images decoded, class labels int64) of the keys asked
  for.

  Args:
    builder: a prepared tfds.core.DatasetBuilder (load_builder).
    split: a split's name ('train', 'test'); not a slice ('train[:90%]').
    keys: the top-level features to read; the others are not parsed.

  Raises:
    CtlError: for a split or feature the dataset does not have, a feature
      of variable length, files not in TFRecord format or missing.
  """

  def __init__(self, builder: Any, split: str, keys: Sequence[str]):
    # Not TFRecordSource.__init__, which globs a pattern and counts the
    # records of files it has no counts for: TFDS counted the split's
    # records when it prepared them (its metadata), and a large dataset
    # would take minutes to read through at every start.
    info = builder.info
    self._features = {key: fixed_size_feature(info, key) for key in keys}
    self.pattern = f'{builder.data_dir} (split {split!r})'
    self.spec = {key: _parse_spec(key, feature)
                 for key, feature in self._features.items()}
    self.files, self.counts = _split_files(builder, split)
    tfrecord_files.check_spec(self.files[0], self.spec)
    if not sum(self.counts):
      raise errors.CtlError(f'{self.pattern} holds no records.')

  def decode_features(self, parsed: dict[str, tf.Tensor]
                      ) -> dict[str, tf.Tensor]:
    """TFDS's decoded features from a record parsed with self.spec."""
    decoded = {}
    for key, feature in self._features.items():
      value = parsed[key]
      dtype = feature.get_serialized_info().tf_dtype
      if value.dtype != dtype:  # Ints are stored as int64, floats float32.
        value = tf.cast(value, dtype)
      decoded[key] = feature.decode_example(value)
    return decoded

  def train_dataset(self, context: tf.distribute.InputContext, *,
                    decode: tfrecord.Decode, **kwargs) -> tf.data.Dataset:
    """TFRecordSource.train_dataset, decode given TFDS's features."""
    return super().train_dataset(context, decode=self._decoding(decode),
                                 **kwargs)

  def global_batches(self, *, decode: tfrecord.Decode,
                     **kwargs) -> tfrecord.GlobalBatches:
    """TFRecordSource.global_batches, decode given TFDS's features."""
    return super().global_batches(decode=self._decoding(decode), **kwargs)

  def eval_dataset(self, context: tf.distribute.InputContext, *,
                   decode: tfrecord.Decode, **kwargs) -> tf.data.Dataset:
    """TFRecordSource.eval_dataset, decode given TFDS's features."""
    return super().eval_dataset(context, decode=self._decoding(decode),
                                **kwargs)

  def _decoding(self, decode: tfrecord.Decode) -> tfrecord.Decode:
    return lambda parsed, seed: decode(self.decode_features(parsed), seed)


def fixed_size_feature(info: Any, key: str) -> Any:
  """The top-level feature `key`, checked to be one fixed-size tensor in a
  record.

  Args:
    info: the dataset's tfds.core.DatasetInfo.
    key: the feature's name.

  Raises:
    CtlError: for a missing key, or a feature stored as a sequence or a
      nest (ctl's parse spec has fixed shapes).
  """
  features = info.features
  if key not in features:
    raise errors.CtlError(
        f'TFDS dataset {info.full_name} has no feature {key!r}; it has '
        f'{sorted(features.keys())}. Correct the key in the config.')
  feature = features[key]
  stored = feature.get_serialized_info()
  if isinstance(stored, dict) or None in tuple(stored.shape):
    raise errors.CtlError(
        f'Feature {key!r} of TFDS dataset {info.full_name} (a '
        f'{type(feature).__name__}) has '
        'no fixed size in its records (a sequence or a nest of features): '
        'ctl reads fixed-size features only; read it in a task of your own '
        'with TFDS\'s as_dataset.')
  return feature


def _parse_spec(key: str, feature: Any) -> tf.io.FixedLenFeature:
  """How a record stores the feature: int64, float32 or bytes, flattened."""
  stored = feature.get_serialized_info()
  dtype = stored.tf_dtype
  if dtype.is_integer or dtype.is_bool:
    dtype = tf.int64
  elif dtype.is_floating:
    dtype = tf.float32
  elif dtype != tf.string:
    raise errors.CtlError(
        f'Feature {key!r} is stored as {dtype.name}, which a '
        'tf.train.Example cannot hold.')
  return tf.io.FixedLenFeature(list(stored.shape), dtype)


def _split_files(builder: Any, split: str) -> tuple[list[str], list[int]]:
  """A split's files, sorted, and how many records each holds (TFDS's
  metadata).

  Raises:
    CtlError: for an unknown split, a format other than TFRecord, or a
      file listed but missing.
  """
  info = builder.info
  if split not in info.splits.keys():
    raise errors.CtlError(
        f'TFDS dataset {info.full_name} has no split {split!r}; it has '
        f'{sorted(info.splits.keys())}. Name one of them (slices such as '
        '"train[:90%]" are not read: each worker reads whole files).')
  file_format = getattr(info.file_format, 'value', info.file_format)
  if file_format != 'tfrecord':
    raise errors.CtlError(
        f'TFDS dataset {info.full_name} was prepared as {file_format} '
        'files; ctl reads TFRecord files: prepare it again with '
        "download_and_prepare(file_format='tfrecord').")
  split_info = info.splits[split]
  shards = sorted(zip((os.fspath(path) for path in split_info.filepaths),
                      split_info.shard_lengths))
  missing = [path for path, _ in shards if not storage.exists(path)]
  if missing:
    raise errors.CtlError(
        f'{len(missing)} file(s) of TFDS dataset {info.full_name}, split '
        f'{split!r}, are missing, e.g. {missing[0]}: prepare the dataset '
        'again, or copy the whole prepared directory.')
  return [path for path, _ in shards], [count for _, count in shards]


def _first_line(error: Exception) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0]
