"""What a worker knows when a job hangs: its stacks, its phase, its peers.

    workdir/diagnostics/worker-<i>-<pid>.txt   (workdir.diagnostics_path)

Written by a worker when its watchdog gives up on a peer (before it aborts
the collectives, so the stack of the waiting thread shows where it
waited), when TensorFlow reports a lost peer, and at any time on SIGUSR1
(`kill -USR1 <pid>`), which does not stop training.

SIGUSR1 reaches Python's handlers only when the main thread runs Python,
and a hung worker's main thread waits inside TensorFlow: training answers
it on a thread of its own (`tf_process.OnSignal`, with the process's other
signals), which calls `write_on_signal`.
"""

import os
import signal
import sys
import threading
import time
import traceback

from absl import logging

from ctl import errors
from ctl import storage
from ctl.cluster import peer_evidence
from ctl.cluster import watchdog
from ctl.cluster import worker_status
from ctl.runtime import workdir as workdir_lib


def write(status: worker_status.WorkerStatus, why: str,
          error: BaseException | None = None) -> str | None:
  """Writes this worker's dump; returns its path (None without a workdir).

  Args:
    status: this worker's status (its phase, step and workdir).
    why: what made it write the dump.
    error: the error that ended the run, if any: its traceback goes in.
  """
  if status.workdir is None:
    return None
  mine = status.snapshot()
  path = workdir_lib.diagnostics_path(status.workdir, status.worker_index,
                                      mine['pid'])
  storage.makedirs(os.path.dirname(path))
  storage.write_text(path, render(status, mine, why, error))
  logging.warning('Diagnostics (every thread\'s stack, the peers\' last '
                  'status) written to %s', path)
  return path


def render(status: worker_status.WorkerStatus, mine: dict, why: str,
           error: BaseException | None) -> str:
  """The dump's text."""
  now = time.time()
  peers = peer_evidence.read_peers(status.workdir, mine['num_workers'])
  peers[status.worker_index] = mine
  lines = [
      f'ctl diagnostics of worker {mine["worker"]} of {mine["num_workers"]} '
      f'(host {mine["host"]}, pid {mine["pid"]}) at '
      f'{time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))}: {why}',
      f'This worker: {peer_evidence.describe(mine, now)}', '',
      'Every worker\'s last status (workdir/workers/):']
  for index, peer in sorted(peers.items()):
    lines.append('  ' + (peer_evidence.describe(peer, now) if peer else
                         f'worker {index}: no status file'))
  stalled = peer_evidence.stalled_peers(peers, status.worker_index, now)
  lines += ['', 'Stopped making progress: ' +
            ('; '.join(stalled) if stalled else
             'none (no peer\'s own status file singles one out)'), '']
  if error is not None:
    lines += ['The error that ended the run:',
              ''.join(traceback.format_exception(error)).rstrip(), '']
  lines.append(thread_stacks())
  return '\n'.join(lines) + '\n'


def thread_stacks() -> str:
  """Every Python thread's stack, the innermost call last."""
  names = {thread.ident: thread.name for thread in threading.enumerate()}
  parts = []
  for ident, frame in sys._current_frames().items():  # pylint: disable=protected-access
    parts.append(f'--- Thread {names.get(ident, "?")} ({ident}) ---\n' +
                 ''.join(traceback.format_stack(frame)))
  return '\n'.join(parts)


def name_stalled_peers(failure: errors.PeerFailure,
                       status: worker_status.WorkerStatus,
                       error: BaseException,
                       watchdog_dump: str | None) -> errors.PeerFailure:
  """The failure, naming the peers that stopped making progress and the
  dump: the watchdog's where its abort ended the wait (its stacks show
  where this worker waited); else one written now with TensorFlow's error
  in it. (The watchdog may have dumped after TensorFlow's error, its stacks
  then showing this worker's way out, not its wait: that dump is
  replaced.)"""
  if status.workdir is None:
    return failure
  stalled = peer_evidence.read_and_wait_for_evidence(status)
  dump = watchdog_dump if watchdog.ended_the_wait(error) else None
  if dump is None:
    try:
      dump = write(status, f'TensorFlow reported a lost peer '
                   f'({type(error).__name__})', error)
    except Exception as write_error:  # pylint: disable=broad-except
      logging.error('Could not write the diagnostics: %s', write_error)
  named = ('Stopped making progress: ' + '; '.join(stalled) + '.' if stalled
           else 'No peer\'s status file singles one out (the network, or '
           'this worker?).')
  where = f' Stacks and every worker\'s last status: {dump}.' if dump else ''
  return errors.PeerFailure(f'{failure} {named}{where}')


def write_on_signal(status: worker_status.WorkerStatus,
                    signum: int = signal.SIGUSR1) -> None:
  """Writes the dump a signal asked for (run on tf_process.OnSignal's
  thread, training going on); a failure to write it is logged."""
  try:
    write(status, f'{signal.Signals(signum).name} asked')
  except Exception as error:  # pylint: disable=broad-except
    logging.error('Could not write the diagnostics: %s', error)
