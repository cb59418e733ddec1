"""The peers' status files read, and which peers stopped making progress,
named only on evidence about each (its own status file, or this machine's
view of its process): what a worker's `ctl: error:` line and its
diagnostics dumps say of the others."""

import time

from ctl import errors
from ctl import storage
from ctl.cluster import worker_status
from ctl.runtime import processes
from ctl.runtime import workdir as workdir_lib


def stalled_peers(peers: dict[int, dict | None], me: int,
                  now: float) -> list[str]:
  """The peers that stopped making progress, each with the evidence about
  it; [] when no peer's own file singles one out.

  Only evidence about that peer names it: no file at all (or one not
  rewritten since before this worker started: an earlier run's), a run that
  ended other than by losing its peers (exit code 43 is a bystander's), a
  process that this machine sees stopped or gone (a peer on the same
  host), a file that stopped changing for two heartbeats (its writer
  thread is silent: the process is stopped, dead or cut off), or an action
  other than this worker's phase that it had been in for two heartbeats
  when it last wrote (stuck in it). A step behind or another phase in a
  file of a moment ago is no evidence: a healthy worker's file lags its
  loop by up to a heartbeat.
  """
  mine = peers.get(me) or {}
  my_phase = mine.get('phase')
  named = []
  for index, status in sorted(peers.items()):
    if index == me:
      continue
    if status is None:
      named.append(f'worker {index}: wrote no status (it never started '
                   'training)')
      continue
    if (status['time'] < mine.get('started', status['time']) and
        now - status['time'] > 2 * status['heartbeat_seconds']):
      # Not rewritten since before this worker started: an earlier run's
      # file (its process, long gone, says nothing of this run's peer), or
      # this run's peer died or stopped before this worker started.
      named.append(f'worker {index}: wrote no status since this worker '
                   'started (it never started training in this run)')
      continue
    why = _evidence(status, my_phase, now)
    if why:
      named.append(f'{describe(status, now)}: {why}')
  return named


def _evidence(status: dict, my_phase: str | None, now: float) -> str | None:
  """What a running or ended peer's file says against it, if anything."""
  heartbeat = status['heartbeat_seconds']
  if status['state'] != worker_status.RUNNING:
    if status.get('exit_code') == errors.EXIT_PEER_FAILED:
      return None  # It lost its peers, as this worker did.
    return f'it ended: {status["reason"]}'
  seen = _process_here(status)
  if seen:
    return seen
  if now - status['time'] > 2 * heartbeat:
    return 'its status stopped changing (stopped, dead or unreachable)'
  in_phase = status['time'] - status.get('phase_time', status['time'])
  if (status['phase'] not in worker_status.LOOP_PHASES and status['phase'] != my_phase and
      in_phase > 2 * heartbeat):
    return (f'in phase {status["phase"]} for {in_phase:.0f} s when it last '
            f'wrote, not in this worker\'s ({my_phase})')
  return None


def _process_here(status: dict) -> str | None:
  """What this machine says of a peer's process when it runs here (Linux's
  /proc): stopped, or gone; None when it runs, or elsewhere."""
  state = processes.state(status.get('host'), status['pid'],
                          status.get('started'))
  if state == processes.GONE:
    return 'its process is gone'
  if state == processes.STOPPED:
    return 'its process is stopped (SIGSTOP, or a debugger)'
  return None


def gone_here(status: worker_status.WorkerStatus) -> str | None:
  """The first peer on this machine whose process is gone without an end
  written (killed, or crashed), described; None when there is none.

  Only a file written since this worker started counts: one an earlier
  run's killed worker left (a job resumed, its peer not yet started and
  so not yet writing) says nothing of this run's peer, and a peer of this
  run that trained with this worker wrote its file since (its training
  phase is written at once, after the cluster formed)."""
  mine = status.snapshot()
  now = time.time()
  peers = read_peers(status.workdir, mine['num_workers'])
  for index, peer in sorted(peers.items()):
    if (index != status.worker_index and peer is not None and
        peer['state'] == worker_status.RUNNING and
        peer['time'] >= mine['started'] and
        processes.state(peer.get('host'), peer['pid'],
                        peer.get('started')) == processes.GONE):
      return f'{describe(peer, now)}: its process is gone'
  return None


def read_and_wait_for_evidence(status: worker_status.WorkerStatus) -> list[str]:
  """The stalled peers (stalled_peers), once the files can tell: a peer
  that stopped just before this worker's error (TensorFlow may report a
  lost peer before its file is two heartbeats old) is named once it is;
  a live one rewrites its file, a bystander ends. Waits two heartbeats
  and a write at most."""
  since = time.time()
  heartbeat = status.snapshot()['heartbeat_seconds']
  deadline = since + 2 * heartbeat + worker_status.MIN_WRITE_SECONDS + 1
  while True:
    now = time.time()
    mine = status.snapshot()
    peers = read_peers(status.workdir, mine['num_workers'])
    peers[status.worker_index] = mine
    stalled = stalled_peers(peers, status.worker_index, now)
    undecided = [peer for index, peer in peers.items()
                 if index != status.worker_index and peer is not None and
                 peer['state'] == worker_status.RUNNING and peer['time'] < since]
    if stalled or not undecided or now > deadline:
      return stalled
    time.sleep(0.2)


def read_peers(workdir: str, num_workers: int) -> dict[int, dict | None]:
  """{worker index: its status, or None without one} for the job's
  workers."""
  found = {}
  for index in range(num_workers):
    try:
      found[index] = storage.read_json(
          workdir_lib.worker_status_path(workdir, index))
    except Exception:  # pylint: disable=broad-except
      found[index] = None
  return found


def describe(status: dict, now: float) -> str:
  """One worker's status in a few words: where it was and when."""
  step = status.get('step')
  return (f'worker {status["worker"]} ({status["host"]}, pid '
          f'{status["pid"]}): {status["state"]}, phase {status["phase"]}, '
          f'step {"?" if step is None else step}, status '
          f'{now - status["time"]:.0f} s old, last progress '
          f'{now - status["progress_time"]:.0f} s ago')
