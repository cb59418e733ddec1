"""One pass over each of a task's eval sets: logs, metrics, whole-pass results.

A tf.data set is read through `distribute_datasets_from_function`, whose
iterator agrees across workers on the end of the data (a replica without
data gets an empty batch, on which eval_step is not called). A `ctl.InMemory` set needs no iterator: each
replica gathers its share of each batch from the arrays (`InMemory.
eval_batch`), as training does. Per batch, a tf.function runs the task's
eval_step on every replica; scalar logs are summed locally, weighted by
examples, and all-reduced once per pass; per-example outputs are gathered
from every replica and worker and handed to the task's `eval_end` at the
end.
"""

from collections.abc import Callable, Mapping
import contextlib
from typing import Any

from absl import logging
import ml_collections
import numpy as np
import tensorflow as tf

from ctl import actions as actions_lib
from ctl import metric_writers
from ctl import task as task_lib
from ctl import task_hooks
from ctl.checkpoints import best as best_lib
from ctl.checkpoints import manager as checkpoint_manager
from ctl.cluster import watchdog as watchdog_lib
from ctl.data import in_memory
from ctl.runtime import workdir as workdir_lib
from ctl.training import assemble
from ctl.training import job as job_lib
from ctl.training import report
from ctl.training import task_calls

# The name of the one eval set of a task whose eval_data returns one set.
SINGLE = ''



