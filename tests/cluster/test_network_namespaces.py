"""Workers on hosts with their own addresses: one network namespace each.

Every other multi-worker test runs its workers on localhost. Here each
worker runs in a network namespace of its own, with its own IP address on
a virtual ethernet link to a bridge that joins them, as hosts on one
network are; TF_CONFIG names those addresses, every worker on the same
port. A job trains to completion; then one host's worker is killed
mid-epoch, the job is started again, and its final weights are
bit-identical to those of the uninterrupted run.

The kill step is drawn from a seed the test prints; CTL_NETNS_SEED=<seed>
reproduces it. Needs root (namespaces, links) and iproute2's `ip`;
skipped, saying so, without them. Whatever a test creates (namespaces,
links, the processes in the namespaces) is removed when it ends, failed or
not.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from ctl import errors
import helpers

pytestmark = pytest.mark.slow

SEED = int(os.environ.get('CTL_NETNS_SEED', random.randrange(10**6)))
NUM_HOSTS = 2
PORT = 2222  # The same on every host: each has its own address.
TIMEOUT_SECONDS = 15
STEPS_PER_EPOCH = 20
TOTAL_STEPS = 2 * STEPS_PER_EPOCH
ARGS = (f'--config={helpers.DIGITS}', '--config.num_epochs=2',
        f'--config.steps_per_epoch={STEPS_PER_EPOCH}',
        '--config.deterministic=True', '--config.model.dropout=0.3',
        '--config.intervals.log_steps=1',
        '--config.intervals.checkpoint_steps=4',
        f'--config.distribution.timeout_seconds={TIMEOUT_SECONDS}')


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  """Runs `ip args`; raises with its message when check and it fails."""
  run = subprocess.run(['ip', *args], capture_output=True, text=True,
                       timeout=30)
  if check and run.returncode:
    raise RuntimeError(f'ip {" ".join(args)}: {run.stderr.strip()}')
  return run


def _skip_reason() -> str | None:
  """Why namespaces cannot be made here; None when they can."""
  if os.geteuid() != 0:
    return 'creating network namespaces needs root'
  if not shutil.which('ip'):
    return "creating network namespaces needs iproute2's `ip` command"
  probe = f'ctl-probe-{uuid.uuid4().hex[:8]}'
  made = _ip('netns', 'add', probe, check=False)
  if made.returncode:
    return f'`ip netns add` fails here: {made.stderr.strip()}'
  _ip('netns', 'del', probe, check=False)
  return None


class Hosts:
  """NUM_HOSTS namespaces on one bridge, each with its own IP address."""

  def __init__(self):
    tag = uuid.uuid4().hex[:6]  # Interface names have at most 15 bytes.
    self.bridge = f'ctlbr{tag}'
    self.namespaces = [f'ctl-test-{tag}-{index}' for index in range(NUM_HOSTS)]
    self._links = [f'ctlv{tag}h{index}' for index in range(NUM_HOSTS)]
    subnet = f'10.213.{random.randrange(256)}'
    self.addresses = [f'{subnet}.{index + 1}' for index in range(NUM_HOSTS)]
    self._workers = []

  def create(self) -> None:
    """Makes the bridge, then each namespace, its link and its address."""
    _ip('link', 'add', self.bridge, 'type', 'bridge')
    _ip('link', 'set', self.bridge, 'up')
    for namespace, link, address in zip(self.namespaces, self._links,
                                        self.addresses):
      _ip('netns', 'add', namespace)
      _ip('link', 'add', link, 'type', 'veth', 'peer', 'name', 'eth0',
          'netns', namespace)
      _ip('link', 'set', link, 'master', self.bridge, 'up')
      inside = ('netns', 'exec', namespace, 'ip')
      _ip(*inside, 'link', 'set', 'lo', 'up')
      _ip(*inside, 'addr', 'add', f'{address}/24', 'dev', 'eth0')
      _ip(*inside, 'link', 'set', 'eth0', 'up')

  def remove(self) -> None:
    """Kills what runs in the namespaces, then removes all it created."""
    for worker in self._workers:
      worker.kill()
    for namespace in self.namespaces:
      pids = _ip('netns', 'pids', namespace, check=False).stdout.split()
      for pid in pids:  # Only processes this test started are in there.
        try:
          os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
          pass
      _ip('netns', 'del', namespace, check=False)
    for link in [*self._links, self.bridge]:
      _ip('link', 'del', link, check=False)

  def tf_configs(self) -> list[str]:
    """Each host's TF_CONFIG: a cluster of one worker per address."""
    workers = [f'{address}:{PORT}' for address in self.addresses]
    return [json.dumps({'cluster': {'worker': workers},
                        'task': {'type': 'worker', 'index': index}})
            for index in range(NUM_HOSTS)]

  def start_job(self, workdir) -> list[helpers.Watched]:
    """Starts `python -m ctl.main` on every host: one job."""
    workers = [
        helpers.Watched(['ip', 'netns', 'exec', namespace,
                         *helpers.ctl_command(*ARGS, f'--workdir={workdir}')],
                        env=helpers.env_with(TF_CONFIG=tf_config))
        for namespace, tf_config in zip(self.namespaces, self.tf_configs())]
    self._workers.extend(workers)
    return workers


