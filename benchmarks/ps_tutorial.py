"""TensorFlow's "Parameter server training with ParameterServerStrategy".

The custom training loop of that tutorial, written plainly as it writes
it, for `python -m benchmarks.bench --sections=parameter_server` to compare
ctl with: the "worker" and "ps" tasks only run `tf.distribute.Server`; the
chief builds the strategy and its `ClusterCoordinator`, makes each worker's
dataset with `create_per_worker_dataset`, `schedule`s one step at a time
(a `strategy.run` of the step on the worker's next batch) and `join`s at
each epoch's end. Changed from the tutorial: Keras 3 names
(`reduction=None`, `reset_state`, the optimizer built in the strategy's
scope, as Keras 3 creates its slots lazily), the tutorials' CNN on random
MNIST-shaped data (benchmarks/tutorial.py's model, ctl's `cnn` with
`configs/mnist.py`), RMSprop at 1e-3 as that config, no
`variable_partitioner` (one server; ctl shards none), the servers given
the inter-op threads ctl gives its own (ctl/cluster/ps_cluster.py: one
thread hung a cluster) so that both contenders run the same cluster, and
timestamps for the benchmark.

    # From the repository root, each task with its TF_CONFIG (chief,
    # workers and ps tasks); the servers run until killed:
    TF_CONFIG=... python -m benchmarks.ps_tutorial [NUM_EPOCHS [STEPS_PER_EPOCH]]
"""

import json
import sys
import time

import numpy as np
import tensorflow as tf

from benchmarks import tutorial

# ctl's loops with its default intervals: 100 steps between joins.
STEPS_PER_EPOCH = 100
NUM_EPOCHS = 4


def dataset_fn(input_context):
  global_batch_size = 64
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (60000, 28, 28), dtype=np.uint8)
  y = rng.integers(0, 10, 60000).astype(np.int64)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60000).repeat()
  dataset = dataset.shard(input_context.num_input_pipelines,
                          input_context.input_pipeline_id)
  dataset = dataset.batch(batch_size)
  # Scaled in the pipeline: uint8 arrays are a quarter of float32 ones in
  # the dataset's graph, which the coordinator sends to each worker.
  dataset = dataset.map(lambda x, y: (tf.cast(x, tf.float32) / 255, y))
  dataset = dataset.prefetch(2)
  return dataset


def serve(cluster_resolver):
  """A worker's or server's whole life, as in the tutorial."""
  server = tf.distribute.Server(
      cluster_resolver.cluster_spec(),
      job_name=cluster_resolver.task_type,
      task_index=cluster_resolver.task_id,
      protocol=cluster_resolver.rpc_layer or 'grpc',
      config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4),
      start=True)
  server.join()


def main(num_epochs=NUM_EPOCHS, steps_per_epoch=STEPS_PER_EPOCH):
  cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  if cluster_resolver.task_type in ('worker', 'ps'):
    serve(cluster_resolver)
    return

  strategy = tf.distribute.experimental.ParameterServerStrategy(
      cluster_resolver)

  with strategy.scope():
    model = tutorial.build_cnn_model()
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    optimizer.build(model.trainable_variables)
    accuracy = tf.keras.metrics.SparseCategoricalAccuracy()

  @tf.function
  def step_fn(iterator):

    def replica_fn(batch_data, labels):
      with tf.GradientTape() as tape:
        pred = model(batch_data, training=True)
        per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=None)(labels, pred)
        loss = tf.nn.compute_average_loss(per_example_loss)
        model_losses = model.losses
        if model_losses:
          loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
      gradients = tape.gradient(loss, model.trainable_variables)

      optimizer.apply_gradients(zip(gradients, model.trainable_variables))

      accuracy.update_state(labels, pred)
      return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

  @tf.function
  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

  per_worker_dataset = coordinator.create_per_worker_dataset(
      per_worker_dataset_fn)
  per_worker_iterator = iter(per_worker_dataset)

  epoch_ends = []  # For the benchmark: (steps, time) after each join.
  for i in range(num_epochs):
    accuracy.reset_state()
    for _ in range(steps_per_epoch):
      coordinator.schedule(step_fn, args=(per_worker_iterator,))
    # Wait at epoch boundaries.
    coordinator.join()
    epoch_ends.append(((i + 1) * steps_per_epoch, time.monotonic()))
    print('Finished epoch %d, accuracy is %f.' % (i, accuracy.result().numpy()))

  print('BENCH ' + json.dumps({'steps_per_second': second_half_speed(
      epoch_ends)}), flush=True)


def second_half_speed(loop_ends):
  """Steps/s over the second half of the steps, between two joins, as ctl
  measures itself (results.json's timing.steps_per_second)."""
  trained, now = loop_ends[-1]
  half = next(end for end in loop_ends if end[0] >= trained / 2)
  if half[0] == trained:
    half = loop_ends[-2]
  return (trained - half[0]) / (now - half[1])


if __name__ == '__main__':
  # Optional arguments: fewer epochs or steps (the benchmark's own test).
  main(*map(int, sys.argv[1:3]))
