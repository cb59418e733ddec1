"""The tests' own task over TFRecord files in ctl's global order
(tests/user_modules.py:IdRecords): 600 records, 12 steps of 48 an epoch."""

import ml_collections

import ctl


def get_config() -> ml_collections.ConfigDict:
  """python -m ctl.main --config=tests/configs/id_records.py --config.data.path='/tmp/ids/part-*.tfrecord' --workdir=/tmp/ctl/ids"""
  config = ctl.base_config()
  config.task = 'user_modules:IdRecords'
  config.data = ml_collections.ConfigDict()
  config.data.path = ''  # A glob of user_modules.write_id_records's files.
  config.batch_size = 48  # Divides across 1, 2 and 3 workers.
  config.num_epochs = 3
  config.jit_compile = 'off'  # The step prints its ids (tf.print).
  config.deterministic = True
  config.intervals.log_steps = 1
  config.intervals.checkpoint_steps = 4
  config.distribution.timeout_seconds = 30.0
  return config
