"""A search, the same in each tool: ctl.sweep against plain Optuna and Keras Tuner.

    python -m benchmarks.bench --sections=search

The search of issue 50, as a new user would try it: ctl's digits CNN
(configs/digits.py, Adam at a constant rate, batch 32, the 359 held-out
digits evaluated after every epoch), the learning rate log-uniform and the
dense layer's width categorical (experiments/digits_search.py's space), TPE
and the median pruner, 16 trials of up to EPOCHS epochs, each ranked by
its best epoch's accuracy (Keras Tuner's objective; ctl's
'best.eval.accuracy', the model a trial exports). The contenders,
each a fresh process timed from its start, one after another:
  ctl.sweep with --parallel=1 and --parallel=2 (warm trial slots, the
    default), each trial's evaluations read from its log.txt, and with
    --parallel=2 and no pruner (a row the targets leave out: it shows what
    the pruner costs the time to 0.99), and with --parallel=2 and
    sampler='gp' (ctl's Gaussian process, Keras Tuner Bayesian's method);
  plain Optuna with its trials in one process, and Keras Tuner's
    RandomSearch and BayesianOptimization (benchmarks/search_contenders.py).
Keras Tuner (`pip install keras-tuner`) is for this benchmark only, not a
dependency of ctl: without it its rows say "skipped: keras-tuner not
installed". Keras Tuner has no pruner: it trains every trial whole.

The wall time pruning saved (ctl and Optuna): the trial-seconds the pruned
trials did not spend, each pruned trial's seconds against the mean of the
complete ones: sum over pruned trials of (mean complete - its own). With
--parallel=2 two trials run at once, so the search's wall saved is about
half of that.

This replaces the earlier comparison with Keras Tuner's Hyperband
(`python -m benchmarks.search`, BENCHMARKS.md of 2026-11-26): one search
of each tool on one budget, rather than a second search section.
"""

import csv
import datetime
import importlib.util
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

_REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = _REPO / 'configs' / 'digits.py'
TRIALS = 16
EPOCHS = 12  # At 6, no contender reached 0.99 (2026-11-28).
BATCH_SIZE = 32
STEPS_PER_EPOCH = 44  # 1,438 training digits in batches of 32.
LEARNING_RATES = (1e-5, 3e-2)
WIDTHS = (32, 64, 128)
PRUNER_OPTIONS = {'n_startup_trials': 3}
FIXED = {'optimizer.schedule': 'constant', 'batch_size': BATCH_SIZE,
         'intervals.eval_steps': STEPS_PER_EPOCH}
ACCURACIES = (0.97, 0.99)
CONTENDERS = {
    'ctl.sweep, --parallel=1': 'ctl:1',
    'ctl.sweep, --parallel=2': 'ctl:2',
    # Not in the targets: with no pruner, as Keras Tuner trains every trial.
    'ctl.sweep, --parallel=2, no pruner': 'ctl:2:no_pruner',
    # Keras Tuner Bayesian's method: a Gaussian process (with the pruner).
    'ctl.sweep, --parallel=2, sampler=gp': 'ctl:2:gp',
    'plain Optuna, trials in one process': 'optuna',
    'Keras Tuner, RandomSearch': 'kt_random',
    'Keras Tuner, BayesianOptimization': 'kt_bayesian',
}
# The searches the targets judge: the (TPE and the median pruner),
# and apart, like for like with Keras Tuner Bayesian, the GP's.
TARGET_CTL = ('ctl.sweep, --parallel=1', 'ctl.sweep, --parallel=2')
TARGET_GP = ('ctl.sweep, --parallel=2, sampler=gp',)
SKIPPED = 'skipped: keras-tuner not installed'
_EVAL_LINE = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*\] eval at step '
                        r'\d+: .*\baccuracy ([\d.]+)', re.MULTILINE)


def run(contender: str, directory: pathlib.Path, trials: int = TRIALS,
        epochs: int = EPOCHS, seed: int = 0) -> dict:
  """One contender's search: its wall seconds, evaluations as (seconds
  since its process started, accuracy) and trials as (state, seconds);
  {'skipped': why} for Keras Tuner where it is not installed."""
  if contender.startswith('kt_') and not importlib.util.find_spec(
      'keras_tuner'):
    return {'skipped': SKIPPED}
  if contender.startswith('ctl:'):
    _, parallel, *variant = contender.split(':')
    return _run_ctl(int(parallel), directory, trials, epochs, seed,
                    pruner=None if variant == ['no_pruner'] else 'median',
                    sampler='gp' if variant == ['gp'] else 'tpe')
  out = directory / f'{contender}.json'
  started, total = _timed_run(
      [sys.executable, '-m', 'benchmarks.search_contenders',
       f'--contender={contender}', f'--trials={trials}', f'--epochs={epochs}',
       f'--seed={seed}', f'--out={out}'], contender)
  record = json.loads(out.read_text())
  return {'total': total, 'trials': record['trials'],
          'evaluations': sorted((stamp - started, accuracy)
                                for stamp, accuracy in record['evaluations'])}