@pytest.fixture
def hosts():
  """Hosts made for one test, and removed after it whatever happened."""
  reason = _skip_reason()
  if reason:
    pytest.skip(reason)
  made = Hosts()
  try:
    made.create()
    yield made
  finally:
    made.remove()


def _finish(workers: list[helpers.Watched]) -> str:
  """Waits for a job to end well; returns the weights' fingerprint."""
  codes = [worker.wait(timeout=300) for worker in workers]
  assert codes == [0] * NUM_HOSTS, workers[0].output[-3000:]
  fingerprints = [helpers.fingerprint(worker.output)[-1]
                  for worker in workers]
  assert len(set(fingerprints)) == 1
  return fingerprints[0]


def test_workers_on_their_own_hosts_resume_a_killed_one_bit_identical(
    hosts, tmp_path):
  reference = hosts.start_job(tmp_path / 'reference')
  uninterrupted = _finish(reference)
  for index, worker in enumerate(reference):
    address = f'{hosts.addresses[index]}:{PORT}'
    peer = f'{hosts.addresses[1 - index]}:{PORT}'
    assert (f'this task is worker:{index}{" (chief)" if index == 0 else ""} '
            f'at {address}; peers: worker:{1 - index} at {peer}'
            in worker.output)

  workdir = tmp_path / 'workdir'
  workers = hosts.start_job(workdir)
  helpers.wait_for_checkpoint(workdir, workers[1].process)
  print(f'seed {SEED} (CTL_NETNS_SEED={SEED} reproduces it)')
  # Mid-epoch, past a save.
  step = random.Random(SEED).randrange(6, STEPS_PER_EPOCH - 4)
  workers[1].wait_for(rf'step {step}/{TOTAL_STEPS} ')
  killed_at = time.monotonic()
  workers[1].process.send_signal(signal.SIGKILL)
  assert workers[0].wait(timeout=120) == errors.EXIT_PEER_FAILED
  assert time.monotonic() - killed_at < TIMEOUT_SECONDS + 20
  assert workers[1].wait() == -signal.SIGKILL
  resume_at = helpers.latest_checkpoint_step(workdir)
  assert 0 < resume_at < TOTAL_STEPS

  resumed = hosts.start_job(workdir)
  assert _finish(resumed) == uninterrupted
  for worker in resumed:
    assert re.search(rf'Training from step {resume_at} to {TOTAL_STEPS}',
                     worker.output)
  final = f'ckpt-{TOTAL_STEPS}'
  assert helpers.assert_same_model(workdir / 'checkpoints' / final,
                                   tmp_path / 'reference' / 'checkpoints' /
                                   final, atol=0) == 6


# A resolver that cannot reach its name server answers "temporary failure"
# (EAI_AGAIN), as in a namespace without a route out; the name is never
# resolvable in the test's own namespace either.
_UNREACHABLE_NAME = 'gpu01.ctl-test.invalid'
_WAIT_FOR_AN_UNRESOLVABLE_PEER = '''
import socket, sys
from ctl import errors
from ctl.cluster import rendezvous, tf_config
try:
  socket.getaddrinfo(sys.argv[2].rpartition(':')[0], 1)
except socket.gaierror as error:
  print('resolver:', error.errno == socket.EAI_AGAIN, flush=True)
cluster = tf_config.Cluster({'worker': tuple(sys.argv[1:])}, 'worker', 0,
                            source='TF_CONFIG')
try:
  rendezvous.wait_for_peers(cluster, 30, lambda: False, unresolved_seconds=1)
except errors.CtlError as error:
  print(str(error), flush=True)
  sys.exit(error.exit_code)
'''


def test_a_name_the_resolver_fails_for_is_exit_2_like_one_that_is_unknown(
    hosts):
  # Once only "no such name" counted: a job there waited out its start-up
  # timeout and exited 43, which slurm.sbatch requeues, for ever.
  waiting = subprocess.run(
      ['ip', 'netns', 'exec', hosts.namespaces[0], sys.executable, '-c',
       _WAIT_FOR_AN_UNRESOLVABLE_PEER, f'{hosts.addresses[0]}:{PORT}',
       f'{_UNREACHABLE_NAME}:{PORT}'],
      cwd=helpers.REPO, env=helpers.env_with(), capture_output=True,
      text=True, timeout=120)
  assert waiting.stdout.startswith('resolver: True\n'), (
      'the resolver did not answer EAI_AGAIN:', waiting.stdout,
      waiting.stderr[-3000:])
  assert waiting.returncode == errors.EXIT_USAGE, waiting.stdout
  assert (f"The host name of worker:1, '{_UNREACHABLE_NAME}', has not "
          'resolved for 1 s (Temporary failure in name resolution)'
          in waiting.stdout)
