"""A user's own dataset, model, loss and tasks, named in configs as
module:function or module:Class."""

import os
import signal
import time

import keras
import numpy as np
import tensorflow as tf

import ctl


def blobs(config):
  """Two Gaussian blobs in 4-D, returned the way Keras's loaders do."""
  del config
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, size=400)
  features = rng.normal(size=(400, 4)) + 3.0 * labels[:, None]
  return ((features[:320].astype(np.float32), labels[:320]),
          (features[320:].astype(np.float32), labels[320:]))


def linear(config, *, input_shape, num_classes):
  """A linear classifier; config.width is ignored."""
  del config
  return keras.Sequential([keras.Input(input_shape),
                           keras.layers.Dense(num_classes)])


def nan_loss(labels, logits):
  """A loss that is NaN from the first step: training diverges at once."""
  return tf.reduce_sum(logits, axis=-1) * np.nan + tf.cast(labels, tf.float32)


def segfault_loss(labels, logits):
  """A loss that kills its process with SIGSEGV as its step is traced."""
  del labels, logits
  os.kill(os.getpid(), signal.SIGSEGV)


def crossentropy(labels, logits):
  """Keras's sparse categorical crossentropy of logits, by another name."""
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


class _PythonRelu(keras.layers.Layer):
  """A ReLU run by the Python interpreter: an op XLA cannot compile."""

  def call(self, inputs):
    outputs = tf.py_function(tf.nn.relu, [inputs], inputs.dtype)
    outputs.set_shape(inputs.shape)
    return outputs


def not_xla(config, *, input_shape, num_classes):
  """A model with an op XLA cannot compile (tf.py_function)."""
  del config
  return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                           keras.layers.Dense(16), _PythonRelu(),
                           keras.layers.Dense(num_classes)])


class NoisyRegression(ctl.Task):
  """A user's task over a tf.data pipeline: sharded per worker, shuffled,
  augmented with stateless noise seeded by (seed, example), with dropout.

  Config: tests/configs/noisy_regression.py.
  """

  DROPOUT = 0.2

  def build(self):
    self.model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(16, activation='relu'),
        keras.layers.Dropout(self.DROPOUT), keras.layers.Dense(1)])
    self.optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    self.optimizer.build(self.model.trainable_variables)
    self.eval_metrics = [keras.metrics.MeanAbsoluteError('mae')]

  def _examples(self, seed, num_examples):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(num_examples, 4)).astype(np.float32)
    targets = (features @ np.array([[1.0], [-2.0], [0.5], [0.0]], np.float32)
               + 0.3).astype(np.float32)
    return features, targets

  def train_data(self, context):
    features, targets = self._examples(0, 512)
    seed = self.config.seed
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.range(512, dtype=tf.int64), features, targets))
    dataset = dataset.shard(context.num_input_pipelines,
                            context.input_pipeline_id)
    dataset = dataset.shuffle(256, seed=seed)

    def augment(index, x, y):
      noise = tf.random.stateless_normal(
          tf.shape(x), seed=tf.stack([tf.constant(seed, tf.int64), index]))
      return x + 0.01 * noise, y

    batch = context.get_per_replica_batch_size(self.config.batch_size)
    return dataset.map(augment).batch(batch, drop_remainder=True)

  def eval_data(self, context):
    del context
    return ctl.InMemory(self._examples(1, 128))

  def train_step(self, batch, ctx):
    x, y = batch
    with tf.GradientTape() as tape:
      per_example = tf.reduce_mean(
          tf.square(self.model(x, training=True) - y), axis=-1)
      loss = tf.nn.compute_average_loss(
          per_example, global_batch_size=ctx.global_batch_size)
    gradients = tape.gradient(loss, self.model.trainable_variables)
    self.optimizer.apply_gradients(
        zip(gradients, self.model.trainable_variables))
    return {'loss': tf.reduce_mean(per_example)}

  def eval_step(self, batch, ctx):
    x, y = batch
    prediction = self.model(x)
    self.eval_metrics[0].update_state(y, prediction)
    return {'mse': tf.reduce_mean(tf.square(prediction - y))}


