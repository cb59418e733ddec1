"""Slurm: the cluster read from srun's variables, and the batch script a user copies.

The parser's tests need no TensorFlow. The batch script
(experiments/deploy/slurm.sbatch) runs as it is, under bash, with a
stand-in for `srun` on the PATH: this machine has no Slurm. The stand-in
starts the script's command once per task with the variables srun sets for
a step of 2 tasks on one node, and exits as srun does, with its tasks'
highest code; a stand-in `scontrol` records what it was asked.
"""

import json
import os
import pathlib
import re
import signal
import socket
import stat
import subprocess
import sys
import time

import portpicker
import pytest

import helpers
from ctl import errors
from ctl.cluster import slurm

SBATCH = helpers.REPO / 'experiments' / 'deploy' / 'slurm.sbatch'

# What srun sets for task 1 of a step of 2 nodes x 2 tasks, Slurm having
# reserved 3 ports per node (MpiParams=ports=..., one more than the tasks).
TWO_BY_TWO = {
    'SLURM_JOB_ID': '4242', 'SLURM_STEP_ID': '0', 'SLURM_PROCID': '1',
    'SLURM_LOCALID': '1', 'SLURM_NODEID': '0', 'SLURMD_NODENAME': 'gpu07',
    'SLURM_STEP_NUM_TASKS': '4', 'SLURM_STEP_NUM_NODES': '2',
    'SLURM_STEP_NODELIST': 'gpu[07-08]', 'SLURM_STEP_TASKS_PER_NODE': '2(x2)',
    'SLURM_STEP_RESV_PORTS': '12000-12002',
}


