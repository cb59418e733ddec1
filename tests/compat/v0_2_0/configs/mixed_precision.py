"""Mixed precision and gradient accumulation in a task's own step:
experiments/mixed_precision.py."""

import ml_collections

from ctl import config as config_lib


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/mixed_precision.py --workdir=/tmp/ctl/mixed_precision

  Batches of 256 as 4 micro-batches of 64, in float16 with loss scaling.
  --config.model.dtype_policy=float32 is the float32 run it matches.

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps, e.g.
      --config=configs/mixed_precision.py:smoke.
  """
  config = config_lib.base_config()
  config.task = 'experiments.mixed_precision:MixedPrecisionClassifier'
  config.data = ml_collections.ConfigDict()
  config.data.num_train = 8192
  config.data.num_eval = 2048
  config.model = ml_collections.ConfigDict()
  config.model.width = 128
  # 'mixed_float16' (with a LossScaleOptimizer) or 'float32'.
  config.model.dtype_policy = 'mixed_float16'
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.learning_rate = 1e-3
  config.batch_size = 256
  config.accumulate_steps = 4
  config.eval_batch_size = 2048
  config.num_epochs = 10
  config.intervals.log_steps = 0
  config.intervals.summary_steps = 0
  if variant == 'smoke':
    config.num_epochs = 3
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}: use '' or 'smoke'.")
  return config
