"""Start-up of a job: TF_CONFIG is checked, the cluster is waited for, boundedly.

The unit tests of ctl/cluster.py run without TensorFlow; the others run
`python -m ctl.main` as real processes, which stop before training.
"""

import concurrent.futures
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import portpicker
import pytest

import helpers
from ctl.cluster import tf_config as cluster_lib
from ctl.cluster import rendezvous
from ctl import errors

SMOKE = f'--config={helpers.DIGITS}:smoke'


def _workers(*addresses: str, index: int = 0, **jobs) -> str:
  """TF_CONFIG text of a cluster of these workers, as worker index."""
  return json.dumps({'cluster': {'worker': list(addresses), **jobs},
                     'task': {'type': 'worker', 'index': index}})


# (TF_CONFIG, what the message must say): one of each kind of mistake.
MALFORMED = {
    'not JSON': ("{'cluster': {}}", 'is not JSON'),
    'not an object': ('["localhost:1"]', 'must be a JSON object'),
    'cluster not an object': (
        '{"cluster": ["localhost:1"], "task": {"type": "worker", "index": 0}}',
        '"cluster" must map job names'),
    'job not a list': (
        '{"cluster": {"worker": "localhost:1"}, '
        '"task": {"type": "worker", "index": 0}}',
        'job "worker" must be a non-empty list'),
    'empty job': (
        '{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}',
        'job "worker" must be a non-empty list'),
    'no port': (_workers('localhost'), 'an address is "host:port"'),
    'port not a number': (_workers('localhost:http'),
                          'an address is "host:port"'),
    'port out of range': (_workers('localhost:70000'),
                          'an address is "host:port"'),
    'no host': (_workers(':2222'), 'an address is "host:port"'),
    'address not a string': (
        '{"cluster": {"worker": [2222]}, "task": {"type": "worker", '
        '"index": 0}}', 'an address is "host:port"'),
    'unknown job': (_workers('localhost:1', master=['localhost:2']),
                    'names the job "master"'),
    'two chiefs': (_workers('localhost:1', chief=['h:2', 'h:3']),
                   'job "chief" has 2 tasks; it can have at most one'),
    'two evaluators': (_workers('localhost:1', evaluator=['h:2', 'h:3']),
                       'job "evaluator" has 2 tasks'),
    'no training job': (
        '{"cluster": {"evaluator": ["localhost:1"]}, '
        '"task": {"type": "evaluator", "index": 0}}',
        'no "chief" or "worker" job'),
    'duplicate address': (_workers('localhost:1', 'localhost:1'),
                          'gives worker:0 and worker:1 the same address'),
    'duplicate across jobs': (_workers('h:1', chief=['h:1']),
                              'gives worker:0 and chief:0 the same address'),
    'no task': ('{"cluster": {"worker": ["localhost:1"]}}', 'no "task"'),
    'task not an object': (
        '{"cluster": {"worker": ["localhost:1"]}, "task": "worker:0"}',
        '"task" must be an object'),
    'no task type': (
        '{"cluster": {"worker": ["localhost:1"]}, "task": {"index": 0}}',
        '"task" has no "type"'),
    'task type not in the cluster': (
        '{"cluster": {"worker": ["localhost:1"]}, '
        '"task": {"type": "chief", "index": 0}}',
        '"task" has the type "chief", which is not a job of the cluster'),
    'no index': (
        '{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker"}}',
        '"task" has no "index"'),
    'index not a number': (
        '{"cluster": {"worker": ["localhost:1"]}, '
        '"task": {"type": "worker", "index": "0"}}',
        'an index is a whole number'),
    'index a boolean': (
        '{"cluster": {"worker": ["localhost:1"]}, '
        '"task": {"type": "worker", "index": true}}',
        'an index is a whole number'),
    'index out of range': (_workers('localhost:1', 'localhost:2', index=2),
                           'job "worker" has 2 task(s): indices 0 to 1'),
    'negative index': (_workers('localhost:1', index=-1), 'indices 0 to 0'),
}


