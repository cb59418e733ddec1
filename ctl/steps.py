"""The training and evaluation steps, and the tf.functions that loop them.

`train_step` and `eval_step` each run one step on every replica through
`strategy.run`. `train_loop` and `eval_loop` run many steps inside one
tf.function (a graph loop whose count is a tensor, so it never retraces);
the Python loop in ctl/train.py owns everything else. They are traced
without AutoGraph: ctl's step code has no Python control flow on tensors,
and converting it cost most of the first step's tracing time.
"""

from collections.abc import Callable

import keras
import tensorflow as tf

from ctl import errors
from ctl import input_pipeline
from ctl import metrics as metrics_lib


# Keras layers whose XLA CPU kernels run several times slower inside a
# compiled loop than in a compiled step (BENCHMARKS.md, levers).
_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
                 keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
                 keras.layers.Conv3DTranspose, keras.layers.DepthwiseConv1D,
                 keras.layers.DepthwiseConv2D, keras.layers.SeparableConv1D,
                 keras.layers.SeparableConv2D)


def resolve_jit_compile(setting: str, *, num_replicas: int,
                        model: keras.Model) -> str:
  """What XLA compiles: config.jit_compile, with 'auto' decided.

  'auto', from measurements on CPUs (BENCHMARKS.md, levers): with one
  replica on the CPU, 'loop', since running a whole loop as one XLA
  program removes the cost of dispatching each op (1.75x ctl's speed on
  the benchmark's MLP); but 'step' for models with convolutions, which
  XLA runs several times slower inside a loop, while a compiled step
  still fuses the optimizer's passes over every weight (1.24x on the
  tutorials' CNN). With several replicas, or with GPUs or TPUs (not
  measured here): 'off'.

  Raises:
    ConfigError: for 'loop' with several replicas.
  """
  if setting == 'loop' and num_replicas > 1:
    raise errors.ConfigError(
        f"config.jit_compile='loop' needs a single replica; this job has "
        f"{num_replicas}. Use 'step' or 'off'.")
  if setting != 'auto':
    return setting
  accelerators = [device for device in tf.config.list_physical_devices()
                  if device.device_type != 'CPU']
  if num_replicas > 1 or accelerators:
    return 'off'
  layers = model._flatten_layers(include_self=False)  # pylint: disable=protected-access
  if any(isinstance(layer, _CONVOLUTIONS) for layer in layers):
    return 'step'
  return 'loop'


