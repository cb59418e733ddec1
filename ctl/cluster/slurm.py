"""The cluster of a Slurm job step, read from the variables srun sets.

`srun` starts every task of a step with the step's shape in its
environment: how many tasks (SLURM_STEP_NUM_TASKS), on which nodes
(SLURM_STEP_NODELIST, a compressed list like `node[01-03,7]`), how many on
each (SLURM_STEP_TASKS_PER_NODE, like `2(x3),1`), which one this is
(SLURM_PROCID, SLURM_LOCALID) and, where slurm.conf has
`MpiParams=ports=...`, the ports Slurm reserved for the step on each of its
nodes (SLURM_STEP_RESV_PORTS). Every task reads the same cluster from them:
job 'worker', one task per Slurm task in rank order, task 0 the chief.
With distribution.slurm_num_ps=K (a parameter-server job), task 0 is the
'chief' (the coordinator), the last K tasks are the 'ps' servers and the
others the 'worker's: the chief stays task 0 (the first task on the first
node, where the batch script runs), and with srun's block placement the
servers are the last node's tasks, a node of their own when its tasks
are all servers.

TensorFlow's own SlurmClusterResolver reads the same variables, but runs
`nvidia-smi` (an uncaught FileNotFoundError on a node without it) and
rewrites CUDA_VISIBLE_DEVICES; this module does neither: each task keeps
the GPUs Slurm gave it (`--gpus-per-task`, `--gpu-bind`). Nor does it call
`scontrol`: the environment is all it reads. Pure Python: nothing here
imports TensorFlow.
"""

from collections.abc import Mapping
import itertools
import re

from absl import logging

from ctl import errors
from ctl.cluster import tf_config as cluster_lib

# The variables srun sets for each task; both are needed to tell a task of
# a step from a batch script (which has SLURM_PROCID but no step).
_STEP_VARIABLES = ('SLURM_PROCID', 'SLURM_STEP_NUM_TASKS')
# A compressed list's ranges, like `01-03` or `7`; so are port ranges.
_RANGE = re.compile(r'(\d+)(?:-(\d+))?')
# An entry of SLURM_STEP_TASKS_PER_NODE: `2`, or `2(x3)` for 3 nodes of 2.
_TASKS = re.compile(r'(\d+)(?:\(x(\d+)\))?')
# No step spans more nodes than this; a longer range is a mistake.
_MAX_EXPANSION = 1 << 16


def started_by_srun(environ: Mapping[str, str]) -> bool:
  """Whether srun started this process as a task of a job step."""
  return all(name in environ for name in _STEP_VARIABLES)


