"""Trains a model: `python -m ctl.main --config=configs/digits.py --workdir=DIR`.

Any config field can be overridden, e.g. `--config.optimizer.learning_rate=0.01`.
The config is locked: a key that does not exist, or a value of the wrong
type, stops the run (exit code 2) before anything is written.
`--print_config` prints the resolved config, each field with its comment;
`--version` prints ctl's version (CHANGELOG.md says what each changed).

`--mode` evaluates, evaluates continuously (a side-car evaluator) or
exports instead of training (ctl/modes.py).

Exit codes (see ctl/errors.py): 0 trained, or had finished; 1 failed, the
message says why; 2 wrong flags or config; 42 preempted by SIGTERM after a
checkpoint, restart to resume; 43 a peer worker failed, restart all workers;
130 Ctrl-C twice, stopped at once without saving.
"""

from collections.abc import Callable
import os
import sys

from absl import app
from absl import flags
from absl import logging

import ctl
from ctl import config as config_lib
from ctl import config_checks
from ctl import config_help
from ctl import errors
from ctl.metric_writers import log_line
from ctl.runtime import tf_process

_CONFIG = config_lib.define_config_flag()
flags.declare_key_flag('config')  # Listed by --help, not only --helpfull.
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Directory for checkpoints, summaries and results.')
_MODE = flags.DEFINE_enum(
    'mode', 'train', ['train', 'evaluate', 'evaluate_continuously', 'export'],
    'train; evaluate: one checkpoint (--checkpoint, else the latest); '
    'evaluate_continuously: each new checkpoint of a training run (a '
    'side-car); export: a SavedModel and .keras files of the best '
    'checkpoint, else the latest (or --checkpoint).')
_CHECKPOINT = flags.DEFINE_string(
    'checkpoint', '',
    'For --mode=evaluate and export: a checkpoint path prefix, e.g. '
    'WORKDIR/checkpoints/ckpt-400; empty: the latest (evaluate) or the best '
    '(export).')
_PRINT_CONFIG = flags.DEFINE_bool(
    'print_config', False,
    'Print the resolved config, each field with its comment and default, '
    'and exit without training (no --workdir needed).')
_VERSION = flags.DEFINE_bool(
    'version', False, 'Print ctl\'s version and exit (no --config needed).')
flags.mark_flag_as_required('config')


def main(argv: list[str], start_up: tf_process.StartUp | None = None) -> int:
  """Runs the command whose flags are parsed; returns its exit code.

  start_up: the run's, from its start (default: the process's): timed up to
  the first loop for results.json.
  """
  start_up = start_up or tf_process.process_start_up()
  if len(argv) > 1:
    return _usage_error(f'Unexpected arguments: {" ".join(argv[1:])}')
  if _PRINT_CONFIG.value:
    print(config_help.describe(_CONFIG.value))
    return 0
  if not _WORKDIR.value:
    return _usage_error('Flag --workdir must name the directory for '
                        'checkpoints, summaries and results.')
  refusal = _refusal_before_tensorflow(_MODE.value, _CONFIG.value,
                                       _WORKDIR.value)
  if refusal:
    return _report(refusal)
  logging.get_absl_handler().addFilter(_drop_tensorflow_info)
  log_line.install()
  tf_process.remove_autograph_bytecode_at_exit()
  start_up.end('flags')
  tf_process.import_tensorflow()
  start_up.end('tensorflow')
  # Imported here so that flag errors are reported before TensorFlow loads.
  from ctl import modes  # pylint: disable=g-import-not-at-top
  from ctl import storage  # pylint: disable=g-import-not-at-top
  from ctl.runtime import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  start_up.end('ctl')
  storage.configure_remote_caches()
  # Those of ctl processes that were killed.
  workdir_lib.remove_scratch_leftovers()
  try:
    modes.run(_MODE.value, _CONFIG.value, _WORKDIR.value, _CHECKPOINT.value,
              start_up=start_up)
  except KeyboardInterrupt:
    # Ctrl-C before training took it over (tf_process.StopSignal): nothing
    # was trained, so nothing needed saving.
    return _report(errors.Preempted(
        'Ctrl-C before training started: nothing was trained or written '
        'since the latest checkpoint. Run the same command again to start.'))
  except errors.CtlError as error:
    return _report(error)
  except Exception as error:  # pylint: disable=broad-except
    return _report(_task_failure(error))
  log_line.finish_line()
  return 0


