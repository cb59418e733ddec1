"""Tells 2-D points inside a circle from those outside it."""
import keras
import numpy as np
import tensorflow as tf

import ctl


def get_config():
  """python -m ctl.main --config=my_task.py --workdir=/tmp/ctl/my_task"""
  config = ctl.base_config()
  config.task = 'my_task:MyTask'  # module:class, importable from here.
  config.batch_size = 64
  config.num_epochs = 10
  return config


def make_points(seed, count):
  points = np.random.default_rng(seed).uniform(-1, 1, (count, 2))
  inside = (points**2).sum(axis=1) < 0.5
  return points.astype(np.float32), inside.astype(np.int32)


class MyTask(ctl.Task):

  def build(self):  # Runs inside strategy.scope().
    self.model = keras.Sequential([keras.Input((2,)),
                                   keras.layers.Dense(32, activation='relu'),
                                   keras.layers.Dense(2)])
    self.optimizer = keras.optimizers.Adam(1e-2)
    self.optimizer.build(self.model.trainable_variables)
    self.eval_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]

  def train_data(self, context):
    return ctl.InMemory(make_points(seed=0, count=4096))

  def eval_data(self, context):
    return ctl.InMemory(make_points(seed=1, count=1024))

  def train_step(self, batch, ctx):
    points, labels = batch
    with tf.GradientTape() as tape:
      logits = self.model(points, training=True)
      per_example_loss = keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True)
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=ctx.global_batch_size)
    variables = self.model.trainable_variables
    gradients = tape.gradient(loss, variables)
    self.optimizer.apply_gradients(zip(gradients, variables))
    return {'loss': tf.reduce_mean(per_example_loss)}

  def eval_step(self, batch, ctx):
    points, labels = batch
    self.eval_metrics[0].update_state(labels, self.model(points))
    return {}
