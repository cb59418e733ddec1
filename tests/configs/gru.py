"""The tests' recurrent task over tf.data (tests/sequence_tasks.py)."""

import ml_collections

import ctl


def get_config() -> ml_collections.ConfigDict:
  """python -m ctl.main --config=tests/configs/gru.py --workdir=/tmp/ctl/gru"""
  config = ctl.base_config()
  config.task = 'sequence_tasks:GruClassifier'
  config.data = ml_collections.ConfigDict()
  # Eval examples: with batch_size 60 on 2 replicas (batches of 30), 80 is
  # 3 batches, the last replica of the last one without examples.
  config.data.num_eval = 80
  config.batch_size = 60
  config.num_epochs = 1
  config.intervals.log_steps = 1
  config.export.at_end = False
  return config
