"""A user's recurrent task over tf.data: token sequences of varying length,
padded per batch, read by a Keras GRU (tests/configs/gru.py)."""

import keras
import numpy as np
import tensorflow as tf

import ctl

VOCABULARY = 8  # Token ids 1..7; 0 pads.


def _examples(seed: int, num_examples: int) -> tf.data.Dataset:
  """Sequences of 2 to 7 tokens; the label: whether they hold more odd
  tokens than even ones."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, 8, num_examples)
  tokens = [rng.integers(1, VOCABULARY, length) for length in lengths]
  labels = np.array([int((t % 2).sum() * 2 > len(t)) for t in tokens],
                    np.int32)
  return tf.data.Dataset.from_tensor_slices(
      (tf.ragged.constant(tokens), labels)).map(
          lambda sequence, label: (sequence, label))


def labels(seed: int, num_examples: int) -> np.ndarray:
  """The labels of _examples(seed, num_examples), in order."""
  return np.array([label for _, label in
                   _examples(seed, num_examples).as_numpy_iterator()])


class GruClassifier(ctl.Task):
  """Embeds the tokens and reads them with a GRU; eval_step returns each
  example's label too (eval_end counts them)."""

  def build(self):
    self.model = keras.Sequential([
        keras.Input((None,), dtype='int32'),
        keras.layers.Embedding(VOCABULARY, 8), keras.layers.GRU(8),
        keras.layers.Dense(2)])
    self.optimizer = keras.optimizers.Adam(0.01)
    self.optimizer.build(self.model.trainable_variables)
    self.eval_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]

  def train_data(self, context):
    batch = context.get_per_replica_batch_size(self.config.batch_size)
    return _examples(0, 240).shard(
        context.num_input_pipelines, context.input_pipeline_id).repeat(
        ).padded_batch(batch, padded_shapes=([None], []), drop_remainder=True)

  def train_steps_per_epoch(self):
    return 4

  def eval_data(self, context):
    # In batches of the per-replica size, which the replicas take in turn:
    # an odd number of batches leaves the last one's second replica
    # without examples (an empty batch, padded to length 0).
    batch = context.get_per_replica_batch_size(self.config.batch_size)
    return _examples(1, self.config.data.num_eval).padded_batch(
        batch, padded_shapes=([None], []))

  def train_step(self, batch, ctx):
    tokens, label = batch
    with tf.GradientTape() as tape:
      per_example = keras.losses.sparse_categorical_crossentropy(
          label, self.model(tokens, training=True), from_logits=True)
      loss = tf.nn.compute_average_loss(
          per_example, global_batch_size=ctx.global_batch_size)
    gradients = tape.gradient(loss, self.model.trainable_variables)
    self.optimizer.apply_gradients(
        zip(gradients, self.model.trainable_variables))
    return {'loss': tf.reduce_mean(per_example)}

  def eval_step(self, batch, ctx):
    del ctx
    tokens, label = batch
    logits = self.model(tokens, training=False)
    self.eval_metrics[0].update_state(label, logits)
    return {'loss': tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
        label, logits, from_logits=True)), 'label': label}

  def eval_end(self, name, outputs, results):
    del name, results
    # Every example once, in order.
    return {'examples': float(len(outputs['label'])),
            'labels_in_order': float(np.array_equal(
                outputs['label'], labels(1, self.config.data.num_eval)))}