@pytest.mark.parametrize('case', MALFORMED)
def test_a_malformed_tf_config_is_a_config_error_saying_what_is_wrong(case):
  text, expected = MALFORMED[case]
  with pytest.raises(errors.ConfigError) as raised:
    cluster_lib.from_tf_config(text)
  message = str(raised.value)
  assert message.startswith('TF_CONFIG ')
  assert expected in message
  assert cluster_lib.EXAMPLE in message  # What a valid one looks like.
  assert '\n' not in message


def test_the_example_in_the_messages_is_a_valid_tf_config():
  cluster = cluster_lib.from_tf_config(cluster_lib.EXAMPLE)
  assert cluster.task_name == 'worker:0' and cluster.peers == ('worker:1',)


@pytest.mark.parametrize('text', [
    '', '  ', '{}', '{"cluster": {}}', '{"cluster": null}',
    '{"cluster": {}, "task": {"type": "worker", "index": 0}}',
    '{"task": {"type": "worker", "index": 3}}',
])
def test_tf_config_without_a_cluster_is_one_process_with_a_warning(
    text, caplog):
  with caplog.at_level(logging.WARNING):
    assert cluster_lib.from_tf_config(text) is None
  assert 'this run is a single process' in caplog.text


def test_no_tf_config_is_one_process_without_a_warning(caplog):
  with caplog.at_level(logging.WARNING):
    assert cluster_lib.from_tf_config(None) is None
  assert not caplog.text


def test_a_cluster_names_this_task_its_peers_and_the_chief():
  cluster = cluster_lib.from_tf_config(json.dumps({
      'cluster': {'chief': ['c:1'], 'worker': ['w:1', 'w:2'],
                  'evaluator': ['e:1']},
      'task': {'type': 'worker', 'index': 1},
      # Keys that TensorFlow reads, or ignores, are accepted.
      'rpc_layer': 'grpc', 'environment': 'cloud',
  }))
  assert cluster.task_name == 'worker:1'
  assert cluster.address == 'w:2'
  # The evaluator does not train, so no one waits for it.
  assert cluster.training_tasks == ('chief:0', 'worker:0', 'worker:1')
  assert cluster.peers == ('chief:0', 'worker:0')
  assert not cluster.is_chief
  assert cluster.describe() == (
      'worker:1 at w:2; peers: chief:0 at c:1, worker:0 at w:1')
  chief = cluster_lib.Cluster(cluster.jobs, 'chief', 0)
  assert chief.is_chief and chief.describe().startswith('chief:0 (chief) at')
  assert chief.fingerprint == cluster.fingerprint


def test_ipv6_addresses_are_accepted():
  cluster = cluster_lib.from_tf_config(_workers('[::1]:2222', '[::1]:2223'))
  assert cluster.address == '[::1]:2222'


# The start-up barrier, in threads of this process.


def _localhost_cluster(num_workers: int) -> list[cluster_lib.Cluster]:
  """One Cluster per worker of num_workers, on free localhost ports."""
  jobs = {'worker': tuple(f'localhost:{portpicker.pick_unused_port()}'
                          for _ in range(num_workers))}
  return [cluster_lib.Cluster(jobs, 'worker', index)
          for index in range(num_workers)]


def _wait_all(clusters, delays=None, timeout_seconds=60.0):
  """Runs wait_for_peers for every task at once; returns their results."""
  delays = delays or [0.0] * len(clusters)

  def wait(cluster, delay):
    time.sleep(delay)
    return rendezvous.wait_for_peers(cluster, timeout_seconds, lambda: False)

  with concurrent.futures.ThreadPoolExecutor(len(clusters)) as pool:
    futures = [pool.submit(wait, cluster, delay)
               for cluster, delay in zip(clusters, delays)]
    return [future.result(timeout=120) for future in futures]


def _port(address: str) -> int:
  """The port of a "host:port"."""
  return int(address.rpartition(':')[2])


