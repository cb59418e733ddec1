"""What a workdir holds about its run, read without TensorFlow (local
paths) and checked: each file that is damaged, of another program, or
gone mid-read is noted as a problem, never raised.

    workers/worker-<i>.json   each worker's status (ctl/cluster/worker_status.py)
    results.json              written when training finished
    checkpoints/checkpoint    the state file naming the checkpoints
    best/best.json            the best evaluation kept
    diagnostics/*.txt         workers' dumps (their names and times only)
    config.json               the run's config (straggler settings)
"""

import dataclasses
import math
import os
import re

from ctl import storage
from ctl.cluster import worker_status
from ctl.runtime import workdir as workdir_lib

_STATES = (worker_status.RUNNING, worker_status.FINISHED,
           worker_status.STOPPED, worker_status.FAILED)

# Fields every ctl config has (ctl/config.py:base_config): a config.json
# without them is another program's.
_CONFIG_FIELDS = ('task', 'batch_size', 'intervals', 'distribution')

# A line of the checkpoint state file (a text protocol buffer).
_STATE_LINE = re.compile(
    r'(model_checkpoint_path|all_model_checkpoint_paths): "([^"]*)"|'
    r'(all_model_checkpoint_timestamps|last_preserved_timestamp): '
    r'[-+.\deE]+')


@dataclasses.dataclass
class Checkpoint:
  """The latest checkpoint a resume would use (its files are there)."""
  step: int
  written: float  # When the state file naming it was written.


@dataclasses.dataclass
class Evidence:
  """A workdir's files, checked; `problems`: a line per unusable one."""
  workers: dict[int, dict]
  results: dict | None
  checkpoint: Checkpoint | None
  best: dict | None
  diagnostics: list[tuple[float, str]]  # (written, path), oldest first.
  config: dict | None
  # 'run': some file of a ctl run, damaged or not; 'folder': a folder
  # without one; 'nothing': no such folder.
  kind: str
  problems: list[str]


def read(workdir: str) -> Evidence:
  """The evidence of workdir (nothing raised for a damaged file)."""
  problems = []
  # The checkpoint first: a save that lands between the reads is older
  # than what the workers then say (ctl/status/view.py shows the later
  # step, as a worker's file may lag a save by its writer's pause).
  checkpoint_state, checkpoint = _checkpoint(workdir, problems)
  workers, worker_files = _workers(workdir, problems)
  results = _json(workdir_lib.results_path(workdir), problems,
                  _check_results)
  config = _json(storage.join(workdir, workdir_lib.CONFIG_FILE), problems,
                 _check_config)
  best = _json(workdir_lib.best_record_path(workdir), problems, _check_best)
  return Evidence(
      workers=workers, results=results, checkpoint=checkpoint, best=best,
      diagnostics=_diagnostics(workdir), config=config,
      kind=_kind(workdir, bool(worker_files or checkpoint_state or config)),
      problems=problems)


def _kind(workdir: str, has_files: bool) -> str:
  """What the workdir is: 'run', 'folder' or 'nothing' (Evidence.kind);
  has_files: whether a worker, checkpoint or config file was found."""
  if has_files or _attempt(lambda: storage.exists(
      workdir_lib.results_path(workdir)), []):
    return 'run'
  return 'folder' if _attempt(lambda: storage.isdir(workdir), []) else (
      'nothing')


def _attempt(read_file, problems: list[str], path: str | None = None):
  """read_file(), or None with the problem noted under path (when given):
  a damaged or vanishing file must not end ctl.status."""
  try:
    return read_file()
  # OSError, ValueError (not JSON, not UTF-8), and on gs:// TensorFlow's
  # OpError, which a local read must not import to name.
  except Exception as error:  # pylint: disable=broad-except
    if path is not None:
      problems.append(f'{path} cannot be read: {type(error).__name__}: '
                      f'{error}')
    return None


def _json(path: str, problems: list[str], check) -> dict | None:
  """A JSON file's content when check(content) finds nothing wrong (it
  returns what is wrong); else None, the problem noted."""
  content = _attempt(lambda: storage.read_json(path), problems, path)
  if content is None:
    return None
  wrong = check(content)
  if wrong:
    problems.append(f'{path} is not what ctl writes there: {wrong}')
    return None
  return content


def _workers(workdir: str, problems: list[str]) -> tuple[dict, list]:
  """({index: status} of the latest job's checked status files, the names
  of every worker-<i>.json)."""
  folder = workdir_lib.workers_dir(workdir)
  names = _attempt(lambda: storage.listdir(folder)
                   if storage.isdir(folder) else [], problems, folder) or []
  names = [name for name in names
           if re.fullmatch(r'worker-\d+\.json', name)]
  workers = {}
  for name in names:
    index = int(name[len('worker-'):-len('.json')])
    path = storage.join(folder, name)
    status = _json(path, problems, lambda content, i=index: _check_worker(
        content, i))
    if status is not None:
      workers[index] = status
  if workers:  # Those of the latest job (a larger one may have left more).
    size = workers[min(workers)]['num_workers']
    workers = {index: status for index, status in workers.items()
               if index < size}
  return workers, names


def is_number(value, low: float = -math.inf) -> bool:
  """A finite int or float (not a bool) of at least `low`."""
  return (isinstance(value, (int, float)) and not isinstance(value, bool) and
          math.isfinite(value) and value >= low)


