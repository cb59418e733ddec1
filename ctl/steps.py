"""The training and evaluation steps, and the tf.functions that loop them.

`train_step` and `eval_step` each run one step on every replica through
`strategy.run`. `train_loop` and `eval_loop` run many steps inside one
tf.function (a `tf.range` loop whose count is a tensor, so it never
retraces); the Python loop in ctl/train.py owns everything else.
"""

import keras
import tensorflow as tf

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
               loss_fn: metrics_lib.LossFn,
               train_metrics: metrics_lib.MetricSet,
               eval_metrics: metrics_lib.MetricSet, state: TrainState,
               global_batch_size: int, steps_per_epoch: int):
    self._strategy = strategy
    self._model = model
    self._optimizer = optimizer
    self._loss_fn = loss_fn
    self._train_metrics = train_metrics
    self._eval_metrics = eval_metrics
    self._state = state
    self._global_batch_size = global_batch_size
    self._steps_per_epoch = steps_per_epoch

  def train_step(self, iterator) -> None:
    """Runs one training step on every replica."""
    self._strategy.run(self._replica_train_step, args=next(iterator))

  def eval_step(self, iterator) -> None:
    """Runs one evaluation step on every replica."""
    self._strategy.run(self._replica_eval_step, args=next(iterator))

  @tf.function
  def train_loop(self, iterator, num_steps: tf.Tensor,
                 requests: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Runs num_steps training steps, then agrees on what to do next.

    Args:
      iterator: the distributed training iterator.
      num_steps: a scalar int32 tensor.
      requests: this worker's int32 flags, e.g. [stop, save].

    Returns:
      The mean loss since the metrics were last read (non-finite if any
      step since diverged), and `requests` summed over every replica of
      every worker: an entry > 0 means some worker asked for it, and every
      worker gets the same answer after the same step.
    """
    for _ in tf.range(num_steps):
      self.train_step(iterator)
    self._state.advance(num_steps, self._steps_per_epoch)
    agreed = self._strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        self._strategy.run(tf.identity, args=(requests,)), axis=None)
    return self._train_metrics.loss.result(), agreed

  @tf.function
  def eval_loop(self, iterator, num_steps: tf.Tensor) -> None:
    """Runs num_steps evaluation steps, accumulating the eval metrics."""
    for _ in tf.range(num_steps):
      self.eval_step(iterator)

  def _replica_train_step(self, features, labels):
    with tf.GradientTape() as tape:
      logits = self._model(features, training=True)
      per_example_loss = self._loss_fn(labels, logits)
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=self._global_batch_size)
      regularization_loss = tf.add_n(self._model.losses) if (
          self._model.losses) else tf.constant(0.0)
      loss += tf.nn.scale_regularization_loss(regularization_loss)
      scaled_loss = self._optimizer.scale_loss(loss)
    variables = self._model.trainable_variables
    gradients = tape.gradient(scaled_loss, variables)
    # Keras 3 optimizers all-reduce gradients across replicas themselves.
    self._optimizer.apply_gradients(zip(gradients, variables))
    self._train_metrics.update(labels, logits,
                               per_example_loss + regularization_loss)

  def _replica_eval_step(self, features, labels, weights):
    logits = self._model(features, training=False)
    self._eval_metrics.update(labels, logits, self._loss_fn(labels, logits),
                              weights)
