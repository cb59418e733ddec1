"""Evaluation outside the training loop: `--mode=evaluate` and the side-car.

`evaluate_checkpoint` evaluates one checkpoint (the latest, or one named)
on every eval set. `evaluate_continuously` is the side-car evaluator of
TensorFlow's multi-worker tutorials (`--mode=evaluate_continuously`, or the
`evaluator` task of TF_CONFIG): it evaluates each checkpoint the chief
writes, in order, and keeps the best.

Both run on this process's own devices, outside any training collective,
and never write into checkpoints/: a checkpoint is read from hard links
(else copies) of its files in workdir/eval/.reading/, so training may
rotate it away meanwhile. Summaries go to workdir/eval (a subdirectory per
eval set) at the checkpoint's step; the last evaluation's results to
workdir/eval/results.json.
"""

import os
import time

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import config as config_lib
from ctl import errors
from ctl import metric_writers
from ctl import storage
from ctl.checkpoints import best as best_lib
from ctl.checkpoints import files as checkpoint_files
from ctl.cluster import distribution
from ctl.runtime import tf_process
from ctl.runtime import workdir as workdir_lib
from ctl.training import assemble as assemble_lib
from ctl.training import evaluation
from ctl.training import report

# Seconds between two looks for a new checkpoint (reading a small file).
POLL_SECONDS = 1.0


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str,
                        checkpoint: str = '') -> dict:
  """Evaluates one checkpoint on every eval set; changes nothing else.

  Args:
    config: the run's config.
    workdir: the run's workdir (summaries and results go to its eval/).
    checkpoint: a checkpoint path prefix; '' for the workdir's latest.

  Returns:
    {'step', 'checkpoint', 'eval'}, as written to workdir/eval/results.json.

  Raises:
    CtlError: no checkpoint, or one that does not fit the task.
  """
  path = checkpoint or tf.train.latest_checkpoint(
      workdir_lib.checkpoint_dir(workdir))
  if not path:
    raise errors.CtlError(
        f'No checkpoint to evaluate in {workdir_lib.checkpoint_dir(workdir)}:'
        ' train first, or name one with --checkpoint=PATH.')
  if not storage.exists(f'{path}.index'):
    raise errors.CtlError(f'Checkpoint {path} does not exist (no '
                          f'{path}.index): name one with --checkpoint=PATH.')
  side = _SideEvaluation(config, workdir)
  try:
    return side.evaluate(path)
  finally:
    side.close()


def evaluate_continuously(config: ml_collections.ConfigDict, workdir: str,
                          strategy: tf.distribute.Strategy | None = None
                          ) -> dict:
  """Evaluates each new checkpoint in workdir until training ends.

  Stops by itself once it evaluated the checkpoint of training's last step
  (config's total steps), or after config.evaluation.timeout_seconds
  without a new checkpoint. A checkpoint rotated away before it was read is
  skipped, with a log line. SIGTERM stops it between checkpoints (exit
  42); restarted, it goes on after the last checkpoint it evaluated.

  Returns:
    The last evaluation's results (as in workdir/eval/results.json), and
    'finished': whether it was of training's final checkpoint.

  Raises:
    Preempted: SIGTERM stopped it.
  """
  side = _SideEvaluation(config, workdir, strategy)
  directory = workdir_lib.checkpoint_dir(workdir)
  timeout = config.evaluation.timeout_seconds
  last = side.last_results() or {'step': -1}
  logging.info('Evaluating each new checkpoint in %s after step %d, until '
               'step %d', directory, last['step'], side.total_steps)
  waiting_since = time.monotonic()
  try:
    with tf_process.StopSignal() as stop_signal:
      while last['step'] < _final_step(workdir, side.total_steps):
        listed = checkpoint_files.listed(directory)
        pending = [(step, path) for step, path in listed
                   if step > last['step']]
        _log_rotated_away(listed, pending, last['step'],
                          config.intervals.keep_checkpoints)
        for step, path in pending:
          if stop_signal.requested:
            break
          last = side.evaluate(path) or {**last, 'step': step}
          waiting_since = time.monotonic()
        if stop_signal.requested:
          raise errors.Preempted(
              'SIGTERM: the evaluator stopped after evaluating step '
              f'{last["step"]}; run it again to go on from there.')
        if pending:
          continue
        if timeout and time.monotonic() - waiting_since > timeout:
          logging.warning('No new checkpoint for %g s '
                          '(config.evaluation.timeout_seconds): stopping.',
                          timeout)
          break
        time.sleep(POLL_SECONDS)
  finally:
    side.close()
  logging.info('The evaluator is done: last evaluated step %d.', last['step'])
  return {**last,
          'finished': last['step'] >= _final_step(workdir, side.total_steps)}


