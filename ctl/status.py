"""A run's state at a glance: `python -m ctl.status WORKDIR [--watch]`.

Reads only small files of the workdir (local or gs://): each worker's
status (workers/worker-<i>.json, ctl/cluster/worker_status.py),
results.json, the checkpoint state file, best/best.json and the names of
the diagnostics files. Says whether the run is running, finished, stopped
(preempted, failed, or by an action; with the reason and exit code) or
hung (a worker whose status stopped changing, or that made no progress,
for longer than distribution.timeout_seconds), where it is, how fast each
worker went at the last report, and which worker lags.

Exit codes: 0 when it could read the workdir, 2 when there is no run there.
"""

import datetime
import re
import signal
import sys
import threading
import time

from absl import app
from absl import flags

from ctl import errors

_WATCH = flags.DEFINE_bool('watch', False,
                           'Show the state again every --every seconds, '
                           'until Ctrl-C or SIGTERM.')
_EVERY = flags.DEFINE_float('every', 5.0, 'Seconds between two --watch '
                            'views.', lower_bound=0.5)

# Without a watchdog (distribution.timeout_seconds=0, one worker), a run
# whose status has not changed for this long is taken for hung.
_DEFAULT_HANG_SECONDS = 600.0


def run_state(workers: dict[int, dict], results: dict | None,
              now: float) -> tuple[str, str]:
  """The run's state ('running', 'finished', 'stopped', 'failed', 'hung')
  and a line saying why."""
  from ctl.cluster import worker_status  # pylint: disable=g-import-not-at-top
  ended = [status for _, status in sorted(workers.items())
           if status['state'] != worker_status.RUNNING]
  failed = [status for status in ended
            if status['state'] in (worker_status.FAILED,
                                   worker_status.STOPPED) and
            status.get('exit_code')]
  if failed:
    first = failed[0]
    state = (worker_status.STOPPED if first['exit_code'] == 42 else
             worker_status.FAILED)
    return state, (f'worker {first["worker"]} exited with code '
                   f'{first["exit_code"]}: {first["reason"]}')
  if workers and len(ended) == len(workers):
    chief = workers[min(workers)]
    if chief['state'] == worker_status.STOPPED:
      return worker_status.STOPPED, f'stopped early: {chief["reason"]}'
    return worker_status.FINISHED, 'training finished (exit code 0)'
  if not workers and results is not None:
    return worker_status.FINISHED, 'training finished (results.json)'
  hung = []
  for _, status in sorted(workers.items()):
    if status['state'] != worker_status.RUNNING:
      continue
    limit = status.get('timeout_seconds') or _DEFAULT_HANG_SECONDS
    if now - status['time'] > limit:
      hung.append(f'worker {status["worker"]}\'s status stopped changing '
                  f'{_age(now - status["time"])} ago (in phase '
                  f'{status["phase"]} at step {status["step"]}): stopped, '
                  'dead or unreachable')
    elif now - status['progress_time'] > limit:
      hung.append(f'worker {status["worker"]} made no progress for '
                  f'{_age(now - status["progress_time"])} (in phase '
                  f'{status["phase"]} at step {status["step"]})')
  if hung:
    return 'hung', '; '.join(hung)
  return worker_status.RUNNING, 'training'


def render(workdir: str, now: float | None = None) -> str:
  """The state of the run in workdir, as lines of text.

  Raises:
    CtlError: there is no run in workdir.
  """
  # Imported here: TensorFlow loads after the flags were checked.
  from ctl import storage  # pylint: disable=g-import-not-at-top
  from ctl.checkpoints import best  # pylint: disable=g-import-not-at-top
  from ctl.cluster import worker_status  # pylint: disable=g-import-not-at-top
  from ctl.runtime import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  now = time.time() if now is None else now
  workers = worker_status.read_all(workdir)
  results = workdir_lib.read_results(workdir)
  if workers:  # Those of the latest job (a larger one may have left more).
    size = workers[min(workers)]['num_workers']
    workers = {index: status for index, status in workers.items()
               if index < size}
  elif results is None and not storage.exists(
      storage.join(workdir, workdir_lib.CONFIG_FILE)):
    raise errors.CtlError(
        f'No run in {workdir}: it has no workers/, results.json or '
        'config.json. Pass the --workdir of a training run.')
  state, why = run_state(workers, results, now)
  lines = [f'{workdir}: {state.upper()}: {why}']
  lines += _progress(workers, results, now, state)
  lines += _checkpoints(workdir, now, storage, workdir_lib, best)
  lines += _workers(workers, now)
  lines += _stragglers(workdir, workers, storage, workdir_lib)
  lines += _diagnostics(workdir, now, storage, workdir_lib)
  return '\n'.join(lines)


