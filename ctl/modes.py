"""What `python -m ctl.main --mode=...` does with a config and a workdir.

    train                  train, evaluating in the loop; keep the best
                           checkpoint; export when training finishes
                           (the evaluator task of TF_CONFIG evaluates
                           continuously instead)
    evaluate               evaluate one checkpoint (--checkpoint, else the
                           latest) on every eval set; nothing else changes
    evaluate_continuously  the side-car: evaluate each new checkpoint as the
                           chief writes it, keep the best, stop when
                           training has finished
    export                 export the best checkpoint, else the latest (or
                           --checkpoint) as a SavedModel and .keras files
"""

from absl import logging
import ml_collections

from ctl import config as config_lib
from ctl import errors

from ctl.cluster import distribution
from ctl.metric_writers import mlflow_run
from ctl.runtime import studies
from ctl.runtime import tf_process
from ctl.training import checkpoint_evaluation
from ctl.training import run as run_lib


def run(mode: str, config: ml_collections.ConfigDict, workdir: str,
        checkpoint: str = '',
        start_up: tf_process.StartUp | None = None) -> dict:
  """Runs `mode`; returns its results (see each mode's function).

  start_up: training's start-up so far (default: since the process started).
  """
  config_lib.check_utf8('--workdir', workdir)
  config_lib.check_utf8('--checkpoint', checkpoint)
  if mode == 'evaluate':
    return checkpoint_evaluation.evaluate_checkpoint(config, workdir, checkpoint)
  if mode == 'evaluate_continuously':
    results = checkpoint_evaluation.evaluate_continuously(config, workdir)
    if results['finished'] and config.export.at_end:
      _export().export_run(config, workdir)
    return results
  if mode == 'export':
    return {'export': _export().export_run(config, workdir,
                                             checkpoint=checkpoint or 'best')}
  return run_lib.train_and_evaluate(config, workdir,
                                    on_finish=ExportAtEnd(config, workdir),
                                    start_up=start_up)


def _export():
  """ctl/serving/export.py, imported when a run exports: one that does not
  never loads it."""
  from ctl.serving import export  # pylint: disable=g-import-not-at-top
  return export


class ExportAtEnd:
  """Training's export when it finishes (config.export.at_end), called by
  every training task and by the evaluator task (run.train_and_evaluate's
  on_finish)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self._config, self._workdir = config, workdir

  def __call__(self, role: distribution.Role, finished_now: bool,
               results: dict) -> None:
    """Exports where this task should; finished_now: False when training
    had finished before this process; results: the run's (results.json)."""
    config, workdir = self._config, self._workdir
    if not config.export.at_end:
      return
    if studies.was_pruned(results):  # No search keeps a pruned trial's.
      logging.info('Not exported (config.export.at_end): the study\'s '
                   'pruner stopped this trial.')
      return
    # A run that had finished is exported again only if that export was
    # cut short (killed or failed): the same command completes it.
    if not finished_now and _export().is_whole(workdir):
      return
    # With an evaluator task in the cluster, it exports, once it has
    # evaluated the last checkpoint: the best is known only then.
    if role.task_type == 'evaluator' or (role.is_chief and
                                         not role.has_evaluator):
      mlflow_run.log_export(config, workdir,
                            _export().export_run(config, workdir))
    elif not role.has_evaluator:
      _export_beside_the_chief(config, workdir)


def _export_beside_the_chief(config: ml_collections.ConfigDict,
                             workdir: str) -> None:
  """Another worker's export, to a temporary folder it deletes, as in
  TensorFlow's multi-worker tutorials. It reads the chief's checkpoints,
  which the chief may still be writing or replacing: a failure here is
  logged, not raised, as the chief's export is the one kept.
  """
  try:
    _export().export_run(config, workdir, is_chief=False)
  except errors.CtlError as error:
    logging.warning('This worker\'s export (discarded in any case; the '
                    'chief writes the export) failed: %s', error)
