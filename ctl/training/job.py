"""What a training process runs in, as ctl/training/run.py hands it to the
Trainer and the Trainer to its loop and evaluation: its place in the job
(`Job`) and what the process holds for the run (`Process`)."""

import dataclasses

import tensorflow as tf

from ctl.cluster import distribution
from ctl.cluster import watchdog as watchdog_lib
from ctl.cluster import worker_status
from ctl.runtime import preemption
from ctl.runtime import workdir as workdir_lib


def _no_status() -> worker_status.WorkerStatus:
  """A status that writes no file."""
  return worker_status.WorkerStatus(None)


@dataclasses.dataclass(frozen=True)
class Job:
  """This process's place in the distributed job, and what watches it.

  Attributes:
    strategy: the distribution strategy (the workers' agreements).
    role: this worker's place in the job.
    watchdog: bounds each wait for a peer (ctl/cluster/watchdog.py): told
      of each step, loop, action and evaluation batch; None (the default)
      for one worker, which waits on no peer.
    status: this worker's status file (ctl/cluster/worker_status.py); by
      default none.
  """

  strategy: tf.distribute.Strategy
  role: distribution.Role
  watchdog: watchdog_lib.Watchdog | None = None
  status: worker_status.WorkerStatus = dataclasses.field(
      default_factory=_no_status)


@dataclasses.dataclass(frozen=True)
class Process:
  """What this process holds for the run.

  Attributes:
    stop_signal: SIGTERM's request to stop (ctl/runtime/preemption.py).
    workdir_lock: the workdir's lock, taken when the chief first writes.
    started: when the process started (speed.process_start_time).
  """

  stop_signal: preemption.StopSignal
  workdir_lock: workdir_lib.Lock
  started: float