def _progress(workers: dict[int, dict], results: dict | None, now: float,
              state: str) -> list[str]:
  """Step of total, epoch, speed and ETA (the chief's)."""
  if not workers:
    if results is None:
      return ['  not started yet']
    return [f'  step {results.get("step")}, epoch {results.get("epoch")}']
  chief = workers[min(workers)]
  line = (f'  step {chief["step"]} of {chief.get("total_steps")}, epoch '
          f'{chief.get("epoch", "?")} of {chief.get("num_epochs")}, phase '
          f'{chief["phase"]}')
  speed = _steps_per_second(chief)
  if speed:
    line += f', {speed:.3g} steps/s'
    left = (chief.get('total_steps') or 0) - (chief['step'] or 0)
    if state == 'running' and left > 0:
      line += f', ETA {_age(left / speed)}'
  return [line, f'  status written {_age(now - chief["time"])} ago']


def _steps_per_second(status: dict) -> float | None:
  """Over the reports in the file, evaluations and checkpoints included;
  else the last report's training speed."""
  reports = status.get('reports') or []
  if len(reports) >= 2 and reports[-1]['time'] > reports[0]['time']:
    return ((reports[-1]['step'] - reports[0]['step']) /
            (reports[-1]['time'] - reports[0]['time']))
  return reports[-1].get('steps_per_second') if reports else None


def _checkpoints(workdir, now, storage, workdir_lib, best) -> list[str]:
  """The latest checkpoint and its age; the best metric."""
  lines = []
  state_file = storage.join(workdir_lib.checkpoint_dir(workdir), 'checkpoint')
  text = storage.read_text(state_file)
  match = text and re.search(r'model_checkpoint_path: "ckpt-(\d+)"', text)
  if match:
    lines.append(f'  last checkpoint: step {match.group(1)}, '
                 f'{_age(now - storage.modified_time(state_file))} ago')
  else:
    lines.append('  last checkpoint: none yet')
  record = best.read(workdir)
  if record:
    lines.append(f'  best {record["metric"]}: {record["value"]:.6g} at step '
                 f'{record["step"]}')
  return lines


def _workers(workers: dict[int, dict], now: float) -> list[str]:
  """A line per worker: where it is and how fast it went; the laggards."""
  if not workers:
    return []
  lines = [f'  workers ({len(workers)}):']
  for _, status in sorted(workers.items()):
    report = (status.get('reports') or [{}])[-1]
    seconds = report.get('seconds', {})
    speed = report.get('steps_per_second')
    lines.append(
        f'    worker {status["worker"]} {status["host"]} pid '
        f'{status["pid"]}: {status["state"]}, {status["phase"]}, step '
        f'{status["step"]}' +
        (f', {speed:.3g} steps/s' if speed else '') +
        (f', training {seconds["training"]:.3g} s (CPU '
         f'{seconds.get("training_cpu", 0):.3g} s) since the report before'
         if 'training' in seconds else '') +
        f', status {_age(now - status["time"])} old')
  return lines


def _stragglers(workdir, workers, storage, workdir_lib) -> list[str]:
  """The workers that held the others up over the last reports."""
  from ctl.cluster import stragglers  # pylint: disable=g-import-not-at-top
  if len(workers) < 2:
    return []
  config = storage.read_json(storage.join(workdir, workdir_lib.CONFIG_FILE))
  section = (config or {}).get('diagnostics') or {}
  check = stragglers.StragglerCheck(section.get('straggler_factor') or 1.5,
                                    section.get('straggler_seconds') or 4.0)
  check.update(dict(workers))
  return ['  stragglers: ' + (', '.join(
      f'worker {index} ({workers[index]["host"]}, pid '
      f'{workers[index]["pid"]}, '
      f'{stragglers.KINDS[check.stragglers[index]]})'
      for index in sorted(check.stragglers))
                              or 'none')]


def _diagnostics(workdir, now, storage, workdir_lib) -> list[str]:
  """The newest diagnostics file, if any."""
  folder = workdir_lib.diagnostics_dir(workdir)
  if not storage.isdir(folder):
    return []
  dumps = [storage.join(folder, name) for name in storage.listdir(folder)]
  if not dumps:
    return []
  stamped = sorted((storage.modified_time(path), path) for path in dumps)
  written, latest = stamped[-1]
  return [f'  latest diagnostics: {latest} (written {_age(now - written)} '
          f'ago; {len(dumps)} in all)']


def _age(seconds: float) -> str:
  return str(datetime.timedelta(seconds=max(0, round(seconds))))


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    _fail_usage('Pass one workdir: python -m ctl.status WORKDIR [--watch]')
  workdir = argv[1]
  from ctl.runtime import tf_process  # pylint: disable=g-import-not-at-top
  tf_process.import_tensorflow()
  stop = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stop.set())
  try:
    while True:
      try:
        view = render(workdir)
      except errors.CtlError as error:
        _fail_usage(str(error))
      if _WATCH.value:
        print(f'\n{time.strftime("%H:%M:%S")}', flush=True)
      print(view, flush=True)
      if not _WATCH.value or stop.wait(_EVERY.value):
        return
  except KeyboardInterrupt:
    return


def _fail_usage(message: str) -> None:
  print(f'ctl: error: {message}', file=sys.stderr, flush=True)
  sys.exit(errors.EXIT_USAGE)


if __name__ == '__main__':
  app.run(main)
