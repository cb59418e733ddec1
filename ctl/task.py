"""The task API: the user owns the step and the data; ctl owns the loop.

A task is a class named in the config (`config.task = 'my_module:MyTask'`):

    class MyTask(ctl.Task):
      def build(self):                      # inside strategy.scope()
        self.model = keras.Sequential([...])
        self.optimizer = keras.optimizers.Adam(1e-3)
        self.eval_metrics = [keras.metrics.SparseCategoricalAccuracy()]

      def train_data(self, context):        # per input pipeline
        return ctl.InMemory((x, y))         # or a tf.data.Dataset of
                                            # per-replica batches
      def eval_data(self, context):
        return {'test': ctl.InMemory((x_test, y_test))}

      def train_step(self, batch, ctx):     # on every replica
        ...tape, loss, gradients, apply...
        return {'loss': loss}               # scalars, averaged in the log

      def eval_step(self, batch, ctx):
        ...
        return {'loss': loss}

Everything `build` assigns to the task (models, optimizers, variables,
metrics, lists and dicts of them) is checkpointed. ctl runs `steps_per_loop`
steps in one tf.function, saves, stops on SIGTERM, resumes exactly, logs,
summarises and evaluates, on one device, several, or several workers.
"""

from collections.abc import Callable, Mapping, Sequence
import keyword
import re
from typing import Any

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from ctl import metric_writers as metric_writers_lib
from ctl import step_context
from ctl.data import in_memory
from ctl import actions as actions_lib

InMemory = in_memory.InMemory
# What train_data / eval_data may return for one set.
Data = tf.data.Dataset | InMemory


Image = metric_writers_lib.Image
Histogram = metric_writers_lib.Histogram
# Its own module (ctl/step_context.py); ctl.task.StepContext still names it.
StepContext = step_context.StepContext


class Task(tf.Module):
  """A training task: subclass it and write the hooks.

  Required: `build`, `train_data`, `train_step`. Evaluation: `eval_data`
  with `eval_step`, optionally `eval_end`.

  Attributes ctl sets before build (for learning-rate schedules):
    steps_per_epoch, total_steps, global_batch_size.

  Attributes a task may set in build:
    train_metrics: Keras metrics updated in train_step; read, logged and
      reset at every report, reduced over every replica and worker.
    eval_metrics: the same for eval_step; reset before each eval set.
  """

  train_metrics: Sequence[keras.metrics.Metric] = ()
  eval_metrics: Sequence[keras.metrics.Metric] = ()
  # Whether config.jit_compile='auto' may compile this task's steps with
  # XLA (steps.resolve_xla): only for steps known to compile, as the built-in
  # tasks' are. Set jit_compile explicitly to try XLA on your own.
  auto_xla = False

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(name=type(self).__name__)
    self.config = config
    self.steps_per_epoch = 0
    self.total_steps = 0
    self.global_batch_size = config.batch_size

  def build(self) -> None:
    """Creates models, optimizers, metrics and any state, as attributes.

    Runs inside `strategy.scope()`. Build optimizers' slots here
    (`optimizer.build(model.trainable_variables)`) so that a checkpoint
    restores them.
    """
    raise NotImplementedError

  def train_data(self, context: tf.distribute.InputContext) -> Data:
    """Training data for one input pipeline (one per worker); called
    before build.

    Returns either ctl.InMemory (arrays; ctl shuffles and batches them,
    and resumes exactly at any step), or a tf.data.Dataset of per-replica
    batches (`context.get_per_replica_batch_size(global_batch_size)`),
    sharded by `context.input_pipeline_id`. A dataset that ends is
    repeated: one pass is an epoch.
    """
    raise NotImplementedError

  def train_steps_per_epoch(self) -> int | None:
    """Steps in an epoch of train_data, when ctl cannot count them (an
    endless dataset that counts its own epochs); called after train_data.
    None: config.steps_per_epoch, or else one pass of the dataset."""
    return None

  def eval_data(self, context: tf.distribute.InputContext
                ) -> Data | Mapping[str, Data] | None:
    """Evaluation data: one set, or {name: set}; None for no evaluation.

    Each set is one pass: a finite dataset of per-replica batches, or
    ctl.InMemory.
    """
    del context
    return None

  def train_step(self, batch: Any, ctx: StepContext) -> Mapping[str, tf.Tensor]:
    """Trains on one replica's batch; returns scalar logs.

    Runs in replica context on every replica. The logs are averaged over
    replicas and steps and logged and summarised.
    `tf.summary` calls here are written by the chief at the summary
    interval.
    """
    raise NotImplementedError

  def eval_step(self, batch: Any, ctx: StepContext) -> Mapping[str, tf.Tensor]:
    """Evaluates one replica's batch.

    Returns scalars, averaged over the pass (weighted by examples), and
    optionally tensors of one row per example (predictions, labels), which
    are gathered over the whole pass and given to `eval_end`.
    """
    raise NotImplementedError

  def eval_end(self, name: str, outputs: Mapping[str, np.ndarray],
               results: Mapping[str, Any]
               ) -> Mapping[str, float | Image | Histogram]:
    """Called after each pass over eval set `name` (every set, '' for a
    task's one set): reduces its per-example outputs (AUC, a confusion
    matrix; {} when eval_step returns none) and may read the pass's
    results so far (its logs' means and eval_metrics). Returns more
    results: scalars, Image or Histogram."""
    del name, outputs, results
    return {}

  def loop_logs(self) -> Mapping[str, tf.Tensor]:
    """Scalar logs computed once per loop of steps, not in every step (e.g.
    the learning rate): inside the loop's tf.function, in cross-replica
    context. The last loop's values are reported."""
    return {}

  def actions(self) -> Sequence[actions_lib.Action]:
    """The task's own actions: work between loops of steps (ctl.Action),
    run after ctl's (the log line, evaluation) and before the checkpoint.
    Called once, after build()."""
    return []

  def metric_writers(self) -> Sequence[metric_writers_lib.MetricWriter]:
    """The task's own sinks (ctl.MetricWriter): each gets, on the chief,
    every logged value as metrics.csv names it (`train/<name>` at each log
    line, `eval/<name>` at each evaluation, `workers/<i>/<phase>_ms`),
    is flushed after each, and closed at the end of training. Called once,
    after build(), on the chief only."""
    return []

  def serving_signature(self) -> Callable | None:
    """What an exported SavedModel serves (`--mode=export`, ctl.load).

    Returns a tf.function with an `input_signature` that takes raw inputs,
    as the data comes before the pipeline's preprocessing (put that
    preprocessing inside), and returns a tensor or a dict of tensors. It
    runs on the restored task outside any strategy and may use the task's
    models and variables. None: no SavedModel (the .keras files are still
    written).

    Default: the task's only Keras model, called on its own inputs
    (`missing_signature` says why a task has none).
    """
    model, _ = _model_to_serve(self)
    if model is None:
      return None
    [inputs] = model.inputs
    spec = tf.TensorSpec(inputs.shape, inputs.dtype, name='inputs')
    return tf.function(lambda inputs: model(inputs, training=False),
                       input_signature=[spec], autograph=False)

  def models(self) -> list[keras.Model]:
    """The Keras models among the task's attributes, each once (for
    checkpoints, export and XLA's choice)."""
    found = {}
    for value in attribute_values(self):
      if isinstance(value, keras.Model):
        found.setdefault(id(value), value)
    return list(found.values())