def _task(environ: dict, rank: int) -> dict:
  """environ as srun sets it for task rank of the same 2 x 2 step."""
  return {**environ, 'SLURM_PROCID': str(rank), 'SLURM_LOCALID': str(rank % 2),
          'SLURM_NODEID': str(rank // 2),
          'SLURMD_NODENAME': f'gpu0{7 + rank // 2}'}


def test_two_nodes_of_two_tasks_on_the_ports_slurm_reserved():
  clusters = [slurm.from_environment(_task(TWO_BY_TWO, rank), port_base=1)
              for rank in range(4)]
  expected = ('gpu07:12000', 'gpu07:12001', 'gpu08:12000', 'gpu08:12001')
  for rank, cluster in enumerate(clusters):
    assert cluster.jobs == {'worker': expected}
    assert (cluster.task_type, cluster.task_index) == ('worker', rank)
  assert [cluster.is_chief for cluster in clusters] == [True, False, False,
                                                         False]
  assert len({cluster.fingerprint for cluster in clusters}) == 1
  assert clusters[1].describe() == (
      'worker:1 at gpu07:12001; peers: worker:0 at gpu07:12000, '
      'worker:2 at gpu08:12000, worker:3 at gpu08:12001')


def test_without_reserved_ports_a_task_takes_the_base_plus_its_local_index():
  environ = {key: value for key, value in _task(TWO_BY_TWO, 3).items()
             if key != 'SLURM_STEP_RESV_PORTS'}
  cluster = slurm.from_environment(environ, port_base=8888)
  assert cluster.jobs['worker'] == ('gpu07:8888', 'gpu07:8889', 'gpu08:8888',
                                    'gpu08:8889')
  assert cluster.address == 'gpu08:8889'


def test_one_node_of_two_tasks_and_uneven_nodes():
  one_node = {'SLURM_PROCID': '0', 'SLURM_LOCALID': '0',
              'SLURM_STEP_NUM_TASKS': '2', 'SLURM_STEP_NODELIST': 'localhost',
              'SLURM_STEP_TASKS_PER_NODE': '2',
              'SLURM_STEP_RESV_PORTS': '12000,12005'}
  assert slurm.from_environment(one_node, 1).jobs == {
      'worker': ('localhost:12000', 'localhost:12005')}
  uneven = {'SLURM_PROCID': '4', 'SLURM_STEP_NUM_TASKS': '5',
            'SLURM_STEP_NODELIST': 'a[1-2],b', 'SLURMD_NODENAME': 'b',
            'SLURM_LOCALID': '0', 'SLURM_STEP_TASKS_PER_NODE': '2(x2),1'}
  cluster = slurm.from_environment(uneven, 9000)
  assert cluster.jobs['worker'] == ('a1:9000', 'a1:9001', 'a2:9000',
                                    'a2:9001', 'b:9000')
  assert cluster.task_name == 'worker:4'


def test_a_step_of_one_task_is_a_single_process():
  assert slurm.from_environment(
      {'SLURM_PROCID': '0', 'SLURM_STEP_NUM_TASKS': '1'}, 8888) is None


def test_a_batch_script_is_not_a_task_of_a_step():
  # sbatch sets SLURM_PROCID=0 for the script, but no step.
  assert not slurm.started_by_srun({'SLURM_JOB_ID': '1', 'SLURM_PROCID': '0',
                                    'SLURM_NTASKS': '4'})
  assert slurm.started_by_srun(TWO_BY_TWO)



def test_with_slurm_num_ps_the_last_tasks_are_the_parameter_servers():
  # Task 0 stays the chief (the coordinator); the last node's tasks serve.
  from ctl.cluster import ps_cluster  # pylint: disable=g-import-not-at-top
  clusters = [slurm.from_environment(_task(TWO_BY_TWO, rank), port_base=1,
                                     num_ps=1) for rank in range(4)]
  for cluster in clusters:
    assert cluster.jobs == {'chief': ('gpu07:12000',),
                            'worker': ('gpu07:12001', 'gpu08:12000'),
                            'ps': ('gpu08:12001',)}
    assert 'distribution.slurm_num_ps=1' in cluster.source
  assert [cluster.task_name for cluster in clusters] == [
      'chief:0', 'worker:0', 'worker:1', 'ps:0']
  assert [cluster.is_chief for cluster in clusters] == [True, False, False,
                                                         False]
  assert len({cluster.fingerprint for cluster in clusters}) == 1
  assert ps_cluster.has_ps(clusters[0], 'auto')  # 'auto' chooses servers.
  ps_cluster.check_cluster(clusters[0])  # A cluster they can run.
  two = slurm.from_environment(_task(TWO_BY_TWO, 2), port_base=1, num_ps=2)
  assert two.jobs['ps'] == ('gpu08:12000', 'gpu08:12001')  # A node's own.
  assert two.task_name == 'ps:0'
  assert slurm.from_environment(_task(TWO_BY_TWO, 2), 1, num_ps=0).jobs == {
      'worker': ('gpu07:12000', 'gpu07:12001', 'gpu08:12000', 'gpu08:12001')}


@pytest.mark.parametrize('num_tasks, num_ps, allowed', [
    (4, 3, 'the last 1 to 2 task(s) can be servers'),
    (4, 4, 'the last 1 to 2 task(s) can be servers'),
    (4, 9, 'the last 1 to 2 task(s) can be servers'),
    (4, -1, 'the last 1 to 2 task(s) can be servers'),
    (2, 1, 'the last none: ask srun for 3 tasks or more'),
    (1, 1, 'the last none: ask srun for 3 tasks or more'),
])
def test_servers_that_leave_no_chief_and_worker_are_a_config_error(
    num_tasks, num_ps, allowed):
  environ = {'SLURM_PROCID': '0', 'SLURM_LOCALID': '0',
             'SLURM_STEP_NUM_TASKS': str(num_tasks),
             'SLURM_STEP_NODELIST': 'localhost',
             'SLURM_STEP_TASKS_PER_NODE': str(num_tasks)}
  with pytest.raises(errors.ConfigError) as raised:
    slurm.from_environment(environ, port_base=8888, num_ps=num_ps)
  message = str(raised.value)
  assert message.startswith(f'distribution.slurm_num_ps={num_ps}, but the '
                            f'Slurm step has {num_tasks} task(s)'), message
  assert allowed in message and '\n' not in message


def test_a_negative_slurm_num_ps_is_refused_with_the_config():
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config()
  config.task = 'classification'
  config.distribution.slurm_num_ps = -1
  with pytest.raises(errors.ConfigError,
                     match='distribution.slurm_num_ps.*must not be negative'):
    config_lib.validate(config)


def test_too_many_servers_stop_ctl_main_with_one_line_at_start(tmp_path):
  # What each task of such a step does: one line, exit 2, nothing written.
  environ = {**_task(TWO_BY_TWO, 1), 'SLURMD_NODENAME': 'gpu07'}
  run = helpers.run_ctl(
      f'--config={helpers.DIGITS}', '--config.distribution.slurm_num_ps=3',
      f'--workdir={tmp_path / "w"}',
      env={key: value for key, value in helpers.env_with(**environ).items()
           if key != 'TF_CONFIG'})
  assert run.returncode == 2, run.stderr[-3000:]
  assert run.stderr.strip().splitlines()[-1].startswith(
      'ctl: error: distribution.slurm_num_ps=3, but the Slurm step has 4 '
      'task(s)'), run.stderr[-3000:]
  assert not (tmp_path / 'w').exists()


def test_a_lost_server_of_a_slurm_job_is_named(monkeypatch):
  # The chief names the server from Slurm's variables as from TF_CONFIG's.
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  from ctl.cluster import distribution  # pylint: disable=g-import-not-at-top
  from ctl.cluster import ps_cluster  # pylint: disable=g-import-not-at-top
  ports = [portpicker.pick_unused_port() for _ in range(3)]
  monkeypatch.delenv('TF_CONFIG', raising=False)
  for name, value in {
      'SLURM_PROCID': '0', 'SLURM_LOCALID': '0', 'SLURM_STEP_NUM_TASKS': '3',
      'SLURM_STEP_NODELIST': 'localhost', 'SLURMD_NODENAME': 'localhost',
      'SLURM_STEP_TASKS_PER_NODE': '3',
      'SLURM_STEP_RESV_PORTS': ','.join(map(str, ports))}.items():
    monkeypatch.setenv(name, value)
  config = config_lib.base_config().distribution
  config.slurm_num_ps = 1
  cluster = distribution.read_cluster(config)
  assert cluster.jobs['ps'] == (f'localhost:{ports[2]}',)
  failure = ps_cluster.lost_server_failure(cluster)
  assert isinstance(failure, errors.PeerFailure), failure
  assert 'The parameter server(s) ps:0 stopped answering' in str(failure)
  with socket.create_server(('localhost', ports[2])):
    assert ps_cluster.lost_server_failure(cluster) is None  # It listens.

@pytest.mark.parametrize('text, expected', [
    ('localhost', ['localhost']),
    ('node[01-03,7],gpu5', ['node01', 'node02', 'node03', 'node7', 'gpu5']),
    ('n[8-10]', ['n8', 'n9', 'n10']),
    ('n[008-010]', ['n008', 'n009', 'n010']),
    ('rack[1-2]-n[1-2]', ['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']),
    ('a, b[2]', ['a', 'b2']),
])
def test_compressed_host_lists(text, expected):
  assert slurm.expand_hostlist(text) == expected


def test_tasks_per_node_and_reserved_ports():
  assert slurm.expand_tasks_per_node('2(x3),1') == [2, 2, 2, 1]
  assert slurm.expand_tasks_per_node('4') == [4]
  assert slurm.expand_ports('12000-12002,12005') == [12000, 12001, 12002,
                                                      12005]


# (a change to TWO_BY_TWO's task 1, what the message must say): one of each
# kind of mistake.
MISTAKES = {
    'not a task': ({'SLURM_PROCID': None}, "cluster_resolver='slurm', but "
                   'SLURM_PROCID is not set: srun did not start this process'),
    'count not a number': ({'SLURM_STEP_NUM_TASKS': 'four'},
                           "SLURM_STEP_NUM_TASKS='four' is not a whole number"),
    'rank out of range': ({'SLURM_PROCID': '4'},
                          'SLURM_PROCID=4 is not a task of the '
                          'SLURM_STEP_NUM_TASKS=4 tasks (0 to 3)'),
    'no node list': ({'SLURM_STEP_NODELIST': None},
                     'SLURM_STEP_NODELIST is not set'),
    'unbalanced': ({'SLURM_STEP_NODELIST': 'gpu[07-08'},
                   "SLURM_STEP_NODELIST='gpu[07-08' cannot be read "
                   '(unbalanced brackets)'),
    'backwards range': ({'SLURM_STEP_NODELIST': 'gpu[08-07]'},
                        "'08-07' is not a range"),
    'letters in a range': ({'SLURM_STEP_NODELIST': 'gpu[a-b]'},
                           "holds 'a-b', not a number or a range"),
    'bad count': ({'SLURM_STEP_TASKS_PER_NODE': '2(3)'},
                  "'2(3)' is not a count like 2 or 2(x3)"),
    'nodes disagree': ({'SLURM_STEP_TASKS_PER_NODE': '2(x3)'},
                       'names 2 node(s) but SLURM_STEP_TASKS_PER_NODE=2(x3) '
                       'counts tasks on 3'),
    'tasks disagree': ({'SLURM_STEP_NUM_TASKS': '3'},
                       'places 4 tasks but SLURM_STEP_NUM_TASKS=3'),
    'a node twice': ({'SLURM_STEP_NODELIST': 'gpu07,gpu07'},
                     'names gpu07 more than once'),
    'bad ports': ({'SLURM_STEP_RESV_PORTS': '12000-99999'},
                  "'12000-99999' is not a port or a range of ports"),
    'too few ports': ({'SLURM_STEP_RESV_PORTS': '12000'},
                      'reserves 1 port(s), but a node runs 2 tasks'),
    'cyclic': ({'SLURMD_NODENAME': 'gpu08'},
               'task 1 runs with SLURMD_NODENAME=gpu08, but placed in blocks '
               '(srun --distribution=block, the default) it would have '
               'SLURMD_NODENAME=gpu07'),
    'local index': ({'SLURM_LOCALID': '0'}, 'SLURM_LOCALID=1'),
}


@pytest.mark.parametrize('case', MISTAKES)
def test_a_wrong_slurm_environment_is_a_config_error_saying_what(case):
  change, expected = MISTAKES[case]
  environ = {**TWO_BY_TWO, **change}
  environ = {key: value for key, value in environ.items() if value is not None}
  with pytest.raises(errors.ConfigError) as raised:
    slurm.from_environment(environ, port_base=8888)
  message = str(raised.value)
  assert expected in message
  assert '\n' not in message


def test_a_port_base_beyond_the_last_port_is_a_config_error():
  environ = {key: value for key, value in TWO_BY_TWO.items()
             if key != 'SLURM_STEP_RESV_PORTS'}
  with pytest.raises(errors.ConfigError,
                     match=r'distribution.slurm_port_base=65535 gives the 2 '
                     r'task\(s\) of a node the ports 65535 to 65536'):
    slurm.from_environment(environ, port_base=65535)


@pytest.mark.parametrize('resolver, tf_config, srun, expected', [
    # auto: TF_CONFIG first (ctl.launch inside an srun step sets it), then
    # Slurm's variables, else a single process.
    ('auto', True, True, 'localhost:1'),
    ('auto', False, True, 'gpu07:12000'),
    ('auto', False, False, None),
    ('tf_config', False, True, None),
    ('slurm', True, True, 'gpu07:12000'),
])
def test_the_resolver_chooses_where_the_cluster_comes_from(
    monkeypatch, resolver, tf_config, srun, expected):
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  from ctl.cluster import distribution  # pylint: disable=g-import-not-at-top
  for name in [*TWO_BY_TWO, 'TF_CONFIG']:
    monkeypatch.delenv(name, raising=False)
  if srun:
    for name, value in _task(TWO_BY_TWO, 0).items():
      monkeypatch.setenv(name, value)
  if tf_config:
    monkeypatch.setenv('TF_CONFIG', json.dumps({
        'cluster': {'worker': ['localhost:1', 'localhost:2']},
        'task': {'type': 'worker', 'index': 0}}))
  config = config_lib.base_config().distribution
  assert config.cluster_resolver == 'auto'  # The default.
  config.cluster_resolver = resolver
  cluster = distribution.read_cluster(config)
  assert (cluster.address if cluster else None) == expected


# The batch script, under bash, with stand-ins for srun and scontrol.

# srun: starts its command once per task, with the step's variables, each
# task's output in STANDIN_LOGS/task<rank>.log; exits with the tasks'
# highest code (128 + N for a task killed by signal N), as srun does. With
# STANDIN_EXIT set it only records its arguments and exits with that code,
# or, for 'sigterm', with 42 once SIGTERM comes (as ctl's tasks do).
STANDIN_SRUN = '''#!{python}
import json, os, signal, subprocess, sys, time
if os.environ.get('STANDIN_EXIT') == 'sigterm':
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
arguments = sys.argv[1:]
options = []
while arguments and arguments[0].startswith('-'):
  options.append(arguments.pop(0))
with open(os.environ['STANDIN_RECORD'], 'a') as record:
  record.write(json.dumps({{'srun': options, 'command': arguments}}) + '\\n')
if os.environ.get('STANDIN_EXIT') == 'sigterm':
  while True:
    time.sleep(0.05)
if 'STANDIN_EXIT' in os.environ:
  sys.exit(int(os.environ['STANDIN_EXIT']))
step = json.loads(os.environ['STANDIN_STEP'])
tasks = []
for rank in range(int(step['SLURM_STEP_NUM_TASKS'])):
  log = open(os.path.join(os.environ['STANDIN_LOGS'], f'task{{rank}}.log'), 'w')
  env = dict(os.environ, **step, SLURM_PROCID=str(rank),
             SLURM_LOCALID=str(rank), SLURM_NODEID='0',
             SLURMD_NODENAME=step['SLURM_STEP_NODELIST'])
  tasks.append(subprocess.Popen(arguments, env=env, stdout=log,
                                stderr=subprocess.STDOUT))
codes = [task.wait(timeout=300) for task in tasks]
sys.exit(max(code if code >= 0 else 128 - code for code in codes))
'''
STANDIN_SCONTROL = '''#!/bin/sh
echo "scontrol $*" >> "$STANDIN_RECORD"
'''


def _standins(tmp_path: pathlib.Path) -> pathlib.Path:
  """A bin/ folder with srun and scontrol stand-ins; returns it."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  for name, text in (('srun', STANDIN_SRUN.format(python=sys.executable)),
                     ('scontrol', STANDIN_SCONTROL)):
    path = bin_dir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return bin_dir


def _start_sbatch(tmp_path, *script_args, **variables) -> subprocess.Popen:
  """Starts the batch script as Slurm would: bash, in the submit directory,
  with the job's variables, in a process group of its own."""
  env = helpers.env_with(
      PATH=os.pathsep.join([str(_standins(tmp_path)),
                            os.path.dirname(sys.executable),
                            os.environ['PATH']]),
      SLURM_JOB_ID='4242', SLURM_JOB_NAME='ctl',
      STANDIN_RECORD=str(tmp_path / 'record'), **variables)
  env.pop('TF_CONFIG', None)
  return subprocess.Popen(['bash', str(SBATCH), *script_args],
                          cwd=helpers.REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          start_new_session=True)


def _asked(tmp_path) -> list[str]:
  """What the stand-ins for srun and scontrol were asked, a line each."""
  record = tmp_path / 'record'
  return record.read_text().splitlines() if record.exists() else []


def _run_sbatch(tmp_path, *script_args, timeout=300, **variables):
  """Runs the batch script to its end; returns its exit code, its stderr
  and what srun and scontrol were asked."""
  script = _start_sbatch(tmp_path, *script_args, **variables)
  try:
    _, stderr = script.communicate(timeout=timeout)
  finally:
    if script.poll() is None:
      os.killpg(script.pid, signal.SIGKILL)
  return script.returncode, stderr, _asked(tmp_path)


def test_the_batch_script_asks_slurm_for_what_ctl_needs():
  text = SBATCH.read_text()
  options = ' '.join(line.split('#')[1].removeprefix('SBATCH ')
                     for line in text.splitlines()
                     if line.startswith('#SBATCH '))
  for option in ('--nodes=', '--ntasks-per-node=', '--requeue',
                 '--open-mode=append', '--signal=TERM@'):
    assert option in options
  # Every #SBATCH line comes before the first command, or sbatch ignores it.
  lines = [line for line in text.splitlines()[1:] if line.strip()]
  first_command = next(index for index, line in enumerate(lines)
                       if not line.startswith('#'))
  assert not any(line.startswith('#SBATCH') for line in lines[first_command:])


@pytest.mark.parametrize('code, restart_count, requeued', [
    (0, '0', False),
    (42, '0', True),  # Preempted after a checkpoint.
    (43, '3', True),  # A peer failed.
    (137, '0', True),  # A task was killed (SIGKILL, out of memory).
    (1, '0', False),  # A restart would fail the same way.
    (2, '0', False),
    (42, '20', False),  # MAX_REQUEUES reached.
])
def test_the_batch_script_requeues_what_a_restart_resumes(
    tmp_path, code, restart_count, requeued):
  exit_code, stderr, asked = _run_sbatch(
      tmp_path, '--config.batch_size=64', STANDIN_EXIT=str(code),
      SLURM_RESTART_COUNT=restart_count)
  assert exit_code == code, stderr
  srun = json.loads(asked[0])
  assert srun['command'][:3] == ['python', '-m', 'ctl.main']
  assert srun['command'][-1] == '--config.batch_size=64'  # The script's args.
  assert '--distribution=block' in srun['srun']
  assert (asked[1:] == ['scontrol requeue 4242']) is requeued, asked
  assert ('requeueing job 4242' in stderr) is requeued


def test_a_job_cancelled_or_preempted_by_slurm_is_left_to_slurm(tmp_path):
  # scancel and a preemption send SIGTERM to the script and the tasks: the
  # script waits for the tasks to save, and does not requeue a job its
  # user cancelled (Slurm requeues a preempted one itself).
  script = _start_sbatch(tmp_path, STANDIN_EXIT='sigterm')
  try:
    deadline = time.monotonic() + 30
    while not _asked(tmp_path):  # srun started, its handler in place.
      assert time.monotonic() < deadline and script.poll() is None
      time.sleep(0.02)
    os.killpg(script.pid, signal.SIGTERM)
    _, stderr = script.communicate(timeout=30)
  finally:
    if script.poll() is None:
      os.killpg(script.pid, signal.SIGKILL)
  assert script.returncode == 42, stderr
  assert 'waiting for the tasks to save' in stderr
  assert len(_asked(tmp_path)) == 1  # srun; no scontrol requeue.


@pytest.mark.slow
def test_the_batch_script_trains_two_tasks_of_one_node(tmp_path):
  ports = sorted(portpicker.pick_unused_port() for _ in range(2))
  logs = tmp_path / 'logs'
  logs.mkdir()
  workdir = tmp_path / 'workdir'
  step = {'SLURM_STEP_ID': '0', 'SLURM_STEP_NUM_TASKS': '2',
          'SLURM_STEP_NUM_NODES': '1', 'SLURM_STEP_NODELIST': 'localhost',
          'SLURM_STEP_TASKS_PER_NODE': '2',
          'SLURM_STEP_RESV_PORTS': ','.join(map(str, ports))}
  exit_code, _, asked = _run_sbatch(
      tmp_path, '--config.num_epochs=1', CONFIG=helpers.DIGITS,
      WORKDIR=str(workdir),
      STANDIN_STEP=json.dumps(step), STANDIN_LOGS=str(logs))
  outputs = [(logs / f'task{rank}.log').read_text() for rank in range(2)]
  assert exit_code == 0, outputs[1][-3000:] + outputs[0][-3000:]
  assert len(asked) == 1  # srun, and no requeue.

  chief, other = (f'localhost:{port}' for port in ports)
  assert (f'this task is worker:0 (chief) at {chief}; peers: worker:1 at '
          f'{other}') in outputs[0]
  assert (f'this task is worker:1 at {other}; peers: worker:0 at {chief}'
          in outputs[1])
  for output in outputs:
    assert 'ports reserved by Slurm' in output
    assert 'Task worker:' in output and 'of 2 worker(s)' in output
  assert len(set(helpers.fingerprint(outputs[0] + outputs[1]))) == 1
  assert helpers.read_results(workdir)['step'] == 44


def _ctl_status(workdir) -> str:
  """What `python -m ctl.status workdir` shows."""
  return subprocess.run(
      [sys.executable, '-m', 'ctl.status', str(workdir)], cwd=helpers.REPO,
      env=helpers.env_with(), capture_output=True, text=True,
      timeout=120).stdout


def _one_node_step(num_tasks: int) -> dict:
  """What srun sets for a step of num_tasks tasks on this machine, on
  ports Slurm reserved."""
  ports = sorted(portpicker.pick_unused_port() for _ in range(num_tasks))
  return {'SLURM_STEP_ID': '0', 'SLURM_STEP_NUM_TASKS': str(num_tasks),
          'SLURM_STEP_NUM_NODES': '1', 'SLURM_STEP_NODELIST': 'localhost',
          'SLURM_STEP_TASKS_PER_NODE': str(num_tasks),
          'SLURM_STEP_RESV_PORTS': ','.join(map(str, ports))}


@pytest.mark.slow
def test_the_batch_script_runs_a_parameter_server_job_with_num_ps(tmp_path):
  logs = tmp_path / 'logs'
  logs.mkdir()
  workdir = tmp_path / 'workdir'
  exit_code, _, asked = _run_sbatch(
      tmp_path, '--config.num_epochs=1', CONFIG=helpers.DIGITS,
      WORKDIR=str(workdir), NUM_PS='1',
      STANDIN_STEP=json.dumps(_one_node_step(3)), STANDIN_LOGS=str(logs))
  outputs = [(logs / f'task{rank}.log').read_text() for rank in range(3)]
  assert exit_code == 0, '\n'.join(output[-2000:] for output in outputs)
  assert len(asked) == 1  # srun, and no requeue.
  assert '--config.distribution.slurm_num_ps=1' in json.loads(asked[0])[
      'command']
  for rank, name in enumerate(('chief:0', 'worker:0', 'ps:0')):
    assert f'this task ({rank}) is {name}.' in outputs[rank]
  assert 'Coordinating 1 worker(s) and 1 parameter server(s)' in outputs[0]
  for output in outputs[1:]:  # Both left once the chief marked the end.
    assert 'The chief marked the job done' in output
  assert helpers.read_results(workdir)['step'] == 44
  shown = _ctl_status(workdir)
  assert f'{workdir}: FINISHED: training finished (exit code 0)' in shown
  assert re.search(r'the chief \S+ pid \d+: finished, finished, step 44',
                   shown), shown


@pytest.mark.slow
def test_a_parameter_server_step_whose_chief_died_ends_and_is_requeued(
    tmp_path):
  # srun waits for every task, and nothing marks the job done: the worker
  # and the server leave once the chief has not answered for
  # distribution.timeout_seconds (43), and the script requeues the job.
  logs = tmp_path / 'logs'
  logs.mkdir()
  workdir = tmp_path / 'workdir'
  script = _start_sbatch(
      tmp_path, '--config.num_epochs=40',
      '--config.distribution.timeout_seconds=20', CONFIG=helpers.DIGITS,
      WORKDIR=str(workdir), NUM_PS='1',
      STANDIN_STEP=json.dumps(_one_node_step(3)), STANDIN_LOGS=str(logs))
  try:
    helpers.wait_for_checkpoint(workdir, script, timeout=300)
    # The chief's own status file (the only one of a parameter-server job).
    chief = json.loads((workdir / 'workers' / 'worker-0.json').read_text())
    running = _ctl_status(workdir)
    os.kill(chief['pid'], signal.SIGKILL)
    _, stderr = script.communicate(timeout=240)
  finally:
    if script.poll() is None:
      os.killpg(script.pid, signal.SIGKILL)
  outputs = [(logs / f'task{rank}.log').read_text() for rank in range(3)]
  # ctl.status, during and after: the chief's step and the job it runs.
  assert f'{workdir}: RUNNING: training' in running, running
  assert ('parameter-server job: the chief coordinates 1 worker(s) and 1 '
          'parameter server(s)' in running), running
  assert f'{workdir}: FAILED: the chief (' in _ctl_status(workdir)
  # srun's code is its tasks' highest: the chief's 128 + SIGKILL.
  assert script.returncode == 137, stderr + outputs[1][-3000:]
  assert _asked(tmp_path)[1:] == ['scontrol requeue 4242']
  for output in outputs[1:]:
    assert ('ctl: error: The chief (chief:0 at localhost:' in output and
            'has not answered for 20 s (distribution.timeout_seconds)'
            in output), output[-3000:]
