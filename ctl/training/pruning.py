"""A search's trial, from inside: its chief reports the sweep's metric to
the study after each evaluation and stops when the study's pruner says so.

ctl.sweep (ctl/sweep/study.py) sets config.search (storage, study, trial,
metric) in each trial's command; the trainer adds `ReportToStudy` for it,
which runs on the chief alone (only the chief opens the study), so an
N-worker trial reports once per evaluation. A
resumed trial evaluates again at steps it reported before it stopped: those
are not reported again (Optuna keys a trial's intermediate values by step).

Optuna (the extra ctl[sweep]) is imported only for such a trial.
"""

from absl import logging
import ml_collections

from ctl import actions
from ctl import errors
from ctl.checkpoints import best as best_lib
from ctl.runtime import studies


class ReportToStudy(actions.Action):
  """After each evaluation: the metric to the study; a stop if pruned."""

  when = actions.When(after_eval=True)
  on_every_worker = False  # Only the chief talks to the study.

  def __init__(self, storage: str, study_name: str, number: int, metric: str,
               is_chief: bool = True):
    """Opens the study on the chief; the other workers hold the action
    only so that every worker's list of actions is the same."""
    self._metric = metric
    if not is_chief:
      return  # run() is never called here (on_every_worker is False).
    optuna = studies.import_optuna()
    self._study = optuna.load_study(study_name=study_name,
                                    storage=studies.open_storage(storage))
    search = self._study.user_attrs[studies.SEARCH]
    self._study.pruner = studies.make_pruner(search['pruner'],
                                             search['pruner_options'])
    self._trial = optuna.trial.Trial(self._study,
                                     studies.trial_id(self._study, number))

  def run(self, event: actions.Event) -> None:
    value = self._value(event.eval_results or {})
    try:
      self._report(event.step, value)
      pruned = self._trial.should_prune()
    except Exception as error:  # pylint: disable=broad-except
      # The study out of reach costs the trial its pruning, not its run.
      logging.warning('The study did not take step %d\'s eval %s (%s: %s); '
                      'training goes on.', event.step, self._metric,
                      type(error).__name__, str(error)[:200])
      return
    if pruned:
      event.request_stop(
          f'{studies.PRUNED} at step {event.step}: eval {self._metric} '
          f'{value:.6g} '
          "is behind the study's other trials (its pruner)")

  def _value(self, eval_results) -> float:
    """The metric in this evaluation's results.

    Raises:
      ConfigError: a task of one's own whose results lack it (the sweep
        could not know before the first evaluation): the trial fails.
    """
    metrics = best_lib.flat_metrics(eval_results)
    if self._metric not in metrics:
      names = ', '.join(f'eval.{name}' for name in sorted(metrics)) or 'none'
      raise errors.ConfigError(
          f"Sweep.metric 'eval.{self._metric}' is not in this trial's eval "
          f'results (it has: {names}); set Sweep.metric in the sweep file to '
          'one of those.')
    return metrics[self._metric]

  def _report(self, step: int, value: float) -> None:
    reported = self._study._storage.get_trial(  # pylint: disable=protected-access
        self._trial._trial_id).intermediate_values  # pylint: disable=protected-access
    if step in reported:
      logging.info('Step %d was reported to the study before this run '
                   'resumed: not again.', step)
      return
    self._trial.report(value, step)
    logging.info('Reported eval %s %.6g at step %d to the study.',
                 self._metric, value, step)


def from_config(config: ml_collections.ConfigDict,
                is_chief: bool) -> list[actions.Action]:
  """ReportToStudy when ctl.sweep runs this as a search's trial.

  Every worker has it: the loop runs a chief-only action on the chief and
  then agrees its stop request with a collective on every worker, so a
  worker without it would meet the chief's collective with another one
  (an N-worker trial died of "Collective instance ... expected type").
  """
  if not config.search.storage:
    return []
  return [ReportToStudy(config.search.storage, config.search.study,
                        config.search.trial, config.search.metric, is_chief)]
