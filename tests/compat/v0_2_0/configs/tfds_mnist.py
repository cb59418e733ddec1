"""configs/mnist.py's run, reading MNIST as TensorFlow Datasets prepared it."""

import importlib.util
import os

import ml_collections


def _mnist_config(variant: str) -> ml_collections.ConfigDict:
  """configs/mnist.py's get_config(variant), loaded beside this file."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mnist.py')
  spec = importlib.util.spec_from_file_location('configs_mnist', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/tfds_mnist.py --workdir=/tmp/ctl/tfds_mnist

  Trains the tutorials' CNN (configs/mnist.py) on TFDS's `mnist`, read from
  data.tfds.data_dir; ctl never downloads. Needs `pip install -e
  ".[tfds]"` and the dataset prepared once, where the network is
  reachable (then copy the directory if that was another machine):

    python -c "import tensorflow_datasets as tfds; tfds.builder('mnist', data_dir='$HOME/tensorflow_datasets').download_and_prepare()"

  Any TFDS image classification dataset of fixed-size images works the
  same way: --config.data.tfds.name=fashion_mnist, or a dataset of your
  own prepared by its builder.

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps on a
      stand-in of MNIST's shapes that ctl prepares offline (random images;
      the log says so), in ~/.cache/ctl/tensorflow_datasets. Run it on
      MNIST with --config.data.tfds.name=mnist
      --config.data.tfds.data_dir=~/tensorflow_datasets.
  """
  # The MNIST run (model, optimizer, batches, epochs, intervals; its smoke
  # variant's few steps), reading TFDS's files.
  config = _mnist_config(variant)
  config.task = 'tfds_classification'
  config.data.tfds = ml_collections.ConfigDict()
  # TFDS's name of the dataset: 'mnist', 'name/config' or 'name:1.*.*'.
  config.data.tfds.name = 'mnist'
  # Where TFDS prepared it (TFDS's default directory), or the prepared
  # version directory itself (it holds dataset_info.json; name is then not
  # used).
  config.data.tfds.data_dir = '~/tensorflow_datasets'
  # Whole splits: each worker reads whole files of the training split.
  config.data.tfds.train_split = 'train'
  config.data.tfds.eval_split = 'test'
  # The features: an Image of fixed shape and a ClassLabel.
  config.data.tfds.image_key = 'image'
  config.data.tfds.label_key = 'label'
  # Images stay uint8 in the pipeline (a small saved position); the step
  # multiplies them by this: 1/255 maps pixels to [0, 1].
  config.data.tfds.feature_scale = 1 / 255
  # 'global': one order of records and global batches whatever the
  # number of workers; the position is the step, so a run resumes on
  # another number of workers (of those that divide the partitions; each
  # worker reads only its own partitions' files). 'by_file': each worker
  # reads only its own files; its position is saved, and a resume needs
  # the same number of workers.
  config.data.tfds.order = 'global'
  # The global order's partitions (whole files each): the numbers of
  # workers that divide it can run the job. 0: the most that divide the
  # batch, at most one per file. 1: ctl 0.2.0's global order.
  config.data.tfds.partitions = 0
  # Serialized records shuffled at once, each block of this many.
  config.data.tfds.shuffle_buffer = 1024
  config.data.tfds.cycle_length = 4  # Files read at once (ahead).
  # Augmentation: shift each training image by up to this many pixels.
  config.data.tfds.shift = 0
  if variant == 'smoke':
    # ctl.data.tfds.STANDIN, prepared by ctl at the first use.
    config.data.tfds.name = 'ctl_mnist_standin'
    config.data.tfds.data_dir = '~/.cache/ctl/tensorflow_datasets'
  return config
