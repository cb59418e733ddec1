"""Clicks predicted from user and item embeddings: experiments/recommend.py."""

import ml_collections

from ctl import config as config_lib


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/recommend.py --workdir=/tmp/ctl/recommend

  Tables of 5,000 users and 2,000 items; the eval AUC passes 0.8 (a
  guess scores 0.5).

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps, e.g.
      --config=configs/recommend.py:smoke.
  """
  config = config_lib.base_config()
  config.task = 'experiments.recommend:Recommend'
  config.data = ml_collections.ConfigDict()
  config.data.num_users = 5000  # Rows of the user table.
  config.data.num_items = 2000  # Rows of the item table.
  config.data.num_train = 100_000  # Interactions to train on.
  config.data.num_eval = 10_000
  config.data.noise = 0.5  # Standard deviation of the noise on a click.
  config.model = ml_collections.ConfigDict()
  config.model.embedding_dim = 16  # Columns of each table.
  config.model.width = 32  # Units of the hidden layer.
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.learning_rate = 1e-2  # Adam's, constant.
  config.batch_size = 256
  config.eval_batch_size = 2000
  config.num_epochs = 5
  config.intervals.log_steps = 0
  config.intervals.summary_steps = 0
  config.intervals.checkpoint_epochs = 1
  config.evaluation.best_metric = 'auc'
  if variant == 'smoke':
    config.data.num_users = 2000
    config.data.num_items = 1000
    config.data.num_train = 20_000
    config.data.num_eval = 4000
    config.num_epochs = 2
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}: use '' or 'smoke'.")
  return config
