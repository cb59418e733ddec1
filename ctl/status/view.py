"""The lines `python -m ctl.status` shows for a workdir."""

import time

from ctl import errors
from ctl.cluster import stragglers
from ctl.status import evidence as evidence_lib
from ctl.status import verdict


def render(workdir: str, now: float | None = None) -> str:
  """The state of the run in workdir, as lines of text.

  Raises:
    CtlError: workdir holds no ctl run.
  """
  now = time.time() if now is None else now
  found = evidence_lib.read(workdir)
  if found.kind != 'run':
    where = ('it has no' if found.kind == 'folder' else
             'no such folder, so no')
    raise errors.CtlError(
        f'{workdir} is not a ctl workdir: {where} workers/worker-<i>.json, '
        'results.json, checkpoints/checkpoint or config.json of a ctl run. '
        'Pass the --workdir of a training run.')
  # Each worker judged once: its process may end between two looks.
  conditions = {index: verdict.condition(status, now)
                for index, status in found.workers.items()}
  state, why = verdict.run_state(found.workers, conditions, found.results)
  if state == verdict.NOT_STARTED and found.problems:
    state, why = verdict.UNKNOWN, found.problems.pop(0)
  lines = [f'{workdir}: {state.upper()}: {why}']
  lines += _progress(found, now, state)
  lines += _checkpoints(found, now)
  lines += _workers(found.workers, conditions, now)
  lines += _stragglers(found)
  lines += _diagnostics(found, now)
  lines += [f'  unreadable: {problem}' for problem in found.problems]
  return '\n'.join(lines)


def _progress(found: evidence_lib.Evidence, now: float,
              state: str) -> list[str]:
  """Step of total, epoch, speed and ETA (the chief's)."""
  # A checkpoint (or results.json) written after the chief's file shows a
  # later step than the file: the run reached it.
  known = [found.checkpoint.step] if found.checkpoint else []
  known += [found.results['step']] if found.results else []
  step = max(known, default=None)
  if not found.workers:
    if step is None:
      return []
    return [f'  step {step}' + (f', epoch {found.results.get("epoch")}'
                                if found.results else '')]
  chief = found.workers[min(found.workers)]
  if chief['step'] is not None:
    step = max(chief['step'], step or 0)
  total = chief.get('total_steps')
  line = (f'  step {"?" if step is None else step} of {total}, epoch '
          f'{chief.get("epoch", "?")} of {chief.get("num_epochs")}, phase '
          f'{chief["phase"]}')
  speed = _steps_per_second(chief)
  if speed:
    line += f', {speed:.3g} steps/s'
    if state == verdict.RUNNING and (total or 0) > (step or 0):
      line += f', ETA {verdict.age((total - (step or 0)) / speed)}'
  return [line, f'  status written {verdict.age(now - chief["time"])} ago']


def _steps_per_second(status: dict) -> float | None:
  """Over the reports in the file, evaluations and checkpoints included;
  else the last report's training speed."""
  reports = status.get('reports') or []
  if len(reports) >= 2 and reports[-1]['time'] > reports[0]['time']:
    return ((reports[-1]['step'] - reports[0]['step']) /
            (reports[-1]['time'] - reports[0]['time']))
  return reports[-1].get('steps_per_second') if reports else None


def _checkpoints(found: evidence_lib.Evidence, now: float) -> list[str]:
  """The latest checkpoint a resume would use, and its age; the best."""
  lines = []
  if found.checkpoint:
    lines.append(f'  last checkpoint: step {found.checkpoint.step}, '
                 f'{verdict.age(now - found.checkpoint.written)} ago')
  else:
    lines.append('  last checkpoint: none yet')
  if found.best:
    lines.append(f'  best {found.best["metric"]}: {found.best["value"]:.6g} '
                 f'at step {found.best["step"]}')
  return lines


def _workers(workers: dict[int, dict],
             conditions: dict[int, tuple[str, str | None]],
             now: float) -> list[str]:
  """A line per worker: what it is, where, and how fast it went."""
  if not workers:
    return []
  size = workers[min(workers)]['num_workers']
  job = workers[min(workers)].get('job')
  lines = [_parameter_server_job(job) if job else f'  workers ({size}):']
  for index in range(size):
    status = workers.get(index)
    if status is None:
      lines.append(f'    worker {index}: no readable status file')
      continue
    what, _ = conditions[index]
    if what in (verdict.FAILED, verdict.STOPPED) and status['exit_code']:
      what = f'{what} (exit code {status["exit_code"]})'
    report = (status.get('reports') or [{}])[-1]
    seconds = report.get('seconds', {})
    speed = report.get('steps_per_second')
    lines.append(
        f'    {verdict.name(status)} {status["host"]} pid {status["pid"]}: '
        f'{what}, '
        f'{status["phase"]}, step {status["step"]}' +
        (f', {speed:.3g} steps/s' if speed else '') +
        (f', training {seconds["training"]:.3g} s (CPU '
         f'{seconds.get("training_cpu", 0):.3g} s) since the report before'
         if 'training' in seconds else '') +
        f', status {verdict.age(now - status["time"])} old')
  return lines


def _parameter_server_job(job: dict[str, int]) -> str:
  """What a parameter-server job's chief's file says of the job."""
  return (f'  parameter-server job: the chief coordinates '
          f'{job.get("worker", 0)} worker(s) and {job.get("ps", 0)} '
          'parameter server(s), which write no status file (a worker lost '
          'leaves its steps to the others; a server lost stops the chief):')


def _stragglers(found: evidence_lib.Evidence) -> list[str]:
  """The workers that held the others up over the last reports."""
  workers = found.workers
  if len(workers) < 2:
    return []
  section = (found.config or {}).get('diagnostics')
  section = section if isinstance(section, dict) else {}
  factor, seconds = (section.get('straggler_factor'),
                     section.get('straggler_seconds'))
  check = stragglers.StragglerCheck(
      factor if evidence_lib.is_number(factor, 1) else 1.5,
      seconds if evidence_lib.is_number(seconds, 0) and seconds > 0 else 4.0)
  check.update({index: {**status, 'reports': status.get('reports') or []}
                for index, status in workers.items()})
  return ['  stragglers: ' + (', '.join(
      f'{verdict.who(workers[index])[:-1]}, '
      f'{stragglers.KINDS[check.stragglers[index]]})'
      for index in sorted(check.stragglers)) or 'none')]


def _diagnostics(found: evidence_lib.Evidence, now: float) -> list[str]:
  """The newest diagnostics file, if any."""
  if not found.diagnostics:
    return []
  written, latest = found.diagnostics[-1]
  return [f'  latest diagnostics: {latest} (written '
          f'{verdict.age(now - written)} ago; {len(found.diagnostics)} in '
          'all)']
