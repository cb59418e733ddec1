"""A GAN on a ring of 2-D Gaussians: experiments/gan.py."""

import ml_collections

from ctl import config as config_lib


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/gan.py --workdir=/tmp/ctl/gan

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps, e.g.
      --config=configs/gan.py:smoke.
  """
  config = config_lib.base_config()
  config.task = 'experiments.gan:Gan'
  config.data = ml_collections.ConfigDict()
  config.data.num_train = 16384  # Real points.
  config.data.num_modes = 8  # Gaussians, evenly spaced on the ring.
  config.data.radius = 2.0  # Of the ring.
  config.data.std = 0.05  # Of each Gaussian.
  config.model = ml_collections.ConfigDict()
  config.model.latent_dim = 8  # Of the generator's input noise.
  config.model.width = 128  # Units of each hidden layer of both networks.
  config.model.depth = 2  # Hidden layers of each network.
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.generator_learning_rate = 1e-3  # Adam's.
  config.optimizer.discriminator_learning_rate = 1e-3  # Adam's.
  config.eval_samples = 4096  # Samples drawn, from fixed noise, to evaluate.
  config.batch_size = 128
  config.eval_batch_size = 4096  # All samples in one step.
  config.num_epochs = 20
  # An epoch is 128 steps: log and summarise at each epoch end, evaluate
  # every other.
  config.intervals.log_steps = 0
  config.intervals.summary_steps = 0
  config.intervals.eval_steps = 256
  config.intervals.checkpoint_epochs = 5
  if variant == 'smoke':
    config.num_epochs = 2
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}: use '' or 'smoke'.")
  return config