def from_environment(environ: Mapping[str, str], port_base: int,
                     num_ps: int = 0) -> cluster_lib.Cluster | None:
  """The cluster of the Slurm step this process is a task of.

  Args:
    environ: the process's environment (os.environ), or a dict in tests.
    port_base: without ports reserved by Slurm, the task with local index
      i on a node listens on port_base + i (distribution.slurm_port_base).
    num_ps: how many of the step's tasks are parameter servers, the last
      ones (distribution.slurm_num_ps); 0 for none.

  Returns:
    The cluster (`_cluster`: job 'worker', one task per Slurm task, or
    with num_ps the jobs of parameter servers), or None for a step of one
    task (a single process).

  Raises:
    ConfigError: a variable is missing or malformed, the variables
      disagree, or the tasks are not placed in blocks (srun's default
      distribution), naming the variable; or num_ps leaves no worker.
  """
  for name in _STEP_VARIABLES:
    if name not in environ:
      raise errors.ConfigError(
          f"distribution.cluster_resolver='slurm', but {name} is not set: "
          'srun did not start this process. Run `srun python -m ctl.main '
          "...` inside an allocation (sbatch, salloc), or set "
          "cluster_resolver='auto' to read TF_CONFIG, or Slurm's variables "
          'when srun sets them.')
  num_tasks = _integer(environ, 'SLURM_STEP_NUM_TASKS', minimum=1)
  rank = _integer(environ, 'SLURM_PROCID', minimum=0)
  _check_num_ps(num_ps, num_tasks)
  if num_tasks == 1:
    logging.info('Slurm step of one task: a single process.')
    return None
  if rank >= num_tasks:
    raise _error(f'SLURM_PROCID={rank} is not a task of the '
                 f'SLURM_STEP_NUM_TASKS={num_tasks} tasks (0 to '
                 f'{num_tasks - 1})')
  hosts = expand_hostlist(_required(environ, 'SLURM_STEP_NODELIST'))
  tasks_per_node = expand_tasks_per_node(
      _required(environ, 'SLURM_STEP_TASKS_PER_NODE'))
  _check_shape(environ, hosts, tasks_per_node, num_tasks)
  ports, port_source = _ports(environ, port_base, max(tasks_per_node))
  addresses = tuple(f'{host}:{ports[local]}'
                    for host, count in zip(hosts, tasks_per_node)
                    for local in range(count))
  _check_placement(environ, rank, hosts, tasks_per_node)
  logging.info(
      'Slurm step %s.%s: %d tasks on %d node(s) (tasks per node: %s), '
      'ports %s. '
      'GPUs as Slurm set them, unchanged: CUDA_VISIBLE_DEVICES=%s.',
      environ.get('SLURM_JOB_ID', '?'), environ.get('SLURM_STEP_ID', '?'),
      num_tasks, len(hosts), environ['SLURM_STEP_TASKS_PER_NODE'],
      port_source, environ.get('CUDA_VISIBLE_DEVICES', '(not set: all)'))
  return _cluster(addresses, rank, num_ps)


def _check_num_ps(num_ps: int, num_tasks: int) -> None:
  """Raises ConfigError unless num_ps servers leave the step a chief and
  a worker (or num_ps is 0)."""
  if num_ps and not 1 <= num_ps <= num_tasks - 2:
    allowed = (f'1 to {num_tasks - 2}' if num_tasks > 2 else
               'none: ask srun for 3 tasks or more')
    raise errors.ConfigError(
        f'distribution.slurm_num_ps={num_ps}, but the Slurm step has '
        f'{num_tasks} task(s) (SLURM_STEP_NUM_TASKS): a parameter-server '
        'job needs task 0 as its chief, at least one worker and at least '
        f'one server, so the last {allowed} task(s) can be servers (0: '
        'a job without servers).')


def _cluster(addresses: tuple[str, ...], rank: int,
             num_ps: int) -> cluster_lib.Cluster:
  """The step's cluster, its tasks in rank order: job 'worker' (rank 0 the
  chief); with num_ps servers, rank 0 the 'chief', the last num_ps ranks
  'ps' and the ranks between 'worker'."""
  source = "Slurm's SLURM_STEP_* variables"
  if not num_ps:
    return cluster_lib.Cluster({'worker': addresses}, 'worker', rank,
                               source=source)
  first_server = len(addresses) - num_ps
  jobs = {'chief': addresses[:1], 'worker': addresses[1:first_server],
          'ps': addresses[first_server:]}
  task_type, task_index = (
      ('chief', 0) if rank == 0 else ('ps', rank - first_server)
      if rank >= first_server else ('worker', rank - 1))
  logging.info('distribution.slurm_num_ps=%d: task 0 is the chief, tasks '
               '%d to %d the parameter servers, the others the workers; '
               'this task (%d) is %s:%d.', num_ps, first_server,
               len(addresses) - 1, rank, task_type, task_index)
  return cluster_lib.Cluster(
      jobs, task_type, task_index,
      source=f'{source} with distribution.slurm_num_ps={num_ps}')


