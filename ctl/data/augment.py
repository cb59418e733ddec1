"""Random augmentation that resumes exactly: stateless seeds per example.

A stateful random op (tf.random.uniform, a Keras random layer) in a
tf.data pipeline makes its position unsavable, and ctl saves it to resume
exactly. Draw instead with `tf.random.stateless_*` ops from a seed that is
a function of (config.seed, epoch, example):

    dataset = dataset.enumerate().map(
        lambda index, (image, label): (
            tf.image.stateless_random_flip_left_right(
                image, augment.seeds(config.seed, index)), label))

The same example in the same epoch then gets the same draw, before and
after a restart.
"""

import tensorflow as tf


def seeds(seed: int, *ids) -> tf.Tensor:
  """A stateless seed (int64 [2]) for `seed` and any ids (epoch, example)."""
  key = tf.stack([tf.constant(seed, tf.int64), tf.constant(0, tf.int64)])
  for value in ids:
    key = tf.random.experimental.stateless_fold_in(
        key, tf.cast(value, tf.int64))
  return key
