"""The 2-worker ceiling for `python -m benchmarks.bench`: the step alone.

Each worker runs the tutorials' CNN step (forward, backward, the gradients'
all-reduce and RMSprop's update, as Keras does them) on batches of 64 read
as a training loop must, by a gather from the examples in memory (as the
one-worker ceiling does, `workloads.batch_reader`; one batch prepared once
ran 1.06x it here, 3 rounds), 100 steps per tf.function call (each call the
next steps' batches), summing its loss on the worker and returning it
(TensorFlow would leave out a loss nobody reads, and the L2 penalty's sum
over the kernels with it) and updating the task's accuracy, as ctl's step
does: no input pipeline, metric reads, checkpoints or logs.
No training loop on the same workers can be faster.

    # From the repository root:
    TF_CONFIG=... python -m benchmarks.ceiling [STEPS_PER_CALL]
"""

import json
import os
import sys
import time

import keras
import tensorflow as tf

from benchmarks import workloads as bw

_STEPS_PER_CALL = 100
_CALLS = 2


def main(steps_per_call: int = _STEPS_PER_CALL) -> None:
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  workload = bw.WORKLOADS['cnn']
  with strategy.scope():
    data, task, _ = bw.parts(workload)  # The optimizer's slots are built.
  model, optimizer, metrics = task.model, task.optimizer, task.train_metrics
  per_example_loss = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=None)
  global_batch_size = workload.batch_size * strategy.num_replicas_in_sync
  read = bw.batch_reader(data, workload.batch_size, gather=True)

  def replica_step(step):
    features, labels = read(step)
    with tf.GradientTape() as tape:
      logits = model(features, training=True)
      value = tf.nn.compute_average_loss(
          per_example_loss(labels, logits),
          global_batch_size=global_batch_size)
      value += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
    gradients = tape.gradient(value, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    for metric in metrics:
      metric.update_state(labels, logits)
    return value

  def worker_loss(step):
    return tf.add_n(strategy.experimental_local_results(
        strategy.run(replica_step, args=(step,))))

  # A graph loop, as ctl's StepRunner loops its steps; each call reads the
  # next steps' batches.
  loop = bw.step_loop(worker_loss, jit_compile='off')
  loop(tf.constant(0), tf.constant(2))  # Traces.
  start = time.perf_counter()
  for call in range(_CALLS):
    loop(tf.constant(call * steps_per_call), tf.constant(steps_per_call))
  seconds = time.perf_counter() - start
  print('BENCH ' + json.dumps(
      {'steps_per_second': _CALLS * steps_per_call / seconds}), flush=True)
  os._exit(0)  # pylint: disable=protected-access


if __name__ == '__main__':
  # An optional argument: fewer steps per call (the benchmark's own test).
  main(*map(int, sys.argv[1:2]))
