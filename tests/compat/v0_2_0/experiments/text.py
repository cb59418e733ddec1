"""Text classification: dict features, token sequences padded per batch.

    python -m ctl.main --config=configs/text.py --workdir=/tmp/ctl/text

A task to copy when examples differ in length: its data is a tf.data
pipeline of its own (`padded_batch` pads each batch to its longest
sentence) of features `{'tokens': int32 [batch, length], 'length': int32
[batch]}` and labels, and its model embeds the tokens and averages them over
each sentence's real length (padding masked out).

The sentences are made up: words of a small vocabulary, a few of them
positive and a few negative; a sentence is positive when it has more
positive words than negative ones.

ctl checkpoints the pipeline's iterator, so that a run stopped mid-epoch
resumes at the next batch. That needs a pipeline whose every op can save its
state: seeded `shuffle`, and no stateful random ops (`tf.random.uniform`,
`tf.py_function`) in `map`; use `tf.random.stateless_*` ops there.
"""

import keras
import ml_collections
import numpy as np
import tensorflow as tf

import ctl

PADDING = 0  # The token id that pads a batch's shorter sentences.
# Token ids of the positive and negative words; every other id is neutral.
POSITIVE = (1, 2, 3, 4)
NEGATIVE = (5, 6, 7, 8)
# The sentences come from these seeds, not config.seed: another config.seed
# changes the initialisation and the order of sentences, never the data.
_TRAIN_SEED, _EVAL_SEED = 1, 2


def make_sentences(config: ml_collections.ConfigDict, num_sentences: int,
                   seed: int) -> tuple[list[np.ndarray], np.ndarray]:
  """Made-up sentences (the `data` section) and their labels.

  Returns:
    int32 token arrays, and int32 labels: 1 when a sentence has more
    positive than negative words. Sentences with as many of each are left
    out (their label is a tie). Most sentences are short, a few long (a
    geometric distribution of lengths, capped at data.max_length), as in
    real text: padding each batch to its own longest saves most padding.
  """
  rng = np.random.default_rng(seed)
  sentiment_words = np.array(POSITIVE + NEGATIVE)
  first_neutral = max(sentiment_words) + 1
  sentences, labels = [], []
  while len(sentences) < num_sentences:
    length = min(rng.geometric(1 / config.mean_length), config.max_length)
    tokens = rng.integers(first_neutral, config.vocab_size, length)
    is_sentiment = rng.random(length) < config.sentiment_share
    tokens[is_sentiment] = rng.choice(sentiment_words, is_sentiment.sum())
    balance = np.isin(tokens, POSITIVE).sum() - np.isin(tokens, NEGATIVE).sum()
    if balance:
      sentences.append(tokens.astype(np.int32))
      labels.append(int(balance > 0))
  return sentences, np.array(labels, np.int32)


def make_dataset(sentences: list[np.ndarray],
                 labels: np.ndarray) -> tf.data.Dataset:
  """One element per sentence: ({'tokens': [length], 'length': []}, label)."""
  tokens = tf.RaggedTensor.from_row_lengths(
      np.concatenate(sentences), [len(sentence) for sentence in sentences])

  def features(tokens, label):
    # Slices of a ragged tensor arrive as ragged; padded_batch needs tensors.
    tokens = tf.convert_to_tensor(tokens)
    return {'tokens': tokens, 'length': tf.size(tokens)}, label

  return tf.data.Dataset.from_tensor_slices((tokens, labels)).map(features)


class MaskedMeanPooling(keras.layers.Layer):
  """The mean of each sentence's vectors over its real length, not padding."""

  def call(self, vectors: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    mask = tf.sequence_mask(lengths, maxlen=tf.shape(vectors)[1],
                            dtype=vectors.dtype)
    total = tf.reduce_sum(vectors * mask[:, :, None], axis=1)
    return total / tf.cast(tf.maximum(lengths, 1), vectors.dtype)[:, None]


def build_model(config: ml_collections.ConfigDict,
                vocab_size: int) -> keras.Model:
  """Embedding, masked mean, a hidden layer, two logits (the `model`
  section)."""
  tokens = keras.Input((None,), dtype='int32', name='tokens')
  lengths = keras.Input((), dtype='int32', name='length')
  vectors = keras.layers.Embedding(vocab_size, config.embedding_dim)(tokens)
  pooled = MaskedMeanPooling()(vectors, lengths)
  hidden = keras.layers.Dense(config.width, activation='relu')(pooled)
  logits = keras.layers.Dense(2)(hidden)
  return keras.Model({'tokens': tokens, 'length': lengths}, logits)


class TextClassifier(ctl.Task):
  """Tells positive made-up sentences from negative ones."""

  def build(self) -> None:
    self.model = build_model(self.config.model, self.config.data.vocab_size)
    self.optimizer = keras.optimizers.Adam(
        self.config.optimizer.learning_rate)
    # Slots built now, so that a restored checkpoint finds them.
    self.optimizer.build(self.model.trainable_variables)
    self.train_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]
    self.eval_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]

  def train_data(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
    data = self.config.data
    dataset = make_dataset(*make_sentences(data, data.num_train, _TRAIN_SEED))
    # Each worker reads its own share of the sentences.
    dataset = dataset.shard(context.num_input_pipelines,
                            context.input_pipeline_id)
    # Seeded: the same order in every run, another in each epoch. The buffer
    # holds every sentence (a few hundred KB in each checkpoint); for large
    # examples shuffle indices or file names instead.
    dataset = dataset.shuffle(data.num_train, seed=self.config.seed)
    # Full batches only: the loss is divided by the global batch size.
    return dataset.padded_batch(
        context.get_per_replica_batch_size(self.config.batch_size),
        padding_values=({'tokens': PADDING, 'length': 0}, 0),
        drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  def eval_data(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
    data = self.config.data
    dataset = make_dataset(*make_sentences(data, data.num_eval, _EVAL_SEED))
    dataset = dataset.shard(context.num_input_pipelines,
                            context.input_pipeline_id)
    return dataset.padded_batch(
        context.get_per_replica_batch_size(
            self.config.eval_batch_size or self.config.batch_size),
        padding_values=({'tokens': PADDING, 'length': 0}, 0))

  def train_step(self, batch, ctx: ctl.StepContext) -> dict:
    features, labels = batch
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      logits = self.model(features, training=True)
      per_example_loss = keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True)
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=ctx.global_batch_size)
    # Dense: the embedding's gradient comes as IndexedSlices, a row per
    # token, so a different number on each replica (each pads its batch to
    # its own length), which TensorFlow's collectives cannot all-reduce
    # ("Shape mismatch in the collective"). A small table's is cheap dense.
    gradients = [tf.convert_to_tensor(gradient)
                 for gradient in tape.gradient(loss, variables)]
    self.optimizer.apply_gradients(zip(gradients, variables))
    for metric in self.train_metrics:
      metric.update_state(labels, logits)
    return {'loss': tf.reduce_mean(per_example_loss),
            # How long the batches were padded to, on average.
            'padded_length': tf.cast(tf.shape(features['tokens'])[1],
                                     tf.float32)}

  def eval_step(self, batch, ctx: ctl.StepContext) -> dict:
    del ctx
    features, labels = batch
    logits = self.model(features, training=False)
    for metric in self.eval_metrics:
      metric.update_state(labels, logits)
    return {'loss': tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True))}
