"""A sweep's results: a table (CSV and printed), a plot and TensorBoard HParams."""

import csv
import dataclasses
import io
import math
import os
from collections.abc import Sequence
from typing import Any

import matplotlib
matplotlib.use('Agg')  # Files only; no display needed.
from matplotlib import pyplot  # pylint: disable=g-import-not-at-top,wrong-import-position
from tensorboard.plugins.hparams import api as hparams_api  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from ctl import hyper  # pylint: disable=g-import-not-at-top,wrong-import-position
from ctl import storage  # pylint: disable=g-import-not-at-top,wrong-import-position
from ctl.runtime import workdir as workdir_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from ctl.sweep import trials as trials_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

_HPARAMS_SUFFIX = '.hparams'


@dataclasses.dataclass(frozen=True)
class Report:
  summary: str  # The printed table.
  all_finished: bool
  best: str | None  # The best trial's name.
  results_csv: str  # Its path.


def write(sweep: hyper.Sweep, trials: Sequence[trials_lib.Trial],
          workdir: str, states: Sequence[str] | None = None) -> Report:
  """Writes results.csv, the plot and the HParams summaries; returns a summary.

  A search's trials come with their states in the study (COMPLETE, PRUNED,
  FAIL, RUNNING): a column of results.csv; a pruned trial is not ranked.
  """
  keys = list(dict.fromkeys(key for trial in trials for key in trial.overrides))
  rows = [_row(trial, sweep.metric) for trial in trials]
  if states is not None:
    rows = [_with_state(row, state) for row, state in zip(rows, states)]
  finished = [row for row in rows
              if row['status'] == 'finished' and row['metric'] is not None]
  ranked = sorted(finished, key=lambda row: row['metric'],
                  reverse=sweep.mode == 'max')
  results_csv = os.path.join(workdir, 'results.csv')
  _write_csv(results_csv, rows, keys)
  plot_path = None
  if finished:
    plot_path = os.path.join(workdir, f'{sweep.metric}.png')
    plot(finished, keys, sweep, plot_path, best=ranked[0])
  _write_hparams(workdir, trials, keys, finished)
  return Report(summary=_summary(sweep, rows, ranked, workdir, plot_path),
                all_finished=all(row['status'] in ('finished', 'pruned')
                                 for row in rows),
                best=ranked[0]['trial'] if ranked else None,
                results_csv=results_csv)


def _row(trial: trials_lib.Trial, metric: str) -> dict[str, Any]:
  """A trial's overrides, status and final numbers."""
  results = workdir_lib.read_results(trial.workdir)
  record = trial.record()
  value = trials_lib.lookup(results, metric) if results else None
  if results is not None and value is None:
    # A task of one's own names its results in its hooks: a metric that
    # never appeared fails the trial, saying what there is instead.
    status = (f'finished without {metric} in its results (it has: '
              f'{", ".join(_result_names(results)) or "none"})')
  elif results is not None:
    status = 'finished'
  elif 'exit_code' in record:
    status = f'exit code {record["exit_code"]}'
  else:
    status = 'not run'
  row = {'trial': trial.name, 'status': status, **trial.overrides,
         'metric': value,
         'step': results['step'] if results else None,
         'wall_seconds': round(record.get('wall_seconds', 0.0), 1),
         'workdir': trial.workdir}
  for name, value in (results or {}).get('eval', {}).items():
    row[f'eval.{name}'] = value
  return row


def _with_state(row: dict[str, Any], state: str) -> dict[str, Any]:
  """A search's row with its trial's state in the study."""
  row = {'state': state, **row}
  if state == 'PRUNED':
    row['status'] = 'pruned'
  elif state == 'RUNNING':
    row['status'] = 'running'
  return row


def _result_names(results: dict) -> list[str]:
  """The names a Sweep.metric can take in a trial's results.json."""
  return ['step', 'epoch', *(f'eval.{name}' for name in
                             sorted((results.get('eval') or {}))
                             if not isinstance(results['eval'][name], dict))]


def _write_csv(path: str, rows: list[dict], keys: list[str]) -> None:
  metrics = sorted({name for row in rows for name in row
                    if name.startswith('eval.')})
  states = ['state'] if any('state' in row for row in rows) else []
  columns = ['trial', *states, 'status', *keys, 'step', *metrics,
             'wall_seconds', 'workdir']
  text = io.StringIO()
  writer = csv.DictWriter(text, columns, extrasaction='ignore')
  writer.writeheader()
  writer.writerows(rows)
  storage.write_text(path, text.getvalue())


