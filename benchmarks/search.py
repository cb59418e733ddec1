"""Time to a target eval accuracy: ctl.sweep against Keras Tuner's Hyperband.

    python -m benchmarks.search --seeds=0,1,2

Run from the repository root, with Keras Tuner installed (`pip install
keras-tuner`: for this benchmark only, not a dependency of ctl). Both
contenders search the same space over the digits CNN (configs/digits.py:
learning rate log-uniform in [1e-4, 3e-2], the dense layer's width one of
32, 64, 128; Adam at a constant rate, batch 32, evaluated on the same 359
held-out digits after every epoch), one trial at a time, on the same
budget: Keras Tuner's Hyperband with max_epochs=9 and factor=3 tries 17
configurations, so ctl.sweep runs 17 trials of up to 9 epochs, TPE with
Optuna's HyperbandPruner at the same rungs (1, 3 and 9 epochs, reduction
factor 3).

Each contender is a fresh process (`python -m ctl.sweep`, and this module
with --contender=keras_tuner), timed from its start: the time to the first
evaluation at or above --target (from the trials' logs for ctl, from a
Keras callback for Keras Tuner), the whole search's time and the best
accuracy reached. Seeds alternate which contender runs first; the median
over seeds is printed, with each seed's numbers, as a Markdown table.
"""

import datetime
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds, one search of '
                           'each contender per seed.')
_TARGET = flags.DEFINE_float('target', 0.97, 'The eval accuracy to reach.')
_CONTENDER = flags.DEFINE_string('contender', None, 'Internal: run Keras '
                                 "Tuner's search in this process "
                                 '(keras_tuner).')
_SEED = flags.DEFINE_integer('seed', 0, 'Internal: the contender\'s seed.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Internal: its directory.')

_REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_EPOCHS = 9
FACTOR = 3
STEPS_PER_EPOCH = 44  # 1,438 training digits in batches of 32.
LEARNING_RATES = (1e-4, 3e-2)
WIDTHS = (32, 64, 128)
FIXED = {'num_epochs': MAX_EPOCHS, 'optimizer.schedule': 'constant',
         'intervals.eval_steps': STEPS_PER_EPOCH}
_EVAL_LINE = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*\] eval at step '
                        r'\d+: .*\baccuracy ([\d.]+)', re.MULTILINE)


def hyperband_configurations(max_epochs: int, factor: int) -> int:
  """How many configurations one Hyperband iteration of Keras Tuner tries:
  its brackets' first rounds, as keras_tuner's HyperbandOracle sizes them
  (_get_num_brackets, _get_size)."""
  brackets, epochs = 0, max_epochs
  while epochs >= 1:
    epochs /= factor
    brackets += 1
  end_size = math.ceil(1 + math.log(max_epochs, factor))
  return sum(math.ceil(end_size / (bracket + 1) * factor ** bracket)
             for bracket in range(brackets))


def _sweep_file(directory: pathlib.Path, seed: int) -> pathlib.Path:
  """The ctl.sweep file of the search, seeded."""
  path = directory / 'search.py'
  rungs = {'min_resource': STEPS_PER_EPOCH,
           'max_resource': MAX_EPOCHS * STEPS_PER_EPOCH,
           'reduction_factor': FACTOR}
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      '  return hyper.Sweep(\n'
      f'      config={str(_REPO / "configs" / "digits.py")!r},\n'
      '      search=hyper.Search(\n'
      "          space={'optimizer.learning_rate': hyper.log_uniform"
      f'{LEARNING_RATES!r},\n'
      f"                 'model.width': hyper.choice({list(WIDTHS)!r})}},\n"
      f'          fixed={FIXED!r},\n'
      f'          num_trials={hyperband_configurations(MAX_EPOCHS, FACTOR)}, '
      f"sampler='tpe', pruner='hyperband',\n"
      f'          pruner_options={rungs!r}, seed={seed}),\n'
      "      metric='eval.accuracy', mode='max')\n")
  return path


def _timed_run(command: list[str], who: str):
  """Runs command; returns its start time (time.time()), its seconds and
  its result. Raises RuntimeError, with its output, where it failed."""
  started = time.time()
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  total = time.time() - started
  if result.returncode != 0:
    raise RuntimeError(f'{who} exited {result.returncode}:\n'
                       f'{result.stdout[-3000:]}\n{result.stderr[-3000:]}')
  return started, total, result


def run_ctl(seed: int, directory: pathlib.Path) -> dict:
  """ctl.sweep's search: its evaluations as (seconds since start, accuracy)."""
  workdir = directory / 'sweep'
  command = [sys.executable, '-m', 'ctl.sweep',
             f'--sweep={_sweep_file(directory, seed)}', f'--workdir={workdir}']
  started, total, result = _timed_run(command, 'ctl.sweep')
  evaluations = []
  for log in sorted(workdir.glob('trial-*/log.txt')):
    for day, clock, accuracy in _EVAL_LINE.findall(log.read_text()):
      evaluations.append((_seconds_since(started, day, clock), float(accuracy)))
  return {'total': total, 'evaluations': sorted(evaluations),
          'trials': len(list(workdir.glob('trial-*'))),
          'pruned': result.stdout.count(': PRUNED at step')}


def _seconds_since(started: float, day: str, clock: str) -> float:
  """An absl log line's local time (MMDD, HH:MM:SS.us) less `started`."""
  start = datetime.datetime.fromtimestamp(started)
  stamp = datetime.datetime.strptime(f'{start.year}{day} {clock}',
                                     '%Y%m%d %H:%M:%S.%f')
  return stamp.timestamp() - started


