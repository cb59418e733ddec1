"""Recommendation: user and item embedding tables, a click predicted.

    python -m ctl.main --config=configs/recommend.py --workdir=/tmp/ctl/recommend

A task to copy when the inputs are ids into large tables: interactions
generated in memory from a hidden world of user and item tastes, a model of
two `keras.layers.Embedding` tables and a small MLP on their product,
binary cross-entropy on the click, AUC and accuracy evaluated, and a serving
signature that takes ids and returns the click's probability.

Keras 3.15 cannot take the gradient of, checkpoint or export a layer whose
variable TensorFlow sharded over parameter servers (BUILD.md, "Facts
checked on this stack"): experiments/recommend_sharded.py is this task
with its tables as plain tf.Variables, which shard.
"""

import keras
import ml_collections
import numpy as np
import tensorflow as tf

import ctl

# The hidden world and the examples come from these seeds, not config.seed:
# another config.seed changes the initialisation and the order, not the data.
_WORLD_SEED, _TRAIN_SEED, _EVAL_SEED = 1, 2, 3
_TASTES = 4  # Dimensions of the hidden tastes behind a click.


def _world(num_users: int, num_items: int) -> tuple:
  """The hidden (user tastes, user bias, item tastes, item bias)."""
  rng = np.random.default_rng(_WORLD_SEED)
  return (rng.normal(0, 1, (num_users, _TASTES)), rng.normal(0, 1, num_users),
          rng.normal(0, 1, (num_items, _TASTES)), rng.normal(0, 1, num_items))


def make_interactions(data: ml_collections.ConfigDict, num_examples: int,
                      seed: int) -> tuple[dict, np.ndarray]:
  """Random (user, item) pairs and whether the user clicked.

  A click is decided by the user's and the item's biases and how well their
  tastes match, plus noise: about half the pairs are clicks.

  Returns:
    ({'user': int32 [n], 'item': int32 [n]}, float32 clicks [n, 1]).
  """
  user_tastes, user_bias, item_tastes, item_bias = _world(data.num_users,
                                                          data.num_items)
  rng = np.random.default_rng(seed)
  users = rng.integers(0, data.num_users, num_examples)
  items = rng.integers(0, data.num_items, num_examples)
  match = np.sum(user_tastes[users] * item_tastes[items], axis=1) / np.sqrt(
      _TASTES)
  logit = user_bias[users] + item_bias[items] + match
  clicks = logit + rng.normal(0, data.noise, num_examples) > 0
  return ({'user': users.astype(np.int32), 'item': items.astype(np.int32)},
          clicks[:, None].astype(np.float32))


def build_model(data: ml_collections.ConfigDict,
                config: ml_collections.ConfigDict) -> keras.Model:
  """Two embedding tables and an MLP on the pair, one logit out."""
  user = keras.Input((), dtype='int32', name='user')
  item = keras.Input((), dtype='int32', name='item')
  user_vector = keras.layers.Embedding(data.num_users, config.embedding_dim,
                                       name='user_embedding')(user)
  item_vector = keras.layers.Embedding(data.num_items, config.embedding_dim,
                                       name='item_embedding')(item)
  pair = keras.layers.Concatenate()(
      [user_vector, item_vector, user_vector * item_vector])
  hidden = keras.layers.Dense(config.width, activation='relu')(pair)
  logit = keras.layers.Dense(1, name='logit')(hidden)
  return keras.Model({'user': user, 'item': item}, logit)


class Recommend(ctl.Task):
  """Predicts whether a user clicks an item, from their ids alone."""

  def build(self) -> None:
    self.model = build_model(self.config.data, self.config.model)
    self.optimizer = keras.optimizers.Adam(
        self.config.optimizer.learning_rate)
    # Slots built now: a restored checkpoint must find them.
    self.optimizer.build(self.model.trainable_variables)
    self.build_metrics()

  def build_metrics(self) -> None:
    """The click's accuracy in training; its AUC and accuracy evaluated."""
    self.train_metrics = [keras.metrics.BinaryAccuracy(name='accuracy',
                                                       threshold=0.0)]
    self.eval_metrics = [keras.metrics.AUC(name='auc', from_logits=True),
                         keras.metrics.BinaryAccuracy(name='accuracy',
                                                      threshold=0.0)]

  def logits(self, ids: dict, training: bool) -> tf.Tensor:
    """The click's logit of each (user, item) pair of ids: [n, 1]."""
    return self.model(ids, training=training)

  def train_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context  # ctl gives each worker and replica its share itself.
    data = self.config.data
    return ctl.InMemory(make_interactions(data, data.num_train, _TRAIN_SEED))

  def eval_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context
    data = self.config.data
    return ctl.InMemory(make_interactions(data, data.num_eval, _EVAL_SEED))

  def train_step(self, batch, ctx: ctl.StepContext) -> dict:
    ids, clicks = batch
    with tf.GradientTape() as tape:
      logits = self.logits(ids, training=True)
      per_example_loss = keras.losses.binary_crossentropy(
          clicks, logits, from_logits=True)
      # Divided by the global batch: the replicas' summed gradients are the
      # gradient of the global mean.
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=ctx.global_batch_size)
    self.update_weights(tape, loss)
    for metric in self.train_metrics:
      metric.update_state(clicks, logits)
    return {'loss': tf.reduce_mean(per_example_loss)}

  def update_weights(self, tape: tf.GradientTape, loss: tf.Tensor) -> None:
    """One optimizer step on the loss's gradients, taken from the tape.

    The tables' gradients are IndexedSlices: only the rows of the batch's
    ids change, however large the tables.
    """
    variables = self.model.trainable_variables
    gradients = tape.gradient(loss, variables)
    self.optimizer.apply_gradients(zip(gradients, variables))

  def eval_step(self, batch, ctx: ctl.StepContext) -> dict:
    del ctx
    ids, clicks = batch
    logits = self.logits(ids, training=False)
    for metric in self.eval_metrics:
      metric.update_state(clicks, logits)
    return {'loss': tf.reduce_mean(keras.losses.binary_crossentropy(
        clicks, logits, from_logits=True))}

  def serving_signature(self) -> tf.types.experimental.GenericFunction:
    """Ids in, the click's probability out."""
    def serve(user, item):
      logit = self.logits({'user': user, 'item': item}, training=False)
      return {'probability': tf.sigmoid(logit[:, 0])}
    return tf.function(serve, input_signature=[
        tf.TensorSpec([None], tf.int32, name='user'),
        tf.TensorSpec([None], tf.int32, name='item')])
