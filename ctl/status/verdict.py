"""The run's state by its evidence: RUNNING, HUNG, FAILED, FINISHED,
STOPPED (or NOT STARTED, UNKNOWN), and the line saying why.

A worker whose file says it is running is judged by what else is known:
- gone: its process, on this host, no longer exists (killed by SIGKILL or
  the OOM killer, or crashed: it could not write its end);
- stopped by a signal: its process, on this host, is stopped (SIGSTOP,
  Ctrl-Z, a debugger): the others wait for it in their all-reduce;
- silent: its file was not rewritten for SILENT_HEARTBEATS heartbeats
  (its writer thread runs even while training waits): stopped, dead or
  cut off, on another host (a job of one worker writes its file on its
  training thread, with no heartbeat: only its progress says);
- no progress: its file is fresh, but it made no step for longer than
  distribution.timeout_seconds (_DEFAULT_HANG_SECONDS without one).
"""

from ctl.cluster import worker_status
from ctl.runtime import processes

RUNNING, HUNG, NOT_STARTED, UNKNOWN = ('running', 'hung', 'not started',
                                       'unknown')
FINISHED, STOPPED, FAILED = (worker_status.FINISHED, worker_status.STOPPED,
                             worker_status.FAILED)

# Heartbeats (heartbeat_seconds) after which a file that stopped changing
# means its worker stopped: 2 are the peers' rule; one more for a busy
# machine, whose writer thread can be late.
SILENT_HEARTBEATS = 3

# Without a watchdog (distribution.timeout_seconds=0, one worker), a
# worker that made no step for this long is taken for hung.
_DEFAULT_HANG_SECONDS = 600.0

# The exit code of a worker that lost a peer: an effect, named after causes.
_EXIT_PEER_FAILED = 43


def condition(status: dict, now: float) -> tuple[str, str | None]:
  """(what a worker is: its file's state, or 'gone', 'stopped by a
  signal', 'silent', 'stalled'; a clause saying why, if not plain)."""
  if status['state'] != worker_status.RUNNING:
    return status['state'], None
  process = processes.state(status['host'], status['pid'],
                            status.get('started'))
  if process == processes.GONE:
    return 'gone', ('its process no longer exists and wrote no end '
                    '(killed: SIGKILL or the OOM killer; or it crashed)')
  if process == processes.STOPPED:
    return 'stopped by a signal', (
        f'its process is stopped (SIGSTOP, Ctrl-Z or a debugger): the '
        f'others wait for it; kill -CONT {status["pid"]} continues it')
  silent = now - status['time']
  heartbeat = status.get('heartbeat_seconds')
  if heartbeat is not None and silent > SILENT_HEARTBEATS * heartbeat:
    return 'silent', (f'its status stopped changing {age(silent)} ago '
                      '(stopped, dead or cut off)')
  limit = status.get('timeout_seconds') or _DEFAULT_HANG_SECONDS
  if now - status['progress_time'] > limit:
    return 'stalled', (
        f'it made no progress for {age(now - status["progress_time"])}, '
        f'over its timeout of {limit:g} s')
  return RUNNING, None


def run_state(workers: dict[int, dict],
              conditions: dict[int, tuple[str, str | None]],
              results: dict | None) -> tuple[str, str]:
  """The run's state and a line saying why, from the latest job's
  workers' statuses and their `condition`s (else results.json)."""
  if not workers:
    if results is not None:
      return FINISHED, 'training finished (results.json)'
    return NOT_STARTED, ('no worker has started training (still starting, '
                         'or it ended before its first step)')
  judged = [(status, *conditions[index])
            for index, status in sorted(workers.items())]
  failed = ([_ended(status) for status, what, _ in judged
             if what == FAILED and status['exit_code'] != _EXIT_PEER_FAILED]
            + [f'{who(status)} is gone: {why}'
               for status, what, why in judged if what == 'gone']
            + [_ended(status) for status, what, _ in judged
               if what == FAILED and status['exit_code'] == _EXIT_PEER_FAILED])
  if failed:
    return FAILED, '; '.join(failed)
  stopped = [status for status, what, _ in judged if what == STOPPED]
  if any(status['exit_code'] for status in stopped):
    return STOPPED, _ended(next(status for status in stopped
                                if status['exit_code']))
  hung = [f'{who(status)} is {what}: {why}'
          for status, what, why in judged if why is not None]
  if hung:
    return HUNG, '; '.join(hung)
  if all(what != RUNNING for _, what, _ in judged):
    chief = workers[min(workers)]
    if chief['state'] == STOPPED:
      return STOPPED, f'stopped early: {chief["reason"]}'
    return FINISHED, 'training finished (exit code 0)'
  return RUNNING, 'training'


def who(status: dict) -> str:
  """A worker by its index, host and pid."""
  return f'{name(status)} ({status["host"]}, pid {status["pid"]})'


def name(status: dict) -> str:
  """'worker <i>'; 'the chief' of a parameter-server job, whose workers
  and servers write no status file (its chief is the loop's one worker)."""
  return 'the chief' if status.get('job') else f'worker {status["worker"]}'


def _ended(status: dict) -> str:
  """How a worker ended, by its file."""
  if status['exit_code'] is None:
    return f'{name(status)} {status["state"]}: {status["reason"]}'
  return (f'{name(status)} exited with code '
          f'{status["exit_code"]}: {status["reason"]}')


def age(seconds: float) -> str:
  """Seconds as h:mm:ss (whatever the number: a file's clock may be off)."""
  seconds = min(max(0, round(seconds)), 10**9 * 86400)  # timedelta's range.
  minutes, second = divmod(seconds, 60)
  hours, minute = divmod(minutes, 60)
  return f'{hours}:{minute:02d}:{second:02d}'