def run_keras_tuner(seed: int, directory: pathlib.Path) -> dict:
  """Keras Tuner's search in a fresh process, timed as ctl's is."""
  out = directory / 'keras_tuner.json'
  command = [sys.executable, '-m', 'benchmarks.search',
             '--contender=keras_tuner', f'--seed={seed}',
             f'--workdir={directory}']
  started, total, result = _timed_run(command, 'Keras Tuner')
  record = json.loads(out.read_text())
  return {'total': total, 'trials': record['configurations'],
          'pruned': record['stopped_early'],
          'evaluations': sorted((stamp - started, accuracy)
                                for stamp, accuracy in record['evaluations'])}


def _keras_tuner_search(seed: int, directory: pathlib.Path) -> None:
  """The contender itself: Hyperband over the same model, data and space."""
  import keras  # pylint: disable=g-import-not-at-top
  import keras_tuner  # pylint: disable=g-import-not-at-top
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  from ctl.builtin_tasks import classification  # pylint: disable=g-import-not-at-top
  from ctl.data import datasets  # pylint: disable=g-import-not-at-top

  config = config_lib.load(str(_REPO / 'configs' / 'digits.py'), FIXED)
  data = datasets.load(config.data)
  train_x = data.train.features.astype('float32') * data.feature_scale
  eval_x = data.eval.features.astype('float32') * data.feature_scale
  keras.utils.set_random_seed(seed)

  def build(hp):
    """The digits CNN and Adam at the values Keras Tuner picks."""
    model_config = config.model.copy_and_resolve_references()
    model_config.width = hp.Choice('width', list(WIDTHS))
    model = classification.build_model(model_config, train_x.shape[1:],
                               data.num_classes)
    model.compile(
        optimizer=keras.optimizers.Adam(hp.Float(
            'learning_rate', *LEARNING_RATES, sampling='log')),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=['accuracy'], jit_compile=False)
    return model

  evaluations = []

  class Record(keras.callbacks.Callback):
    """Each epoch's eval accuracy, with the time it was known."""

    def on_epoch_end(self, epoch, logs=None):
      evaluations.append((time.time(), float(logs['val_accuracy'])))

  tuner = keras_tuner.Hyperband(
      build, objective='val_accuracy', max_epochs=MAX_EPOCHS, factor=FACTOR,
      hyperband_iterations=1, seed=seed, directory=str(directory),
      project_name='keras_tuner', overwrite=True)
  tuner.search(train_x, data.train.labels, batch_size=32,
               validation_data=(eval_x, data.eval.labels),
               callbacks=[Record()], verbose=0)
  trials = tuner.oracle.trials.values()
  new = [trial for trial in trials
         if not trial.hyperparameters.values.get('tuner/trial_id')]
  # A configuration stopped early: the last trial of its chain (a trial
  # no other continued) trained it for fewer than max_epochs.
  continued = {trial.hyperparameters.values.get('tuner/trial_id')
               for trial in trials}
  stopped_early = sum(
      1 for trial in trials if trial.trial_id not in continued and
      trial.hyperparameters.values.get('tuner/epochs') < MAX_EPOCHS)
  (directory / 'keras_tuner.json').write_text(json.dumps(
      {'evaluations': evaluations, 'configurations': len(new),
       'stopped_early': stopped_early}))


def _to_target(result: dict, target: float) -> float | None:
  """Seconds to the first evaluation at or above target (None: never)."""
  return next((seconds for seconds, accuracy in result['evaluations']
               if accuracy >= target), None)


def _summary(result: dict, target: float) -> dict:
  """What the table shows of one search."""
  return {'to_target': _to_target(result, target), 'total': result['total'],
          'best': max(accuracy for _, accuracy in result['evaluations']),
          'trials': result['trials'], 'pruned': result['pruned']}


def _seconds(value: float | None) -> str:
  """Seconds for the table."""
  return 'not reached' if value is None else f'{value:.0f} s'


def main(argv: list[str]) -> None:
  """Runs each seed's two searches (or, internally, Keras Tuner's alone)."""
  del argv
  if _CONTENDER.value == 'keras_tuner':
    _keras_tuner_search(_SEED.value, pathlib.Path(_WORKDIR.value))
    return
  target = _TARGET.value
  runs = {'ctl': [], 'keras_tuner': []}
  contenders = {'ctl': run_ctl, 'keras_tuner': run_keras_tuner}
  for index, seed in enumerate(int(seed) for seed in _SEEDS.value):
    order = ['ctl', 'keras_tuner'][::1 if index % 2 == 0 else -1]
    for name in order:
      with tempfile.TemporaryDirectory(prefix=f'search-{name}-') as directory:
        summary = _summary(contenders[name](seed, pathlib.Path(directory)),
                           target)
      runs[name].append(summary)
      print(f'seed {seed} {name}: {json.dumps(summary)}', flush=True)
  print(f'\n| seed | contender | to {target} | whole search | best accuracy '
        '| configurations (stopped early) |\n|---|---|---|---|---|---|')
  for name, summaries in runs.items():
    for seed, summary in zip(_SEEDS.value, summaries):
      print(f'| {seed} | {name} | {_seconds(summary["to_target"])} | '
            f'{summary["total"]:.0f} s | {summary["best"]:.4f} | '
            f'{summary["trials"]} ({summary["pruned"]}) |')
  for name, summaries in runs.items():
    reached = [s['to_target'] for s in summaries if s['to_target'] is not None]
    print(f'| median | {name} | '
          f'{_seconds(statistics.median(reached)) if reached else "never"} '
          f'({len(reached)} of {len(summaries)} reached) | '
          f'{statistics.median(s["total"] for s in summaries):.0f} s | '
          f'{statistics.median(s["best"] for s in summaries):.4f} | |')


if __name__ == '__main__':
  app.run(main)