def expand_hostlist(text: str) -> list[str]:
  """Slurm's compressed host list, expanded: 'n[1-2],g5' -> n1, n2, g5.

  A range keeps the zero-padding of its first number (`n[08-10]`: n08,
  n09, n10); a name may have several bracketed parts, each expanded.

  Raises:
    ConfigError: text is not a host list.
  """
  hosts = []
  for expression in _split_top_level(text, 'SLURM_STEP_NODELIST'):
    parts = re.split(r'(\[[^\[\]]*\])', expression)
    if any(char in part for part in parts[::2] for char in '[]'):
      raise _malformed('SLURM_STEP_NODELIST', text, 'unbalanced brackets')
    choices = [_expand_brackets(part, text) if part.startswith('[')
               else [part] for part in parts]
    hosts.extend(''.join(pieces) for pieces in itertools.product(*choices))
  for host in hosts:
    if not host or any(char.isspace() or char in '/:' for char in host):
      raise _malformed('SLURM_STEP_NODELIST', text,
                       f'{host!r} is not a host name')
  return hosts


def expand_tasks_per_node(text: str) -> list[int]:
  """SLURM_STEP_TASKS_PER_NODE, expanded: '2(x3),1' -> [2, 2, 2, 1].

  Raises:
    ConfigError: text is not a list of counts.
  """
  counts = []
  for entry in text.split(','):
    match = _TASKS.fullmatch(entry.strip())
    if not match or int(match.group(1)) < 1 or match.group(2) == '0':
      raise _malformed('SLURM_STEP_TASKS_PER_NODE', text,
                       f'{entry!r} is not a count like 2 or 2(x3)')
    repeat = int(match.group(2) or 1)
    if len(counts) + repeat > _MAX_EXPANSION:
      raise _malformed('SLURM_STEP_TASKS_PER_NODE', text, 'too many nodes')
    counts.extend([int(match.group(1))] * repeat)
  return counts


def expand_ports(text: str) -> list[int]:
  """SLURM_STEP_RESV_PORTS, expanded: '12000-12001,12005' -> 3 ports.

  Raises:
    ConfigError: text is not a list of ports from 1 to 65535.
  """
  ports = []
  for entry in text.split(','):
    match = _RANGE.fullmatch(entry.strip())
    low, high = (int(match.group(1)), int(match.group(2) or match.group(1))
                 ) if match else (0, -1)
    if not 1 <= low <= high <= 65535:
      raise _malformed('SLURM_STEP_RESV_PORTS', text,
                       f'{entry!r} is not a port or a range of ports')
    ports.extend(range(low, high + 1))
  return ports


def _split_top_level(text: str, name: str) -> list[str]:
  """text split at the commas outside brackets."""
  expressions, depth, start = [], 0, 0
  for position, char in enumerate(text):
    depth += {'[': 1, ']': -1}.get(char, 0)
    if depth not in (0, 1):
      raise _malformed(name, text, 'unbalanced brackets')
    if char == ',' and depth == 0:
      expressions.append(text[start:position].strip())
      start = position + 1
  if depth:
    raise _malformed(name, text, 'unbalanced brackets')
  expressions.append(text[start:].strip())
  if not all(expressions):
    raise _malformed(name, text, 'an empty entry')
  return expressions


def _expand_brackets(part: str, text: str) -> list[str]:
  """'[01-03,7]' -> ['01', '02', '03', '7']."""
  names = []
  for entry in part[1:-1].split(','):
    match = _RANGE.fullmatch(entry.strip())
    if not match:
      raise _malformed('SLURM_STEP_NODELIST', text,
                       f'[{part[1:-1]}] holds {entry!r}, not a number or '
                       'a range like 01-03')
    low_text = match.group(1)
    low, high = int(low_text), int(match.group(2) or low_text)
    if high < low or len(names) + high - low >= _MAX_EXPANSION:
      raise _malformed('SLURM_STEP_NODELIST', text,
                       f'{entry!r} is not a range of a few nodes')
    names.extend(f'{number:0{len(low_text)}d}'
                 for number in range(low, high + 1))
  return names