def own_attribute_names(task: Task) -> list[str]:
  """The names of the task's instance attributes, tf.Module's own aside."""
  return [name for name in vars(task) if not name.startswith('_self_')]


def attribute_values(task: Task) -> list[Any]:
  """The task's attribute values, lists, tuples and dicts opened.

  tf.Module's own tracking attributes (`_self_*`, which hold every tracked
  value again) are left out.
  """
  found, pending = [], [vars(task)[name] for name in own_attribute_names(task)]
  while pending:
    value = pending.pop()
    if isinstance(value, Mapping):
      pending.extend(value.values())
    elif isinstance(value, (list, tuple)):
      pending.extend(value)
    else:
      found.append(value)
  return found


def _model_to_serve(task: Task) -> tuple[keras.Model | None, str]:
  """(the model the default serving_signature serves, '') or (None, why
  there is none)."""
  models = task.models()
  if len(models) != 1:
    return None, f'it holds {len(models)} Keras models, not one'
  try:
    inputs = models[0].inputs
  except (AttributeError, ValueError):  # A subclassed model.
    return None, ('its model is a subclassed keras.Model, whose inputs '
                  'Keras does not know')
  if not inputs or len(inputs) != 1:
    names = ', '.join(_input_names(inputs or []))
    return None, (f'its model takes {len(inputs or [])} inputs ({names}), '
                  'and the default serves a model of one input')
  return models[0], ''


def missing_signature(task: Task) -> str:
  """Why the task has no serving signature and what to write, in one
  sentence: for --mode=export's warning and ctl.load's serve()."""
  name = type(task).__name__
  if type(task).serving_signature is not Task.serving_signature:
    return f'{name}.serving_signature() returned None'
  _, why = _model_to_serve(task)
  return (f'{name} has no serving_signature() of its own and {why}: write '
          f'one in {name}, e.g. {_signature_example(task)} '
          '(README.md, "Export")')


def _signature_example(task: Task) -> str:
  """`def serving_signature(self): ...` for the task's model, on one line:
  its inputs as TensorSpecs, when Keras knows them."""
  models = task.models()
  attribute = next((key for key in own_attribute_names(task)
                    if models and vars(task)[key] is models[0]), 'model')
  try:
    inputs = models[0].inputs or []
  except (AttributeError, ValueError, IndexError):
    inputs = []
  if len(inputs) < 2:
    arguments, specs = ['inputs'], ["tf.TensorSpec([None, ...], tf.float32, "
                                    "name='inputs')"]
    called = 'inputs'
  else:
    arguments = _input_names(inputs)
    specs = [f'tf.TensorSpec({list(tensor.shape)}, tf.{tensor.dtype}, '
             f'name={argument!r})'
             for argument, tensor in zip(arguments, inputs)]
    called = f'[{", ".join(arguments)}]'
  return (f'`def serving_signature(self): return tf.function(lambda '
          f'{", ".join(arguments)}: self.{attribute}({called}, '
          f'training=False), input_signature=[{", ".join(specs)}])`')


def _input_names(inputs) -> list[str]:
  """Python names for a model's inputs: their Keras names where those are
  names, else input_1, input_2..."""
  names = []
  for index, tensor in enumerate(inputs, 1):
    name = re.sub(r'\W', '_', getattr(tensor, 'name', '') or '')
    if not name.isidentifier() or keyword.iskeyword(name) or name in names:
      name = f'input_{index}'
    names.append(name)
  return names