def _is_count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _wrong_fields(content, fields: dict) -> str | None:
  """What is wrong with a JSON object, given {field: (test, what it
  should be)}; None when nothing."""
  if not isinstance(content, dict):
    return f'a JSON {type(content).__name__}, not an object'
  for field, (test, what) in fields.items():
    if not test(content.get(field)):
      return (f'its "{field}" is {content.get(field)!r:.60}, not {what}'
              if field in content else f'it has no "{field}"')
  return None


def _optional(test):
  return lambda value: value is None or test(value)


def _check_worker(content, index: int) -> str | None:
  """What is wrong with a worker's status file; None when nothing."""
  text = lambda value: isinstance(value, str)
  wrong = _wrong_fields(content, {
      'worker': (lambda value: value == index, f'{index} (its file name)'),
      'num_workers': (lambda value: _is_count(value) and value > index,
                      f'a number of workers above {index}'),
      'host': (text, 'a host name'), 'pid': (_is_count, 'a process id'),
      'state': (lambda value: value in _STATES, f'one of {_STATES}'),
      'phase': (text, 'a phase'),
      'step': (_optional(_is_count), 'a step'),
      'total_steps': (_optional(_is_count), 'a step count'),
      'num_epochs': (_optional(_is_count), 'an epoch count'),
      'time': (is_number, 'a time'),
      'progress_time': (is_number, 'a time'),
      'started': (_optional(is_number), 'a time'),
      # None: one worker's, written by its training thread.
      'heartbeat_seconds': (_optional(lambda value: is_number(value) and
                                      value > 0), 'seconds'),
      'timeout_seconds': (_optional(lambda value: is_number(value, 0)),
                          'seconds'),
      'reason': (_optional(text), 'a reason'),
      'exit_code': (_optional(lambda value: isinstance(value, int)),
                    'an exit code'),
      'reports': (_optional(lambda value: isinstance(value, list)),
                  'a list of reports'),
      # A parameter-server job's chief: its tasks by job.
      'job': (_optional(lambda value: isinstance(value, dict) and all(
          isinstance(job, str) and _is_count(count)
          for job, count in value.items())), 'task counts by job')})
  if wrong:
    return wrong
  for report in content.get('reports') or []:
    wrong = _wrong_fields(report, {
        'step': (_is_count, 'a step'), 'time': (is_number, 'a time'),
        'steps_per_second': (_optional(is_number), 'a speed'),
        'seconds': (lambda value: isinstance(value, dict) and all(
            is_number(seconds) for seconds in value.values()), 'seconds')})
    if wrong:
      return f'a report: {wrong}'
  return None


def _check_results(content) -> str | None:
  return _wrong_fields(content, {'step': (_is_count, 'a step'),
                                 'epoch': (_optional(_is_count), 'an epoch')})


def _check_best(content) -> str | None:
  return _wrong_fields(content, {
      'metric': (lambda value: isinstance(value, str), 'a metric name'),
      'value': (is_number, 'a number'), 'step': (_is_count, 'a step')})


def _check_config(content) -> str | None:
  if not isinstance(content, dict) or not all(
      field in content for field in _CONFIG_FIELDS):
    return ('not a ctl config (it lacks ' +
            ', '.join(f'"{field}"' for field in _CONFIG_FIELDS) + ')')
  return None


def _checkpoint(workdir: str,
                problems: list[str]) -> tuple[bool, Checkpoint | None]:
  """(whether there is a state file, the latest checkpoint it names whose
  files are there: the one a resume starts from)."""
  directory = workdir_lib.checkpoint_dir(workdir)
  path = storage.join(directory, 'checkpoint')
  text = _attempt(lambda: storage.read_text(path), problems, path)
  if text is None:
    return False, None
  written = _attempt(lambda: storage.modified_time(path), problems, path)
  paths = _listed(text)
  if paths is None or written is None:
    if paths is None:
      problems.append(
          f'{path} cannot be read (not a checkpoint state file): the next '
          'run stops until it is repaired or removed')
    return True, None
  for prefix in sorted(paths, key=_step_of, reverse=True):
    full = prefix if os.path.isabs(prefix) or '://' in prefix else (
        storage.join(directory, prefix))
    if _attempt(lambda full=full: storage.exists(f'{full}.index'), []):
      return True, Checkpoint(_step_of(prefix), written)
  return True, None


def _listed(text: str) -> list[str] | None:
  """The checkpoint paths a state file names; None when it is not one."""
  paths = []
  for line in text.splitlines():
    match = _STATE_LINE.fullmatch(line.strip()) if line.strip() else True
    if not match:
      return None
    if match is not True and match.group(2) is not None:
      paths.append(match.group(2))
  named = [path for path in paths if re.search(r'ckpt-\d+$', path)]
  return named if named and len(named) == len(paths) else None


def _step_of(path: str) -> int:
  return int(path.rsplit('-', 1)[1])


def _diagnostics(workdir: str) -> list[tuple[float, str]]:
  """(written, path) of each diagnostics file, oldest first; a file gone
  between the listing and its stat is left out."""
  folder = workdir_lib.diagnostics_dir(workdir)
  names = _attempt(lambda: storage.listdir(folder)
                   if storage.isdir(folder) else [], []) or []
  found = []
  for name in names:
    path = storage.join(folder, name)
    written = _attempt(lambda path=path: storage.modified_time(path), [])
    if written is not None:
      found.append((written, path))
  return sorted(found)
