"""Export: a run's best checkpoint (else its latest) for serving.

    workdir/export/saved_model/    a SavedModel; `serving_default` is the
                                   task's serving signature: raw inputs in,
                                   outputs out (classification: the
                                   features as the dataset ships them ->
                                   probabilities and class)
    workdir/export/<model>.keras   each of the task's Keras models
    workdir/export/export.json     the step and checkpoint exported

The export is written to a folder beside it and then renamed into place,
so workdir/export is always a whole export (briefly absent while the
folders swap). A kill meanwhile leaves temporary folders that the next
export removes (those outside the workdir: the next `ctl.main`), and a
finished run whose export was cut short is exported by the same command
run again. As in TensorFlow's multi-worker tutorials,
the workers that are not the chief export too, to a temporary folder they
delete: the chief alone writes into the workdir.
"""

import glob
import os
import socket
import tempfile

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl import task as task_lib
from ctl.checkpoints import contents as checkpoint_contents
from ctl.checkpoints import files as checkpoint_files
from ctl.checkpoints import lookup
from ctl.runtime import workdir as workdir_lib
from ctl.serving import load as load_lib

SAVED_MODEL = 'saved_model'
EXPORT_JSON = 'export.json'


def is_whole(workdir: str) -> bool:
  """Whether workdir holds a whole export (its export.json is written
  last, in the staging folder, before the folder is renamed into place)."""
  return storage.exists(os.path.join(workdir_lib.export_dir(workdir),
                                    EXPORT_JSON))


def _temporary(name: str, pid: int | None = None) -> str:
  """The name of a temporary folder of process `pid` (this one) in a
  workdir, e.g. `.export-123-host-staging-`: who made it, for the clean-up."""
  return f'{name}-{pid or os.getpid()}-{socket.gethostname()}-'


def _remove_leftovers(workdir: str) -> None:
  """Removes the temporary folders of exports that were cut short: those
  of processes of this host that are gone (another host's, or a live
  process's, may still be in use)."""
  if not storage.is_local(workdir):
    return  # Staged on this machine: nothing temporary there.
  # Staging folders, and the export a replace moved aside
  # (storage.publish_folder names it export.old-<pid>-<host>-replaced).
  for name in ('.export', f'{workdir_lib.EXPORT_DIR}.old'):
    for path in storage.glob(os.path.join(glob.escape(workdir), f'{name}-*')):
      try:
        pid = int(os.path.basename(path)[len(name) + 1:].split('-')[0])
      except ValueError:
        continue
      if (os.path.basename(path).startswith(_temporary(name, pid)) and
          not workdir_lib.is_alive(pid)):
        logging.info('Removing %s, left by an export that was cut short.',
                     path)
        storage.remove(path)


def _make_folder(purpose: str, workdir: str | None) -> str:
  """A new temporary folder in workdir (named for _remove_leftovers), or
  with None in this machine's temporary directory (ctl/runtime/workdir.py
  names it: the next `ctl.main` removes it if this one is killed)."""
  if workdir is None:
    return workdir_lib.make_scratch_folder(f'export-{purpose}')
  return tempfile.mkdtemp(prefix=_temporary('.export') + purpose + '-',
                          dir=workdir)


def export_run(config: ml_collections.ConfigDict, workdir: str, *,
               is_chief: bool = True, checkpoint: str = 'best') -> str:
  """Exports a checkpoint of the run in workdir; returns where.

  Args:
    config: the run's config.
    workdir: the run's workdir.
    is_chief: False exports to a temporary folder, deleted at once.
    checkpoint: 'best' (else the latest), 'latest' or a path prefix.

  Raises:
    CtlError: no checkpoint, one that does not fit, or a task whose
      serving signature cannot be saved.
  """
  final = workdir_lib.export_dir(workdir)
  lookup.find(workdir, checkpoint)  # None: an error before anything is made.
  # Staged beside the workdir's files (a rename puts it in place, and
  # links can be made), or on this machine for a workdir that is not.
  local = storage.is_local(workdir)
  if is_chief and local:
    storage.makedirs(workdir)  # A --checkpoint exported to a new workdir.
    _remove_leftovers(workdir)
  staging = _make_folder('staging', workdir if is_chief and local else None)
  reading = _make_folder('reading', workdir if local else None)
  try:
    path, which, snapshot = _snapshot(workdir, checkpoint, reading)
    run = load_lib.restore(config, snapshot)
    _write(run.task, staging)
    storage.write_json(os.path.join(staging, EXPORT_JSON), {
        'step': run.step, 'checkpoint': path, 'which': which,
        'task': config.task})
    if is_chief:
      _replace(staging, final)
  finally:
    storage.remove(staging)
    storage.remove(reading)
  if not is_chief:
    logging.info('Took part in the export (the chief writes it).')
    return staging
  logging.info('Exported the %s checkpoint (step %d) to %s', which, run.step,
               final)
  return final


def _snapshot(workdir: str, checkpoint: str, directory: str,
              attempts: int = 3) -> tuple[str, str, str]:
  """Links (else copies) the checkpoint to export into directory.

  The chief may replace the best checkpoint meanwhile (another worker
  exports while it does): a checkpoint gone before it was linked is looked
  up again.

  Returns:
    (its path, 'best' | 'latest' | 'named', the snapshot's path).
  """
  for _ in range(attempts):
    path, which = lookup.find(workdir, checkpoint)
    snapshot = os.path.join(directory, os.path.basename(path))
    if checkpoint_files.snapshot_checkpoint(path, snapshot):
      return path, which, snapshot
  raise errors.CtlError(
      f'Checkpoint {path} was deleted while it was being exported, '
      f'{attempts} times: run --mode=export again.')


def _write(task: task_lib.Task, directory: str) -> None:
  """The SavedModel and the .keras files of a restored task."""
  signature = task.serving_signature()
  if signature is None:
    logging.warning('No SavedModel, only .keras files: %s.',
                    task_lib.missing_signature(task))
  else:
    root = tf.Module()
    root.models = task.models()
    # Variables the signature may use besides the models' (an EMA's).
    root.task_variables = [value for value in task_lib.attribute_values(task)
                           if isinstance(value, tf.Variable)]
    root.serve = signature
    try:
      tf.saved_model.save(root, os.path.join(directory, SAVED_MODEL),
                          signatures={'serving_default': signature})
    except (ValueError, TypeError, AssertionError) as error:
      raise errors.CtlError(
          f'Cannot save task {type(task).__name__}\'s serving signature as '
          f'a SavedModel: {errors.summary(error)}. Its variables must '
          'belong to the task\'s Keras models or be tf.Variables that the '
          'task holds.') from error
  for name, model in checkpoint_contents.models_by_name(task).items():
    try:
      model.save(os.path.join(directory, f'{name}.keras'))
    except Exception as error:  # pylint: disable=broad-except
      logging.warning('Model %s cannot be saved as a .keras file (%s); the '
                      'SavedModel and the checkpoints have it.', name,
                      errors.summary(error, 200))


def _replace(staging: str, final: str, attempts: int = 3) -> None:
  """Puts staging at final, replacing an earlier export (export.json,
  which is_whole reads, last).

  Retried: a side-car evaluator may be replacing it at the same moment.
  """
  for attempt in range(attempts):
    try:
      storage.publish_folder(staging, final, EXPORT_JSON)
      return
    except (OSError, tf.errors.OpError):
      if attempt == attempts - 1:
        raise
