"""Digits with clipping after the all-reduce and an EMA: experiments/clip_ema.py."""

import ml_collections

from ctl import config as config_lib


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/clip_ema.py --workdir=/tmp/ctl/clip_ema

  Two replicas on one CPU, to see the all-reduce at work:
  python tests/split_cpu.py 2 --config=configs/clip_ema.py --config.distribution.strategy=mirrored --workdir=/tmp/ctl/clip_ema2

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps, e.g.
      --config=configs/clip_ema.py:smoke.
  """
  config = config_lib.base_config()
  config.task = 'experiments.clip_ema:ClipEma'
  config.data = ml_collections.ConfigDict()
  # Share of the digits held out for evaluation (the built-in task's split).
  config.data.eval_fraction = 0.2
  config.model = ml_collections.ConfigDict()
  config.model.width = 128  # Units of the hidden layer.
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.learning_rate = 0.1  # SGD's.
  config.optimizer.momentum = 0.9
  # The global norm the summed gradients are clipped to.
  config.optimizer.clip_norm = 1.0
  config.ema = ml_collections.ConfigDict()
  # Weight of the old average at each step (after a short warm-up).
  config.ema.decay = 0.99
  config.batch_size = 32
  config.eval_batch_size = 360  # The whole eval split in one step.
  config.num_epochs = 20
  # An epoch is 44 steps: log, summarise and evaluate at each epoch end.
  config.intervals.log_steps = 0
  config.intervals.summary_steps = 0
  config.intervals.checkpoint_epochs = 5
  if variant == 'smoke':
    config.num_epochs = 3
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}: use '' or 'smoke'.")
  return config