def _sweep_file(directory: pathlib.Path, trials: int, epochs: int,
                seed: int, pruner: str | None, sampler: str) -> pathlib.Path:
  """The ctl.sweep file of the search."""
  path = directory / 'search.py'
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      '  return hyper.Sweep(\n'
      f'      config={str(CONFIG)!r},\n'
      '      search=hyper.Search(\n'
      "          space={'optimizer.learning_rate': hyper.log_uniform"
      f'{LEARNING_RATES!r},\n'
      f"                 'model.width': hyper.choice({list(WIDTHS)!r})}},\n"
      f"          fixed={ {**FIXED, 'num_epochs': epochs}!r},\n"
      f"          num_trials={trials}, sampler={sampler!r}, "
      f"pruner={pruner!r},\n"
      f'          pruner_options={PRUNER_OPTIONS if pruner else {}!r}, '
      f'seed={seed}),\n'
      "      metric='best.eval.accuracy', mode='max')\n")
  return path


def _timed_run(command: list[str], who: str) -> tuple[float, float]:
  """Runs command from the repository root; returns its start time
  (time.time()) and its seconds. Raises RuntimeError, with its output,
  where it failed."""
  started = time.time()
  result = subprocess.run(command, capture_output=True, text=True,
                          check=False, cwd=_REPO)
  total = time.time() - started
  if result.returncode != 0:
    raise RuntimeError(f'{who} exited {result.returncode}:\n'
                       f'{result.stdout[-3000:]}\n{result.stderr[-3000:]}')
  return started, total


def _run_ctl(parallel: int, directory: pathlib.Path, trials: int,
             epochs: int, seed: int, pruner: str | None, sampler: str) -> dict:
  """ctl.sweep's search, its evaluations read from the trials' logs."""
  workdir = directory / f'sweep-{parallel}'
  started, total = _timed_run(
      [sys.executable, '-m', 'ctl.sweep',
       '--sweep=' + str(_sweep_file(directory, trials, epochs, seed, pruner,
                                    sampler)),
       f'--workdir={workdir}', f'--parallel={parallel}'], 'ctl.sweep')
  evaluations = []
  for log in sorted(workdir.glob('trial-*/log.txt')):
    for day, clock, accuracy in _EVAL_LINE.findall(log.read_text()):
      evaluations.append((_seconds_since(started, day, clock), float(accuracy)))
  with open(workdir / 'results.csv', newline='') as file:
    rows = list(csv.DictReader(file))
  return {'total': total, 'evaluations': sorted(evaluations),
          'trials': [(row['state'], _trial_record(row)['wall_seconds'])
                     for row in rows],
          'timings': [_trial_timing(row) for row in rows]}


def _trial_record(row: dict) -> dict:
  """A ctl trial's trial.json (wall_seconds, warm, ...)."""
  return json.loads((pathlib.Path(row['workdir']) / 'trial.json').read_text())


def _trial_timing(row: dict) -> dict:
  """Where a ctl trial's time went: its wall seconds, whether it ran warm,
  and its phases' seconds as its log.txt dates them (trial_phases)."""
  record = _trial_record(row)
  log = pathlib.Path(row['workdir']) / 'log.txt'
  return {'state': row['state'], 'wall': record['wall_seconds'],
          'warm': record.get('warm'),
          **(trial_phases(log.read_text()) if log.exists() else {})}


# A trial's phases, each ended by the first log line matching its pattern
# after the previous phase's end; 'eval' is apart, the seconds to each
# "eval at step" line from the line before it.
PHASES = (('start', r'\] Task '), ('build', r'\] Training from step'),
          ('first step', r'\] First (step|loop)'),
          ('train, eval, saves', r'\] Results written'),
          ('export', r'\] Exported'))
_LOG_LINE = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*$', re.MULTILINE)
_HEADER = re.compile(r'^=== (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d):', re.MULTILINE)


def trial_phases(log_text: str) -> dict[str, float]:
  """Seconds of a trial's phases from its log.txt: 'start' from the line
  the runner wrote when it started the trial (a whole second) to the run's
  first line (a slot's start and imports, the config), then PHASES; 'eval'
  (within 'train, eval, saves') the evaluations."""
  header = _HEADER.search(log_text)
  if not header:
    return {}
  started = datetime.datetime.strptime(header.group(1),
                                       '%Y-%m-%d %H:%M:%S').timestamp()
  lines = [(_seconds_since(started, day, clock), match.group(0))
           for match in _LOG_LINE.finditer(log_text)
           for day, clock in [match.groups()]]
  phases, previous, index = {}, 0.0, 0
  for name, pattern in PHASES:
    found = next((i for i in range(index, len(lines))
                  if re.search(pattern, lines[i][1])), None)
    if found is not None:
      phases[name], previous, index = lines[found][0] - previous, lines[
          found][0], found
  phases['eval'] = sum(lines[i][0] - lines[i - 1][0]
                       for i in range(1, len(lines))
                       if '] eval at step' in lines[i][1])
  return phases


