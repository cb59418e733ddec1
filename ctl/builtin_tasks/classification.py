"""The built-in task: a classifier on in-memory examples, chosen by name.

`config.task = 'classification'` (configs/digits.py, configs/mnist.py): the
dataset (`data.name`), model (`model.name`), loss, metrics and optimizer
are chosen in the config, built in or a user's `package.module:function`,
and built here (the model by keras_model.py too). A model builder is
`build(config, input_shape, num_classes) -> keras.Model`, taking the
`model` config section; its model maps a batch of float32 features to
logits. Its steps are the tutorials' step_fn; its data is held in memory
and gathered inside the step, ctl's fastest input path.
"""

from collections.abc import Callable

import keras
import ml_collections
import tensorflow as tf

from ctl import config_checks
from ctl import task as task_lib
from ctl.data import datasets


class Classification(task_lib.Task):
  """Classifies features into data.num_classes classes (logits out)."""

  auto_xla = True  # Its steps compile; measured in BENCHMARKS.md.

  def build(self) -> None:
    config = self.config
    data = self._data()
    self.model = build_model(config.model, data.input_shape,
                                    data.num_classes)
    self.optimizer = build_optimizer(
        config.optimizer, self.total_steps,
        loss_scaling=config.model.dtype_policy == 'mixed_float16')
    # Builds the optimizer's slots now: lazily built slots fail with several
    # replicas, and a restore must find them to match the checkpoint.
    self.optimizer.build(self.model.trainable_variables)
    self.train_metrics = [build_metric(name) for name in config.metrics]
    self.eval_metrics = [build_metric(name) for name in config.metrics]

  def train_data(self, context: tf.distribute.InputContext) -> task_lib.InMemory:
    del context  # ctl shards in-memory data itself.
    split = self._data().train
    return task_lib.InMemory((split.features, split.labels),
                             preprocess=self._scale)

  def eval_data(self, context: tf.distribute.InputContext) -> task_lib.InMemory:
    del context
    split = self._data().eval
    return task_lib.InMemory((split.features, split.labels),
                             preprocess=self._scale)

  def train_step(self, batch, ctx: task_lib.StepContext) -> dict:
    variables = self.model.trainable_variables

    def compute(micro_batch):  # The whole batch, or a part of it.
      features, labels = micro_batch
      with tf.GradientTape() as tape:
        # Float32 logits: under mixed precision the model computes in 16 bits.
        logits = tf.cast(self.model(features, training=True), tf.float32)
        per_example_loss = self._loss(labels, logits)
        loss = tf.nn.compute_average_loss(
            per_example_loss, global_batch_size=ctx.global_batch_size)
        regularization = (tf.add_n(self.model.losses) if self.model.losses
                          else tf.constant(0.0))
        # Once per update, however many micro-batches make it.
        loss += tf.nn.scale_regularization_loss(
            regularization) / ctx.accumulate_steps
        scaled_loss = self.optimizer.scale_loss(loss)
      for metric in self.train_metrics:
        metric.update_state(labels, logits)
      return (tape.gradient(scaled_loss, variables),
              {'loss': tf.reduce_mean(per_example_loss) + regularization})

    gradients, logs = ctx.accumulate(compute, batch)
    ctx.apply(self.optimizer, zip(gradients, variables))
    return logs

  def loop_logs(self) -> dict[str, tf.Tensor]:
    # Once per loop, not in every step: a schedule costs ops.
    return {'learning_rate': self.optimizer.learning_rate}

  def eval_step(self, batch, ctx: task_lib.StepContext) -> dict:
    del ctx
    features, labels = batch
    logits = tf.cast(self.model(features, training=False), tf.float32)
    for metric in self.eval_metrics:
      metric.update_state(labels, logits)
    return {'loss': tf.reduce_mean(self._loss(labels, logits))}

  def serving_signature(self):
    """Raw features (as the dataset ships them, before ctl's scaling) ->
    class probabilities and the most likely class."""
    shape = self._data().input_shape

    @tf.function(input_signature=[
        tf.TensorSpec([None, *shape], tf.float32, name='features')],
                 autograph=False)
    def serve(features):
      scaled, _ = self._scale((features, None))
      logits = tf.cast(self.model(scaled, training=False), tf.float32)
      return {'probabilities': tf.nn.softmax(logits),
              'class': tf.argmax(logits, axis=-1)}
    return serve

  def _data(self) -> datasets.Data:
    """The dataset, loaded once (kept off the checkpoint)."""
    if not hasattr(self, '_loaded'):
      self._loaded = datasets.load(self.config.data)  # Not trackable.
    return self._loaded

  def _loss(self, labels, logits):
    return build_loss(self.config.loss)(labels, logits)

  def _scale(self, batch):
    features, labels = batch
    features = tf.cast(features, tf.float32)
    scale = self._data().feature_scale
    return (features if scale == 1 else features * scale), labels


LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def build_loss(name: str) -> LossFn:
  """Returns loss(labels, logits) -> per-example losses, shape [batch]
  (config.loss).

  A user's own is `package.module:function`, that function being the loss.
  """
  return config_checks.resolve_builder(name, _LOSSES, 'loss')


def sparse_categorical_crossentropy(labels, logits):
  """Per-example cross-entropy of integer labels and logits."""
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


def build_metric(name: str) -> keras.metrics.Metric:
  """A new Keras metric(labels, logits) (config.metrics): built in, or a
  user's `package.module:function` returning one."""
  return config_checks.resolve_builder(name, _METRICS, 'metric')()


_LOSSES = {'sparse_categorical_crossentropy': sparse_categorical_crossentropy}
_METRICS = {
    'accuracy': lambda: keras.metrics.SparseCategoricalAccuracy('accuracy'),
    'top5_accuracy': lambda: keras.metrics.SparseTopKCategoricalAccuracy(
        k=5, name='top5_accuracy'),
}


def build_optimizer(config: ml_collections.ConfigDict, total_steps: int,
                    loss_scaling: bool = False) -> keras.optimizers.Optimizer:
  """Builds the optimizer named by config.name (the `optimizer` section).

  A user's own is `package.module:function(config, learning_rate)`, the
  learning rate being a float or a Keras schedule. With ema_momentum, it
  keeps a moving average of the weights, which evaluation, export and
  ctl.load use (ctl/training/assemble.py). With loss_scaling (for float16
  models) it is wrapped in a keras.optimizers.LossScaleOptimizer.
  """
  learning_rate = build_schedule(config, total_steps)
  builder = config_checks.resolve_builder(config.name, _OPTIMIZERS,
                                         'optimizer')
  optimizer = builder(config, learning_rate)
  if config.ema_momentum:
    # Read by the optimizer when it is built (in the task's build()).
    optimizer.use_ema = True
    optimizer.ema_momentum = config.ema_momentum
  if loss_scaling:
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