class TrainState:
  """The position of training, saved in every checkpoint.

  `step` counts finished global steps and decides the data position;
  `epoch` and `step_in_epoch` are kept beside it so that a checkpoint says
  where in the data it stopped, and a resume can check that the config
  still cuts epochs the same way.
  """

  def __init__(self):
    """Creates the counters; call inside `strategy.scope()`."""
    self.step = self._counter('step')
    self.epoch = self._counter('epoch')
    self.step_in_epoch = self._counter('step_in_epoch')

  @staticmethod
  def _counter(name: str) -> tf.Variable:
    return tf.Variable(0, dtype=tf.int64, trainable=False, name=name,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def advance(self, num_steps: tf.Tensor, steps_per_epoch: int) -> None:
    """Moves the counters num_steps steps on."""
    step = self.step.assign_add(tf.cast(num_steps, tf.int64))
    self.epoch.assign(step // steps_per_epoch)
    self.step_in_epoch.assign(step % steps_per_epoch)

  def as_dict(self) -> dict[str, int]:
    return {'step': int(self.step.numpy()), 'epoch': int(self.epoch.numpy()),
            'step_in_epoch': int(self.step_in_epoch.numpy())}


class Steps:
  """train_step / eval_step for one model, loss, optimizer and metric sets."""

  def __init__(self, *, strategy: tf.distribute.Strategy, model: keras.Model,
               optimizer: keras.optimizers.Optimizer,
               train_data: input_pipeline.InMemory,
               loss_fn: metrics_lib.LossFn,
               train_metrics: metrics_lib.MetricSet,
               eval_metrics: metrics_lib.MetricSet, state: TrainState,
               global_batch_size: int, steps_per_epoch: int,
               steps_per_loop: int, jit_compile: str = 'off',
               all_reduce_dtype: str = 'float32'):
    """Args as named; see ctl/config.py for all_reduce_dtype.

    Args:
      jit_compile: what XLA compiles, as `resolve_jit_compile` decides:
        'off'; 'step': each step (with several replicas, each replica's
        forward and backward pass only); 'loop': all the steps of a loop
        (one replica only).
    """
    self._strategy = strategy
    self._model = model
    self._optimizer = optimizer
    self._train_data = train_data
    self._loss_fn = loss_fn
    self._train_metrics = train_metrics
    self._eval_metrics = eval_metrics
    self._state = state
    self._global_batch_size = global_batch_size
    self._steps_per_epoch = steps_per_epoch
    self._steps_per_loop = steps_per_loop
    self._jit_compile = jit_compile
    # XLA compiles one program per input shape, so each compiled function
    # takes inputs of one shape: a step its batch's indices, a loop the
    # indices of steps_per_loop steps (padded).
    self._run_steps = self._loop_steps
    self._train_batch = self._replica_train_batch
    self._gradients = self._replica_gradients
    one_replica = strategy.num_replicas_in_sync == 1
    if jit_compile == 'loop':
      self._run_steps = tf.function(self._loop_steps, jit_compile=True,
                                    autograph=False)
    elif jit_compile == 'step' and one_replica:
      self._train_batch = tf.function(self._replica_train_batch,
                                      jit_compile=True, autograph=False)
    elif jit_compile == 'step':
      # Applying the gradients all-reduces them, which XLA cannot compile
      # on every device: only the forward and backward pass are compiled.
      self._gradients = tf.function(self._replica_gradients,
                                    jit_compile=True, autograph=False)
    self._all_reduce_dtype = (tf.as_dtype(all_reduce_dtype)
                              if strategy.num_replicas_in_sync > 1 and
                              all_reduce_dtype != 'float32' else None)
    if self._all_reduce_dtype is not None:
      _skip_keras_gradient_all_reduce(optimizer)

  def train_step(self, rows, step: tf.Tensor) -> None:
    """Runs step `step` of a loop on every replica.

    Args:
      rows: each replica's example indices for the loop's steps (an element
        of input_pipeline.train_chunks).
      step: which of them.
    """
    self._strategy.run(
        lambda replica_rows: self._train_batch(replica_rows[step]),
        args=(rows,))

  def eval_step(self, iterator) -> None:
    """Runs one evaluation step on every replica."""
    self._strategy.run(self._replica_eval_step, args=next(iterator))

  @tf.function(autograph=False)
  def train_loop(self, iterator, num_steps: tf.Tensor,
                 requests: tf.Tensor) -> dict[str, tf.Tensor]:
    """Runs num_steps training steps, then agrees on what to do next.

    Args:
      iterator: the distributed iterator of input_pipeline.train_chunks; one
        element is the loop's data.
      num_steps: a scalar int32 tensor, the steps in this loop's element.
      requests: this worker's int32 flags, e.g. [stop, save].

    Returns:
      'loss': the mean loss since the metrics were last read (non-finite if
        any step since diverged);
      'requests': `requests` summed over every replica of every worker: an
        entry > 0 means some worker asked for it, and every worker gets the
        same answer after the same step;
      'learning_rate': the learning rate of the next step.
    """
    rows = next(iterator)
    if self._jit_compile == 'loop':  # One replica: rows is a tensor.
      rows = tf.pad(rows, [[0, self._steps_per_loop - num_steps], [0, 0]])
    self._run_steps(rows, num_steps)
    self._state.advance(num_steps, self._steps_per_epoch)
    agreed = self._strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        self._strategy.run(tf.identity, args=(requests,)), axis=None)
    return {'loss': self._train_metrics.loss.result(), 'requests': agreed,
            'learning_rate': tf.cast(self._optimizer.learning_rate,
                                     tf.float32)}

  @tf.function(autograph=False)
  def eval_loop(self, iterator, num_steps: tf.Tensor) -> None:
    """Runs num_steps evaluation steps, accumulating the eval metrics."""
    repeat(lambda step: self.eval_step(iterator), num_steps)

  def _loop_steps(self, rows, num_steps: tf.Tensor) -> None:
    """Runs the first num_steps steps of rows."""
    repeat(lambda step: self.train_step(rows, step), num_steps)

  def _replica_train_batch(self, rows: tf.Tensor) -> None:
    """Trains one replica on the examples at indices rows."""
    features, labels = self._train_data.batch(rows)
    logits, per_example_loss, regularization_loss, gradients = (
        self._gradients(features, labels))
    self._apply(gradients)
    self._train_metrics.update(labels, logits,
                               per_example_loss + regularization_loss)

  def _replica_gradients(self, features, labels):
    """Logits, losses and gradients of one replica's batch."""
    with tf.GradientTape() as tape:
      # Float32 logits: under mixed precision the model computes in 16 bits.
      logits = tf.cast(self._model(features, training=True), tf.float32)
      per_example_loss = self._loss_fn(labels, logits)
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=self._global_batch_size)
      regularization_loss = tf.add_n(self._model.losses) if (
          self._model.losses) else tf.constant(0.0)
      loss += tf.nn.scale_regularization_loss(regularization_loss)
      scaled_loss = self._optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled_loss, self._model.trainable_variables)
    return logits, per_example_loss, regularization_loss, gradients

  def _apply(self, gradients) -> None:
    """Sums the gradients over all replicas and applies them."""
    variables = self._model.trainable_variables
    if self._all_reduce_dtype is None:
      # Keras 3 optimizers all-reduce gradients across replicas themselves.
      self._optimizer.apply_gradients(zip(gradients, variables))
      return
    summed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM,
        [tf.cast(gradient, self._all_reduce_dtype) for gradient in gradients])
    self._optimizer.apply_gradients(
        (tf.cast(gradient, variable.dtype), variable)
        for gradient, variable in zip(summed, variables))

  def _replica_eval_step(self, features, labels, weights):
    logits = tf.cast(self._model(features, training=False), tf.float32)
    self._eval_metrics.update(labels, logits, self._loss_fn(labels, logits),
                              weights)


def repeat(body: Callable[[tf.Tensor], None], num_times: tf.Tensor) -> None:
  """Calls body(i) for i in 0..num_times-1, as one graph loop.

  An explicit tf.while_loop: these tf.functions are traced without
  AutoGraph, whose conversion of ctl's code took most of the first step's
  second of tracing. (AutoGraph's `for i in tf.range(n)` would also make n
  a compile-time constant for XLA: one compilation per loop length.)
  """

  def step(i):
    body(i)
    return i + 1

  tf.while_loop(lambda i: i < num_times, step, [tf.constant(0)])


def _skip_keras_gradient_all_reduce(optimizer: keras.optimizers.Optimizer):
  """Makes this optimizer apply gradients as given, already all-reduced.

  Keras 3's TensorFlow optimizers sum gradients across replicas in
  `_all_reduce_sum_gradients`, in float32; Steps does it itself to send
  16-bit gradients. Only this instance (and the optimizer a
  LossScaleOptimizer wraps) changes.
  """
  for instance in (optimizer, getattr(optimizer, 'inner_optimizer', None)):
    if instance is not None:
      instance._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars  # pylint: disable=protected-access
