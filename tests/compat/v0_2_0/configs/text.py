"""Made-up sentences, padded per batch, classified: experiments/text.py."""

import ml_collections

from ctl import config as config_lib


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/text.py --workdir=/tmp/ctl/text

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps, e.g.
      --config=configs/text.py:smoke.
  """
  config = config_lib.base_config()
  config.task = 'experiments.text:TextClassifier'
  config.data = ml_collections.ConfigDict()
  config.data.num_train = 4096  # Sentences.
  config.data.num_eval = 1024
  config.data.vocab_size = 64  # Token ids, the padding's 0 included.
  # Tokens per sentence: geometric, with this mean, capped at max_length.
  config.data.mean_length = 12
  config.data.max_length = 100
  config.data.sentiment_share = 0.2  # Of the words, positive or negative.
  config.model = ml_collections.ConfigDict()
  config.model.embedding_dim = 16
  config.model.width = 32  # Units of the hidden layer.
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.learning_rate = 3e-3  # Adam's.
  config.batch_size = 32
  config.eval_batch_size = 256
  config.num_epochs = 5
  # An epoch is 128 steps: log, summarise and evaluate at each epoch end.
  config.intervals.log_steps = 0
  config.intervals.summary_steps = 0
  config.intervals.checkpoint_epochs = 1
  if variant == 'smoke':
    config.data.num_train = 1600  # 50 steps an epoch.
    config.num_epochs = 2
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}: use '' or 'smoke'.")
  return config
