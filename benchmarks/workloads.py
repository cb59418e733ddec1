"""What `python -m benchmarks.bench` measures: workloads, and what ctl is
compared with.

ctl trains each workload as its built-in classification task
(ctl/builtin_tasks/classification.py) through `ctl.training.run`; every other
contender trains the same model, optimizer and data, as that task builds
them. Each `*_speed` function builds its contender once and returns a
function that trains a further stretch of steps and returns steps per
second: repeated calls measure the steady state, tracing and warm-up left
out, as ctl's own `timing.steps_per_second` does.
"""

import dataclasses
import tempfile
import time
from collections.abc import Callable

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from ctl import config as config_lib
from ctl import task as task_lib
from ctl import task_hooks
from ctl.data import datasets
from ctl.training import steps as steps_lib

NUM_TRAIN = 60_000  # As MNIST.
NUM_EVAL = 1_000


@dataclasses.dataclass(frozen=True)
class Workload:
  """A model, its data and how long to measure it."""

  name: str
  description: str
  data: str  # A dataset function of this module.
  model: str  # A builder of ctl/builtin_tasks/classification.py.
  optimizer: str
  batch_size: int
  measure_steps: int  # Steps per measurement of the hand-written loops.
  ctl_steps: int  # Steps of a ctl run; its second half is measured.


WORKLOADS = {
    'mlp': Workload(
        'mlp', 'MLP 8x8 -> 128 -> 10 (overhead-bound), Adam, batch 64',
        data='mlp_data', model='mlp', optimizer='adam', batch_size=64,
        measure_steps=4000, ctl_steps=9000),
    'cnn': Workload(
        'cnn', "the tutorials' CNN on 28x28 (compute-bound), RMSprop, batch 64",
        data='cnn_data', model='cnn', optimizer='rmsprop', batch_size=64,
        measure_steps=150, ctl_steps=400),
}


def mlp_data(config: ml_collections.ConfigDict) -> datasets.Data:
  """60,000 random 8x8 float images (and 1,000 to evaluate), 10 classes."""
  del config
  rng = np.random.default_rng(0)
  features = rng.random((NUM_TRAIN + NUM_EVAL, 8, 8), dtype=np.float32)
  return _split(features, rng, feature_scale=1.0)


def cnn_data(config: ml_collections.ConfigDict) -> datasets.Data:
  """60,000 random 28x28 uint8 images (and 1,000 to evaluate), as MNIST."""
  del config
  rng = np.random.default_rng(0)
  features = rng.integers(0, 256, (NUM_TRAIN + NUM_EVAL, 28, 28),
                          dtype=np.uint8)
  return _split(features, rng, feature_scale=1 / 255)


def _split(features, rng, feature_scale) -> datasets.Data:
  labels = rng.integers(0, 10, len(features)).astype(np.int32)
  return datasets.Data(
      train=datasets.Split(features[:NUM_TRAIN], labels[:NUM_TRAIN]),
      eval=datasets.Split(features[NUM_TRAIN:], labels[NUM_TRAIN:]),
      num_classes=10, feature_scale=feature_scale)


def ctl_config(workload: Workload, **overrides) -> ml_collections.ConfigDict:
  """ctl's defaults for this workload; overrides are dotted keys."""
  config = config_lib.classification_config()
  config.data.name = f'benchmarks.workloads:{workload.data}'
  config.model.name = workload.model
  config.optimizer.name = workload.optimizer
  config.batch_size = workload.batch_size
  config.eval_batch_size = NUM_EVAL
  config.total_steps = workload.ctl_steps
  override(config, overrides)
  config_lib.validate(config)
  return config


def override(config: ml_collections.ConfigDict, overrides: dict) -> None:
  """Locks config, then sets each dotted key of overrides: a key that does
  not exist fails, as on the command line."""
  config.lock()
  for key, value in overrides.items():
    section, _, field = key.rpartition('.')
    (config[section] if section else config)[field] = value


