"""Errors a user can act on; `ctl.main` prints their message and exits with their code."""

EXIT_FAILURE = 1  # Bad data, a mismatched checkpoint, a diverged run, an unwritable workdir.
EXIT_USAGE = 2  # A wrong flag or config value; nothing was written.


class CtlError(Exception):
  """A failure with a message that tells the user what to do; no traceback needed."""

  exit_code = EXIT_FAILURE


class ConfigError(CtlError):
  """A config value that cannot work; raised before anything is written."""

  exit_code = EXIT_USAGE