def _check_shape(environ: Mapping[str, str], hosts: list[str],
                 tasks_per_node: list[int], num_tasks: int) -> None:
  """Raises unless the node list, the counts and the task count agree."""
  nodes, counts = environ['SLURM_STEP_NODELIST'], environ[
      'SLURM_STEP_TASKS_PER_NODE']
  if len(hosts) != len(tasks_per_node):
    raise _error(f'SLURM_STEP_NODELIST={nodes} names {len(hosts)} node(s) '
                 f'but SLURM_STEP_TASKS_PER_NODE={counts} counts tasks on '
                 f'{len(tasks_per_node)}')
  if sum(tasks_per_node) != num_tasks:
    raise _error(f'SLURM_STEP_TASKS_PER_NODE={counts} places '
                 f'{sum(tasks_per_node)} tasks but SLURM_STEP_NUM_TASKS='
                 f'{num_tasks}')
  repeated = sorted({host for host in hosts if hosts.count(host) > 1})
  if repeated:
    raise _error(f'SLURM_STEP_NODELIST={nodes} names {repeated[0]} more '
                 'than once')


def _ports(environ: Mapping[str, str], port_base: int,
           tasks_on_a_node: int) -> tuple[list[int], str]:
  """The ports of a node's tasks, by local index, and where they come from.

  Slurm reserves the same ports on every node of the step, so the task of
  local index i listens on the i-th of them on its node.
  """
  reserved = environ.get('SLURM_STEP_RESV_PORTS')
  if reserved:
    ports = expand_ports(reserved)
    if len(ports) < tasks_on_a_node:
      raise _error(f'SLURM_STEP_RESV_PORTS={reserved} reserves '
                   f'{len(ports)} port(s), but a node runs {tasks_on_a_node} '
                   'tasks, each needing its own; ask srun for at least '
                   f'--resv-ports={tasks_on_a_node}')
    return ports, f'reserved by Slurm (SLURM_STEP_RESV_PORTS={reserved})'
  last = port_base + tasks_on_a_node - 1
  if not (1 <= port_base and last <= 65535):
    raise errors.ConfigError(
        f'distribution.slurm_port_base={port_base} gives the {tasks_on_a_node}'
        f' task(s) of a node the ports {port_base} to {last}; a port is from '
        '1 to 65535.')
  ports = list(range(port_base, last + 1))
  return ports, (f'{port_base} + local task index '
                 '(distribution.slurm_port_base; Slurm reserved none)')


def _check_placement(environ: Mapping[str, str], rank: int,
                     hosts: list[str], tasks_per_node: list[int]) -> None:
  """Raises unless srun placed the tasks in blocks, as the cluster assumes.

  Tasks 0 to k-1 on the first node, and so on (srun's default
  distribution): only then does every task compute the same address for
  each rank. This task's node (SLURMD_NODENAME) and local index
  (SLURM_LOCALID) tell.
  """
  first_ranks = list(itertools.accumulate([0, *tasks_per_node]))
  node = next(index for index in range(len(hosts))
              if rank < first_ranks[index + 1])
  expected = {'SLURMD_NODENAME': hosts[node],
              'SLURM_LOCALID': str(rank - first_ranks[node])}
  for name, value in expected.items():
    if name in environ and environ[name].strip() != value:
      raise _error(
          f'task {rank} runs with {name}={environ[name]}, but placed in '
          f'blocks (srun --distribution=block, the default) it would have '
          f'{name}={value}; start the step with --distribution=block')


def _required(environ: Mapping[str, str], name: str) -> str:
  """A variable srun sets for every task of a step."""
  value = environ.get(name, '').strip()
  if not value:
    raise _error(f'{name} is not set')
  return value


def _integer(environ: Mapping[str, str], name: str, minimum: int) -> int:
  """A whole-number variable, at least minimum."""
  text = environ[name].strip()
  if not text.isascii() or not text.isdigit() or int(text) < minimum:
    raise _error(f'{name}={environ[name]!r} is not a whole number of at '
                 f'least {minimum}')
  return int(text)


def _malformed(name: str, text: str, problem: str) -> errors.ConfigError:
  """The error for a variable whose text cannot be read."""
  return _error(f'{name}={text!r} cannot be read ({problem})')


def _error(problem: str) -> errors.ConfigError:
  """A ConfigError about Slurm's variables, saying how to get them right."""
  return errors.ConfigError(
      f'Slurm: {problem}. ctl builds the cluster from the variables srun '
      'sets for each task of a step, left as srun set them; or give every '
      'task a TF_CONFIG instead.')
