"""The tests' own task over a tf.data pipeline (tests/user_modules.py)."""

import ml_collections

import ctl


def get_config(task: str = 'NoisyRegression') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=tests/configs/noisy_regression.py --workdir=/tmp/ctl/noisy

  Args:
    task: the class in tests/user_modules.py.
  """
  config = ctl.base_config()
  config.task = f'user_modules:{task}'
  config.batch_size = 32
  config.num_epochs = 3  # 16 steps an epoch on one worker.
  config.intervals.log_steps = 1
  config.intervals.checkpoint_steps = 4
  config.distribution.timeout_seconds = 30.0
  return config
