"""A sweep's trials: loaded, checked, named and turned into commands.

Nothing here runs a trial; ctl/sweep/__main__.py does.
"""

import collections
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import signal
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from ctl import config as config_lib
from ctl import errors
from ctl import hyper
from ctl import storage
from ctl.runtime import workdir as workdir_lib

_MAX_NAME_CHARS = 80
# How ctl.main says why it stopped; ctl.launch names the worker before it.
_ERROR_LINE = re.compile(r'^(?:\[worker (?P<worker>\d+)\] )?ctl: error: '
                         r'(?P<error>.*)$', re.MULTILINE)
# A failed trial's error line is among its log's last lines (a traceback's
# length at most).
_ERROR_TAIL_BYTES = 64 * 1024


def say(message: str) -> None:
  """One line of the sweep runner's own output."""
  print(f'[sweep] {message}', flush=True)


class StopSignals:
  """SIGTERM and SIGINT, while a runner runs trials, kept as a flag.

  The handler only records the signal; the runner's loop calls `forward`,
  which says so and passes SIGTERM on to the trials. (A handler that
  printed could interrupt the loop's own print and die with "reentrant
  call"; one that signalled the trials would miss a trial started between
  its Popen and its entry in the runner's table.)
  """

  def __init__(self, message: str):
    self._message = message
    self._previous = {}
    self._said = False
    self._forwarded = set()  # The pids sent SIGTERM.
    self._reason = None  # Why the runner stopped by itself (request).
    self.signum = None

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def __enter__(self) -> 'StopSignals':
    self._previous = {signum: signal.signal(signum, self._record)
                      for signum in (signal.SIGTERM, signal.SIGINT)}
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def _record(self, signum, frame) -> None:
    del frame
    if self.signum is None:
      self.signum = signum

  def request(self, message: str) -> None:
    """Stops as SIGTERM would, saying message instead (the runner's own
    reason to stop its trials)."""
    if self.signum is None:
      self.signum = signal.SIGTERM
      self._reason = message

  def stopped(self, exit_code: int) -> bool:
    """Whether a trial that exited with exit_code was stopped, not failed:
    preempted (42), or ended by the signal passed on (SIGTERM before
    ctl.main handles it kills it). The next run resumes it."""
    return exit_code == errors.EXIT_PREEMPTED or bool(exit_code and
                                                      self.requested)

  def forward(self, processes) -> None:
    """Once a signal came: says so, once, and sends SIGTERM to each of
    `processes` not sent one yet."""
    if self.signum is None:
      return
    if not self._said:
      say(self._reason or
          f'{signal.Signals(self.signum).name}: {self._message}')
      self._said = True
    for process in processes:
      if process.pid not in self._forwarded:
        self._forwarded.add(process.pid)
        process.send_signal(signal.SIGTERM)


def killing_signal(exit_code: int, error: str | None) -> str | None:
  """The signal that killed a trial's process (the kernel's OOM killer's
  SIGKILL), if a signal did and the trial printed no error of its own."""
  if exit_code >= 0 or error:
    return None
  try:
    return signal.Signals(-exit_code).name
  except ValueError:
    return f'signal {-exit_code}'


@dataclasses.dataclass(frozen=True)
class Trial:
  """One planned trial."""

  name: str
  overrides: dict[str, Any]
  workdir: str
  command: tuple[str, ...]

  @property
  def finished(self) -> bool:
    return workdir_lib.read_results(self.workdir) is not None

  def record(self) -> dict:
    """trial.json: what the runner knows of this trial (exit code, time)."""
    return storage.read_json(os.path.join(self.workdir, 'trial.json')) or {}

  def open_log(self):
    """The file the trial's process writes its output to, for appending:
    its workdir's log.txt, or for a workdir on an object store (which
    cannot take a process's output) a local file, published there by
    publish_log when the trial exits."""
    return open(self._local_log(), 'a')  # pylint: disable=consider-using-with

  def error_line(self) -> str | None:
    """Why the trial's latest run failed, in one line: its last
    `ctl: error:` line (the chief's, of N workers), without the prefix.

    Read before publish_log; only the lines after the runner's latest
    `=== ` header count (an earlier run's error is not this one's).
    """
    path = self._local_log()
    if not os.path.exists(path):
      return None
    with open(path, 'rb') as log:
      log.seek(max(0, os.path.getsize(path) - _ERROR_TAIL_BYTES))
      tail = log.read().decode('utf-8', 'replace')
    tail = tail[tail.rfind('\n=== ') + 1:]
    # ctl.launch prefixes each worker's lines: the chief's line says why.
    found = {}  # worker ('0' or '' unprefixed, the chief) -> latest line
    for match in _ERROR_LINE.finditer(tail):
      found[match['worker'] or '0'] = match['error'].strip()
    return found.get('0') or (list(found.values())[-1] if found else None)

  def publish_log(self) -> None:
    """Copies a remote workdir's local log into its log.txt."""
    if storage.is_local(self.workdir):
      return  # Written in place.
    local = self._local_log()
    storage.append_text(os.path.join(self.workdir, 'log.txt'),
                        storage.read_text(local) or '')
    storage.remove(local)

  def _local_log(self) -> str:
    if storage.is_local(self.workdir):
      return os.path.join(self.workdir, 'log.txt')
    return os.path.join(tempfile.gettempdir(),
                        f'ctl-sweep-{os.getpid()}-{self.name}.log')


