"""The watchdog's question, which peer on this machine is gone
(peer_evidence.gone_here), answered from real status files and real
processes."""

import json
import os
import subprocess
import sys
import time

from ctl.cluster import peer_evidence
from ctl.cluster import worker_status
from ctl.runtime import workdir as workdir_lib


def _write_peer(workdir, fields: dict) -> None:
  """Worker 1's status file, as its writer thread leaves it."""
  path = workdir_lib.worker_status_path(str(workdir), 1)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as file:
    json.dump(fields, file)


def test_a_peer_killed_in_this_run_is_gone_one_of_an_earlier_run_is_not(
    tmp_path):
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  peer = worker_status.WorkerStatus(str(tmp_path), worker_index=1,
                                    num_workers=2, timeout_seconds=30)
  killed = {**peer.snapshot(), 'pid': dead.pid}
  # An earlier run's worker 1, killed: its file was last written before
  # this worker started (a resumed job whose worker 1 is still starting).
  _write_peer(tmp_path, {**killed, 'time': time.time() - 60})
  me = worker_status.WorkerStatus(str(tmp_path), worker_index=0,
                                  num_workers=2, timeout_seconds=30)
  assert peer_evidence.gone_here(me) is None
  # This run's worker 1, killed after it wrote while training with me.
  _write_peer(tmp_path, {**killed, 'time': time.time() + 1})
  gone = peer_evidence.gone_here(me)
  assert gone is not None and gone.endswith(': its process is gone'), gone
  assert f'pid {dead.pid}' in gone
  # Alive, or ended with its end written: not gone.
  _write_peer(tmp_path, {**killed, 'pid': os.getpid(),
                         'time': time.time() + 1})
  assert peer_evidence.gone_here(me) is None
  _write_peer(tmp_path, {**killed, 'time': time.time() + 1,
                         'state': worker_status.FINISHED, 'exit_code': 0})
  assert peer_evidence.gone_here(me) is None