class EvalInOrder(NoisyRegression):
  """Its eval_step returns each example's index: eval_end gets them in the
  examples' order, each once (13 examples: the last batch is partial)."""

  NUM_EVAL = 13

  def eval_data(self, context):
    del context
    features, targets = self._examples(1, self.NUM_EVAL)
    return ctl.InMemory((np.arange(self.NUM_EVAL, dtype=np.int32), features,
                         targets))

  def eval_step(self, batch, ctx):
    index, x, y = batch
    return {**super().eval_step((x, y), ctx), 'index': index}

  def eval_end(self, name, outputs, results):
    return {'in_order': float(np.array_equal(outputs['index'],
                                              np.arange(self.NUM_EVAL)))}


class StatefulPipeline(NoisyRegression):
  """Augments with a stateful op: its data position cannot be saved."""

  def train_data(self, context):
    return super().train_data(context).map(
        lambda x, y: (x + tf.random.uniform(tf.shape(x)), y))


class StatefulBeforeShuffle(NoisyRegression):
  """A stateful op before the shuffle: an iterator meets it only once the
  shuffle buffer fills, so a save before training would pass."""

  def train_data(self, context):
    features, targets = self._examples(0, 512)
    dataset = tf.data.Dataset.from_tensor_slices((features, targets)).map(
        lambda x, y: (x + tf.random.uniform(tf.shape(x)), y))
    batch = context.get_per_replica_batch_size(self.config.batch_size)
    return dataset.shuffle(256, seed=self.config.seed).batch(
        batch, drop_remainder=True)


class ShufflesTwice(NoisyRegression):
  """Shuffles shuffled examples again: the inner shuffle's seeds cannot be
  restored (ctl/data/resumable.py), so it is refused."""

  def train_data(self, context):
    features, targets = self._examples(0, 512)
    dataset = tf.data.Dataset.from_tensor_slices((features, targets))
    batch = context.get_per_replica_batch_size(self.config.batch_size)
    return dataset.shuffle(64, seed=1).shuffle(256, seed=2).batch(
        batch, drop_remainder=True)


class SlowInputOnOneWorker(NoisyRegression):
  """The worker whose index is in $CTL_SLOW_INPUT_WORKER waits 50 ms for
  each batch of its pipeline (TensorFlow's testing `sleep` transformation,
  whose iterator saves); the others read theirs at full speed."""

  def train_data(self, context):
    dataset = super().train_data(context)
    if str(context.input_pipeline_id) != os.environ.get(
        'CTL_SLOW_INPUT_WORKER'):
      return dataset
    # pylint: disable=g-import-not-at-top
    from tensorflow.python.data.experimental.ops import testing
    return dataset.apply(testing.sleep(50_000))


class ShadowsModels(NoisyRegression):
  """Names an attribute `models`, which hides ctl.Task.models()."""

  def build(self):
    super().build()
    self.models = [self.model]


class NonScalarLogs(NoisyRegression):
  """Returns a per-example log from train_step: an error."""

  def train_step(self, batch, ctx):
    super().train_step(batch, ctx)
    return {'per_example': tf.reduce_sum(batch[0], axis=-1)}


class MissingStep(ctl.Task):
  """Lacks train_step."""

  def build(self):
    pass

  def train_data(self, context):
    return ctl.InMemory((np.zeros((8, 1)),))


class SummarizedRegression(NoisyRegression):
  """Writes its own tf.summary in train_step; two eval sets, and eval_end
  results of every kind."""

  def train_step(self, batch, ctx):
    logs = super().train_step(batch, ctx)
    tf.summary.scalar('kernel_norm', tf.norm(self.model.weights[0]))
    return logs

  def eval_data(self, context):
    del context
    return {'near': ctl.InMemory(self._examples(1, 100)),
            'far': ctl.InMemory(self._examples(2, 60))}

  def eval_step(self, batch, ctx):
    logs = super().eval_step(batch, ctx)
    x, y = batch
    return {**logs, 'error': tf.abs(self.model(x) - y)[:, 0]}

  def eval_end(self, name, outputs, results):
    errors = outputs['error']
    return {'examples': float(len(errors)),
            'errors': ctl.Histogram(errors),
            'error_image': ctl.Image(np.tile(
                errors[None, :, None] / errors.max(), (4, 1, 1)))}


