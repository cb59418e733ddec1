"""The optimizer and its learning-rate schedule, built from config.optimizer."""

import keras
import ml_collections
import tensorflow as tf

from ctl import registry


def build_optimizer(config: ml_collections.ConfigDict, total_steps: int,
                    loss_scaling: bool = False) -> keras.optimizers.Optimizer:
  """Builds the optimizer named by config.name (the `optimizer` section).

  A user's own is `package.module:function(config, learning_rate)`, the
  learning rate being a float or a Keras schedule. With ema_momentum, it
  keeps a moving average of the weights, which evaluation, export and
  ctl.load use (ctl/training/ema.py). With loss_scaling (for float16
  models) it is wrapped in a keras.optimizers.LossScaleOptimizer.
  """
  learning_rate = build_schedule(config, total_steps)
  builder = registry.resolve(config.name, _OPTIMIZERS, 'optimizer')
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