def load_sweep(sweep_file: str) -> tuple[hyper.Sweep, str]:
  """Returns the sweep a file defines and its config file's path."""
  try:
    spec = importlib.util.spec_from_file_location('ctl_sweep', sweep_file)
    module = importlib.util.module_from_spec(spec)
    with config_lib.loading_user_file():
      spec.loader.exec_module(module)
    sweep = module.get_sweep()
  except SystemExit as error:  # sys.exit() or exit() in the file.
    raise errors.ConfigError(
        f'Cannot load the sweep {sweep_file}: it called sys.exit('
        f'{error.code!r}); get_sweep() must return a ctl.hyper.Sweep.'
    ) from error
  except Exception as error:  # pylint: disable=broad-except
    raise errors.ConfigError(
        f'Cannot load the sweep {sweep_file}: {type(error).__name__}: '
        f'{error}') from error
  if not isinstance(sweep, hyper.Sweep):
    raise errors.ConfigError(
        f'{sweep_file}: get_sweep() returned {type(sweep).__name__}, not a '
        'ctl.hyper.Sweep.')
  path, colon, argument = sweep.config.partition(':')
  path = os.path.join(os.path.dirname(os.path.abspath(sweep_file)), path)
  return sweep, os.path.normpath(path) + colon + argument


def plan(sweep: hyper.Sweep, config_file: str, workdir: str) -> list[Trial]:
  """Names the trials and checks every override before anything runs.

  Raises:
    ConfigError: listing each trial whose overrides ctl.main would refuse.
  """
  names = _keep_earlier_names(sweep.trials, trial_names(sweep.trials),
                              workdir)
  problems = []
  for index, (name, overrides) in enumerate(zip(names, sweep.trials)):
    try:
      config = config_lib.load(config_file, overrides)
    except errors.ConfigError as error:
      problems.append(f'trial {index} ({name}): {error}')
      continue
    problem = metric_problem(sweep.metric, config)
    if problem:
      problems.append(f'trial {index} ({name}): {problem}')
  if problems:
    raise errors.ConfigError(
        f'{len(problems)} of {len(sweep.trials)} trials cannot run; nothing '
        'was started:\n  ' + '\n  '.join(problems))
  return [
      Trial(name, dict(overrides), os.path.join(workdir, name),
            command(sweep, config_file, os.path.join(workdir, name),
                     overrides))
      for name, overrides in zip(names, sweep.trials)
  ]


def _keep_earlier_names(trials: list[Mapping[str, Any]], names: list[str],
                        workdir: str) -> list[str]:
  """The names the workdir's sweep.json gave the same overrides (ctl 0.1.0
  named trials after every override, the fixed ones too), so that a rerun
  resumes those trials rather than training them anew."""
  earlier = storage.read_json(os.path.join(workdir, 'sweep.json')) or {}
  named = {_digest(trial['overrides']): trial['name']
           for trial in earlier.get('trials', ())}
  kept = [named.get(_digest(overrides), name)
          for overrides, name in zip(trials, names)]
  # An earlier name that a new trial's name meets: today's names for all.
  return kept if len(set(kept)) == len(kept) else names


