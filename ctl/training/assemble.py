"""A task built as training builds it: for training, evaluation, export, load.

Every mode builds the task the same way (its data read, its length known,
`build` run in the strategy's scope), so that a checkpoint written by
training restores into it, and learning-rate schedules see the same
`total_steps`. What `build` made of the task is checked here, before
anything is written (its class was checked when it was found by name:
ctl/builtin_tasks/__init__.py and ctl/task_hooks.py).

EMA weights, for evaluation and serving, as Keras's SwapEMAWeights does
(`EmaWeights`): a Keras optimizer built with `use_ema=True` keeps a moving
average of the variables it trains. Checkpoints always hold the training
(raw) weights in the model and the averages in the optimizer. In-loop
evaluation swaps the averages in and back out (`EmaWeights.swapped`),
exactly (an exchange, not Keras's sums and differences, which round):
training resumes on the raw weights, bit for bit. A task restored to
evaluate or serve (the side-car, export, `ctl.load`: `Assembled.restore`)
gets the averages in its models for good (`EmaWeights.swap`).
"""

import contextlib
import dataclasses

import keras
import ml_collections
import tensorflow as tf

from ctl import actions as actions_lib
from ctl import errors
from ctl import task as task_lib
from ctl import task_hooks
from ctl.checkpoints import contents as checkpoint_contents
from ctl.data import inputs
from ctl.cluster import distribution
from ctl.cluster import watchdog as watchdog_lib
from ctl.runtime import tf_internals
from ctl.training import sharding
from ctl.training import state as state_lib


@dataclasses.dataclass
class Assembled:
  """A built task, its training state and what it was built from."""

  task: task_lib.Task
  train_state: state_lib.TrainState
  length: state_lib.TrainingLength
  context: tf.distribute.InputContext
  train_data: task_lib.Data
  action_states: actions_lib.ActionStates
  strategy: tf.distribute.Strategy

  def checkpoint(self) -> tf.train.Checkpoint:
    """What training checkpoints: the task, the step counters and the
    actions' states."""
    return checkpoint_contents.checkpoint_of(
        self.task, self.train_state, actions=self.action_states.variable)

  def restore(self, path: str) -> None:
    """Reads a training checkpoint's task and step, for evaluation or export.

    The data positions are not read (they are not needed to evaluate). An
    optimizer's moving averages of the weights (`use_ema=True`) are put
    in the models: what evaluation and serving use (`EmaWeights`).

    Raises:
      CtlError: when the checkpoint does not fit this task's objects.
    """
    try:
      # Without the actions' states: evaluation and export do not need
      # them (and a checkpoint of an earlier ctl has none).
      checkpoint = checkpoint_contents.checkpoint_of(self.task,
                                                     self.train_state)
      load_status = checkpoint_contents.readable_part(checkpoint,
                                                      path).read(path)
      load_status.expect_partial().assert_existing_objects_matched()
    except Exception as error:  # pylint: disable=broad-except
      raise errors.CtlError(
          f'Checkpoint {path} does not match the task of this config, or '
          f'cannot be read: {errors.summary(error)}') from error
    EmaWeights(self.task, self.strategy).swap()


def paused(watchdog: watchdog_lib.Watchdog | None):
  """The watchdog's pause, for work that waits on no peer (reading data);
  nothing without a watchdog (a job of one worker)."""
  return watchdog.paused() if watchdog else contextlib.nullcontext()


def assemble(config: ml_collections.ConfigDict,
             strategy: tf.distribute.Strategy,
             role: distribution.Role,
             task_class: type[task_lib.Task],
             watchdog: watchdog_lib.Watchdog | None = None) -> Assembled:
  """Creates the task, reads its training data's length, and builds it.

  Reading the data waits on no peer: the watchdog (training's) does not
  count it.
  """
  keras.utils.set_random_seed(config.seed)
  state_lib.check_batch_sizes(config, strategy.num_replicas_in_sync)
  context = inputs.input_context(strategy, role.worker_index, role.num_workers)
  task = task_class(config)
  with paused(watchdog):
    train_data = task.train_data(context)
    task_steps_per_epoch = task.train_steps_per_epoch()
    length = training_length(config, train_data,
                             distribution.local_replicas(strategy),
                             task_steps_per_epoch)
  task.steps_per_epoch = length.steps_per_epoch
  task.total_steps = length.total_steps
  with strategy.scope():
    task.build()
    state = state_lib.TrainState()
  check_nothing_shadowed(task, config)
  if (distribution.is_parameter_server(strategy) and
      config.distribution.get('min_shard_bytes')):
    sharding.check_task(task, config.distribution)
  if strategy.num_replicas_in_sync > 1:
    check_no_keras_accumulation(task)
  return Assembled(task, state, length, context, train_data,
                   actions_lib.ActionStates(), strategy)


def assemble_locally(config: ml_collections.ConfigDict,
                     strategy: tf.distribute.Strategy) -> Assembled:
  """config's task, built as one process of its own on `strategy` (this
  process's devices): for evaluation, export and ctl.load."""
  task_class = task_hooks.resolve(config.task)
  tf_internals.apply_fixes()
  return assemble(config, strategy, distribution.Role(None, 0, 1, True),
                  task_class)


