"""The training and evaluation steps, and the tf.functions that loop them.

`train_step` and `eval_step` each run one step on every replica through
`strategy.run`. `train_loop` and `eval_loop` run many steps inside one
tf.function (a `tf.range` loop whose count is a tensor, so it never
retraces); the Python loop in ctl/train.py owns everything else.
"""

import keras
import tensorflow as tf

from ctl import input_pipeline
from ctl import metrics as metrics_lib


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
               jit_compile: bool = False, all_reduce_dtype: str = 'float32'):
    """Args as named; see ctl/config.py for jit_compile and all_reduce_dtype."""
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
    # XLA compiles the forward and backward pass; applying the gradients
    # stays outside, as it may run collectives XLA cannot on every device.
    self._gradients = (tf.function(self._replica_gradients, jit_compile=True)
                       if jit_compile else self._replica_gradients)
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
    self._strategy.run(self._replica_train_step, args=(rows, step))

  def eval_step(self, iterator) -> None:
    """Runs one evaluation step on every replica."""
    self._strategy.run(self._replica_eval_step, args=next(iterator))

  @tf.function
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
    for step in tf.range(num_steps):
      self.train_step(rows, step)
    self._state.advance(num_steps, self._steps_per_epoch)
    agreed = self._strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        self._strategy.run(tf.identity, args=(requests,)), axis=None)
    return {'loss': self._train_metrics.loss.result(), 'requests': agreed,
            'learning_rate': tf.cast(self._optimizer.learning_rate,
                                     tf.float32)}

  @tf.function
  def eval_loop(self, iterator, num_steps: tf.Tensor) -> None:
    """Runs num_steps evaluation steps, accumulating the eval metrics."""
    for _ in tf.range(num_steps):
      self.eval_step(iterator)

  def _replica_train_step(self, rows, step):
    features, labels = self._train_data.batch(rows[step])
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