def metric_problem(metric: str, config) -> str | None:
  """Why a trial's results cannot hold `metric`, where the config tells.

  A built-in task's config lists its metrics (`config.metrics`); a task of
  one's own makes its results in its hooks, so its metric is only checked
  for shape here, and against its results when the trial has run (a
  trial whose results lack it is reported as such, ctl/sweep/report.py).
  'best.<...>' is the best checkpoint's record (best.json)."""
  if metric.startswith('best.') and not config.get('evaluation', {}).get(
      'best_metric'):
    return (f'Sweep.metric {metric!r} reads the best checkpoint, which '
            'config.evaluation.best_metric=\'\' keeps none of; name the '
            'metric that picks it there')
  if 'metrics' not in config:
    if metric in ('step', 'epoch') or metric.startswith(('eval.', 'best.')):
      return None
    return (f'Sweep.metric {metric!r} is not a result; use \'step\', '
            "'epoch', an eval result, 'eval.<name>' (for a set of "
            "eval_data's dict: 'eval.<set>/<name>'), or the best "
            "checkpoint's, 'best.eval.<name>'")
  names = ['loss', *config.metrics]
  known = ['step', 'epoch', *(f'eval.{name}' for name in names),
           'best.value', 'best.step', *(f'best.eval.{name}' for name in names)]
  if metric not in known:
    return (f'Sweep.metric {metric!r} is not in its results; use one of '
            f'{known}')
  return None


def lookup(tree: dict, dotted_key: str) -> Any:
  """The value at a dotted path into results.json ('eval.accuracy'), or None."""
  for part in dotted_key.split('.'):
    if not isinstance(tree, dict) or part not in tree:
      return None
    tree = tree[part]
  return tree


def trial_names(trials: list[Mapping[str, Any]]) -> list[str]:
  """Short, filesystem-safe, unique names made of the trials' overrides.

  Only the overrides that tell trials apart are named: a key set to the
  same value in every trial (hyper.fixed's) is left out, unless there is
  a single trial. Keys are shortened to their last part where that stays
  unambiguous; numbers keep 4 significant digits. Names that would still
  collide, or are too long, get a hash of the exact overrides.
  """
  named = _varying_keys(trials)
  last_part = {key: key.rsplit('.', 1)[-1] for key in named}
  uses = collections.Counter(last_part.values())
  short = {key: part if uses[part] == 1 else key
           for key, part in last_part.items()}
  names = []
  for trial in trials:
    name = '-'.join(f'{short[key]}={_format(value)}'
                    for key, value in trial.items() if key in named) or 'base'
    name = re.sub(r'[^A-Za-z0-9._=+-]', '_', name)
    if len(name) > _MAX_NAME_CHARS:
      name = f'{name[:_MAX_NAME_CHARS - 9]}-{_digest(trial)}'
    names.append(name)
  for index, name in enumerate(names):
    same = [other for other, other_name in enumerate(names)
            if other_name == name]
    if len(same) > 1:
      digests = {_digest(trials[other]) for other in same}
      if len(digests) < len(same):
        raise errors.ConfigError(
            f'Trials {same} have the same overrides: {dict(trials[index])}')
      for other in same:
        names[other] = f'{name}-{_digest(trials[other])}'
  return names


def _varying_keys(trials: list[Mapping[str, Any]]) -> set[str]:
  """The keys whose value is not the same in every trial; every key when
  there is one trial."""
  keys = {key for trial in trials for key in trial}
  if len(trials) == 1:
    return keys
  # A value's digest: lists and arrays compare as their text does.
  seen = {key: {_digest({key: trial[key]}) if key in trial else None
                for trial in trials} for key in keys}
  return {key for key, values in seen.items() if len(values) > 1}


def _format(value: Any) -> str:
  if isinstance(value, float):
    return f'{value:.4g}'
  if isinstance(value, (tuple, list)):
    return '+'.join(_format(item) for item in value)
  return str(value)


def _digest(overrides: Mapping[str, Any]) -> str:
  text = json.dumps(overrides, sort_keys=True, default=repr)
  return hashlib.sha1(text.encode()).hexdigest()[:8]


def command(sweep: hyper.Sweep, config_file: str, workdir: str,
             overrides: Mapping[str, Any]) -> tuple[str, ...]:
  ctl_args = (f'--config={config_file}', f'--workdir={workdir}',
              *config_lib.override_flags(overrides))
  if sweep.num_workers > 1:
    return (sys.executable, '-m', 'ctl.launch',
            f'--num_workers={sweep.num_workers}', '--', *ctl_args)
  return (sys.executable, '-m', 'ctl.main', *ctl_args)