def test_every_task_goes_on_once_all_have_started():
  clusters = _localhost_cluster(3)
  # The last one starts well after the others have begun waiting.
  assert _wait_all(clusters, delays=[0.0, 0.3, 1.5]) == [True, True, True]
  # Each has closed its listener: TensorFlow's server can take the port.
  for cluster in clusters:
    with socket.create_server(('', _port(cluster.address))):
      pass


def test_a_single_worker_cluster_waits_for_no_one():
  cluster, = _localhost_cluster(1)
  assert rendezvous.wait_for_peers(cluster, 0.1, lambda: False)


def test_a_peer_that_never_starts_is_named_after_the_timeout():
  worker0, worker1 = _localhost_cluster(2)
  with pytest.raises(errors.PeerFailure) as raised:
    rendezvous.wait_for_peers(worker0, 0.5, lambda: False)
  message = str(raised.value)
  assert message.startswith('The cluster did not form within '
                            'distribution.startup_timeout_seconds=0.5: ')
  assert (f'worker:1 at {worker1.address} did not arrive (nothing accepts '
          'connections there') in message
  assert 'restart all workers' in message
  assert raised.value.exit_code == errors.EXIT_PEER_FAILED == 43


def test_another_program_on_a_peers_port_is_not_taken_for_the_peer():
  worker0, worker1 = _localhost_cluster(2)
  with socket.create_server(('', _port(worker1.address))) as other:
    stop = threading.Event()

    def serve():  # Accepts connections and says something else.
      other.settimeout(0.1)
      while not stop.is_set():
        try:
          connection, _ = other.accept()
        except TimeoutError:
          continue
        with connection:
          connection.sendall(b'HTTP/1.0 400 Bad Request\r\n\r\n')

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
      with pytest.raises(errors.PeerFailure,
                         match='worker:1 at .* is not a ctl task'):
        rendezvous.wait_for_peers(worker0, 1.0, lambda: False)
    finally:
      stop.set()
      server.join()


def test_a_peer_started_with_another_cluster_is_not_taken_for_the_peer():
  worker0, worker1 = _localhost_cluster(2)
  # Worker 1 was given a third worker: its cluster is not worker 0's.
  other = cluster_lib.Cluster(
      {'worker': (*worker0.jobs['worker'], 'localhost:1')}, 'worker', 1)
  assert other.address == worker1.address
  stopped = []
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    waiting = pool.submit(rendezvous.wait_for_peers, other, 0,
                          lambda: bool(stopped))
    try:
      with pytest.raises(errors.PeerFailure, match='another cluster'):
        rendezvous.wait_for_peers(worker0, 1.5, lambda: False)
    finally:
      stopped.append(True)
    assert waiting.result(timeout=30) is False


def test_should_stop_ends_the_wait_at_once():
  worker0, _ = _localhost_cluster(2)
  calls = []
  stop_after_a_few = lambda: calls.append(1) or len(calls) > 3
  assert rendezvous.wait_for_peers(worker0, 0, stop_after_a_few) is False


def test_a_port_held_by_another_program_is_an_error_naming_it():
  worker0, _ = _localhost_cluster(2)
  with socket.create_server(('', _port(worker0.address))):
    with pytest.raises(errors.CtlError,
                       match=f'cannot listen at its address '
                       f'{worker0.address}'):
      rendezvous.wait_for_peers(worker0, 1, lambda: False)


def test_sigterm_while_waiting_is_recorded_not_fatal_and_then_restored():
  from ctl.cluster import distribution  # pylint: disable=g-import-not-at-top
  before = signal.getsignal(signal.SIGTERM)
  with distribution._StartUpSignal() as sigterm:  # pylint: disable=protected-access
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not sigterm.received and time.monotonic() < deadline:
      time.sleep(0.01)  # The handler runs between bytecodes.
    assert sigterm.received
  assert signal.getsignal(signal.SIGTERM) == before


# ctl.main as a real process: it stops before training.


def _assert_one_line(stderr: str, label: str) -> str:
  """The one `ctl: label: ...` line of stderr, after checking for tracebacks."""
  assert 'Traceback' not in stderr, stderr[-3000:]
  lines = [line for line in stderr.splitlines()
           if line.startswith(f'ctl: {label}: ')]
  assert len(lines) == 1, stderr[-3000:]
  return lines[0]


