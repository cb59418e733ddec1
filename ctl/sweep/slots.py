"""A sweep runner's trial processes: warm slots, or a fresh process each.

A trial of a small model trains for a second or two and spends 10-35 s
starting (Python, the TensorFlow import). A slot is a `python -m ctl.warm`
process (ctl/warm.py) that runs trial after trial, each from the state a
fresh process has; a runner keeps one slot for each trial it runs at once.
A trial's process, warm or fresh, has the surface of the Popen the runners
use: poll(), returncode, pid, send_signal(). In a slot, pid is the slot's
process: SIGTERM reaches the trial's preemption handler (exit 42), and a
trial that kills its slot (a segfault, SIGKILL) ends with that signal's
negative exit code, as a fresh process would.

Fresh, as before: trials of several workers (`ctl.launch`), runs that
ctl.warm refuses (a cluster, other CPU devices), and every trial with
`--warm_trials=false`. A slot is replaced by a fresh one after a trial that
killed it, after `SlotLimits.trials` trials, or once its resident memory
(/proc) passed `SlotLimits.memory_mb`. Slots die with their runner, as
trials' processes do (ctl/runtime/subprocesses.py).
"""

import dataclasses
import os
import subprocess

from ctl.runtime import subprocesses
from ctl.runtime import warm_client

_CLOSE_SECONDS = 30  # For a slot to exit once its input ends.


@dataclasses.dataclass(frozen=True)
class SlotLimits:
  """When a slot is replaced by a fresh process: after this many trials,
  or once its resident memory passed memory_mb."""

  trials: int
  memory_mb: int


class _Slot:
  """One warm process (ctl/runtime/warm_client.py) and its trial count."""

  def __init__(self):
    self.warm = warm_client.WarmProcess(stderr=subprocess.DEVNULL)
    self.process = self.warm.process
    self.trials = 0

  def send(self, argv: list[str], log_path: str) -> None:
    """Asks it to run `python -m ctl.main argv`, appending to log_path."""
    self.trials += 1
    self.warm.send({'argv': argv, 'log': log_path, 'cwd': os.getcwd(),
                    'append': True})

  def answer(self) -> dict | None:
    """Its answer to the run sent, once there is one; {'died': code} when
    the run ended the process."""
    return self.warm.answer()

  def usable(self, limits: SlotLimits) -> bool:
    """Whether it may run another trial."""
    return (self.process.poll() is None and self.trials < limits.trials and
            resident_mb(self.process.pid) <= limits.memory_mb)

  def close(self) -> None:
    """Ends it: its input closed, killed if it does not exit in time."""
    self.warm.close(_CLOSE_SECONDS)
    self.process.stdout.close()


class SlotRun:
  """One trial running in a slot, as a Popen of it would look; run fresh
  instead if the slot refuses it."""

  def __init__(self, slot: _Slot, command: tuple[str, ...], log):
    self.slot = slot
    self._command = command
    self._log = log
    self._fresh = None  # Its own process, if the slot refused it.
    self.returncode = None
    self.pid = slot.process.pid
    slot.send(list(command[3:]), log.name)

  @property
  def warm(self) -> bool:
    return self._fresh is None

  def poll(self) -> int | None:
    """Its exit code once it ended, else None."""
    if self._fresh is not None:
      self.returncode = self._fresh.poll()
    if self.returncode is not None:
      return self.returncode
    answer = self.slot.answer()
    if answer is None:
      return None
    if 'refused' in answer:
      self._log.write(f'(not run warm: {answer["refused"]})\n')
      self._log.flush()
      self._fresh = subprocesses.start(list(self._command), stdout=self._log)
      self.pid = self._fresh.pid
      return None
    self.returncode = answer.get('exit_code', answer.get('died'))
    return self.returncode

  def send_signal(self, signum: int) -> None:
    """Signals the process running the trial."""
    process = self._fresh or self.slot.process
    if process.poll() is None:
      process.send_signal(signum)


class TrialProcesses:
  """Starts a runner's trials: in warm slots (limits given) or each in a
  fresh process (limits None)."""

  def __init__(self, parallel: int, limits: SlotLimits | None):
    self.parallel = parallel
    self._limits = limits
    self._idle = []  # Slots that ran a trial and may run another.

  def start(self, command: tuple[str, ...], log):
    """Starts a trial's command, its output appended to the open file log."""
    if self._limits is None or tuple(command[1:3]) != ('-m', 'ctl.main'):
      return subprocesses.start(list(command), stdout=log)
    while self._idle:
      slot = self._idle.pop()
      try:
        return SlotRun(slot, command, log)
      except BrokenPipeError:
        slot.close()  # Killed while idle.
    return SlotRun(_Slot(), command, log)

  def finished(self, process) -> dict:
    """Takes back an ended trial's slot (kept, or ended past its limits);
    returns what trial.json records of its process."""
    if not isinstance(process, SlotRun):
      return {'pid': process.pid, 'warm': False}
    if process.slot.usable(self._limits):
      self._idle.append(process.slot)
    else:
      process.slot.close()
    return {'pid': process.pid, 'warm': process.warm}

  def close(self) -> None:
    """Ends the idle slots (every slot, once no trial runs)."""
    while self._idle:
      self._idle.pop().close()


def resident_mb(pid: int) -> float:
  """A process's resident memory in MiB (VmRSS, /proc); 0 if unknown."""
  try:
    with open(f'/proc/{pid}/status', encoding='utf-8') as status:
      for line in status:
        if line.startswith('VmRSS:'):
          return int(line.split()[1]) / 1024
  except (OSError, ValueError, IndexError):
    pass
  return 0.0