def _final_step(workdir: str, total_steps: int) -> int:
  """Training's last step: total_steps, or where an action stopped it
  (its results.json says so)."""
  results = workdir_lib.read_results(workdir) or {}
  return (results.get('stopped') or {}).get('step', total_steps)


def _log_rotated_away(listed, pending, last_step: int,
                      keep_checkpoints: int) -> None:
  """Says when checkpoints may have been rotated away unread: the oldest
  kept is new, and training keeps no more than keep_checkpoints (the
  evaluator was down, started late, or slower than training)."""
  if (pending and pending[0] == listed[0] and
      len(listed) >= keep_checkpoints):
    logging.warning(
        'Skipped any checkpoints written after step %d and before step %d: '
        'training rotated them away (intervals.keep_checkpoints=%d) before '
        'this evaluator read them (it was not running, or slower than '
        'training).', max(last_step, 0), pending[0][0], keep_checkpoints)


class _SideEvaluation:
  """A task built on this process's devices, evaluated at checkpoints."""

  def __init__(self, config, workdir, strategy=None):
    config_lib.validate(config)
    if config.deterministic:
      tf.config.experimental.enable_op_determinism()
    strategy = strategy or distribution.local_strategy(config.distribution)
    self._workdir = workdir
    self._eval_dir = workdir_lib.summary_dir(workdir, 'eval')
    self._assembled = assemble_lib.assemble_locally(config, strategy)
    self.total_steps = self._assembled.length.total_steps
    self._evaluator = evaluation.Evaluator(
        strategy=strategy, task=self._assembled.task,
        context=self._assembled.context,
        eval_batch_size=self._assembled.length.eval_batch_size,
        seed=config.seed, autograph=config.autograph,
        make_writer=lambda name: report.eval_writer(
            self._eval_dir, name, True))
    if not self._evaluator.has_data():
      raise errors.CtlError(
          f'Task {config.task!r} has no eval_data: there is nothing to '
          'evaluate.')
    self._best = best_lib.BestCheckpoint(workdir,
                                         config.evaluation.best_metric,
                                         config.evaluation.best_mode)

  def last_results(self) -> dict | None:
    return storage.read_json(workdir_lib.eval_results_path(self._workdir))

  def evaluate(self, path: str) -> dict | None:
    """Evaluates checkpoint `path` and keeps it if it is the best.

    Returns:
      The results, or None when the checkpoint was gone before it was read.
    """
    step = checkpoint_files.step_of(path)
    # Beside the checkpoints, where a hard link costs nothing; on an
    # object store, a local copy in a folder of its own, removed after.
    local = storage.is_local(self._eval_dir)
    if local:
      reading = os.path.join(self._eval_dir, '.reading')
      storage.makedirs(reading)
    else:
      reading = workdir_lib.make_scratch_folder('reading')
    snapshot = os.path.join(reading, f'ckpt-{step}')
    if not checkpoint_files.snapshot_checkpoint(path, snapshot):
      logging.warning('Skipped checkpoint %s: it was deleted (rotated away '
                      'by keep_checkpoints) before it could be read.', path)
      if not local:
        storage.remove(reading)
      return None
    try:
      self._assembled.restore(snapshot)
      results = {'step': step, 'checkpoint': path,
                 'eval': self._evaluator.evaluate(step)}
      storage.write_json(workdir_lib.eval_results_path(self._workdir),
                             metric_writers.json_ready(results))
      if self._best.improves(results['eval']):
        self._best.keep(step, results['eval'], lambda prefix:
                        checkpoint_files.copy_checkpoint(snapshot, prefix))
    finally:
      checkpoint_files.remove_checkpoint(snapshot)
      if not local:
        storage.remove(reading)
    return results

  def close(self) -> None:
    self._evaluator.close()