# Every kind of mistake takes the same way out of ctl.main, so real
# processes run one of each group above (the unit tests run every case);
# two of them in the quick tests.
# As processes, one mistake of each stage of the parse (JSON, the cluster,
# the task): every case of MALFORMED takes the same way out as these, and
# each case's message is tested in-process above (a process costs 4 s).
@pytest.mark.parametrize('case', ['not JSON', 'two chiefs',
                                  'index out of range'])
def test_ctl_main_with_a_malformed_tf_config_exits_2_writing_nothing(
    case, tmp_path):
  text, expected = MALFORMED[case]
  workdir = tmp_path / 'workdir'
  run = helpers.run_ctl(SMOKE, f'--workdir={workdir}',
                        env=helpers.env_with(TF_CONFIG=text), timeout=300)
  assert run.returncode == 2, run.stderr[-3000:]
  line = _assert_one_line(run.stderr, 'error')
  assert line.startswith('ctl: error: TF_CONFIG ') and expected in line
  assert not workdir.exists()


@pytest.mark.slow
def test_a_worker_whose_peer_never_starts_exits_43_naming_it(tmp_path):
  workdir = tmp_path / 'workdir'
  worker0_env, worker1_env = helpers.cluster_envs(2)
  worker1 = json.loads(worker1_env['TF_CONFIG'])['cluster']['worker'][1]
  run = helpers.run_ctl(SMOKE, f'--workdir={workdir}',
                        '--config.distribution.startup_timeout_seconds=3',
                        env=worker0_env, timeout=3 + 60)
  assert run.returncode == errors.EXIT_PEER_FAILED, run.stderr[-3000:]
  line = _assert_one_line(run.stderr, 'error')
  assert f'worker:1 at {worker1} did not arrive' in line
  assert 'restart all workers' in line
  assert not workdir.exists()


@pytest.mark.slow
def test_a_worker_that_starts_late_joins_the_one_waiting(tmp_path):
  args = (SMOKE, f'--workdir={tmp_path / "workdir"}')
  envs = helpers.cluster_envs(2)
  workers = [helpers.Watched(helpers.ctl_command(*args), env=envs[0])]
  try:
    workers[0].wait_for('Waiting up to 300 s for every peer to start', 120)
    time.sleep(3)
    workers.append(helpers.Watched(helpers.ctl_command(*args), env=envs[1]))
    for index, worker in enumerate(workers):
      # Logged once the strategy exists, i.e. TensorFlow's cluster formed.
      worker.wait_for(rf'Task worker:{index} of 2 worker\(s\)', 120)
  finally:
    for worker in workers:
      worker.kill()
  assert 'Every peer has started' in workers[0].output


def test_a_peer_that_leaves_while_the_cluster_forms_stops_the_others():
  # Three workers, the third never starts: worker 1 gives up (SIGTERM,
  # say) once it has been waiting a while, and says so to worker 0.
  worker0, worker1, worker2 = _localhost_cluster(3)
  rounds = []
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    leaving = pool.submit(rendezvous.wait_for_peers, worker1, 0,
                          lambda: rounds.append(1) or len(rounds) > 15)
    with pytest.raises(errors.PeerFailure) as raised:
      rendezvous.wait_for_peers(worker0, 0, lambda: False)
    assert leaving.result(timeout=60) is False
  message = str(raised.value)
  assert message.startswith(
      f'worker:1 at {worker1.address} stopped while the cluster formed; '), \
      message
  # The others missing are named too.
  assert f'worker:2 at {worker2.address} did not arrive' in message


_WAIT_IN_A_PROCESS = '''
import sys
from ctl.cluster import rendezvous, tf_config as cluster
jobs = {'worker': tuple(sys.argv[1:])}
rounds = []
def report():
  rounds.append(1)
  if len(rounds) == 15:  # 3 s of probes: worker 0 has heard this task.
    print('waited', flush=True)
  return False
rendezvous.wait_for_peers(cluster.Cluster(jobs, 'worker', 1), 0, report)
'''


