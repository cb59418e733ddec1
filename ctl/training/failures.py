"""What a failure that stopped training means for the user: TensorFlow's
errors turned into ctl's, in one place.

    raise failures.explain(error, ...) or error

- a collective that lost a peer: PeerFailure (restart every worker);
- a bad record: the data source holding it names it. A data source is any
  attribute of the task with `explain_failure(error)` (ctl's
  `TFRecordSource`, `TFDSSource`, or a user's own), which reads its files
  through and returns a CtlError, or None; a corrupt record of a task's
  own pipeline gets a message of its own;
- XLA that cannot compile the step;
- a full disk, or a workdir that vanished;
- an error of the task's own code, in any of its hooks (`task_failure`,
  which ctl.main asks): its traceback, then a line naming the hook.

Each says what was kept: checkpoints are whole or absent, so the latest
whole one resumes the run.
"""

import errno
import math
import os
import traceback

import tensorflow as tf

from ctl import actions as actions_lib
from ctl import errors
from ctl import storage
from ctl import task as task_lib
from ctl import task_hooks
from ctl.cluster import coordination
from ctl.cluster import distribution
from ctl.cluster import watchdog
from ctl.runtime import workdir as workdir_lib

# What a collective raises when a peer is gone or too slow.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
               tf.errors.AbortedError, tf.errors.CancelledError)


def explain(error: Exception, *, workdir: str, task: task_lib.Task | None,
            role: distribution.Role, timeout_seconds: float,
            jit_compile: str,
            workdir_lock: workdir_lib.Lock | None = None
            ) -> errors.CtlError | None:
  """The ctl error that says what `error` means; None for an error ctl
  cannot explain (it is raised as it is). workdir_lock: the chief's, which
  tells a workdir deleted mid-run from one that writes since recreated."""
  found = store_failure(error, workdir)
  if found is not None:
    return found
  if isinstance(error, PEER_ERRORS):
    return None if role.num_workers == 1 else peer_failure(
        error, workdir, timeout_seconds)
  if isinstance(error, (tf.errors.DataLossError,
                        tf.errors.InvalidArgumentError)):
    found = (data_failure(error, data_sources(task)) or
             xla_failure(error, jit_compile))
    if found is not None:
      return found
  if isinstance(error, (tf.errors.OpError, OSError)):
    return storage_failure(error, workdir, workdir_lock)
  return None


def task_failure(error: Exception) -> errors.CtlError | None:
  """The error for an exception the task's own code raised: a line naming
  the outermost of the task's hooks (or of its actions') in its traceback
  (or in those of the errors it was raised from) and what to do; None when no hook of a task
  raised it (a bug of ctl, whose traceback is the message).

  One place for every hook, wherever ctl calls it: in every mode, while
  tracing a step (AutoGraph's copy of a hook is `tf__<hook>`), or in an
  old form through a wrapper.
  """
  found = _raised_in_hook(error)
  if found is None:
    return None
  hook, task_class, raised = found
  message = ' '.join(errors.summary(raised, 300).split())  # One line.
  return errors.CtlError(
      f'{task_class.__module__}.{task_class.__qualname__}.{hook}() raised '
      f'{type(raised).__name__}: {message} (the traceback is above). Fix '
      'the task and run the same command again (the checkpoints saved '
      'before are kept).')


# The task's methods ctl calls: its hooks, and the constructor; and those
# of a task's own actions (ctl.Action).
_HOOKS = frozenset(task_hooks.HOOKS) | {'__init__'}
_ACTION_HOOKS = frozenset({'run', 'state', 'restore'})


