"""Whether a worker's process still runs, for a worker of this host: the
kernel's view of its pid (/proc), which a status file cannot give when its
process was killed (SIGKILL, the OOM killer) or stopped (SIGSTOP)."""

import os
import socket
import time

GONE, STOPPED, ALIVE = 'gone', 'stopped', 'alive'

# Slack between the process's start as /proc tells it (clock ticks) and
# the worker's `started`, which comes after it.
_START_SLACK_SECONDS = 2.0


def state(host: str, pid: int, started: float | None) -> str | None:
  """GONE, STOPPED (by a signal) or ALIVE for the worker process `pid`
  that started before `started` (time.time()); None when it is not this
  host's, or this host has no /proc to tell."""
  if host != socket.gethostname() or not os.path.exists('/proc/self/stat'):
    return None
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8',
              errors='replace') as file:
      fields = file.read().rsplit(')', 1)[1].split()
    with open('/proc/uptime', encoding='utf-8') as file:
      uptime = float(file.read().split()[0])
  except FileNotFoundError:
    return GONE
  except (OSError, ValueError, IndexError):
    return None
  # Field 3 is the state (Z: a zombie, dead but not yet reaped), field 22
  # the start, in clock ticks after boot.
  if fields[0] in ('Z', 'X', 'x'):
    return GONE
  began = time.time() - (uptime - int(fields[19]) /
                         os.sysconf('SC_CLK_TCK'))
  if started is not None and began > started + _START_SLACK_SECONDS:
    return GONE  # Its pid was reused by a later process.
  return STOPPED if fields[0] in ('T', 't') else ALIVE
