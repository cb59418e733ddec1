"""Trains a model: `python -m ctl.main --config=configs/digits.py --workdir=DIR`.

Any config field can be overridden, e.g. `--config.optimizer.learning_rate=0.01`.
The config is locked: a key that does not exist, or a value of the wrong
type, stops the run (exit code 2) before anything is written.

Exit codes (see ctl/errors.py): 0 trained, or had finished; 1 failed, the
message says why; 2 wrong flags or config; 42 preempted by SIGTERM after a
checkpoint, restart to resume; 43 a peer worker failed, restart all workers.
"""

import atexit
import os
import sys

from absl import app
from absl import flags
from absl import logging

from ctl import config as config_lib
from ctl import errors

_CONFIG = config_lib.define_config_flag()
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Directory for checkpoints, summaries and results.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _exit_usage(f'Unexpected arguments: {" ".join(argv[1:])}')
  logging.get_absl_handler().addFilter(_drop_tensorflow_info)
  # Imported here so that flag errors are reported before TensorFlow loads.
  from ctl import train  # pylint: disable=g-import-not-at-top
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except errors.CtlError as error:
    if error.exit_code == errors.EXIT_PREEMPTED:
      logging.warning('%s', error)
    else:
      logging.error('%s', error)
    print(f'ctl: {error.label}: {error}', file=sys.stderr)
    _exit_now(error.exit_code)
  _exit_now(0)


def _exit_now(code: int) -> None:
  """Exits without TensorFlow's shutdown, once everything is flushed.

  Under MultiWorkerMirroredStrategy the runtime's shutdown takes seconds
  (4 to 11 measured, more when a peer is gone), which a preemption's grace
  period cannot spare. train_and_evaluate has closed every summary writer
  and waited for every checkpoint by the time it returns or raises, so
  nothing is lost.
  """
  # atexit handlers still run: autograph deletes its temporary files there.
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def _drop_tensorflow_info(record) -> bool:
  """Keeps TensorFlow's own warnings and errors, not its INFO chatter."""
  return (record.levelno > logging.converter.STANDARD_INFO or
          f'{os.sep}tensorflow{os.sep}' not in record.pathname)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags; on any flag or config error, says which and exits 2."""
  try:
    remaining = flags.FLAGS(argv)
    _CONFIG.value.keys()  # A config file that failed to load raises when read.
  except Exception as error:  # pylint: disable=broad-except
    _exit_usage(config_lib.explain_flag_error(error, argv))
  return remaining


def _exit_usage(message: str) -> None:
  print(f'ctl: error: {message}', file=sys.stderr)
  sys.exit(errors.EXIT_USAGE)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
