"""The best checkpoint by an eval metric, kept in workdir/best/.

    workdir/best/ckpt-<step>.*   the best checkpoint (a whole training one)
    workdir/best/best.json       its step, the metric, its value and every
                                 eval metric of that evaluation

A new best is written under its own name first, checked whole, then
best.json is replaced atomically, then the older files are deleted: a kill
or a failed write (a full disk) at any moment leaves best.json naming a
whole checkpoint. Training's checkpoint rotation (`keep_checkpoints`) never
touches this folder, and a restarted trainer or side-car evaluator reads
best.json to know the value to beat.

Should best.json name files that are not whole (written by an older ctl, or
deleted by hand), the training checkpoint of the same step, while it
exists, has the same contents: readers use it, and a restarted trainer
copies it back into best/ (`repair`). Without it, the best is lost: a
restarted trainer's next evaluation keeps a new one.
"""

from collections.abc import Callable, Mapping
import math
import os

from absl import logging

from ctl import errors
from ctl import storage
from ctl.checkpoints import files as checkpoint_files
from ctl.runtime import workdir as workdir_lib


def read(workdir: str) -> dict | None:
  """best.json's content, or None when no best was kept yet."""
  return storage.read_json(workdir_lib.best_record_path(workdir))


def _paths(workdir: str, kept: Mapping) -> tuple[str, str]:
  """(the best's path in best/, the training checkpoint of its step)."""
  return (os.path.join(workdir_lib.best_dir(workdir), kept['checkpoint']),
          os.path.join(workdir_lib.checkpoint_dir(workdir),
                       f'ckpt-{kept["step"]}'))


def kept_checkpoint(workdir: str) -> str | None:
  """The path of the best checkpoint's whole files: in best/, else the
  training checkpoint of its step; None when no best was kept.

  Raises:
    CtlError: best.json names files that are not whole, and the training
      checkpoint of that step is gone too.
  """
  kept = read(workdir)
  if kept is None:
    return None
  for path in _paths(workdir, kept):
    if checkpoint_files.is_whole(path):
      return path
  raise errors.CtlError(
      f'The best checkpoint, {_paths(workdir, kept)[0]} (step '
      f'{kept["step"]}, {kept["metric"]} {kept["value"]}), is not whole '
      '(a write that failed, e.g. on a full disk, or files deleted), and '
      f'{workdir_lib.checkpoint_dir(workdir)} no longer has that step: '
      'read the latest checkpoint instead (--checkpoint=latest), or train '
      'on in this workdir, whose next evaluation keeps a new best.')


def flat_metrics(results: Mapping) -> dict[str, float]:
  """Eval results as {name: value}: 'accuracy', or 'set/accuracy' for a
  task with several eval sets; only numbers (no images)."""
  flat = {}
  for key, value in results.items():
    if isinstance(value, Mapping):
      flat.update({f'{key}/{name}': inner
                   for name, inner in flat_metrics(value).items()})
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      flat[key] = float(value)
  return flat