def graph_loop(step: Callable, iterator) -> Callable[[int], float]:
  """A hand-written loop, the fair equivalent of ctl's: a tf.function
  running a number of steps in a tf.while_loop, each `step(batch)` on
  `next(iterator)` returning the loss, summed for a log line. Returns a
  function running that many steps and returning their mean loss.
  """
  @tf.function(autograph=False)
  def loop(num_steps):
    def body(i, loss_sum):
      return i + 1, loss_sum + step(next(iterator))

    _, loss_sum = tf.while_loop(lambda i, _: i < num_steps, body,
                                [tf.constant(0), tf.constant(0.0)])
    return loss_sum / tf.cast(num_steps, tf.float32)

  return lambda num_steps: float(loop(tf.constant(num_steps)))


def graph_loop_speed(step: Callable, iterator, measure_steps: int,
                     steps_per_loop: int = 100) -> Callable[[], float]:
  """graph_loop, traced now; returns a function measuring its steps per
  second over measure_steps."""
  loop = graph_loop(step, iterator)
  loop(steps_per_loop)  # Traces.

  def measure() -> float:
    calls = max(measure_steps // steps_per_loop, 1)
    start = time.perf_counter()
    for _ in range(calls):
      loop(steps_per_loop)  # The log line's loss.
    return calls * steps_per_loop / (time.perf_counter() - start)

  return measure


def graph_loop_progress(step: Callable, iterator, total_steps: int,
                        steps_per_loop: int = 100) -> list[tuple[int, float]]:
  """graph_loop run for total_steps: (steps trained, time.time()) after each
  loop, as ctl reports its own (benchmarks/timeslice.py)."""
  loop = graph_loop(step, iterator)
  return _loops_with_progress(lambda first, num_steps: loop(num_steps),
                              total_steps, steps_per_loop)


def _loops_with_progress(run: Callable[[int, int], object], total_steps: int,
                         steps_per_loop: int) -> list[tuple[int, float]]:
  """Calls run(first step, steps) for a first loop of one step (it traces,
  as ctl's first loop), then loops of steps_per_loop up to total_steps;
  (steps trained, time.time()) after each."""
  run(0, 1)
  progress = [(1, time.time())]
  while progress[-1][0] < total_steps:
    num_steps = min(steps_per_loop, total_steps - progress[-1][0])
    run(progress[-1][0], num_steps)
    progress.append((progress[-1][0] + num_steps, time.time()))
  return progress


def ctl_speed(workload: Workload, **overrides) -> Callable[[], float]:
  """ctl's trainer, a fresh run each call: its steady steps per second."""
  return lambda: run_speed(ctl_config(workload, **overrides))


def run_speed(config: ml_collections.ConfigDict) -> float:
  """Trains config's task with ctl in a new workdir; its steady steps/s."""
  from ctl.training import run  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as workdir:
    results = run.train_and_evaluate(config, workdir)
  return results['timing']['steps_per_second']


def run_progress(config: ml_collections.ConfigDict
                 ) -> list[tuple[int, float]]:
  """Trains config's task with ctl in a new workdir; (step, wall time) of
  each of its training summaries (with the default intervals, one per loop),
  as TensorBoard shows them (benchmarks/timeslice.py)."""
  from ctl.runtime import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from ctl.training import run  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as workdir:
    run.train_and_evaluate(config, workdir)
    logdir = workdir_lib.summary_dir(workdir, 'train')
    progress = {
        event.step: event.wall_time
        for path in tf.io.gfile.glob(f'{logdir}/events.out.tfevents.*')
        for event in tf.compat.v1.train.summary_iterator(path)
        if event.summary.value}
  return sorted(progress.items())


def ctl_progress(workload: str, total_steps: int,
                 **overrides) -> Callable[[], list[tuple[int, float]]]:
  """(a) ctl training a workload for total_steps: a function returning its
  progress (benchmarks/timeslice.py)."""
  return lambda: run_progress(ctl_config(WORKLOADS[workload],
                                         total_steps=total_steps, **overrides))


def build_task(workload: Workload) -> task_lib.Task:
  """The workload's classification task, built as ctl's trainer builds it
  (call inside the strategy's scope, if any)."""
  config = ctl_config(workload)
  task = task_hooks.resolve(config.task)(config)
  task.total_steps = config.total_steps
  task.build()
  return task


def parts(workload: Workload):
  """What every contender shares: the data, the classification task (its
  model, and its optimizer with slots built) and the loss."""
  task = build_task(workload)
  data = globals()[workload.data](task.config.data)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  return data, task, loss


def _hand_pipeline(data: datasets.Data, batch_size: int, *,
                   parallel_map: bool = False,
                   cache: bool = False) -> tf.data.Dataset:
  """The usual tf.data pipeline: slices, shuffle, batch, scale, prefetch.

  parallel_map and cache are the tf.data levers: the scaling map with
  num_parallel_calls=AUTOTUNE, and the scaled examples cached in memory
  before shuffling (their batches then need no map at all).
  """
  dataset = tf.data.Dataset.from_tensor_slices(
      (data.train.features, data.train.labels))

  def scale(x, y):
    return tf.cast(x, tf.float32) * data.feature_scale, y

  if cache:
    dataset = dataset.map(scale).cache()
  dataset = dataset.shuffle(len(data.train), seed=0).repeat().batch(
      batch_size, drop_remainder=True)
  if data.feature_scale != 1 and not cache:
    dataset = dataset.map(
        scale, num_parallel_calls=tf.data.AUTOTUNE if parallel_map else None)
  return dataset.prefetch(tf.data.AUTOTUNE)


def _loop_speed(step, steps: int, steps_per_loop: int = 100,
                jit_compile: str = 'off'):
  """Times a loop of `step(i) -> loss` (step_loop), after one call to
  trace it."""
  loop = step_loop(step, jit_compile)
  loop(tf.constant(0), tf.constant(steps_per_loop))
  calls = steps // steps_per_loop

  def measure() -> float:
    # Each loop reads the next steps' batches, as a training loop does.
    start = time.perf_counter()
    for call in range(calls):
      loop(tf.constant(call * steps_per_loop), tf.constant(steps_per_loop))
    return calls * steps_per_loop / (time.perf_counter() - start)

  return measure


def step_loop(step: Callable[[tf.Tensor], tf.Tensor], jit_compile: str):
  """loop(first, num_steps): `step(i)` for i in first..first+num_steps-1 in
  a graph loop, their losses summed and returned, as a training loop that
  logs its loss must compute them (XLA leaves out a loss nobody reads,
  and with it the L2 penalty's sum over the kernels: BENCHMARKS.md,
  "Compute-bound speed").

  jit_compile: 'step' compiles each step with XLA, 'loop' the whole loop,
  as ctl's config.jit_compile does.
  """
  if jit_compile == 'step':
    step = tf.function(step, jit_compile=True, autograph=False)

  @tf.function(jit_compile=jit_compile == 'loop', autograph=False)
  def loop(first, num_steps):
    _, loss_sum = tf.while_loop(
        lambda i, _: i < first + num_steps,
        lambda i, loss_sum: (i + 1, loss_sum + step(i)),
        [first, tf.constant(0.0)])
    return loss_sum

  return loop


def _train_step(model, optimizer, loss, metrics=()):
  """step(features, labels) -> the loss, as ctl's task computes it, and
  the task's train metrics updated as its train_step does (metrics: the
  task's train_metrics; none in the hand-written loop)."""
  def step(features, labels):
    with tf.GradientTape() as tape:
      logits = model(features, training=True)
      value = loss(labels, logits)
      value += tf.add_n(model.losses)
    gradients = tape.gradient(value, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    for metric in metrics:
      metric.update_state(labels, logits)
    return value
  return step


def hand_loop_speed(workload: Workload, **pipeline) -> Callable[[], float]:
  """(b) A minimal hand-written loop: a tf.function running a graph loop
  over a prefetched tf.data pipeline, summing the loss; no metrics,
  checkpoints or summaries.

  pipeline: the tf.data levers of _hand_pipeline.
  """
  data, task, loss = parts(workload)
  iterator = iter(_hand_pipeline(data, workload.batch_size, **pipeline))
  step = _train_step(task.model, task.optimizer, loss)
  return _loop_speed(lambda i: step(*next(iterator)), workload.measure_steps)


def compute_only_speed(workload: Workload, jit_compile: str = 'off',
                       gather: bool = False,
                       metrics: bool = True) -> Callable[[], float]:
  """(c) The same step on batches already in memory: the ceiling.

  jit_compile: as ctl's; ctl's 'auto' is the ceiling of ctl's default.
  gather: see _batch_reader.
  metrics: whether the step updates the task's train metrics (the
    accuracy), as the task's train_step in ctl does.
  """
  data, task, loss = parts(workload)
  step = _train_step(task.model, task.optimizer, loss,
                     task.train_metrics if metrics else ())
  batch_of = batch_reader(data, workload.batch_size, gather)
  return _loop_speed(lambda i: step(*batch_of(i)), workload.measure_steps,
                     jit_compile=_jit_mode(jit_compile, task))


def _jit_mode(jit_compile: str, task: task_lib.Task) -> str:
  """jit_compile, with 'auto' as ctl resolves it for in-memory data."""
  if jit_compile == 'auto':
    return steps_lib.resolve_xla('auto', num_replicas=1, task=task,
                                 in_memory=True)
  return jit_compile


def keras_fit_speed(workload: Workload, steps_per_execution: int,
                    jit_compile: bool | str = 'auto') -> Callable[[], float]:
  """(d) Keras 3 Model.fit over the same pipeline, with accuracy as ctl has.

  jit_compile: Model.compile's; its 'auto' means no XLA on a machine
  without GPUs.
  """
  model, dataset = _compiled_for_fit(workload, steps_per_execution,
                                     jit_compile)
  steps = max(workload.measure_steps // steps_per_execution, 2) * (
      steps_per_execution)
  timer = _FitTimer()

  def measure() -> float:
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0,
              callbacks=[timer])
    return (steps - steps_per_execution) / timer.seconds_after_first_batch

  measure()  # Traces the train function.
  return measure


def _compiled_for_fit(workload: Workload, steps_per_execution: int,
                      jit_compile: bool | str
                      ) -> tuple[keras.Model, tf.data.Dataset]:
  """The workload's model compiled as fit's contenders run it, with
  accuracy as ctl has, and the pipeline fit reads."""
  data, task, loss = parts(workload)
  task.model.compile(optimizer=task.optimizer, loss=loss,
                     metrics=['accuracy'],
                     steps_per_execution=steps_per_execution,
                     jit_compile=jit_compile)
  return task.model, _hand_pipeline(data, workload.batch_size)


class _FitTimer(keras.callbacks.Callback):
  """Times a fit from the end of its first batch to its end."""

  def on_train_batch_end(self, batch, logs=None):
    del batch, logs
    if not hasattr(self, '_first'):
      self._first = time.perf_counter()

  def on_train_begin(self, logs=None):
    del logs
    if hasattr(self, '_first'):
      del self._first

  def on_train_end(self, logs=None):
    del logs
    self.seconds_after_first_batch = time.perf_counter() - self._first


def tf_data_element_microseconds(num_elements: int = 3000) -> float:
  """What tf.data costs per element handed to a tf.function loop.

  Elements are scalars from a prefetched range, so the cost measured is the
  hand-over itself (iterator get_next inside a tf.range loop): what a
  pipeline that yields one batch per step pays per step.
  """
  iterator = iter(tf.data.Dataset.range(10**12).prefetch(tf.data.AUTOTUNE))

  @tf.function
  def loop(num_steps):
    total = tf.constant(0, tf.int64)
    for _ in tf.range(num_steps):
      total += next(iterator)
    return total

  loop(tf.constant(10))
  start = time.perf_counter()
  loop(tf.constant(num_elements))
  return (time.perf_counter() - start) / num_elements * 1e6


def report_milliseconds(writer: str, num_reports: int = 50) -> float:
  """What writing one report of 6 scalars costs the training thread.

  writer: 'ctl' (ctl.metric_writers.tensorboard.TensorBoardWriter) or 'tf.summary'
  (eager tf.summary.scalar calls under a default file writer).
  """
  from ctl.metric_writers import tensorboard  # pylint: disable=g-import-not-at-top
  scalars = {name: 0.5 for name in ('loss', 'accuracy', 'learning_rate',
                                    'steps_per_second', 'examples_per_second',
                                    'eval_accuracy')}
  with tempfile.TemporaryDirectory() as logdir:
    if writer == 'ctl':
      ctl_writer = tensorboard.TensorBoardWriter(logdir)
      write = ctl_writer.write_scalars
      close = ctl_writer.close
    else:
      tf_writer = tf.summary.create_file_writer(logdir)

      def write(step, values):
        with tf_writer.as_default(step=step):
          for name, value in values.items():
            tf.summary.scalar(name, value)

      close = tf_writer.close
    write(0, scalars)  # Warms up.
    start = time.perf_counter()
    for step in range(1, num_reports + 1):
      write(step, scalars)
    seconds = time.perf_counter() - start
    close()
  return seconds / num_reports * 1e3


def compute_only_progress(workload: str, total_steps: int,
                          jit_compile: str = 'auto', gather: bool = False,
                          steps_per_loop: int = 100, metrics: bool = True
                          ) -> Callable[[], list[tuple[int, float]]]:
  """(c) The compute-only loop, as compute_only_speed's, trained for
  total_steps: a function returning its progress after each loop
  (benchmarks/timeslice.py)."""
  def train() -> list[tuple[int, float]]:
    spec = WORKLOADS[workload]
    data, task, loss = parts(spec)
    step = _train_step(task.model, task.optimizer, loss,
                       task.train_metrics if metrics else ())
    batch_of = batch_reader(data, spec.batch_size, gather)
    loop = step_loop(lambda i: step(*batch_of(i)),
                     _jit_mode(jit_compile, task))
    return _loops_with_progress(
        lambda first, num_steps: loop(tf.constant(first),
                                      tf.constant(num_steps)),
        total_steps, steps_per_loop)

  return train


def batch_reader(data: datasets.Data, batch_size: int, gather: bool):
  """step -> (features, labels): one batch prepared once, or (gather) as a
  training loop must read it, the step's rows of a fixed random order of
  the examples in memory, gathered and scaled in the step."""
  if not gather:
    features = tf.constant(np.asarray(data.train.features[:batch_size],
                                      np.float32) * data.feature_scale)
    labels = tf.constant(data.train.labels[:batch_size])
    return lambda step: (features, labels)
  all_features = tf.constant(data.train.features)
  all_labels = tf.constant(data.train.labels)
  steps = len(data.train) // batch_size
  order = tf.constant(np.random.default_rng(0).permutation(
      steps * batch_size).reshape(steps, batch_size).astype(np.int32))

  def read(step):
    rows = tf.gather(order, step % steps)
    features = tf.cast(tf.gather(all_features, rows), tf.float32)
    return features * data.feature_scale, tf.gather(all_labels, rows)

  return read


def keras_fit_progress(workload: str, total_steps: int,
                       steps_per_execution: int = 100,
                       jit_compile: bool | str = True
                       ) -> Callable[[], list[tuple[int, float]]]:
  """(d) Keras fit, as keras_fit_speed's, for total_steps: a function
  returning its progress after each execution (benchmarks/timeslice.py)."""
  def train() -> list[tuple[int, float]]:
    model, dataset = _compiled_for_fit(WORKLOADS[workload],
                                       steps_per_execution, jit_compile)
    recorder = _ProgressRecorder()
    model.fit(dataset, epochs=1, steps_per_epoch=total_steps, verbose=0,
              callbacks=[recorder])
    return recorder.progress

  return train


class _ProgressRecorder(keras.callbacks.Callback):
  """(steps trained, time.time()) after each of fit's executions."""

  def __init__(self):
    super().__init__()
    self.progress = []

  def on_train_batch_end(self, batch, logs=None):
    del logs
    self.progress.append((batch + 1, time.time()))
