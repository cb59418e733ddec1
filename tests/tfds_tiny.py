"""A tiny TFDS dataset that the tests prepare offline: scikit-learn's 8x8
digits as TFDS images, in 4 shards per split.

Once prepared, ctl reads it by name from its data directory (TFDS finds
the prepared files without this module), as it reads any TFDS dataset.
"""

import pathlib

import numpy as np
import tensorflow_datasets as tfds

from ctl.data import datasets
import helpers

NAME = 'tiny_digits'
NUM_SHARDS = 4


class TinyDigits(tfds.core.GeneratorBasedBuilder):
  """The digits' train and eval splits as 'train' and 'test' (uint8 0..16)."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(8, 8, 1)),
            'label': tfds.features.ClassLabel(num_classes=10),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    data = datasets.load_digits(helpers.digits().data)
    return {'train': self._generate_examples(data.train),
            'test': self._generate_examples(data.eval)}

  def _generate_examples(self, split: datasets.Split):
    for index, (image, label) in enumerate(zip(split.features,
                                               split.labels)):
      yield index, {'image': image[..., np.newaxis], 'label': int(label)}


def prepare(data_dir: pathlib.Path) -> pathlib.Path:
  """Prepares the dataset in data_dir; returns its version directory."""
  builder = TinyDigits(data_dir=str(data_dir))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      num_shards=NUM_SHARDS, try_download_gcs=False))
  return pathlib.Path(builder.data_dir)
