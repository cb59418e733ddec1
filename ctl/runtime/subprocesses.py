"""Child processes that die with their parent and take signals only from it."""

import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1  # From <linux/prctl.h>.


def start(command: list[str], *, env: dict[str, str] | None = None,
          stdout=None, stdin=None,
          stderr=subprocess.STDOUT) -> subprocess.Popen:
  """Starts command in a session of its own, killed if this process dies.

  In its own session, a terminal's Ctrl-C reaches only this process, which
  decides what to pass on. Killed with this process (on Linux), a child never
  goes on training unwatched, e.g. beside a rerun in the same workdir.
  stderr goes where stdout goes unless given.
  """
  return subprocess.Popen(command, env=env, stdin=stdin, stdout=stdout,
                          stderr=stderr, text=True,
                          start_new_session=True,
                          preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
  """Runs in the child before exec: asks for SIGKILL when the parent dies."""
  if not sys.platform.startswith('linux'):
    return
  parent = os.getppid()
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  if os.getppid() != parent:  # The parent died before prctl took effect.
    os._exit(1)  # pylint: disable=protected-access
