"""The caller's side of a warm process (`python -m ctl.warm`, ctl/warm.py
has the protocol): starts it, sends it runs, reads its answers.

One client for the compatibility suite (a run, then its answer) and a
sweep's slots (ctl/sweep/slots.py: a run sent, its answer polled between
other work). The process dies with its caller (subprocesses.start).
"""

import contextlib
import json
import select
import subprocess
import sys
import time
from typing import Any

from ctl.runtime import subprocesses

_EXIT_SECONDS = 30  # For a process whose output closed to be gone.


class WarmProcess:
  """One `python -m ctl.warm` process. Every wait is bounded: a run past
  its timeout kills the process (TimeoutError); one that ended the process
  raises EOFError in `run`, or is answered {'died': code} by `answer`."""

  def __init__(self, *, cpu_devices: int = 1, env: dict[str, str] | None = None,
               stderr=None):
    self.process = subprocesses.start(
        [sys.executable, '-m', 'ctl.warm', f'--cpu_devices={cpu_devices}'],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)

  def send(self, request: dict[str, Any]) -> None:
    """Sends one run's request (ctl/warm.py's fields)."""
    self.process.stdin.write(json.dumps(request) + '\n')
    self.process.stdin.flush()

  def answer(self, timeout: float = 0) -> dict[str, Any] | None:
    """The answer to the run sent, waiting at most timeout s; None when
    there is none yet; {'died': code} when the run ended the process."""
    if not select.select([self.process.stdout], [], [], timeout)[0]:
      return None
    line = self.process.stdout.readline()
    if not line:
      # Its exit code, the signal's that killed it (a segfault's -11).
      return {'died': self.close(timeout=_EXIT_SECONDS)}
    return json.loads(line)

  def run(self, argv: list[str], log: str, *, cwd: str | None = None,
          env: dict[str, str | None] | None = None,
          timeout: float = 600, **fields) -> dict[str, Any]:
    """Runs `python -m ctl.main argv` there; returns its answer
    ({'exit_code': n} or {'refused': reason})."""
    self.send({'argv': list(argv), 'log': str(log), 'cwd': cwd, 'env': env,
               **fields})
    deadline = time.monotonic() + timeout
    while True:
      answer = self.answer(max(0.0, deadline - time.monotonic()))
      if answer is not None and 'died' in answer:
        raise EOFError(f'The warm process ended (code {answer["died"]}) '
                       f'during {argv}; its log: {log}.')
      if answer is not None:
        return answer
      if time.monotonic() >= deadline:
        self.close(timeout=0)
        raise TimeoutError(f'The warm run {argv} took over {timeout} s.')

  def close(self, timeout: float = 60) -> int:
    """Ends the process (at the end of its input; killed after timeout)."""
    with contextlib.suppress(OSError):
      self.process.stdin.close()
    try:
      return self.process.wait(timeout)
    except subprocess.TimeoutExpired:
      self.process.kill()
      return self.process.wait()