def build_schedule(
    config: ml_collections.ConfigDict, total_steps: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
  """Warm-up (if any), then the schedule named by config.schedule."""
  peak = config.learning_rate
  decay_steps = max(total_steps - config.warmup_steps, 1)
  end = peak * config.end_learning_rate_factor
  if config.schedule == 'cosine':
    schedule = keras.optimizers.schedules.CosineDecay(
        peak, decay_steps, alpha=config.end_learning_rate_factor)
  elif config.schedule == 'linear':
    schedule = keras.optimizers.schedules.PolynomialDecay(
        peak, decay_steps, end_learning_rate=end, power=1.0)
  else:
    schedule = peak
  if config.warmup_steps:
    return Warmup(schedule, peak, config.warmup_steps)
  return schedule


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
  """Rises linearly from 0 to `peak`, then follows `after` from its step 0."""

  def __init__(self, after, peak: float, warmup_steps: int):
    self.after = after
    self.peak = peak
    self.warmup_steps = warmup_steps

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    warming = self.peak * (step + 1) / self.warmup_steps
    after_step = step - self.warmup_steps
    after = (self.after(after_step) if callable(self.after) else
             tf.constant(self.after, tf.float32))
    return tf.where(step < self.warmup_steps, warming, after)

  def get_config(self):
    return {'after': self.after, 'peak': self.peak,
            'warmup_steps': self.warmup_steps}


def _adam(config, learning_rate):
  return keras.optimizers.Adam(learning_rate,
                               weight_decay=config.weight_decay or None)


def _adamw(config, learning_rate):
  return keras.optimizers.AdamW(learning_rate,
                                weight_decay=config.weight_decay)


def _sgd(config, learning_rate):
  return keras.optimizers.SGD(learning_rate, momentum=config.momentum,
                              weight_decay=config.weight_decay or None)


def _rmsprop(config, learning_rate):
  return keras.optimizers.RMSprop(learning_rate, momentum=config.momentum,
                                  weight_decay=config.weight_decay or None)


_OPTIMIZERS = {'adam': _adam, 'adamw': _adamw, 'sgd': _sgd,
               'rmsprop': _rmsprop}


def build_model(config: ml_collections.ConfigDict,
                input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Builds the model named by config.name (the `model` config section).

  Its layers get config.dtype_policy (Keras's global policy is set while
  the builder runs, then restored).
  """
  builder = config_checks.resolve_builder(config.name, _BUILDERS, 'model')
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(config.dtype_policy)
  try:
    return builder(config, input_shape=input_shape, num_classes=num_classes)
  finally:
    keras.config.set_dtype_policy(previous)


def cnn(config: ml_collections.ConfigDict, *, input_shape: tuple[int, ...],
        num_classes: int) -> keras.Model:
  """The CNN of TensorFlow's multi-worker tutorials, for any image size.

  Conv2D(filters, 3x3, relu), Flatten, Dense(width, relu), Dense(classes),
  each kernel L2-regularised. Grey images of shape (height, width) get a
  channel axis first.
  """
  regularizer = L2(config.l2) if config.l2 else None
  image_shape = input_shape if len(input_shape) == 3 else (*input_shape, 1)
  return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Reshape(image_shape),
      keras.layers.Conv2D(config.filters, 3, activation='relu',
                          kernel_regularizer=regularizer),
      keras.layers.Flatten(),
      keras.layers.Dense(config.width, activation='relu',
                         kernel_regularizer=regularizer),
      keras.layers.Dropout(config.dropout),
      keras.layers.Dense(num_classes, kernel_regularizer=regularizer),
  ], name='cnn')


def mlp(config: ml_collections.ConfigDict, *, input_shape: tuple[int, ...],
        num_classes: int) -> keras.Model:
  """Flatten, then `depth` Dense(width, relu) layers, then Dense(classes)."""
  regularizer = L2(config.l2) if config.l2 else None
  hidden = [
      keras.layers.Dense(config.width, activation='relu',
                         kernel_regularizer=regularizer)
      for _ in range(config.depth)
  ]
  return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Flatten(),
      *hidden,
      keras.layers.Dropout(config.dropout),
      keras.layers.Dense(num_classes, kernel_regularizer=regularizer),
  ], name='mlp')


_BUILDERS = {'cnn': cnn, 'mlp': mlp}


@keras.saving.register_keras_serializable(package='ctl')
class L2(keras.regularizers.Regularizer):
  """keras.regularizers.L2's penalty, l2 * sum(x ** 2), summed in parts.

  The training loss a step logs holds this sum of every kernel's squares.
  Compiled by XLA for a CPU, one reduction runs on one thread: 1.8 ms a
  step for the CNN's 11 MB dense kernel, about a sixth of its step. Summed
  as independent parts, XLA's CPU runtime reduces them side by side
  (0.7 ms; BENCHMARKS.md, "Compute-bound speed"). The gradient is
  Keras's, bit for bit; the penalty the same up to the order of the sum.
  """

  # Elements per part: kernels of fewer than two parts are summed whole.
  PART = 1 << 20

  def __init__(self, l2: float = 0.01):
    self.l2 = float(l2)

  def __call__(self, x):
    l2 = self.l2

    @tf.custom_gradient
    def penalty(x):
      flat = tf.reshape(x, [-1])
      size = flat.shape[0] or 0  # Kernels' shapes are known.
      parts = min(8, size // self.PART)
      if parts < 2:
        total = tf.reduce_sum(tf.square(flat))
      else:
        total = tf.add_n([tf.reduce_sum(tf.square(part))
                          for part in tf.split(flat, _cuts(size, parts))])

      def gradient(upstream):  # As the gradient of l2 * sum(square(x)).
        return (upstream * l2) * (2.0 * x)

      return l2 * total, gradient

    return penalty(tf.convert_to_tensor(x))

  def get_config(self):
    return {'l2': self.l2}


def _cuts(size: int, parts: int) -> list[int]:
  """size split into `parts` sizes that differ by at most one."""
  return [size // parts + (1 if index < size % parts else 0)
          for index in range(parts)]
