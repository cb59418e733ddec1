"""configs/digits.py's run, reading the digits from TFRecord shards."""

import importlib.util
import os

import ml_collections


def _digits_config(variant: str) -> ml_collections.ConfigDict:
  """configs/digits.py's get_config(variant), loaded beside this file."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'digits.py')
  spec = importlib.util.spec_from_file_location('configs_digits', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/digits_tfrecord.py --workdir=/tmp/ctl/digits_tfrecord

  Trains the digits CNN from 4 TFRecord shards per split in
  data.tfrecord.dir, writing them there first if they are missing (or
  write them yourself: `python -m ctl.data.write_tfrecords --dataset=digits
  --output=DIR --num_shards=4`). Reaches the in-memory config's eval
  accuracy, about 0.98.

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps, e.g.
      --config=configs/digits_tfrecord.py:smoke.
  """
  # The digits run (model, optimizer, batches, epochs, intervals; its
  # variants), reading TFRecord shards.
  config = _digits_config(variant)
  config.task = 'tfrecord_classification'
  # The dataset written to data.tfrecord.dir when it is missing.
  config.data.name = 'digits'
  config.data.tfrecord = ml_collections.ConfigDict()
  # The shards and their features.json.
  config.data.tfrecord.dir = '~/.ctl/data/digits_tfrecord'
  # Write them from data.name when the directory does not exist; False
  # makes a missing directory an error.
  config.data.tfrecord.prepare = True
  config.data.tfrecord.num_shards = 4  # Files per split, when writing.
  # Each split's files, globs within dir.
  config.data.tfrecord.train_pattern = 'train-*-of-*.tfrecord'
  config.data.tfrecord.eval_pattern = 'eval-*-of-*.tfrecord'
  # 'global': one order of records and global batches whatever the
  # number of workers; the position is the step, so a run resumes on
  # another number of workers (of those that divide the partitions; each
  # worker reads only its own partitions' files). 'by_file': each worker
  # reads only its own files; its position is saved, and a resume needs
  # the same number of workers.
  config.data.tfrecord.order = 'global'
  # The global order's partitions (whole files each): the numbers of
  # workers that divide it can run the job. 0: the most that divide the
  # batch, at most one per file. 1: ctl 0.2.0's global order.
  config.data.tfrecord.partitions = 0
  # Serialized records shuffled at once, each block of this many.
  config.data.tfrecord.shuffle_buffer = 512
  config.data.tfrecord.cycle_length = 4  # Files read at once (ahead).
  # Augmentation: shift each training image by up to this many pixels.
  config.data.tfrecord.shift = 0
  return config
