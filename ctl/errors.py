"""Errors a user can act on; `ctl.main` prints their message and exits with their code.

Exit codes a scheduler can act on:
  0   finished (or had finished before).
  1   failed: bad data, a mismatched checkpoint, a diverged loss, an
      unwritable workdir. Restarting will not help.
  2   a wrong flag or config value, a checkpoint of another cluster shape,
      or a workdir another job trains in; nothing was written.
  42  preempted: stopped by SIGTERM after saving a checkpoint at the step it
      reached, on every worker. Restart to resume; nothing is lost.
  43  a peer worker died or stopped responding (or this worker lost the
      cluster), or the store of a gs:// workdir stopped answering. Restart
      every worker: they resume from the latest checkpoint.
"""

import warnings

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 42
EXIT_PEER_FAILED = 43


class CtlError(Exception):
  """A failure with a message that tells the user what to do; no traceback needed."""

  exit_code = EXIT_FAILURE
  label = 'error'


class ConfigError(CtlError):
  """A config value that cannot work; raised before anything is written."""

  exit_code = EXIT_USAGE


class WorkdirInUse(CtlError):
  """Another job trains in the workdir; nothing was written."""

  exit_code = EXIT_USAGE


class Preempted(CtlError):
  """SIGTERM stopped training after a checkpoint at the step it reached."""

  exit_code = EXIT_PREEMPTED
  label = 'preempted'


class PeerFailure(CtlError):
  """A collective failed: a worker died, hung or lost the cluster."""

  exit_code = EXIT_PEER_FAILED


class StoreUnavailable(CtlError):
  """The store of a workdir on cloud storage failed, retries included."""

  exit_code = EXIT_PEER_FAILED


def summary(error: Exception, max_chars: int = 600) -> str:
  """The error's message, cut to one readable paragraph."""
  text = str(error).strip() or type(error).__name__
  return text if len(text) <= max_chars else text[:max_chars] + ' ...'


def op_reason(error: Exception) -> str:
  """A TensorFlow op error's message without its function and op names,
  nor the traceback of a graph's ("Graph execution error: Detected at
  node ...")."""
  message = getattr(error, 'message', str(error))
  lines = [line.strip() for line in message.splitlines()
           if line.strip() and not line.startswith((' ', '\t'))
           and not line.startswith(('Graph execution error',
                                    'Detected at node'))]
  message = lines[-1] if lines else message.strip()
  return message.split('}}')[-1].split('[Op:')[0].strip()


class CtlDeprecationWarning(FutureWarning):
  """An old form of ctl's API or of a config that still works, with a
  warning saying what to write (CHANGELOG.md says until when).

  A FutureWarning, which Python shows by default (a DeprecationWarning it
  hides outside __main__); `python -W error::FutureWarning` turns it into
  an error.
  """


def warn_deprecated(message: str, filename: str, lineno: int,
                    module: str) -> None:
  """Warns of an old form (CtlDeprecationWarning) at filename:lineno, once
  per process.

  Once in Python's own `warnings.onceregistry`, by text: the registry that
  `warnings` keeps per module is emptied whenever the filters change
  (scikit-learn's functions change them, in `warnings.catch_warnings`), and
  ctl checks a task or config more than once a run (training, then the
  export), which showed the same warning twice.
  """
  key = (message, CtlDeprecationWarning)
  if warnings.onceregistry.get(key):
    return
  warnings.warn_explicit(message, CtlDeprecationWarning, filename, lineno,
                         module=module, registry={})
  warnings.onceregistry[key] = 1  # Not when the filters made it an error.
