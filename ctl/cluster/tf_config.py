"""The cluster this task belongs to: read from TF_CONFIG and checked.

`from_tf_config` checks TF_CONFIG in Python, before TensorFlow starts a
server: TensorFlow itself reports a malformed one as a traceback from deep
inside it, or, for an empty cluster, not at all (the run silently becomes
a single process). Pure Python: nothing here imports TensorFlow.
"""

import collections
import dataclasses
import hashlib
import json

from absl import logging

from ctl import errors

# The jobs ctl's strategies know, and how many tasks each may have (None:
# any number). An evaluator is not part of training; "ps" tasks (parameter
# servers) belong to distribution.strategy='parameter_server' only.
MAX_TASKS = {'chief': 1, 'worker': None, 'evaluator': 1, 'ps': None}
TRAINING_JOBS = ('chief', 'worker')

EXAMPLE = ('{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
           '"task": {"type": "worker", "index": 0}}')

@dataclasses.dataclass(frozen=True)
class Cluster:
  """Every task of the job, by job name, and which of them this process is."""

  jobs: dict[str, tuple[str, ...]]  # Job name -> its tasks' "host:port".
  task_type: str
  task_index: int
  # Where the cluster was read from, as messages name it.
  source: str = 'TF_CONFIG'

  @property
  def task_name(self) -> str:
    """This task as 'worker:0'."""
    return f'{self.task_type}:{self.task_index}'

  @property
  def address(self) -> str:
    """This task's "host:port"."""
    return self.jobs[self.task_type][self.task_index]

  @property
  def training_tasks(self) -> tuple[str, ...]:
    """The tasks that train together, as 'chief:0', 'worker:0', ..."""
    return tuple(f'{job}:{index}' for job in TRAINING_JOBS
                 for index in range(len(self.jobs.get(job, ()))))

  @property
  def training_jobs(self) -> dict[str, list[str]]:
    """The chief and worker jobs: the cluster that trains together.

    An evaluator is left out, so that training neither waits for it nor
    includes it in a collective.
    """
    return {job: list(self.jobs[job]) for job in TRAINING_JOBS
            if job in self.jobs}

  @property
  def has_evaluator(self) -> bool:
    """Whether an evaluator task evaluates the chief's checkpoints."""
    return 'evaluator' in self.jobs

  @property
  def peers(self) -> tuple[str, ...]:
    """The other training tasks: the ones this task waits for."""
    return tuple(name for name in self.training_tasks
                 if name != self.task_name)

  @property
  def is_chief(self) -> bool:
    """Whether this task writes checkpoints, summaries and results."""
    return is_chief(self.task_type, self.task_index, self.jobs)

  @property
  def fingerprint(self) -> str:
    """Equal for tasks given the same cluster; tells one job from another."""
    text = json.dumps(self.jobs, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  def address_of(self, task_name: str) -> str:
    """The "host:port" of a task named as 'worker:1'."""
    job, index = task_name.split(':')
    return self.jobs[job][int(index)]

  def describe(self) -> str:
    """'worker:0 (chief) at host:port; peers: worker:1 at host:port'."""
    role = ' (chief)' if self.is_chief else ''
    peers = ', '.join(f'{peer} at {self.address_of(peer)}'
                      for peer in self.peers) or 'none'
    return f'{self.task_name}{role} at {self.address}; peers: {peers}'


def is_chief(task_type: str | None, task_index: int, job_names) -> bool:
  """Decides the chief as TensorFlow's multi-worker tutorials do.

  The task of type 'chief' is the chief; without one, worker 0 is; a single
  process (no task type) is its own chief.
  """
  if not task_type or task_type == 'chief':
    return True
  return task_type == 'worker' and task_index == 0 and 'chief' not in job_names


def from_tf_config(text: str | None) -> Cluster | None:
  """Parses and checks TF_CONFIG's text; None when it names no cluster.

  Args:
    text: the value of the TF_CONFIG variable; None when it is not set.

  Returns:
    The cluster, or None for a single process: TF_CONFIG not set, or set
    without a cluster (then a warning says so, as it may be a mistake).

  Raises:
    ConfigError: TF_CONFIG is malformed or names something that
      MultiWorkerMirroredStrategy cannot run; the message says what and
      shows a valid one.
  """
  if text is None:
    return None
  if not text.strip():
    return _no_cluster('TF_CONFIG is set but empty')
  try:
    value = json.loads(text)
  except json.JSONDecodeError as error:
    raise _error(f'is not JSON ({error.msg} at character {error.pos} of '
                 f'{_shorten(text)})') from None
  if not isinstance(value, dict):
    raise _error(f'must be a JSON object, not {_shorten(text)}')
  if value.get('cluster') in (None, {}):
    return _no_cluster('TF_CONFIG names no cluster')
  jobs = _check_jobs(value['cluster'])
  task_type, task_index = _check_task(value.get('task'), jobs)
  return Cluster(jobs, task_type, task_index)


def _no_cluster(reason: str) -> None:
  """Warns that TF_CONFIG is set yet the run is a single process."""
  logging.warning('%s: this run is a single process, not part of a cluster. '
                  'A cluster looks like %s.', reason, EXAMPLE)
  return None


def _check_jobs(cluster) -> dict[str, tuple[str, ...]]:
  """TF_CONFIG's "cluster", checked, as {job: addresses}."""
  if not isinstance(cluster, dict):
    raise _error('"cluster" must map job names to lists of "host:port" '
                 f'addresses, not {_shorten(json.dumps(cluster))}')
  for job, addresses in cluster.items():
    name = _shorten(json.dumps(job))
    if job not in MAX_TASKS:
      raise _error(f'names the job {name}, which ctl does not know: its '
                   'jobs are "chief" (at most one task), "worker", '
                   '"evaluator" (at most one task) and "ps" (parameter '
                   'servers)')
    if not isinstance(addresses, list) or not addresses:
      raise _error(f'job {name} must be a non-empty list of "host:port" '
                   f'addresses, not {_shorten(json.dumps(addresses))}')
    if MAX_TASKS[job] is not None and len(addresses) > MAX_TASKS[job]:
      raise _error(f'job {name} has {len(addresses)} tasks; it can have at '
                   'most one')
    for address in addresses:
      if not _is_address(address):
        raise _error(f'job {name} has the address '
                     f'{_shorten(json.dumps(address))}; an address is '
                     '"host:port" with a port from 1 to 65535')
  if not any(job in cluster for job in TRAINING_JOBS):
    raise _error('"cluster" has no "chief" or "worker" job: no task of it '
                 'would train')
  tasks_at = collections.defaultdict(list)
  for job, addresses in cluster.items():
    for index, address in enumerate(addresses):
      tasks_at[address].append(f'{job}:{index}')
  for address, tasks in tasks_at.items():
    if len(tasks) > 1:
      raise _error(f'gives {" and ".join(tasks)} the same address '
                   f'{json.dumps(address)}; each task needs its own host:port')
  return {job: tuple(addresses) for job, addresses in cluster.items()}


def _is_address(address) -> bool:
  """Whether address is "host:port" (an IPv6 host in brackets)."""
  if not isinstance(address, str):
    return False
  host, _, port = address.rpartition(':')
  return (bool(host) and not any(char.isspace() or char == '/'
                                 for char in host)
          and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)


def _check_task(task, jobs: dict) -> tuple[str, int]:
  """TF_CONFIG's "task", checked against the cluster: (type, index)."""
  if task is None:
    raise _error('has a cluster but no "task" saying which of its tasks '
                 'this process is, e.g. "task": {"type": "worker", '
                 '"index": 0}')
  if not isinstance(task, dict):
    raise _error('"task" must be an object like {"type": "worker", '
                 f'"index": 0}}, not {_shorten(json.dumps(task))}')
  task_type = task.get('type')
  if task_type is None:
    raise _error('"task" has no "type"; it names one of the cluster\'s '
                 f'jobs: {_job_list(jobs)}')
  if not isinstance(task_type, str) or task_type not in jobs:
    raise _error(f'"task" has the type {_shorten(json.dumps(task_type))}, '
                 f'which is not a job of the cluster: {_job_list(jobs)}')
  num_tasks = len(jobs[task_type])
  if 'index' not in task:
    raise _error(f'"task" has no "index": which of the {num_tasks} '
                 f'{json.dumps(task_type)} tasks this process is, from 0')
  index = task['index']
  # bool is an int in Python, but `true` is no index.
  if not isinstance(index, int) or isinstance(index, bool):
    raise _error(f'"task" has the index {_shorten(json.dumps(index))}; an '
                 'index is a whole number, e.g. "index": 0')
  if not 0 <= index < num_tasks:
    raise _error(f'"task" has the index {index}, but job '
                 f'{json.dumps(task_type)} has {num_tasks} task(s): indices '
                 f'0 to {num_tasks - 1}')
  return task_type, index


def _job_list(jobs: dict) -> str:
  """The cluster's job names, quoted as in JSON."""
  return ', '.join(json.dumps(job) for job in jobs)


def _shorten(text: str, limit: int = 200) -> str:
  """text quoted, cut to limit characters: a message stays one line."""
  text = text if len(text) <= limit else text[:limit] + '...'
  return repr(text) if '\n' in text else text


def _error(problem: str) -> errors.ConfigError:
  """A ConfigError saying what is wrong and what a valid TF_CONFIG is."""
  return errors.ConfigError(
      f'TF_CONFIG {problem}. A valid TF_CONFIG looks like {EXAMPLE}: the '
      'same "cluster" for every task, and in "task" which one this is.')