class BestCheckpoint:
  """Decides whether an evaluation beats the best so far, and keeps it."""

  def __init__(self, workdir: str, metric: str, mode: str,
               is_chief: bool = True, reread: bool = True):
    """Args: workdir; metric and mode as config.evaluation.best_metric and
    best_mode ('' metric: keep none); is_chief: whether this process
    writes the workdir (others only take part in the save); reread: read
    best.json before each decision, in case a side-car evaluator beside
    this process kept one (not with several workers: they must decide
    alike, as each takes part in the save)."""
    self._reread = reread
    self._workdir = workdir
    self._directory = workdir_lib.best_dir(workdir)
    self._record = workdir_lib.best_record_path(workdir)
    self._is_chief = is_chief
    self._metric = metric
    self._mode = mode
    self._best = self._kept_value()
    self._pending = None  # A best whose files are being written.

  def _kept_value(self) -> float | None:
    """The value in best.json, when it is of this metric and its files
    are whole or can be repaired (every worker sees the same files, so
    all decide alike)."""
    kept = read(self._workdir) if self._metric else None
    if not kept or kept['metric'] != self._metric:
      return None
    if not any(checkpoint_files.is_whole(path)
               for path in _paths(self._workdir, kept)):
      return None
    return kept['value']

  def repair(self) -> None:
    """Makes best/ whole when best.json names files that are not: copies
    the training checkpoint of its step back, or says the best is lost
    (the next evaluation keeps a new one). For the chief, before training.
    """
    kept = read(self._workdir)
    if kept is None:
      return
    path, source = _paths(self._workdir, kept)
    if checkpoint_files.is_whole(path):
      return
    if not checkpoint_files.is_whole(source):
      logging.warning(
          'The best checkpoint %s that %s names is not whole, and %s is '
          'gone: that best is lost; the next evaluation keeps a new one.',
          path, self._record, source)
      return
    checkpoint_files.remove_checkpoint(path)
    checkpoint_files.copy_checkpoint(source, path)
    logging.warning('The best checkpoint %s that %s names was not whole: '
                    'copied it back from %s.', path, self._record, source)

  @property
  def enabled(self) -> bool:
    return bool(self._metric)

  def record(self) -> dict | None:
    """best.json's content, once `finish()` wrote it (results.json's
    `best`); None without a best, or on a worker that does not write it."""
    return read(self._workdir) if self._is_chief and self.enabled else None

  def improves(self, results: Mapping) -> bool:
    """Whether these eval results beat the best kept (any does, at first).

    Raises:
      ConfigError: the metric is not among the results.
    """
    if not self.enabled:
      return False
    value = self._value_of(results)
    if math.isnan(value):
      return False
    if self._reread and self._pending is None:
      self._best = self._kept_value()
    if self._best is None:
      return True
    return value > self._best if self._mode == 'max' else value < self._best

  def keep(self, step: int, results: Mapping,
           write: Callable[[str | None], None],
           wait: Callable[[], None] | None = None) -> None:
    """Writes checkpoint `step` as the best and records it in best.json.

    Args:
      step: the evaluated checkpoint's step.
      results: its eval results.
      write: writes the checkpoint's files at the path prefix it is given
        (another worker's write is given None).
      wait: for a write that returns before its files are complete (an
        asynchronous save), returns once they are: best.json is then
        written at the next evaluation or at `finish()`, so that it never
        names files still being written, and training does not wait.
    """
    self.finish()
    value = self._value_of(results)
    self._best = value
    if not self._is_chief:
      write(None)
      return
    # Logged now, at the evaluation that found it: the files may be
    # written in the background, and best.json names them once whole.
    logging.info('New best %s %s at step %d: keeping it in %s', self._metric,
                 value, step, self._directory)
    storage.makedirs(self._directory)
    write(os.path.join(self._directory, f'ckpt-{step}'))
    self._pending = (step, value, flat_metrics(results), wait)
    if wait is None:
      self.finish()

  def finish(self) -> None:
    """Records the best whose files were being written, once they are."""
    if self._pending is None:
      return
    step, value, metrics, wait = self._pending
    self._pending = None
    if wait is not None:
      wait()
    name = f'ckpt-{step}'
    path = os.path.join(self._directory, name)
    if not checkpoint_files.is_whole(path):
      # Its write failed (wait() raised that error, unless TensorFlow raised
      # it before), or its files were deleted: best.json keeps naming the
      # previous best, whose files stay.
      logging.warning('The best checkpoint of step %d is not whole (its '
                      'write failed, or its files were deleted): %s still '
                      'names the previous best, if any.', step, self._record)
      checkpoint_files.remove_checkpoint(path)
      return
    checkpoint_files.make_durable(path)  # Before best.json names it.
    storage.write_json(self._record, {
        'step': step, 'checkpoint': name, 'metric': self._metric,
        'mode': self._mode, 'value': value, 'eval': metrics})
    # Older bests, and what a kill left of any write (TensorFlow writes a
    # checkpoint's parts into a ckpt-<step>_temp folder first).
    for file in storage.listdir(self._directory):
      if file.startswith('ckpt-') and not file.startswith(f'{name}.'):
        storage.remove(os.path.join(self._directory, file))
    logging.info('Best checkpoint of step %d written: %s', step,
                 self._record)

  def _value_of(self, results: Mapping) -> float:
    return metric_value(results, self._metric, 'evaluation.best_metric',
                        "or '' to keep no best checkpoint")


def metric_value(results: Mapping, metric: str, field: str,
                 otherwise: str) -> float:
  """The eval metric `metric` ('name' or 'set/name') of eval results.

  Raises:
    ConfigError: naming config.<field> and the metrics there are, when
      the results have no such metric; `otherwise` says what else to do.
  """
  metrics = flat_metrics(results)
  if metric not in metrics:
    raise errors.ConfigError(
        f'config.{field}={metric!r} is not an eval metric of this task; it '
        f'has {sorted(metrics)}. Set one of those, {otherwise}.')
  return metrics[metric]