class CountingModel(keras.Model):
  """A Keras model whose own train_step and test_step count their calls."""

  def __init__(self, num_classes):
    super().__init__()
    self.dense = keras.layers.Dense(num_classes)
    self.train_calls = self.add_weight(shape=(), initializer='zeros',
                                       trainable=False, name='train_calls')

  def call(self, inputs):
    return self.dense(inputs)

  def train_step(self, data):
    self.train_calls.assign_add(1.0)
    return super().train_step(data)


def counting_model(config, *, input_shape, num_classes):
  """A compiled CountingModel (config.task='keras_model')."""
  del config
  model = CountingModel(num_classes)
  model(np.zeros((1, *input_shape), np.float32))  # Builds every layer.
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                metrics=[keras.metrics.SparseCategoricalAccuracy('acc')])
  return model


def keras_accumulating_model(config, *, input_shape, num_classes):
  """counting_model whose optimizer accumulates gradients itself (Keras's
  gradient_accumulation_steps), which ctl refuses on several replicas."""
  model = counting_model(config, input_shape=input_shape,
                         num_classes=num_classes)
  model.compile(optimizer=keras.optimizers.SGD(
      0.1, gradient_accumulation_steps=2),
                loss=model.loss, metrics=['accuracy'])
  return model


class Examples(keras.metrics.Sum):
  """A metric(labels, logits) counting the examples it is given
  (config.metrics='user_modules:Examples'): exact counts show lost
  updates."""

  def __init__(self, name='examples'):
    super().__init__(name=name)

  def update_state(self, labels, logits, sample_weight=None):
    del logits, sample_weight
    super().update_state(tf.ones(tf.shape(labels)[:1]))


def three_arguments(labels, logits, weights):
  """A loss that wants a third argument: the step cannot call it."""
  return labels * logits * weights


class StopRequest(ctl.Action):
  """Chief-only: asks to stop after step `at`; notes each step it ran."""

  when = ctl.When(steps=4)

  def __init__(self, at: int):
    self._at = at

  def run(self, event):
    with open(os.path.join(event.workdir, 'stop_request.txt'), 'a') as file:
      file.write(f'{event.step}\n')
    if event.step >= self._at:
      event.request_stop(f'asked at step {event.step}')


class StoppedByAnAction(NoisyRegression):
  """NoisyRegression whose chief-only action stops it after step 20."""

  def actions(self):
    return [StopRequest(at=20)]


class StopAt(ctl.Action):
  """Asks to stop after step 6 (not a step the tests log at)."""

  when = ctl.When(steps=6)

  def run(self, event):
    event.request_stop(f'asked at step {event.step}')


class CountsSteps(NoisyRegression):
  """A train metric counting the steps it was updated in; stopped by an
  action after step 6."""

  def build(self):
    super().build()
    self.train_metrics = [keras.metrics.Sum('steps_counted')]

  def train_step(self, batch, ctx):
    self.train_metrics[0].update_state(1.0)
    return super().train_step(batch, ctx)

  def actions(self):
    return [StopAt()]


class ListWriter(ctl.MetricWriter):
  """A sink in one class: keeps each value written as (step, name, value)."""

  def __init__(self):
    self.rows = []
    self.closed = False

  def write_scalars(self, step, scalars):
    self.rows += [(step, name, value) for name, value in scalars.items()]

  def close(self):
    self.closed = True


class WritesToAList(CountsSteps):
  """CountsSteps with a sink of its own (each one made is kept in `made`,
  for the test that reads it in the same process)."""

  made = []

  def metric_writers(self):
    writer = ListWriter()
    WritesToAList.made.append(writer)
    return [writer]


class SeesEvalResults(NoisyRegression):
  """eval_end reads the pass's results; there are no per-example outputs."""

  def eval_end(self, name, outputs, results):
    return {'mae_seen': results['mae'], 'outputs_seen': float(len(outputs))}


class Requests(ctl.Action):
  """At step 10: asks for an evaluation and a checkpoint; keeps what it saw
  after each evaluation (its state: the steps evaluated)."""

  when = ctl.When(steps=10, after_eval=True)

  def __init__(self):
    self.evaluated_at = []

  def run(self, event):
    if event.step == 10 and not event.evaluated:
      event.request_evaluation()
      event.request_checkpoint()
    if event.evaluated:
      self.evaluated_at.append(event.step)
      with open(os.path.join(event.workdir, 'evaluated.txt'), 'w') as file:
        file.write(' '.join(map(str, self.evaluated_at)))

  def state(self):
    return {'evaluated_at': self.evaluated_at}

  def restore(self, state):
    self.evaluated_at = state['evaluated_at']