def test_a_peer_killed_while_the_cluster_forms_stops_the_others():
  worker0, worker1, _ = _localhost_cluster(3)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    waiting = pool.submit(rendezvous.wait_for_peers, worker0, 120,
                          lambda: False)
    peer = subprocess.Popen(
        [sys.executable, '-c', _WAIT_IN_A_PROCESS, *worker0.jobs['worker']],
        cwd=helpers.REPO, env=helpers.env_with(), stdout=subprocess.PIPE,
        text=True)
    try:
      assert peer.stdout.readline() == 'waited\n'
      peer.kill()
      with pytest.raises(errors.PeerFailure) as raised:
        waiting.result(timeout=60)
    finally:
      peer.kill()
      peer.wait()
  assert str(raised.value).startswith(
      f'worker:1 at {worker1.address} had started and is gone')


def test_a_peer_stopped_for_a_while_then_killed_stops_the_others():
  # Worker 1 answers, is stopped (SIGSTOP) long enough for a probe of
  # worker 0 to go unanswered, goes on, and is killed: once, a probe
  # answered late marked it as done, never probed again, and worker 0
  # waited out its timeout naming only worker 2, which never starts.
  worker0, worker1, worker2 = _localhost_cluster(3)
  rounds = []

  def count_rounds():
    rounds.append(1)
    return False

  def wait_for_rounds(count):
    """Until worker 0 has probed each peer `count` more times."""
    target = len(rounds) + 2 * count + 1
    deadline = time.monotonic() + 60
    while len(rounds) < target:
      assert time.monotonic() < deadline, 'worker 0 stopped probing'
      time.sleep(0.05)

  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    waiting = pool.submit(rendezvous.wait_for_peers, worker0, 60,
                          count_rounds)
    peer = subprocess.Popen(
        [sys.executable, '-c', _WAIT_IN_A_PROCESS, *worker0.jobs['worker']],
        cwd=helpers.REPO, env=helpers.env_with(), stdout=subprocess.PIPE,
        text=True)
    try:
      assert peer.stdout.readline() == 'waited\n'
      peer.send_signal(signal.SIGSTOP)
      wait_for_rounds(2)  # At least one probe of it went unanswered.
      peer.send_signal(signal.SIGCONT)
      wait_for_rounds(2)
      peer.kill()
      with pytest.raises(errors.PeerFailure) as raised:
        waiting.result(timeout=120)
    finally:
      peer.kill()
      peer.wait()
  message = str(raised.value)
  assert message.startswith(
      f'worker:1 at {worker1.address} had started and is gone'), message
  assert f'worker:2 at {worker2.address} did not arrive' in message


def test_a_peer_name_that_does_not_resolve_is_a_config_error_naming_it():
  jobs = {'worker': (f'localhost:{portpicker.pick_unused_port()}',
                     'gpu-no-such-node.invalid:8888')}
  cluster = cluster_lib.Cluster(jobs, 'worker', 0,
                                source="Slurm's SLURM_STEP_* variables")
  with pytest.raises(errors.ConfigError) as raised:
    rendezvous.wait_for_peers(cluster, 60, lambda: False,
                              unresolved_seconds=0.5)
  message = str(raised.value)
  assert message.startswith("The host name of worker:1, "
                            "'gpu-no-such-node.invalid', has not resolved")
  assert "(Slurm's SLURM_STEP_* variables)" in message
  assert raised.value.exit_code == errors.EXIT_USAGE