def _seconds_since(started: float, day: str, clock: str) -> float:
  """An absl log line's local time (MMDD, HH:MM:SS.us) less `started`."""
  start = datetime.datetime.fromtimestamp(started)
  stamp = datetime.datetime.strptime(f'{start.year}{day} {clock}',
                                     '%Y%m%d %H:%M:%S.%f')
  return stamp.timestamp() - started


def summary(result: dict) -> dict:
  """What the table shows of one search."""
  if 'skipped' in result:
    return result
  accuracies = [accuracy for _, accuracy in result['evaluations']]
  complete = [s for state, s in result['trials'] if state == 'COMPLETE']
  pruned = [s for state, s in result['trials'] if state == 'PRUNED']
  mean_complete = statistics.mean(complete) if complete else 0.0
  return {'wall': result['total'], 'best': max(accuracies, default=0.0),
          **{f'to_{target}': to_accuracy(result, target)
             for target in ACCURACIES},
          'trials': len(result['trials']), 'pruned': len(pruned),
          'saved': sum(mean_complete - seconds for seconds in pruned),
          'mean_complete': mean_complete,
          'mean_pruned': statistics.mean(pruned) if pruned else None}


def to_accuracy(result: dict, target: float) -> float | None:
  """Seconds to the first evaluation at or above target (None: never)."""
  return next((seconds for seconds, accuracy in result['evaluations']
               if accuracy >= target), None)


def run_all(trials: int = TRIALS, epochs: int = EPOCHS,
            seed: int = 0) -> dict[str, dict]:
  """Each contender's summary, one search after another, in one sitting."""
  summaries = {}
  for name, contender in CONTENDERS.items():
    with tempfile.TemporaryDirectory(prefix='search-') as directory:
      result = run(contender, pathlib.Path(directory), trials, epochs, seed)
    summaries[name] = summary(result)
    if 'timings' in result:
      summaries[name]['timings'] = result['timings']
    print(f'{name}: {json.dumps(summaries[name])}', flush=True)
  return summaries


def wall_ratio(summaries: dict[str, dict]) -> float:
  """ctl's whole search (the better of --parallel=1 and 2) over plain
  Optuna's."""
  ctl = min(summaries[name]['wall'] for name in TARGET_CTL)
  return ctl / summaries['plain Optuna, trials in one process']['wall']


def to_099_ratio(summaries: dict[str, dict],
                 names: tuple[str, ...] = TARGET_CTL) -> float | None:
  """ctl's seconds to 0.99 (the best of names' searches) over Keras Tuner
  Bayesian's: inf where only Keras Tuner reached it, 0 where only
  ctl did; None where neither did, or Keras Tuner was skipped."""
  bayesian = summaries['Keras Tuner, BayesianOptimization']
  ctl = min((summaries[name]['to_0.99'] for name in names
             if summaries[name]['to_0.99'] is not None), default=None)
  if 'skipped' in bayesian or (ctl is None and bayesian['to_0.99'] is None):
    return None
  if ctl is None:
    return float('inf')
  return ctl / bayesian['to_0.99'] if bayesian['to_0.99'] else 0.0


def _seconds(value: float | None) -> str:
  """Seconds for the table."""
  return 'not reached' if value is None else f'{value:.0f}'


def table(summaries: dict[str, dict]) -> str:
  """The section's table, a row per contender."""
  lines = ['| contender | wall (s) | best accuracy | seconds to 0.97 / 0.99 '
           '| trials (pruned) | trial-seconds pruning saved |',
           '| --- | --- | --- | --- | --- | --- |']
  for name, row in summaries.items():
    if 'skipped' in row:
      lines.append(f'| {name} | {row["skipped"]} | | | | |')
      continue
    saved = (f'{row["saved"]:.0f} (complete {row["mean_complete"]:.1f} s, '
             f'pruned {row["mean_pruned"]:.1f} s on average)'
             if row['pruned'] else '-')
    lines.append(
        f'| {name} | {row["wall"]:.0f} | {row["best"]:.4f} | '
        f'{_seconds(row["to_0.97"])} / {_seconds(row["to_0.99"])} | '
        f'{row["trials"]} ({row["pruned"]}) | {saved} |')
  return '\n'.join(lines)


def timings_table(summaries: dict[str, dict]) -> str:
  """Where ctl's trials spent their time: the median seconds of each phase
  (trial_phases) over a contender's trials, 'other' the wall left over
  (the trial's end, the runner's wait for it)."""
  names = [name for name, _ in PHASES] + ['eval', 'other']
  lines = ['| ctl trials: median seconds | wall | ' + ' | '.join(names) + ' |',
           '| --- ' * (len(names) + 2) + '|']
  for name, row in summaries.items():
    timings = [t for t in row.get('timings', []) if 'start' in t]
    for t in timings:
      t['other'] = t['wall'] - sum(t.get(phase, 0.0) for phase, _ in PHASES)
    if timings:
      lines.append(f'| {name} | ' + ' | '.join(
          f'{statistics.median(t.get(key, 0.0) for t in timings):.1f}'
          for key in ['wall', *names]) + ' |')
  return '\n'.join(lines) if len(lines) > 2 else ''