class Evaluator:
  """Evaluates the task's current state on every eval set."""

  def __init__(self, *, strategy: tf.distribute.Strategy,
               task: task_lib.Task, context: tf.distribute.InputContext,
               eval_batch_size: int, seed: int,
               make_writer: Callable[[str], metric_writers.MetricWriter],
               autograph: bool = True,
               watchdog: watchdog_lib.Watchdog | None = None):
    """Args as named; make_writer(set name) makes a set's writer (its log
    line, its summaries: report.eval_writer);
    the watchdog (training's) is told of each batch, and does not count
    the eval sets' making."""
    self._strategy = strategy
    self._watchdog = watchdog
    self._task = task
    self._eval_end = task_hooks.eval_end_of(task)  # An old form called so.
    self._context = context
    self._eval_batch_size = eval_batch_size
    self._seed = seed
    self._make_writer = make_writer
    self._autograph = autograph
    # {name: distributed dataset or ctl.InMemory}, made at first use.
    self._sets = None
    self._writers = {}
    self._functions = {}
    self._metrics = task_calls.MetricReader(task.eval_metrics)
    self._sum_over_workers = task_calls.WorkerSum(strategy)

  def has_data(self) -> bool:
    """Whether the task has eval sets (builds them the first time)."""
    return bool(self._eval_sets())

  def evaluate(self, step: int) -> dict[str, Any]:
    """Evaluates every set; writes the results at step (logs, summaries).

    Returns:
      The results of the one set, or {set name: results} for several.
    """
    results = {}
    for name, dataset in self._eval_sets().items():
      results[name] = self._evaluate_set(name, dataset, step)
      metric_writers.write_results(self._writer(name), step, results[name])
    return results[SINGLE] if SINGLE in results else results

  def close(self) -> None:
    for writer in self._writers.values():
      writer.close()

  def _writer(self, name: str) -> metric_writers.MetricWriter:
    if name not in self._writers:
      self._writers[name] = self._make_writer(name)
    return self._writers[name]

  def _eval_sets(self) -> dict[str, Any]:
    """The task's eval sets, made once: tf.data sets distributed, in-memory
    ones held as tensors."""
    if self._sets is None:
      # Reading data waits on no peer.
      with (self._watchdog.paused() if self._watchdog else
            contextlib.nullcontext()):
        sets = self._task.eval_data(self._context)
        if sets is None:
          sets = {}
        elif not isinstance(sets, Mapping):
          sets = {SINGLE: sets}
        self._sets = {name: self._prepare(data) for name, data in
                      sets.items()}
    return self._sets

  def _prepare(self, data):
    """A tf.data set distributed; an in-memory one held as tensors."""
    if isinstance(data, in_memory.InMemory):
      data.materialize()
      return data
    # Built for this worker's pipeline: each worker returns its own.
    return self._strategy.distribute_datasets_from_function(
        lambda context: data)

  def _evaluate_set(self, name: str, data, step: int) -> dict[str, Any]:
    """One pass over a set; its logs, metrics and eval_end results."""
    self._metrics.reset()
    sums, outputs = {}, {}
    for batch_sums, batch_outputs in self._run_batches(name, data, step):
      if self._watchdog:
        self._watchdog.beat()
      for key, value in batch_sums.items():
        sums[key] = sums.get(key, 0.0) + value.numpy()
      for key, value in batch_outputs.items():
        outputs.setdefault(key, []).append(value.numpy())
    results = self._mean_over_workers(sums)
    results.update(self._metrics.read())
    # Called for every set, with or without per-example outputs.
    results.update(self._eval_end(name, {
        key: np.concatenate(values) for key, values in outputs.items()},
                                  dict(results)))
    return results

  def _run_batches(self, name: str, data, step: int):
    """Evaluates each batch of a set: yields its (log sums, per-example
    outputs) on this worker."""
    step = tf.constant(step, tf.int64)
    if not isinstance(data, in_memory.InMemory):
      run_batch = self._function(name, lambda batch: batch)
      for batch in data:
        yield run_batch(batch, step)
      return
    size = self._eval_batch_size
    for index, full in data.eval_batches(size):
      # Traced apart: a full batch has a static size.
      run_batch = self._function((name, full), lambda index, full=full: (
          data.eval_batch(index, size, full)))
      yield run_batch(tf.constant(index, tf.int64), step)

  def _function(self, function_key, read: Callable) -> Callable:
    """The tf.function that evaluates one batch: each replica's batch is
    read(input) (the input: a distributed batch, or an in-memory batch's
    index); one per function_key."""
    if function_key not in self._functions:
      def run_batch(batch_input, step):
        outputs = self._strategy.run(
            lambda batch_input, step: self._eval_replica(read(batch_input),
                                                         step),
            args=(batch_input, step))
        scalars, per_example = outputs
        local = {key: tf.add_n(self._strategy.experimental_local_results(v))
                 for key, v in scalars.items()}
        gathered = {key: self._strategy.gather(value, axis=0)
                    for key, value in per_example.items()}
        return local, gathered
      self._functions[function_key] = tf.function(
          run_batch, autograph=False, reduce_retracing=True)
    return self._functions[function_key]

  def _eval_replica(self, batch, step):
    """This replica's (weighted scalar logs, per-example outputs) of
    eval_step; a replica without examples (past the end of a set) does not
    call it: an empty batch, whose other dimensions may be 0 too, fails
    some models (a Keras GRU over 0 time steps)."""
    ctx = task_lib.StepContext(
        global_batch_size=self._eval_batch_size, step=step, seed=self._seed,
        training=False)
    traced = []  # The outputs eval_step gives, for the empty case's form.

    def evaluate():
      outputs = task_calls.check_logs(
          task_calls.call_step(
              task_calls.task_function(self._task.eval_step, self._autograph),
              batch, ctx, 'eval_step'),
          'eval_step', scalars_only=False)
      traced.append(outputs)
      return outputs

    outputs = tf.cond(task_calls.batch_size(batch) > 0, evaluate,
                      lambda: _no_examples(traced[-1]))
    scalars = {key: value for key, value in outputs.items()
               if value.shape.rank == 0}
    per_example = {key: value for key, value in outputs.items()
                   if value.shape.rank != 0}
    return task_calls.weighted_logs(scalars, batch, 'eval_step'), per_example

  def _mean_over_workers(self, sums: dict[str, float]) -> dict[str, float]:
    """Sums over every worker, divided by the examples: example means."""
    if not sums:
      return {}
    keys = sorted(sums)
    totals = self._sum_over_workers(
        np.array([sums[key] for key in keys], np.float64))
    totals = dict(zip(keys, totals))
    examples = totals.pop(task_calls.EXAMPLES)
    return {key: float(value / examples) if examples else float('nan')
            for key, value in totals.items()}


