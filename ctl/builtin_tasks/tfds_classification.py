"""The built-in classifier, reading a dataset that TensorFlow Datasets
prepared.

`config.task = 'tfds_classification'` (configs/tfds_mnist.py): the model,
loss, metrics, optimizer and steps are the classification task's; the data
are the TFDS dataset `config.data.tfds.name` as prepared in
`config.data.tfds.data_dir` (ctl never downloads; ctl/data/tfds.py), its
`image_key` and `label_key` features (an Image of fixed shape and a
ClassLabel), read as the TFRecord task reads its shards: the same
pipeline, the same exact resume, the same `shift` augmentation.

Needs the optional extra: `pip install -e ".[tfds]"`.
"""

from typing import Any

import tensorflow as tf

from ctl import errors
from ctl.data import tfds as tfds_data
from ctl.builtin_tasks import tfrecord_classification


class TFDSClassification(tfrecord_classification.TFRecordClassification):
  """Classifies the images of a prepared TFDS dataset (logits out)."""

  _reading_key = 'tfds'

  def _decode(self, features, seed):
    """TFDS's decoded (image, label) as (image, int32 label), shifted at
    random when training (seed given)."""
    settings = self.config.data.tfds
    return (self._shift(features[settings.image_key], seed),
            tf.cast(features[settings.label_key], tf.int32))

  def _data(self) -> tfrecord_classification.ImageInfo:
    """The images' shape and the classes, from TFDS's metadata.

    Raises:
      CtlError: for images of varying shape or a label that is not a
        ClassLabel.
    """
    if not hasattr(self, '_info'):
      settings = self.config.data.tfds
      info = self._builder().info
      image = tfds_data.fixed_size_feature(info, settings.image_key)
      label = tfds_data.fixed_size_feature(info, settings.label_key)
      if None in tuple(image.shape):
        raise errors.CtlError(
            f'The images {settings.image_key!r} of TFDS dataset '
            f'{info.full_name} vary in shape {tuple(image.shape)}; batches '
            'need one: resize them in a task of your own, or pick a '
            'dataset of fixed-size images.')
      if not getattr(label, 'num_classes', None):
        raise errors.CtlError(
            f'Feature {settings.label_key!r} of TFDS dataset '
            f'{info.full_name} is not a ClassLabel: set '
            'config.data.tfds.label_key to the class label.')
      self._info = tfrecord_classification.ImageInfo(
          tuple(image.shape), int(label.num_classes), settings.feature_scale)
    return self._info

  def _source(self, split: str) -> tfds_data.TFDSSource:
    """A split's files (config.data.tfds.train_split or eval_split)."""
    attribute = f'_{split}_source'
    if not hasattr(self, attribute):
      settings = self.config.data.tfds
      setattr(self, attribute, tfds_data.TFDSSource(
          self._builder(),
          settings.train_split if split == 'train' else settings.eval_split,
          keys=(settings.image_key, settings.label_key)))
    return getattr(self, attribute)

  def _builder(self) -> Any:
    """The prepared dataset, found once (not checkpointed)."""
    if not hasattr(self, '_tfds_builder'):
      settings = self.config.data.tfds
      self._tfds_builder = tfds_data.load_builder(settings.name,
                                                  settings.data_dir)
    return self._tfds_builder