def training_length(config, train_data, local_replicas: int,
                    task_steps_per_epoch: int | None
                    ) -> state_lib.TrainingLength:
  """Epochs and steps, from the config and the task's training data."""
  if task_steps_per_epoch and not config.steps_per_epoch:
    return state_lib.training_length(config, task_steps_per_epoch)
  if isinstance(train_data, task_lib.InMemory):
    steps_per_epoch = state_lib.in_memory_steps_per_epoch(config,
                                                          len(train_data))
  elif inputs.is_global_batches(train_data):
    steps_per_epoch = (config.steps_per_epoch or
                       train_data.steps_per_pass(config.batch_size))
  elif isinstance(train_data, tf.data.Dataset):
    # A step takes one element for each of this worker's replicas.
    steps_per_epoch = inputs.steps_per_epoch_of(
        train_data, config.steps_per_epoch, local_replicas)
  else:
    raise errors.CtlError(
        f'The task\'s train_data returned {type(train_data).__name__}; it '
        'must return a tf.data.Dataset of per-replica batches, '
        'ctl.InMemory, or ctl.data.tfrecord.GlobalBatches.')
  return state_lib.training_length(config, steps_per_epoch)


# What a task sets that Task declares too: everything else Task (and
# tf.Module) defines is what ctl calls or reads, and must not be shadowed.
SETTABLE = ('train_metrics', 'eval_metrics', 'auto_xla')


def check_nothing_shadowed(task: task_lib.Task,
                           config: ml_collections.ConfigDict) -> None:
  """Fails if the task set an attribute that hides what ctl reads of it.

  `self.models = [...]` in build would hide `Task.models()`, which ctl
  calls to find the models to checkpoint; `self.config = ...` the config
  ctl gave it.

  Raises:
    CtlError: naming the attributes and what they hide.
  """
  hidden = sorted(name for name in task_lib.own_attribute_names(task)
                  if not name.startswith('_') and name not in SETTABLE
                  and hasattr(task_lib.Task, name))
  if vars(task).get('config', config) is not config:
    hidden.append('config')
  if hidden:
    raise errors.CtlError(
        f'{type(task).__name__} sets attribute(s) {", ".join(hidden)}, which '
        'hide ctl.Task\'s own of that name (ctl reads them): rename them, '
        'e.g. self.model or self.networks instead of self.models.')


def check_no_keras_accumulation(task: task_lib.Task) -> None:
  """Fails if an optimizer accumulates gradients itself, which Keras 3
  cannot do on more than one replica (a merge_call inside a tf.cond).

  Raises:
    CtlError: saying to use config.accumulate_steps or ctx.accumulate.
  """
  for value in task_lib.attribute_values(task):
    inner = getattr(value, 'inner_optimizer', value)  # LossScaleOptimizer.
    if (isinstance(inner, keras.optimizers.Optimizer) and
        (inner.gradient_accumulation_steps or 0) > 1):
      raise errors.CtlError(
          f'An optimizer of {type(task).__name__} has gradient_accumulation'
          f'_steps={inner.gradient_accumulation_steps}, which Keras cannot '
          'run on more than one replica: leave it out, and set '
          'config.accumulate_steps (built-in tasks) or call ctx.accumulate '
          'in train_step.')


class EmaWeights:
  """Swaps a task's trained variables with their moving averages."""

  def __init__(self, task: task_lib.Task, strategy: tf.distribute.Strategy):
    self._strategy = strategy
    self._pairs = _pairs(task)
    self._swap = tf.function(self._swap_all, autograph=False)

  def swap(self) -> None:
    """Exchanges the variables with their averages (again: back)."""
    if self._pairs:
      with self._strategy.scope():
        self._swap()

  @contextlib.contextmanager
  def swapped(self):
    """Within it, the task's models hold the averages."""
    self.swap()
    try:
      yield
    finally:
      self.swap()

  def _swap_all(self) -> None:
    for variable, average in self._pairs:
      self._strategy.extended.update(variable, _exchange, args=(average,))


def _exchange(variable: tf.Variable, average: tf.Variable) -> None:
  old = tf.identity(variable)
  variable.assign(average)
  average.assign(old)


def _pairs(task: task_lib.Task) -> list[tuple[tf.Variable, tf.Variable]]:
  """(trained variable, its average) of every optimizer that keeps an EMA."""
  pairs, seen = [], set()
  for value in task_lib.attribute_values(task):
    if (not isinstance(value, keras.optimizers.Optimizer) or
        id(value) in seen):
      continue
    seen.add(id(value))
    value = getattr(value, 'inner_optimizer', value)  # LossScaleOptimizer.
    averages = getattr(value, '_model_variables_moving_average', None)
    if not value.use_ema or not averages:
      continue
    trained = value._trainable_variables  # pylint: disable=protected-access
    for variable, average in zip(trained, averages):
      pairs.append((_tf_variable(variable), _tf_variable(average)))
  return pairs


def _tf_variable(variable):
  return variable.value if isinstance(variable, keras.Variable) else variable
