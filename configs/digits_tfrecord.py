"""configs/digits.py's run, reading the digits from TFRecord shards."""

import ml_collections

from ctl import config as config_lib


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
  config = config_lib.classification_config()
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
  # Serialized records shuffled at once (saved with the data position).
  config.data.tfrecord.shuffle_buffer = 512
  config.data.tfrecord.cycle_length = 4  # Files read at once.
  # Augmentation: shift each training image by up to this many pixels.
  config.data.tfrecord.shift = 0

  config.model.name = 'cnn'
  config.optimizer.name = 'adam'
  config.optimizer.learning_rate = 3e-3
  config.optimizer.schedule = 'cosine'
  config.batch_size = 32
  config.eval_batch_size = 360  # The whole eval split in one step.
  config.num_epochs = 20
  config.intervals.log_steps = 0
  config.intervals.summary_steps = 11
  config.intervals.checkpoint_epochs = 1
  config.jit_compile = 'off'
  if variant == 'smoke':
    config.num_epochs = 2
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}: use '' or 'smoke'.")
  return config