def test_every_task_gives_exit_2_for_a_name_that_does_not_resolve():
  # The first task to give up must not make the other exit 43 (requeued by
  # slurm.sbatch): both see the same name and exit 2 by themselves.
  jobs = {'worker': (f'localhost:{portpicker.pick_unused_port()}',
                     f'localhost:{portpicker.pick_unused_port()}',
                     'gpu-no-such-node.invalid:8888')}
  clusters = [cluster_lib.Cluster(jobs, 'worker', index, source='TF_CONFIG')
              for index in (0, 1)]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    futures = [pool.submit(rendezvous.wait_for_peers, cluster, 60,
                           lambda: False, unresolved_seconds=seconds)
               for cluster, seconds in zip(clusters, (0.5, 5.0))]
    messages = []
    for future in futures:
      with pytest.raises(errors.ConfigError) as raised:
        future.result(timeout=60)
      messages.append(str(raised.value))
  assert "'gpu-no-such-node.invalid'" in messages[0], messages
  assert '(worker:0 found so and stopped)' in messages[1], messages

@pytest.mark.slow
def test_a_worker_sigtermed_during_start_up_exits_42_and_stops_its_peers(
    tmp_path):
  # Three workers, the third never starts: both others wait for it. Worker
  # 1, sent SIGTERM while it waits, exits 42 at once (nothing trained, no
  # workdir), and worker 0 stops with it.
  workdir = tmp_path / 'workdir'
  args = (SMOKE, f'--workdir={workdir}')
  envs = helpers.cluster_envs(3)
  workers = []
  try:
    for env in envs[:2]:
      workers.append(helpers.Watched(helpers.ctl_command(*args), env=env))
      workers[-1].wait_for('Waiting up to 300 s for every peer to start', 120)
    time.sleep(1)  # Well inside worker 1's wait, not at its start.
    workers[1].process.send_signal(signal.SIGTERM)
    codes = [worker.wait(timeout=60) for worker in workers]
  finally:
    for worker in workers:
      worker.kill()
  assert codes == [errors.EXIT_PEER_FAILED, errors.EXIT_PREEMPTED], (
      workers[0].output[-3000:])
  line = _assert_one_line(workers[0].output, 'error')
  assert 'worker:1 at ' in line and 'stopped while the cluster formed' in line
  line = _assert_one_line(workers[1].output, 'preempted')
  assert 'nothing was trained' in line
  assert not workdir.exists()


_JOIN_THEN_WAIT = '''
import sys, time
from ctl.cluster import rendezvous, tf_config as cluster
jobs = {'worker': tuple(sys.argv[2:])}
rendezvous.wait_for_peers(cluster.Cluster(jobs, 'worker', int(sys.argv[1])),
                          120, lambda: False)
print('joining', flush=True)
time.sleep(3600)  # Killed before it joins TensorFlow's cluster.
'''


@pytest.mark.slow
@pytest.mark.parametrize('victim', [0, 1])
def test_a_peer_killed_as_tensorflows_cluster_forms_stops_the_other(
    tmp_path, victim):
  # The peer passes ctl's start-up barrier, then is killed before it
  # registers with TensorFlow's coordination service (hosted by worker 0):
  # the other had waited there silently for an hour (TensorFlow's default
  # registration timeout), past distribution.startup_timeout_seconds.
  envs = helpers.cluster_envs(2)
  addresses = json.loads(envs[0]['TF_CONFIG'])['cluster']['worker']
  survivor = helpers.Watched(helpers.ctl_command(
      SMOKE, f'--workdir={tmp_path / "workdir"}',
      # TensorFlow's registration gets at least 10 s whatever is left.
      '--config.distribution.startup_timeout_seconds=10'),
                             env=envs[1 - victim])
  peer = subprocess.Popen(
      [sys.executable, '-c', _JOIN_THEN_WAIT, str(victim), *addresses],
      cwd=helpers.REPO, env=helpers.env_with(), stdout=subprocess.PIPE,
      text=True)
  try:
    assert peer.stdout.readline() == 'joining\n'
    survivor.wait_for('joining the cluster', 120)
    peer.kill()
    code = survivor.wait(timeout=10 + 120)
  finally:
    peer.kill()
    peer.wait()
    survivor.kill()
  assert code == errors.EXIT_PEER_FAILED, survivor.output[-3000:]
  line = _assert_one_line(survivor.output, 'error')
  assert line.startswith('ctl: error: The cluster did not form: every peer '
                         'had started, but not all registered'), line
  assert 'distribution.startup_timeout_seconds=10' in line
