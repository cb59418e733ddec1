"""The built-in classifier, reading TFRecord shards instead of arrays.

`config.task = 'tfrecord_classification'` (configs/digits_tfrecord.py):
the model, loss, metrics, optimizer and steps are the classification
task's; the data are the shards in `config.data.tfrecord.dir`, as
`python -m ctl.data.write_tfrecords` writes them (features `image`, raw
uint8 bytes, and `label`, described by the directory's features.json).

Missing shards are written on first use from `config.data.name`, as TFDS
prepares a dataset: each worker that finds none writes its own copy beside
the directory and renames it into place, so workers starting together
never see half-written files and the first whole copy wins.

Batches stay uint8 in the pipeline (a small saved position) and are
scaled to floats in the step. Augmentation: a random shift of up to
`data.tfrecord.shift` pixels, from stateless seeds, so a resumed run sees
the same shifted images.
"""

import dataclasses
import os

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl import task as task_lib
from ctl.builtin_tasks import classification
from ctl.data import datasets
from ctl.data import tfrecord
from ctl.data import tfrecord_files
from ctl.data import write_tfrecords


@dataclasses.dataclass(frozen=True)
class ImageInfo:
  """What the model and the step need to know of the dataset."""

  input_shape: tuple[int, ...]
  num_classes: int
  feature_scale: float


class TFRecordClassification(classification.Classification):
  """Classifies the images of TFRecord shards (logits out)."""

  def train_data(self, context: tf.distribute.InputContext
                 ) -> tf.data.Dataset | tfrecord.GlobalBatches:
    settings = self._reading()
    source = self._source('train')
    if settings.order == 'global':
      self._steps_per_pass = None  # ctl counts global batches.
      return source.global_batches(decode=self._decode,
                                   shuffle_buffer=settings.shuffle_buffer,
                                   cycle_length=settings.cycle_length,
                                   partitions=settings.get('partitions', 0))
    if settings.order != 'by_file':
      raise errors.ConfigError(
          f"config.data.{self._reading_key}.order={settings.order!r}: use "
          "'global' (resumes on any number of workers) or 'by_file'.")
    per_replica_batch_size = context.get_per_replica_batch_size(
        self.config.batch_size)
    # The dataset is endless (it counts its own epochs, to shuffle each
    # statelessly), so ctl cannot count an epoch's steps from its length:
    # one pass over the records, the same on every worker.
    self._steps_per_pass = source.steps_per_epoch(context,
                                                  per_replica_batch_size)
    return source.train_dataset(
        context, per_replica_batch_size=per_replica_batch_size,
        seed=self.config.seed, decode=self._decode,
        shuffle_buffer=settings.shuffle_buffer,
        cycle_length=settings.cycle_length)

  def train_steps_per_epoch(self) -> int | None:
    return self._steps_per_pass

  def eval_data(self, context: tf.distribute.InputContext
                ) -> tf.data.Dataset:
    global_batch_size = self.config.eval_batch_size or self.config.batch_size
    return self._source('eval').eval_dataset(
        context,
        per_replica_batch_size=context.get_per_replica_batch_size(
            global_batch_size),
        decode=self._decode)

  def train_step(self, batch, ctx: task_lib.StepContext) -> dict:
    return super().train_step(self._scale(batch), ctx)

  def eval_step(self, batch, ctx: task_lib.StepContext) -> dict:
    return super().eval_step(self._scale(batch), ctx)

  _reading_key = 'tfrecord'  # config.data's section of the settings below.

  def _reading(self) -> ml_collections.ConfigDict:
    """The config section of order, shuffle_buffer, cycle_length,
    partitions, shift."""
    return self.config.data[self._reading_key]

  def _decode(self, features, seed):
    """A record's (uint8 image, int32 label), shifted at random when
    training (seed given)."""
    image = tf.reshape(tf.io.decode_raw(features['image'], tf.uint8),
                       self._data().input_shape)
    return self._shift(image, seed), tf.cast(features['label'], tf.int32)

  def _shift(self, image: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
    """The image shifted by up to `shift` pixels, drawn from the stateless
    seed (training); as it is without one (eval)."""
    shift = self._reading().shift
    if seed is None or not shift:
      return image
    shape = self._data().input_shape
    padding = [[shift, shift], [shift, shift]] + [[0, 0]] * (len(shape) - 2)
    return tf.image.stateless_random_crop(tf.pad(image, padding), shape, seed)

  def _data(self) -> ImageInfo:
    """The dataset's shapes and classes, from features.json (not
    checkpointed)."""
    if not hasattr(self, '_info'):
      metadata = write_tfrecords.read_metadata(self._directory())
      self._info = ImageInfo(tuple(metadata['image_shape']),
                         int(metadata['num_classes']),
                         float(metadata['feature_scale']))
    return self._info

  def _source(self, split: str) -> tfrecord.TFRecordSource:
    """A split's files, checked, made once; the record counts that
    features.json holds are not counted again."""
    attribute = f'_{split}_source'
    if not hasattr(self, attribute):
      directory = self._directory()
      metadata = write_tfrecords.read_metadata(directory)
      settings = self.config.data.tfrecord
      pattern = settings.train_pattern if split == 'train' else (
          settings.eval_pattern)
      setattr(self, attribute, tfrecord.TFRecordSource(
          os.path.join(directory, pattern),
          tfrecord_files.spec_from_json(metadata['features']),
          known_counts=metadata['splits'].get(split, {}).get('files')))
    return getattr(self, attribute)

  def _directory(self) -> str:
    """The shards' directory, written from data.name first if missing."""
    if hasattr(self, '_prepared'):
      return self._prepared
    settings = self.config.data.tfrecord
    directory = os.path.expanduser(settings.dir)
    if not storage.exists(directory):
      if not settings.prepare:
        raise errors.CtlError(
            f'The data directory {directory} (config.data.tfrecord.dir) does '
            'not exist. Write the shards with `python -m '
            f'ctl.data.write_tfrecords --output={directory}`, or set '
            'config.data.tfrecord.prepare=True to write them from '
            f'config.data.name={self.config.data.name!r}.')
      logging.info('Writing %s as %d TFRecord shards to %s (first use).',
                   self.config.data.name, settings.num_shards, directory)
      written = write_tfrecords.write(
          datasets.load(self.config.data), directory, settings.num_shards,
          self.config.data.name)
      if not written:
        logging.info('Another worker wrote %s first; reading its copy.',
                      directory)
    elif not storage.exists(os.path.join(directory,
                                         write_tfrecords.METADATA)):
      raise errors.CtlError(
          f'{directory} (config.data.tfrecord.dir) exists but has no '
          f'{write_tfrecords.METADATA}: it is not a directory that '
          'ctl.data.write_tfrecords wrote. Point the config at one, or at a '
          'path that does not exist yet to write it there.')
    self._prepared = directory
    return directory