def _raised_in_hook(error: BaseException
                    ) -> tuple[str, type, BaseException] | None:
  """(hook, the task's class, the error whose traceback holds it) of the
  outermost frame of a task's hook, searching the error, then the errors
  it was raised from."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    for frame, _ in traceback.walk_tb(error.__traceback__):
      hook = frame.f_code.co_name.removeprefix('tf__')
      owner = frame.f_locals.get('self')
      if _is_hook(hook, owner):
        return hook, type(owner), error
    error = error.__cause__ or error.__context__
  return None


def _is_hook(name: str, owner) -> bool:
  """Whether a method `name` of `owner` is a hook of the user's: of a
  task (ctl's built-in ones too), or of an action that is not ctl's."""
  if isinstance(owner, task_lib.Task):
    return name in _HOOKS
  return (name in _ACTION_HOOKS and isinstance(owner, actions_lib.Action) and
          not type(owner).__module__.startswith('ctl.'))


def peer_failure(error: Exception, workdir: str,
                 timeout_seconds: float) -> errors.PeerFailure:
  """The error for a lost peer, naming what noticed it, and when."""
  return errors.PeerFailure(
      f'Lost the other workers ({type(error).__name__}): '
      f'{_how_lost(error, timeout_seconds)}. Nothing was saved after the '
      f'latest checkpoint in {workdir_lib.checkpoint_dir(workdir)}; restart '
      'every worker to resume from it.')


def _how_lost(error: Exception, timeout_seconds: float) -> str:
  """Which of the four ways a lost peer is noticed this was.

  This worker's watchdog (ctl/cluster/watchdog.py) aborts its collectives
  with a message of its own, after the timeout or at once when a peer's
  process on this machine is gone; TensorFlow's coordination service fails every
  worker's collectives once one sent no heartbeat for its heartbeat
  timeout (ctl/cluster/coordination.py sets it); anything else is a
  connection to a peer that broke (a process gone: seconds, not a timeout).
  """
  message = str(error)
  if watchdog.ABORT_MESSAGE in message:
    return ('this worker made no progress for distribution.timeout_seconds='
            f'{timeout_seconds:g} (its watchdog ended the wait): another '
            'worker is stopped or hung, or died unnoticed')
  if watchdog.PEER_GONE_MESSAGE in message:
    return ('a peer\'s process on this machine is gone (its watchdog ended '
            'the wait): ' + message.split(watchdog.PEER_GONE_MESSAGE, 1)[1]
            .split('\n')[0][:300])
  if 'heartbeat' in message.lower():
    heartbeat = coordination.heartbeat_timeout_seconds(timeout_seconds)
    # Its message names the tasks on lines of their own: one line here.
    said = ' '.join(message.split())[:300]
    return ("TensorFlow's coordination service found a worker silent for "
            f'its heartbeat timeout, {heartbeat:g} s ('
            f'{coordination.HEARTBEAT_TIMEOUTS} x distribution.timeout_'
            f'seconds={timeout_seconds:g}): it died, was stopped or is cut '
            f'off (TensorFlow: {said})')
  return ('a connection to another worker failed: it died, exited or was '
          f'killed (TensorFlow: {errors.op_reason(error)[:300]})')


def data_sources(task: task_lib.Task | None) -> list:
  """The task's attributes that explain their data's failures."""
  if task is None:
    return []
  return [value for value in task_lib.attribute_values(task)
          if callable(getattr(value, 'explain_failure', None))]


def data_failure(error: tf.errors.OpError,
                 sources) -> errors.CtlError | None:
  """The error of the first source that finds a bad record; for a corrupt
  record no source holds (a task's own pipeline), one that says so."""
  for source in sources:
    found = source.explain_failure(error)
    if found is not None:
      return found
  if not isinstance(error, tf.errors.DataLossError):
    return None
  return errors.CtlError(
      f'Training read a corrupt record ({errors.op_reason(error)}) through '
      'the task\'s own pipeline, which does not say from which file: check '
      'each file, e.g. with ctl.data.tfrecord_files.count_records(path). '
      'Nothing was saved after the latest checkpoint.')


def xla_failure(error: tf.errors.OpError,
                jit_compile: str) -> errors.CtlError | None:
  """The error for a step XLA cannot compile."""
  for line in error.message.splitlines():
    if 'trying to compile' in line and '_JIT' in line:
      return errors.CtlError(
          f'XLA cannot compile the training step: {line.strip()[:500]}. Run '
          f'with --config.jit_compile=off (config.jit_compile='
          f'{jit_compile!r}). Nothing was trained.')
  return None


def store_failure(error: Exception,
                  workdir: str) -> errors.StoreUnavailable | None:
  """The error for a workdir's cloud store that failed to answer (after
  TensorFlow's own retries); None for other errors."""
  if storage.is_local(workdir) or not isinstance(error, tf.errors.OpError):
    return None
  message = str(error)
  store = workdir.split('/')[2] if workdir.count('/') >= 2 else workdir
  if store not in message and 'retry attempts failed' not in message:
    return None
  return errors.StoreUnavailable(
      f'The store of workdir {workdir} did not answer, TensorFlow\'s '
      f'retries included: {errors.summary(error, 300)}. Every checkpoint '
      'before the one being written is whole and kept: run the same command '
      'again (every worker) to resume from the latest.')


def storage_failure(error: Exception, workdir: str,
                    workdir_lock: workdir_lib.Lock | None = None
                    ) -> errors.CtlError | None:
  """The error for a full disk or a workdir that vanished mid-run; None for
  other errors. Checkpoints are whole or absent (the state file naming the
  latest is written last), so the latest whole one is kept either way."""
  if (workdir_lock is not None and workdir_lock.lost()) or not _present(
      workdir):
    return workdir_lib.vanished(workdir, errors.summary(error, 300))
  if _names_missing_file(error, workdir):
    return errors.CtlError(
        f'Files of the workdir {workdir} vanished during the run (deleted '
        f'by another process?): {errors.summary(error, 300)}. A checkpoint '
        'whose files are all there is whole: run the same command again to '
        'resume from the latest of those, or train in a new --workdir.')
  if 'No space left on device' in str(error) or getattr(
      error, 'errno', None) == errno.ENOSPC:
    return errors.CtlError(
        f'The disk of {workdir} is full: {errors.summary(error, 300)}. Every '
        'checkpoint before the one being written is whole and kept. Free '
        'some space (or lower config.intervals.keep_checkpoints), then run '
        'the same command again to resume from the latest.')
  return None


def _names_missing_file(error: Exception, workdir: str) -> bool:
  """Whether the error says that a file in the workdir does not exist
  (TensorFlow's checkpoint merge says so in an InvalidArgumentError)."""
  message = str(error)
  missing = isinstance(error, (tf.errors.NotFoundError,
                               FileNotFoundError)) or 'NOT_FOUND' in message
  return missing and os.path.join(workdir, '') in message


def _present(workdir: str) -> bool:
  """Whether the workdir is there; True when the store cannot say."""
  try:
    return storage.isdir(workdir)
  except tf.errors.OpError:
    return True


def divergence(logs: dict[str, float], previous_step: int,
               step: int) -> errors.CtlError | None:
  """The CtlError naming the first log that is not finite; None if all are."""
  for name, value in logs.items():
    if not math.isfinite(value):
      where = (f'at step {step}' if step - previous_step == 1 else
               f'in steps {previous_step + 1}..{step}')
      return errors.CtlError(
          f'The training {name} is {value} after step {step}: it diverged '
          f'{where}. Nothing was saved after step {previous_step}. Lower the '
          'learning rate, or run with --config.steps_per_loop=1 to find the '
          'exact step.')
  return None