def plot(rows: list[dict], keys: list[str], sweep: hyper.Sweep, path: str,
         best: dict) -> None:
  """The metric against each swept key, one panel per key; best in red."""
  figure, axes = pyplot.subplots(1, len(keys) or 1,
                                 figsize=(4.5 * max(len(keys), 1), 3.6),
                                 squeeze=False)
  for axis, key in zip(axes[0], keys):
    values = [row.get(key) for row in rows]
    numeric = all(isinstance(value, (int, float)) and
                  not isinstance(value, bool) for value in values)
    if numeric:
      positions = values
      if min(values) > 0 and max(values) / min(values) >= 20:
        axis.set_xscale('log')
    else:
      labels = sorted({str(value) for value in values})
      positions = [labels.index(str(value)) for value in values]
      axis.set_xticks(range(len(labels)), labels)
    axis.scatter(positions, [row['metric'] for row in rows], color='tab:blue')
    best_position = positions[rows.index(best)]
    axis.scatter([best_position], [best['metric']], color='tab:red',
                 label=f'best: {best["trial"]}', zorder=3)
    axis.set_xlabel(key)
    axis.set_ylabel(sweep.metric)
    axis.grid(alpha=0.3)
  axes[0][0].legend(loc='best', fontsize='small')
  figure.suptitle(f'{sweep.metric} ({sweep.mode} is best), '
                  f'{len(rows)} trials')
  figure.tight_layout()
  image = io.BytesIO()
  figure.savefig(image, dpi=100, format='png')
  storage.write_bytes(path, image.getvalue())
  pyplot.close(figure)


def _write_hparams(workdir: str, trials: Sequence[trials_lib.Trial],
                   keys: list[str], finished: list[dict]) -> None:
  """The HParams dashboard's experiment (sweep dir) and sessions (trials).

  Each is written once: a later run of the sweep adds what is missing.
  """
  if finished and not _has_hparams(workdir):
    metrics = [hparams_api.Metric(name[len('eval.'):], group='eval')
               for name in finished[0] if name.startswith('eval.')]
    _write_summary(workdir, lambda: hparams_api.hparams_config(
        hparams=[hparams_api.HParam(key) for key in keys], metrics=metrics))
  for trial in trials:
    if storage.isdir(trial.workdir) and not _has_hparams(trial.workdir):
      values = {key: _hparam_value(value)
                for key, value in trial.overrides.items()}
      _write_summary(trial.workdir, lambda values=values, trial=trial:
                     hparams_api.hparams(values, trial_id=trial.name))


def _has_hparams(directory: str) -> bool:
  return bool(storage.glob(os.path.join(directory, f'*{_HPARAMS_SUFFIX}')))


def _write_summary(directory: str, write) -> None:
  writer = tf.summary.create_file_writer(directory,
                                         filename_suffix=_HPARAMS_SUFFIX)
  with writer.as_default():
    write()
  writer.close()


def _hparam_value(value: Any) -> bool | int | float | str:
  return value if isinstance(value, (bool, int, float, str)) else str(value)


def _summary(sweep: hyper.Sweep, rows: list[dict], ranked: list[dict],
             workdir: str, plot_path: str | None) -> str:
  lines = [f'{"rank":>4}  {sweep.metric:>14}  {"step":>6}  {"wall s":>7}  trial']
  for rank, row in enumerate(ranked, 1):
    lines.append(f'{rank:>4}  {_number(row["metric"]):>14}  {row["step"]:>6}  '
                 f'{row["wall_seconds"]:>7}  {row["trial"]}')
  for row in rows:
    if row['status'] != 'finished':  # Pruned, failed, running, not run.
      lines.append(f'{"-":>4}  {row["status"]:>14}  {"":>6}  '
                   f'{row["wall_seconds"]:>7}  {row["trial"]}  '
                   f'(log: {os.path.join(row["workdir"], "log.txt")})')
  if ranked:
    lines.append(f'best: {ranked[0]["trial"]} ({sweep.metric} '
                 f'{_number(ranked[0]["metric"])}), in {ranked[0]["workdir"]}')
  lines.append(f'table: {os.path.join(workdir, "results.csv")}' +
               (f'; plot: {plot_path}' if plot_path else ''))
  return '\n'.join(lines)


def _number(value: float | None) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return 'n/a'
  return f'{value:.4f}'
