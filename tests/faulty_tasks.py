"""Tasks of the tests with a user's mistake in them: hooks that raise, as a
bug of a user's own would (tests/test_task_mistakes.py), a model the
default serving signature cannot serve (tests/serving/test_export.py)."""

import keras
import tensorflow as tf

import ctl
import user_modules


class BugInTrainStep(user_modules.NoisyRegression):

  def train_step(self, batch, ctx):
    raise RuntimeError('a bug in train_step')


class BugInEvalStep(user_modules.NoisyRegression):

  def eval_step(self, batch, ctx):
    raise RuntimeError('a bug in eval_step')


class BugInEvalEnd(user_modules.NoisyRegression):

  def eval_end(self, name, outputs, results):
    raise RuntimeError('a bug in eval_end')


class BugInServingSignature(user_modules.NoisyRegression):

  def serving_signature(self):
    raise RuntimeError('a bug in serving_signature')


class TwoInputs(user_modules.NoisyRegression):
  """Its model takes two inputs, and it writes no serving_signature."""

  def build(self):
    left, right = keras.Input((2,), name='left'), keras.Input((2,), name='right')
    output = keras.layers.Dense(1)(keras.layers.Concatenate()([left, right]))
    self.model = keras.Model([left, right], output)
    self.optimizer = keras.optimizers.SGD(0.05)
    self.optimizer.build(self.model.trainable_variables)

  def _predict(self, x, training):
    return self.model([x[:, :2], x[:, 2:]], training=training)

  def train_step(self, batch, ctx):
    x, y = batch
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(self._predict(x, True) - y))
    gradients = tape.gradient(loss, self.model.trainable_variables)
    self.optimizer.apply_gradients(
        zip(gradients, self.model.trainable_variables))
    return {'loss': loss}

  def eval_step(self, batch, ctx):
    x, y = batch
    return {'mse': tf.reduce_mean(tf.square(self._predict(x, False) - y))}


class ThreeProblems(user_modules.NoisyRegression):
  """A pipeline whose position cannot be saved three ways: a stateful
  random op, Python code, a reshuffling shuffle below another shuffle."""

  def train_data(self, context):
    features, targets = self._examples(0, 512)
    dataset = tf.data.Dataset.from_tensor_slices((features, targets)).map(
        lambda x, y: (x + tf.random.uniform(tf.shape(x)), y)).map(
            lambda x, y: (tf.py_function(tf.identity, [x], tf.float32), y))
    batch = context.get_per_replica_batch_size(self.config.batch_size)
    return dataset.shuffle(64, seed=1).shuffle(256, seed=2).batch(
        batch, drop_remainder=True)


class RaisingAction(ctl.Action):
  """An action of the user's with a bug."""

  when = ctl.When(steps=1)

  def run(self, event):
    raise RuntimeError('a bug in run')


class BugInAnAction(user_modules.NoisyRegression):

  def actions(self):
    return [RaisingAction()]
