"""A user's own task on a tf.data pipeline, and the hand-written loop it is
measured against (`python -m benchmarks.bench --sections=user_task`).

Both train the same model (`build_model`) with the same step (`step_fn`)
over the same pipeline (`make_dataset`): the MLP workload's model and data
(benchmarks/workloads.py), written as a user would write them. ctl runs
`MLPTask` with its default settings (for a task of one's own: no XLA). The
hand-written loop is the fair equivalent of ctl's loop: a tf.function
running `steps_per_loop` steps in a tf.while_loop, each reading
`next(iterator)`, the loss summed for a log line; no metrics, checkpoints
or summaries. Each is a fresh run of CTL_STEPS steps in a process of
its own, measured over its second half in turns with the other
(benchmarks/timeslice.py says why).
"""

from collections.abc import Callable

import keras
import ml_collections
import tensorflow as tf

import ctl
from benchmarks import workloads
from benchmarks.timeslice import Progress

# As the MLP workload's.
BATCH_SIZE = 64
CTL_STEPS = 60_000  # A run of about 16 s; its second half is measured.


def build_model() -> keras.Model:
  """The MLP: 8x8 -> 128 -> 10 logits."""
  return keras.Sequential([
      keras.Input((8, 8)),
      keras.layers.Flatten(),
      keras.layers.Dense(128, activation='relu'),
      keras.layers.Dense(10),
  ])


def make_dataset(global_batch_size: int,
                 context: tf.distribute.InputContext) -> tf.data.Dataset:
  """One pass over the examples in this pipeline's per-replica batches:
  slices, shard, shuffle, batch, prefetch."""
  data = workloads.mlp_data(None)
  dataset = tf.data.Dataset.from_tensor_slices(
      (data.train.features, data.train.labels))
  if context.num_input_pipelines > 1:
    dataset = dataset.shard(context.num_input_pipelines,
                            context.input_pipeline_id)
  per_replica = context.get_per_replica_batch_size(global_batch_size)
  return dataset.shuffle(len(data.train), seed=0).batch(
      per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def step_fn(model: keras.Model, optimizer: keras.optimizers.Optimizer,
            batch, global_batch_size: int) -> tf.Tensor:
  """The tutorials' step: tape, loss, gradients, apply; the mean loss."""
  features, labels = batch
  with tf.GradientTape() as tape:
    logits = model(features, training=True)
    per_example_loss = keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True)
    loss = tf.nn.compute_average_loss(per_example_loss,
                                      global_batch_size=global_batch_size)
  gradients = tape.gradient(loss, model.trainable_variables)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))
  return tf.reduce_mean(per_example_loss)


class MLPTask(ctl.Task):
  """The MLP on a tf.data pipeline of per-replica batches."""

  def build(self) -> None:
    self.model = build_model()
    self.optimizer = keras.optimizers.Adam(1e-3)
    self.optimizer.build(self.model.trainable_variables)

  def train_data(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
    return make_dataset(self.config.batch_size, context)

  def train_step(self, batch, ctx: ctl.StepContext) -> dict[str, tf.Tensor]:
    return {'loss': step_fn(self.model, self.optimizer, batch,
                            ctx.global_batch_size)}


def ctl_config(**overrides) -> ml_collections.ConfigDict:
  """ctl's defaults for MLPTask; overrides are dotted keys."""
  config = ctl.base_config()
  config.task = 'benchmarks.user_task:MLPTask'
  config.batch_size = BATCH_SIZE
  config.total_steps = CTL_STEPS
  workloads.override(config, overrides)
  return config


def ctl_progress(**overrides) -> Callable[[], Progress]:
  """(a) ctl running MLPTask: a function training a fresh run and returning
  its progress (benchmarks/timeslice.py)."""
  return lambda: workloads.run_progress(ctl_config(**overrides))


def hand_loop_progress(total_steps: int = CTL_STEPS,
                       steps_per_loop: int = 100) -> Callable[[], Progress]:
  """(b) The same model, step and pipeline in a hand-written loop: a
  function building it, training total_steps and returning its progress."""
  def train() -> Progress:
    model = build_model()
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    # Repeated, as a hand-written loop does (ctl reads it through
    # ctl/data/resumable.py, to resume every pass exactly).
    iterator = iter(make_dataset(BATCH_SIZE, tf.distribute.InputContext())
                    .repeat())
    return workloads.graph_loop_progress(
        lambda batch: step_fn(model, optimizer, batch, BATCH_SIZE), iterator,
        total_steps, steps_per_loop)

  return train