def _no_examples(outputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """eval_step's outputs for no examples: each scalar 0 (weighted by 0
  examples), each per-example output 0 rows (its other dimensions as
  traced, 0 where unknown)."""
  empty = {}
  for key, value in outputs.items():
    inner = value.shape.as_list()[1:] if value.shape.rank else []
    empty[key] = tf.zeros(
        [] if value.shape.rank == 0 else [0] + [size or 0 for size in inner],
        value.dtype)
  return empty


class TrainingEvaluation(actions_lib.Action):
  """The evaluate action: evaluates every eval set and keeps the best
  checkpoint; does nothing when the cluster has an evaluator task, which
  then does both."""

  name = 'evaluate'
  on_every_worker = True

  def __init__(self, evaluator: Evaluator, best: best_lib.BestCheckpoint,
               checkpoint: checkpoint_manager.TrainingCheckpoint, *,
               task: task_lib.Task, strategy: tf.distribute.Strategy,
               when: actions_lib.When, enabled: bool = True):
    """Args as named; checkpoint: the run's, whose state a best is a copy
    of; enabled: False when the cluster's evaluator task evaluates."""
    self._evaluator, self.best = evaluator, best
    self._checkpoint = checkpoint
    self._task, self._strategy = task, strategy
    self.when = when
    self._ema = None  # Made at the first evaluation (optimizers built).
    self._enabled = enabled
    if not enabled:
      logging.info('The cluster\'s evaluator task evaluates the checkpoints: '
                   'training does not evaluate.')
    self.last = None  # The latest results.

  def run(self, event: actions_lib.Event) -> dict | None:
    """As an action: evaluates at the event's step; the results (the loop
    hands them to the work after an evaluation), or None."""
    return self.evaluate(event.step)

  def evaluate(self, step: int) -> dict | None:
    """Evaluates; keeps the best. None without eval data or evaluation."""
    if not self._enabled or not self._evaluator.has_data():
      return None
    if self._ema is None:
      self._ema = assemble.EmaWeights(self._task, self._strategy)
    # With the optimizers' moving averages of the weights, if they keep
    # any; the best checkpoint is written with the training weights.
    with self._ema.swapped():
      self.last = self._evaluator.evaluate(step)
    # Every worker has the same (all-reduced) results, so all decide alike
    # and take part in the save.
    if self.best.improves(self.last):
      self._checkpoint.check_workdir()  # Before writing into it.
      self.best.keep(step, self.last,
                     self._checkpoint.checkpointer.write_copy,
                     wait=self._checkpoint.checkpointer.wait)
    return self.last

  def close(self) -> None:
    """Closes the writers; records a best still being written, once it is."""
    self._evaluator.close()
    self._checkpoint.checkpointer.wait()
    self.best.finish()


def for_training(config: ml_collections.ConfigDict, workdir: str, *,
                 job: job_lib.Job, task: task_lib.Task,
                 context: tf.distribute.InputContext, eval_batch_size: int,
                 checkpoint: checkpoint_manager.TrainingCheckpoint
                 ) -> TrainingEvaluation:
  """A training run's evaluate action, due every config.intervals.eval_steps,
  each epoch, at the end and on request, keeping the best checkpoint."""
  role = job.role
  best = best_lib.BestCheckpoint(
      workdir, config.evaluation.best_metric, config.evaluation.best_mode,
      is_chief=role.is_chief, reread=role.num_workers == 1)
  evaluator = Evaluator(
      strategy=job.strategy, task=task, context=context,
      eval_batch_size=eval_batch_size, seed=config.seed,
      autograph=config.autograph,
      make_writer=lambda name: report.eval_writer(
          workdir_lib.summary_dir(workdir, 'eval'), name, role.is_chief),
      watchdog=job.watchdog)
  return TrainingEvaluation(
      evaluator, best, checkpoint, task=task, strategy=job.strategy,
      when=actions_lib.When(steps=config.intervals.eval_steps, epochs=1,
                            at_end=True, on_request='evaluate'),
      enabled=not role.has_evaluator)
