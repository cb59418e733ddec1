"""TensorFlow's "Custom training loop with Keras and MultiWorkerMirroredStrategy".

The approach of that tutorial, written plainly as it writes it, for
`python -m benchmarks.bench` to compare ctl with: one tf.function call per
step, a new iterator each epoch over a `from_tensor_slices` dataset
shuffled with a 60,000-example buffer, a checkpoint of model, epoch and
step-in-epoch at each epoch end (other workers into a temporary directory
they delete). Changed from the tutorial: Keras 3 names (`reduction=None`,
`reset_state`), random MNIST-shaped data instead of a download, the
checkpoint directory from argv, and timestamps for the benchmark.

    # From the repository root:
    TF_CONFIG=... python -m benchmarks.tutorial CHECKPOINT_DIR
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf


def mnist_dataset():
  rng = np.random.default_rng(0)
  x_train = rng.integers(0, 256, (60000, 28, 28), dtype=np.uint8)
  y_train = rng.integers(0, 10, 60000)
  # The `x` arrays are in uint8 and have values in the [0, 255] range.
  # You need to convert them to float32 with values in the [0, 1] range.
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000)
  return train_dataset


def dataset_fn(global_batch_size, input_context):
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  dataset = mnist_dataset()
  dataset = dataset.shard(input_context.num_input_pipelines,
                          input_context.input_pipeline_id)
  dataset = dataset.batch(batch_size)
  return dataset


def build_cnn_model():
  regularizer = tf.keras.regularizers.L2(1e-5)
  return tf.keras.Sequential([
      tf.keras.Input(shape=(28, 28)),
      tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3,
                             activation='relu',
                             kernel_regularizer=regularizer),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128,
                            activation='relu',
                            kernel_regularizer=regularizer),
      tf.keras.layers.Dense(10, kernel_regularizer=regularizer)
  ])


def _is_chief(task_type, task_id, cluster_spec):
  return (task_type is None
          or task_type == 'chief'
          or (task_type == 'worker'
              and task_id == 0
              and 'chief' not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath, task_id):
  base_dirpath = 'workertemp_' + str(task_id)
  temp_dir = os.path.join(dirpath, base_dirpath)
  tf.io.gfile.makedirs(temp_dir)
  return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
  dirpath = os.path.dirname(filepath)
  base = os.path.basename(filepath)
  if not _is_chief(task_type, task_id, cluster_spec):
    dirpath = _get_temp_dir(dirpath, task_id)
  return os.path.join(dirpath, base)


def main(checkpoint_dir, num_epochs=3):
  tf_config = json.loads(os.environ['TF_CONFIG'])
  per_worker_batch_size = 64
  num_workers = len(tf_config['cluster']['worker'])
  global_batch_size = per_worker_batch_size * num_workers

  num_steps_per_epoch = 70

  strategy = tf.distribute.MultiWorkerMirroredStrategy()

  with strategy.scope():
    multi_worker_model = build_cnn_model()

    multi_worker_dataset = strategy.distribute_datasets_from_function(
        lambda input_context: dataset_fn(global_batch_size, input_context))
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
        name='train_accuracy')

  @tf.function
  def train_step(iterator):
    """Training step function."""

    def step_fn(inputs):
      """Per-Replica step function."""
      x, y = inputs
      with tf.GradientTape() as tape:
        predictions = multi_worker_model(x, training=True)
        per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=None)(y, predictions)
        loss = tf.nn.compute_average_loss(per_example_loss)
        model_losses = multi_worker_model.losses
        if model_losses:
          loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))

      grads = tape.gradient(loss, multi_worker_model.trainable_variables)
      optimizer.apply_gradients(
          zip(grads, multi_worker_model.trainable_variables))
      train_accuracy.update_state(y, predictions)
      return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(
        tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

  epoch = tf.Variable(
      initial_value=tf.constant(0, dtype=tf.dtypes.int64), name='epoch')
  step_in_epoch = tf.Variable(
      initial_value=tf.constant(0, dtype=tf.dtypes.int64),
      name='step_in_epoch')
  task_type, task_id = (strategy.cluster_resolver.task_type,
                        strategy.cluster_resolver.task_id)
  cluster_spec = strategy.cluster_resolver.cluster_spec()

  checkpoint = tf.train.Checkpoint(
      model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)

  write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id,
                                        cluster_spec)
  checkpoint_manager = tf.train.CheckpointManager(
      checkpoint, directory=write_checkpoint_dir, max_to_keep=1)

  # Restoring the checkpoint
  latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
  if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)

  step_ends = []  # For the benchmark: time after each step.
  # Resume our CTL training
  while epoch.numpy() < num_epochs:
    iterator = iter(multi_worker_dataset)
    total_loss = 0.0
    num_batches = 0

    while step_in_epoch.numpy() < num_steps_per_epoch:
      total_loss += train_step(iterator)
      num_batches += 1
      step_in_epoch.assign_add(1)
      step_ends.append(time.monotonic())

    train_loss = total_loss / num_batches
    print('Epoch: %d, accuracy: %f, train_loss: %f.'
          % (epoch.numpy(), train_accuracy.result(), train_loss))

    train_accuracy.reset_state()

    checkpoint_manager.save()
    if not _is_chief(task_type, task_id, cluster_spec):
      tf.io.gfile.rmtree(write_checkpoint_dir)

    epoch.assign_add(1)
    step_in_epoch.assign(0)

  # For the benchmark: steps per second over the second half of the steps,
  # as ctl measures itself.
  half = len(step_ends) // 2
  print('BENCH ' + json.dumps({
      'steps_per_second': (len(step_ends) - 1 - half) /
                          (step_ends[-1] - step_ends[half])}), flush=True)


if __name__ == '__main__':
  # An optional second argument: fewer epochs (the benchmark's own test).
  main(sys.argv[1], *map(int, sys.argv[2:3]))
