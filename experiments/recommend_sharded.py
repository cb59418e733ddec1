"""Recommendation with embedding tables sharded over parameter servers.

    python -m ctl.launch --num_workers=2 --num_ps=2 -- \\
        --config=configs/recommend_sharded.py \\
        --workdir=/tmp/ctl/recommend_sharded

experiments/recommend.py's task (its interactions, metrics and serving
signature: ids in, the click's probability out), with its two embedding
tables held as plain tf.Variables, the task's own attributes, so that
`distribution.min_shard_bytes` shards them over the servers, each table
split by rows. Keras 3.15 cannot use a sharded variable
(BUILD.md, "Facts checked on this stack"): ctl refuses a Keras layer whose
variable was sharded, and a table you want sharded is held as here:

- read with `tf.nn.embedding_lookup`, which asks each server for the rows
  it holds (converting a sharded table to one tensor would fetch all of
  it);
- its gradients taken of its shards (`shards`: a sharded table's
  `variables`, the table itself where it is whole), `IndexedSlices` of the
  batch's rows, and applied by the task's own `SparseAdagrad`, row by row;
- the dense part (a small Keras MLP) trained by a Keras optimizer as usual.

The same task runs without servers (one device: the tables whole) with
`--config.distribution.min_shard_bytes=0`, and its checkpoints restore
onto any number of servers, or onto one device: TensorFlow saves a
sharded table as slices of one variable. Not on several replicas in sync
(`mirrored`, `multi_worker`): the sparse updates are not all-reduced.
"""

from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from experiments import recommend


def shards(table) -> list[tf.Variable]:
  """A table's shards: its `variables` when the strategy split it over
  the servers, else the table itself."""
  return list(getattr(table, 'variables', [table]))


def _initial_values(shape: Sequence[int], seed: int,
                    stddev: float) -> Callable:
  """A table's initial values as TensorFlow makes a shard's: it passes
  each shard's partition_shape and partition_offset, so no process ever
  holds the whole table (one device calls it without them)."""
  def initial_value(partition_shape=shape, partition_offset=(0, 0)):
    return tf.random.stateless_normal(
        partition_shape, seed=[seed, partition_offset[0]], stddev=stddev)
  return initial_value


def _filled(shape: Sequence[int], value: float) -> Callable:
  """Initial values all `value`, made shard by shard as _initial_values."""
  def initial_value(partition_shape=shape, partition_offset=(0, 0)):
    del partition_offset
    return tf.fill(partition_shape, value)
  return initial_value


class SparseAdagrad(tf.Module):
  """Adagrad on the rows of a table that a batch read, and on no others.

  Each table's accumulator of squared gradients has the table's shape, so
  the strategy shards it as it shards the table: the table's shard i and
  the accumulator's shard i hold the same rows.
  """

  def __init__(self, tables: Sequence[tf.Variable], learning_rate: float,
               initial_accumulator: float = 1e-6):
    super().__init__()
    self.learning_rate = learning_rate
    self.accumulators = [
        tf.Variable(_filled(table.shape.as_list(), initial_accumulator),
                    shape=table.shape, dtype=table.dtype,
                    name=f'{table.name.split(":")[0]}_accumulator')
        for table in tables]

  def apply(self, gradients: Sequence[Sequence[tf.IndexedSlices]],
            tables: Sequence[tf.Variable]) -> None:
    """Updates each table, shard by shard, from its shards' gradients."""
    for table, accumulator, table_gradients in zip(tables, self.accumulators,
                                                   gradients):
      for shard, squares, gradient in zip(shards(table), shards(accumulator),
                                          table_gradients):
        # A row read twice in the batch has two parts: summed first.
        rows, where = tf.unique(gradient.indices)
        values = tf.math.unsorted_segment_sum(gradient.values, where,
                                              tf.size(rows))
        squares.scatter_add(tf.IndexedSlices(tf.square(values), rows))
        step = (self.learning_rate * values *
                tf.math.rsqrt(squares.sparse_read(rows)))
        shard.scatter_sub(tf.IndexedSlices(step, rows))


class RecommendSharded(recommend.Recommend):
  """Predicts whether a user clicks an item; the tables are plain
  variables, which the strategy may shard."""

  def build(self) -> None:
    data, model = self.config.data, self.config.model
    self.user_table = tf.Variable(
        _initial_values([data.num_users, model.embedding_dim], seed=1,
                        stddev=0.05),
        shape=[data.num_users, model.embedding_dim], dtype=tf.float32,
        name='user_table')
    self.item_table = tf.Variable(
        _initial_values([data.num_items, model.embedding_dim], seed=2,
                        stddev=0.05),
        shape=[data.num_items, model.embedding_dim], dtype=tf.float32,
        name='item_table')
    self.table_optimizer = SparseAdagrad(
        [self.user_table, self.item_table],
        self.config.optimizer.table_learning_rate)
    # The MLP on a pair's vectors and their product.
    self.model = keras.Sequential([
        keras.Input((3 * model.embedding_dim,)),
        keras.layers.Dense(model.width, activation='relu'),
        keras.layers.Dense(1, name='logit')], name='mlp')
    self.optimizer = keras.optimizers.Adam(
        self.config.optimizer.learning_rate)
    self.optimizer.build(self.model.trainable_variables)
    self.build_metrics()

  def logits(self, ids: dict, training: bool) -> tf.Tensor:
    """The click's logit of each (user, item) pair of ids: [n, 1]."""
    user = tf.nn.embedding_lookup(self.user_table, ids['user'])
    item = tf.nn.embedding_lookup(self.item_table, ids['item'])
    return self.model(tf.concat([user, item, user * item], axis=1),
                      training=training)

  def update_weights(self, tape: tf.GradientTape, loss: tf.Tensor) -> None:
    """The tables' sparse step and the dense part's optimizer step
    (Recommend.train_step computes the loss)."""
    tables = [self.user_table, self.item_table]
    dense = self.model.trainable_variables
    # Of the shards, not the tables: TensorFlow takes no gradient of a
    # sharded table as a whole.
    table_gradients, dense_gradients = tape.gradient(
        loss, ([shards(table) for table in tables], dense))
    self.table_optimizer.apply(table_gradients, tables)
    self.optimizer.apply_gradients(zip(dense_gradients, dense))