class MakesRequests(NoisyRegression):

  def actions(self):
    return [Requests()]


class AtSteps(ctl.Action):
  """One-off after steps 7, 20 and 25: appends each step it ran after to
  at_steps.txt."""

  when = ctl.When(at_steps=(7, 20, 25))

  def run(self, event):
    with open(os.path.join(event.workdir, 'at_steps.txt'), 'a') as file:
      file.write(f'{event.step}\n')


class RunsAtSteps(NoisyRegression):

  def actions(self):
    return [AtSteps()]


class SpikesOnce(NoisyRegression):
  """Its 21st step's targets are 10,000 times too large: the loss jumps,
  and the weights with it."""

  def train_step(self, batch, ctx):
    x, y = batch
    y = tf.where(tf.equal(ctx.step, 20), y * 1e4, y)
    return super().train_step((x, y), ctx)


class LogsItsSteps(CountsSteps):
  """Logs its step (from 1), so that a report's mean says which steps it
  averaged ((first + last) / 2), and counts them in a train metric; its
  logged loss (not the one trained on) is NaN at step 21, or SPIKE times
  what it is, so that a rollback can be seen to start the reports anew."""

  SPIKE_STEP = 21
  SPIKE = float('nan')

  def train_step(self, batch, ctx):
    logs = super().train_step(batch, ctx)
    spiked = tf.equal(ctx.step + 1, self.SPIKE_STEP)
    return {'loss': tf.where(spiked, logs['loss'] * self.SPIKE, logs['loss']),
            'step': tf.cast(ctx.step + 1, tf.float32)}

  def actions(self):
    return [HoldsAfter()]


class SpikesInItsLog(LogsItsSteps):
  """LogsItsSteps whose logged loss is 40 times what it is at step 41: a
  rollback with factor 10 sees it in a loop of one step, and not in a loop
  of steps 41..48."""

  SPIKE_STEP = 41
  SPIKE = 40.0


class HoldsAfter(ctl.Action):
  """With CTL_TEST_HOLD_AFTER_STEP=N in the environment: after step N's
  log line and before its checkpoint, says "Holding after step N" and
  sleeps (a test kills the process there); without it, nothing."""

  when = ctl.When(every_loop=True)

  def run(self, event):
    hold = os.environ.get('CTL_TEST_HOLD_AFTER_STEP')
    if hold and event.step == int(hold):
      print(f'Holding after step {event.step}', flush=True)
      time.sleep(300)


class PythonControlFlow(NoisyRegression):
  """A train_step written as users write one: Python `if`, `for` and
  `while` on tensors (AutoGraph's), freezing the model for steps 1..4."""

  def train_step(self, batch, ctx):
    x, y = batch
    with tf.GradientTape() as tape:
      per_example = tf.reduce_mean(
          tf.square(self.model(x, training=True) - y), axis=-1)
      loss = tf.nn.compute_average_loss(
          per_example, global_batch_size=ctx.global_batch_size)
    gradients = tape.gradient(loss, self.model.trainable_variables)
    frozen = 0.0
    if ctx.step < 4:  # A tensor: AutoGraph makes it a tf.cond.
      gradients = [tf.zeros_like(gradient) for gradient in gradients]
      frozen = 1.0
    total = 0.0
    for i in tf.range(3):  # 0 + 1 + 2
      total += tf.cast(i, tf.float32)
    count = tf.constant(0)
    while count < 2:
      count += 1
    kernel = tf.reduce_sum(self.model.trainable_variables[0])  # Before.
    self.optimizer.apply_gradients(
        zip(gradients, self.model.trainable_variables))
    return {'loss': tf.reduce_mean(per_example), 'kernel': kernel,
            'flow': total + tf.cast(count, tf.float32) + frozen}


class TfFunctionStep(PythonControlFlow):
  """Its train_step wrapped in @tf.function, as many TensorFlow 2
  tutorials write it: its own tf.function converts its control flow."""

  @tf.function
  def train_step(self, batch, ctx):
    return PythonControlFlow.train_step(self, batch, ctx)


