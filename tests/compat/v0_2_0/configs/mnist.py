"""The CNN and optimizer of TensorFlow's multi-worker tutorials, on MNIST."""

import ml_collections

from ctl import config as config_lib


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/mnist.py --workdir=/tmp/ctl/mnist

  Reads mnist.npz from the Keras cache (~/.keras/datasets, where
  keras.datasets.mnist.load_data() puts it) or --config.data.path; it never
  downloads. As in the tutorials: RMSprop at 1e-3, 64 examples per worker.
  With N workers, pass --config.batch_size=64*N to keep 64 per worker.

  Args:
    variant: '' for MNIST; 'smoke' for a few steps on a generated stand-in
      of MNIST's shapes (offline, on a fresh machine; the log says so).
  """
  config = config_lib.classification_config()
  config.data.name = 'mnist'
  config.model.name = 'cnn'
  config.optimizer.name = 'rmsprop'
  config.optimizer.learning_rate = 1e-3
  config.batch_size = 64
  config.eval_batch_size = 1000
  config.num_epochs = 3
  config.steps_per_epoch = 70
  config.intervals.log_steps = 10
  config.intervals.summary_steps = 10
  config.intervals.checkpoint_epochs = 1  # As the tutorials do.
  if variant == 'smoke':
    config.data.name = 'mnist_standin'
    config.num_epochs = 1
    config.steps_per_epoch = 5
    config.eval_batch_size = 256
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}: use '' or 'smoke'.")
  return config
