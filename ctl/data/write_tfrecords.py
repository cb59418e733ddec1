"""Writes a built-in dataset as TFRecord shards, the format ctl reads.

    python -m ctl.data.write_tfrecords --dataset=digits \
        --output=/tmp/digits_tfrecord --num_shards=4

writes `train-00000-of-00004.tfrecord` ... `eval-00003-of-00004.tfrecord`,
one tf.train.Example per example with features `image` (the raw uint8
pixels, row-major, as bytes) and `label` (int64), and `features.json`,
which describes them:

    {"features": {"image": {"dtype": "string", "shape": []},
                  "label": {"dtype": "int64", "shape": []}},
     "image_shape": [8, 8], "image_dtype": "uint8", "feature_scale": 0.0625,
     "num_classes": 10, "splits": {"train": {"num_examples": 1437,
     "files": {"train-00000-of-00004.tfrecord": {"records": 360,
                                                "bytes": 40680}, ...}}}}

Readers take each file's record count from there while its size is the
one recorded, instead of reading the file through to count it.

The files are written to a temporary directory beside the output and
renamed to it at the end: a reader never sees half-written shards, and two
workers writing the same output at once leave one whole copy.
"""

import os
import sys
import tempfile

from absl import app
from absl import flags
import ml_collections
import numpy as np
import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl.data import datasets

METADATA = 'features.json'
SPLITS = ('train', 'eval')


def shard_name(split: str, shard: int, num_shards: int) -> str:
  return f'{split}-{shard:05d}-of-{num_shards:05d}.tfrecord'


def split_pattern(split: str) -> str:
  """The glob of a split's shards, relative to the output directory."""
  return f'{split}-*-of-*.tfrecord'


def write(data: datasets.Data, output: str, num_shards: int,
          name: str) -> bool:
  """Writes data's splits to output as num_shards shards each.

  Args:
    data: the dataset; its features must be uint8 arrays (images).
    output: the directory to create; it must not exist yet.
    num_shards: files per split; example i goes to shard i % num_shards.
    name: the dataset's name, recorded in features.json.

  Returns:
    True if this call's copy became output; False if another writer's did
    first (this copy is then discarded).
  """
  if data.train.features.dtype != np.uint8:
    raise errors.CtlError(
        f'Dataset {name!r} has {data.train.features.dtype} features; the '
        'TFRecord writer writes uint8 images only.')
  local = storage.is_local(output)
  # Written beside output and renamed into place; or, for an output on an
  # object store, written here and published with features.json last.
  parent = os.path.dirname(os.path.abspath(output)) if local else None
  if parent:
    storage.makedirs(parent)
  scratch = tempfile.mkdtemp(prefix=f'.{os.path.basename(output)}.tmp-',
                             dir=parent)
  # mkdtemp makes it private; the renamed copy is for every reader.
  os.chmod(scratch, 0o755)
  try:
    metadata = {
        'dataset': name,
        'features': {'image': {'dtype': 'string', 'shape': []},
                     'label': {'dtype': 'int64', 'shape': []}},
        'image_shape': list(data.input_shape),
        'image_dtype': 'uint8',
        'feature_scale': data.feature_scale,
        'num_classes': data.num_classes,
        'splits': {},
    }
    for split_name, split in zip(SPLITS, (data.train, data.eval)):
      metadata['splits'][split_name] = _write_split(scratch, split_name,
                                                    split, num_shards)
    # Written last: a directory with features.json is whole.
    storage.write_json(os.path.join(scratch, METADATA), metadata)
    return _publish(scratch, output, local)
  finally:
    storage.remove(scratch)


def _write_split(scratch: str, split_name: str, split: datasets.Split,
                 num_shards: int) -> dict:
  """Writes one split's shards into scratch; returns its features.json
  entry, with each shard's records and bytes (readers need not count)."""
  files = {}
  for shard in range(num_shards):
    name = shard_name(split_name, shard, num_shards)
    labels = split.labels[shard::num_shards]
    _write_shard(os.path.join(scratch, name),
                 split.features[shard::num_shards], labels)
    files[name] = {'records': len(labels),
                   'bytes': storage.size(os.path.join(scratch, name))}
  return {'pattern': split_pattern(split_name), 'num_shards': num_shards,
          'num_examples': len(split), 'files': files}


def _publish(scratch: str, output: str, local: bool) -> bool:
  """Makes the written scratch copy output; False if another writer's
  copy became it first."""
  whole = os.path.join(output, METADATA)
  if not local:
    if storage.exists(whole):
      return False  # Another writer finished first.
    storage.publish_folder(scratch, output, METADATA)
    return True
  try:
    storage.rename_local_folder(scratch, output)
  except OSError:
    if storage.exists(whole):
      return False  # Another writer finished first.
    raise
  return True


def read_metadata(directory: str) -> dict:
  """features.json of a directory written by `write`.

  Raises:
    CtlError: when it is missing or unreadable.
  """
  path = os.path.join(directory, METADATA)
  try:
    metadata = storage.read_json(path)
    if metadata is None:
      raise FileNotFoundError(f'no such file: {path}')
    return metadata
  except (OSError, ValueError, tf.errors.OpError) as error:
    raise errors.CtlError(
        f'Cannot read {path} ({error}): the directory must hold TFRecord '
        'shards and their features.json, as `python -m '
        'ctl.data.write_tfrecords` writes them.') from error


def _write_shard(path: str, images: np.ndarray, labels: np.ndarray) -> None:
  with tf.io.TFRecordWriter(path) as writer:
    for image, label in zip(images, labels):
      example = tf.train.Example(features=tf.train.Features(feature={
          'image': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[np.ascontiguousarray(image).tobytes()])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(
              value=[int(label)])),
      }))
      writer.write(example.SerializeToString())


def _define_flags() -> None:
  flags.DEFINE_string('dataset', 'digits',
                      "A built-in dataset ('digits', 'mnist') or "
                      "'package.module:function' (see ctl/data/datasets.py).")
  flags.DEFINE_string('output', None, 'The directory to write; must not '
                      'exist.', required=True)
  flags.DEFINE_integer('num_shards', 4, 'Files per split.', lower_bound=1)
  flags.DEFINE_string('path', '', "The dataset's file, if not its default.")
  flags.DEFINE_float('eval_fraction', 0.2, 'Share held out for evaluation, '
                     'for datasets without an eval split.')


def main(argv) -> None:
  del argv
  values = flags.FLAGS
  if storage.exists(values.output):
    sys.exit(f'error: {values.output} exists: choose a new --output. '
             'Nothing was written.')
  config = ml_collections.ConfigDict({
      'name': values.dataset, 'path': values.path,
      'eval_fraction': values.eval_fraction})
  try:
    data = datasets.load(config)
    write(data, values.output, values.num_shards, values.dataset)
  except errors.CtlError as error:
    sys.exit(f'error: {error} Nothing was written.')
  print(f'Wrote {len(data.train)} train and {len(data.eval)} eval examples '
        f'of {values.dataset} to {values.output} as {values.num_shards} '
        f'shards each; features: {os.path.join(values.output, METADATA)}')


if __name__ == '__main__':
  _define_flags()
  app.run(main)