def run_in_process(argv: list[str],
                   check: Callable[..., str | None] | None = None) -> int:
  """Runs one `python -m ctl.main` command line in this process.

  For a process that runs command after command (ctl/warm.py),
  inside `fresh_state.restored_after()`: the flags of the command before
  are forgotten, config overrides included.

  Args:
    argv: the command line, program name first (`['ctl.main', '--config=...']`).
    check: called with the parsed config before anything runs; a string it
      returns refuses the command (raised as RunRefused).

  Returns:
    The exit code `python -m ctl.main argv` would exit with.
  """
  start_up = tf_process.run_start_up()  # Its timing is its own, not the process's.
  _forget_flags()
  sys.argv = list(argv)  # Where ml_collections reads --config.* overrides.
  try:
    remaining = parse_flags(list(argv))
    if flags.FLAGS['verbosity'].using_default_value:
      flags.FLAGS.verbosity = 0  # INFO, as absl's app.run sets it.
    refusal = check(_CONFIG.value) if check else None
    if refusal:
      raise RunRefused(refusal)
    return main(remaining, start_up)
  except SystemExit as exit_:
    return exit_.code if isinstance(exit_.code, int) else 1


class RunRefused(Exception):
  """A command that this process must not run (it needs a process of its
  own); nothing of it ran."""


def _forget_flags() -> None:
  """Every flag back to its default; the --config.* overrides of an earlier
  command undefined (ml_collections defines them while parsing)."""
  for name in list(flags.FLAGS):
    if name.startswith('config.'):
      delattr(flags.FLAGS, name)
  flags.FLAGS.unparse_flags()


def _refusal_before_tensorflow(mode: str, config,
                               workdir: str) -> errors.ConfigError | None:
  """The error of a config or --workdir that cannot work, found in a
  second, before TensorFlow loads (the checks training and evaluation make
  again once it has: an export checks only what it reads)."""
  try:
    config_checks.check_utf8('--workdir', workdir)
    if mode != 'export':
      config_checks.validate(config)
  except errors.ConfigError as error:
    return error
  except Exception:  # pylint: disable=broad-except
    return None  # Raised again by the same checks, where they report it.
  return None


def _task_failure(error: Exception) -> errors.CtlError:
  """The line for an error of the task's own code, after its traceback
  (which the user needs to mend it); any other error is raised as it is."""
  from ctl.training import failures  # pylint: disable=g-import-not-at-top
  failure = failures.task_failure(error)
  if failure is None:
    raise error  # A bug of ctl: its traceback says where.
  log_line.finish_line()
  logging.error('The task raised:', exc_info=error)
  return failure


def _report(error: errors.CtlError) -> int:
  """Prints the error as one `ctl: <label>:` message (stderr, where the log
  goes too); returns its exit code."""
  log_line.finish_line()
  print(f'ctl: {error.label}: {error}', file=sys.stderr, flush=True)
  return error.exit_code


def _drop_tensorflow_info(record) -> bool:
  """Keeps TensorFlow's own warnings and errors, not its INFO chatter."""
  return (record.levelno > logging.converter.STANDARD_INFO or
          f'{os.sep}tensorflow{os.sep}' not in record.pathname)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags; on any flag or config error, says which and exits 2.

  `--version` prints the version and exits 0 before the flags are parsed:
  --config, which it does not need, is required there.
  """
  if '--version' in argv[1:]:
    print(f'ctl {ctl.__version__}')
    sys.exit(0)
  try:
    # A task's config file may import TensorFlow: quietly, then.
    with tf_process.quiet_start_up(), config_lib.loading_user_file():
      remaining = flags.FLAGS(argv)
      _CONFIG.value.keys()  # A config file that failed to load raises here.
      config_checks.check_type(_CONFIG.value)
  except Exception as error:  # pylint: disable=broad-except
    _exit_usage(config_lib.explain_flag_error(error, argv))
  return remaining


def _usage_error(message: str) -> int:
  """Prints a flag error as one `ctl: error:` line; returns exit code 2."""
  print(f'ctl: error: {message}', file=sys.stderr, flush=True)
  return errors.EXIT_USAGE


def _exit_usage(message: str) -> None:
  sys.exit(_usage_error(message))


def _main_then_exit(argv: list[str]) -> None:
  """app.run's main: runs the command and exits with its code."""
  code = main(argv)
  if 'tensorflow' in sys.modules:
    tf_process.exit_now(code)  # Without TensorFlow's slow shutdown.
  sys.exit(code)


if __name__ == '__main__':
  app.run(_main_then_exit, flags_parser=parse_flags)