class IdRecords(NoisyRegression):
  """A user's task over TFRecord files (config.data.path, a glob) of
  records {'id', 'x', 'y'}, read in ctl's global order: it resumes on any
  number of workers. Each replica prints the ids of its batch at each step
  ("ids <step> [...]"), so a test can compare global batches. No dropout:
  runs on different numbers of replicas then agree to float tolerance.
  """

  SPEC = {'id': tf.io.FixedLenFeature([], tf.int64),
          'x': tf.io.FixedLenFeature([4], tf.float32),
          'y': tf.io.FixedLenFeature([1], tf.float32)}

  DROPOUT = 0.0

  def train_data(self, context):
    del context  # ctl gives each worker its share of each global batch.
    source = ctl.TFRecordSource(self.config.data.path, self.SPEC)

    def decode(features, seed):
      noise = tf.random.stateless_normal([4], seed)  # Augmentation.
      return features['id'], features['x'] + 0.01 * noise, features['y']

    # 6 partitions of 2 files each (write_id_records's 12 files): runs and
    # resumes on 1, 2, 3 or 6 workers.
    return source.global_batches(decode=decode, shuffle_buffer=64,
                                 cycle_length=2, partitions=6)

  def eval_data(self, context):
    del context
    return None

  def train_step(self, batch, ctx):
    ids, x, y = batch
    tf.print('ids', ctx.step, ids, summarize=-1)
    return super().train_step((x, y), ctx)


def write_id_records(directory, counts=(60, 58, 55, 52, 50, 50, 50, 50, 48,
                                        45, 42, 40)) -> str:
  """TFRecord files of IdRecords's records, ids 0.. across the files, of
  uneven sizes (dealt into 6 partitions of 100 records each); returns
  their glob."""
  rng = np.random.default_rng(0)
  first = 0
  for index, count in enumerate(counts):
    with tf.io.TFRecordWriter(f'{directory}/part-{index:02}.tfrecord'
                              ) as writer:
      for record_id in range(first, first + count):
        x = rng.normal(size=4).astype(np.float32)
        y = float(x @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3)
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            'id': tf.train.Feature(
                int64_list=tf.train.Int64List(value=[record_id])),
            'x': tf.train.Feature(float_list=tf.train.FloatList(value=x)),
            'y': tf.train.Feature(float_list=tf.train.FloatList(value=[y])),
        })).SerializeToString())
    first += count
  return f'{directory}/part-*.tfrecord'


class StuckInPython(ctl.Action):
  """On every worker after each step: notes its process's thread count in
  workdir/threads-<worker>.txt; from step 12 on, worker 1 stops in Python
  for an hour (a task's own code that hangs, outside TensorFlow)."""

  when = ctl.When(steps=1)
  on_every_worker = True

  def run(self, event):
    with open('/proc/self/status') as status:
      threads = next(line.split()[1] for line in status
                     if line.startswith('Threads:'))
    worker = 0 if event.is_chief else 1
    path = os.path.join(event.workdir, f'threads-{worker}.txt')
    with open(path, 'a') as file:
      file.write(f'{event.step} {threads}\n')
    if worker == 1 and event.step >= 12:
      time.sleep(3600)


class HangsInPython(NoisyRegression):

  def actions(self):
    return [StuckInPython()]


class HeldAfterStep4(ctl.Action):
  """After step 4: prints "Held after step 4 until <path> exists" and waits
  (an hour at most) until that file in the workdir exists. Whatever the
  loop does next, a stop's save included, waits for a test to let it go."""

  when = ctl.When(steps=4)

  def run(self, event):
    if event.step != 4:
      return
    path = os.path.join(event.workdir, 'release')
    print(f'Held after step 4 until {path} exists', flush=True)
    deadline = time.monotonic() + 3600
    while not os.path.exists(path) and time.monotonic() < deadline:
      time.sleep(0.05)  # A signal's Python handler runs in between.


class HeldAtStep4(NoisyRegression):

  def actions(self):
    return [HeldAfterStep4()]


class FailsToBuild(NoisyRegression):
  """Its build fails, as a bug of the user's own would."""

  def build(self):
    raise ValueError('the model of this task cannot be built')


class FailsToReadData(NoisyRegression):
  """Its train_data has a bug of the user's own (a missing key)."""

  def train_data(self, context):
    return {}['features']
