"""File access for workdirs and data: local paths, and any URL that
TensorFlow's filesystems understand (gs://, s3:// with tensorflow-io, ...).

The one module of ctl that touches the filesystem. TensorFlow is
imported only for what needs it: plain local paths (no scheme) are read
with Python's own calls, so a reader of a local workdir (ctl.status)
never loads it. Local paths keep what
they had (an atomic rename, hard links); on an object store, where a
directory cannot be renamed nor a file linked, each whole file is one
upload, which the store makes visible all at once, and a folder that must
appear whole is published with a marker file written last.

TensorFlow's GCS client caches a file's status for 5 s and a listing's
matches for 0 s by default: a reader polling for new checkpoints in
another process (the side-car evaluator) could miss one for that long.
`configure_remote_caches` turns the status cache off for the processes
ctl starts, unless the user set GCS_STAT_CACHE_MAX_AGE.
"""

import json
import os
import shutil
import socket


def _gfile():
  """tf.io.gfile, TensorFlow imported at its first use: reading a local
  workdir (ctl.status) needs none, and the import takes seconds."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def _tf_errors():
  """tf.errors (TensorFlow imported at its first use)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.errors


def io_errors(path: str) -> tuple[type[Exception], ...]:
  """What reading or writing path raises: OSError, and TensorFlow's
  OpError for a path its filesystems handle (imported only then)."""
  return (OSError,) if _is_plain(path) else (OSError, _tf_errors().OpError)


def _is_plain(path: str) -> bool:
  """Whether path is a plain local one (no scheme), which Python's own
  calls read without TensorFlow."""
  return '://' not in path


def is_local(path: str) -> bool:
  """Whether path is on this machine's filesystem (no scheme, or file://)."""
  return '://' not in path or path.startswith('file://')


def configure_remote_caches() -> None:
  """No status cache in TensorFlow's GCS client (before its first use):
  a new checkpoint, results.json or best.json is seen at once."""
  os.environ.setdefault('GCS_STAT_CACHE_MAX_AGE', '0')


def join(path: str, *parts: str) -> str:
  return os.path.join(path, *parts)


def exists(path: str) -> bool:
  if _is_plain(path):
    return os.path.exists(path)
  return _gfile().exists(path)


def isdir(path: str) -> bool:
  if _is_plain(path):
    return os.path.isdir(path)
  return _gfile().isdir(path)


def makedirs(path: str) -> None:
  if _is_plain(path):
    os.makedirs(path, exist_ok=True)
    return
  _gfile().makedirs(path)


def listdir(path: str) -> list[str]:
  """Names in a folder (without a trailing '/' for sub-folders)."""
  if _is_plain(path):
    return os.listdir(path)
  return [name.rstrip('/') for name in _gfile().listdir(path)]


def glob(pattern: str) -> list[str]:
  return _gfile().glob(pattern)


def size(path: str) -> int:
  return _gfile().stat(path).length


def modified_time(path: str) -> float:
  """When a file was last written (seconds since the epoch)."""
  if _is_plain(path):
    return os.stat(path).st_mtime_ns / 1e9
  return _gfile().stat(path).mtime_nsec / 1e9


def remove(path: str) -> None:
  """Removes a file, or a folder and all it holds; nothing if it is gone."""
  if _is_plain(path):
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
      os.remove(path)
    return
  try:
    if _gfile().isdir(path):
      if is_local(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        _gfile().rmtree(path)
    else:
      _gfile().remove(path)
  except _tf_errors().NotFoundError:
    pass


def copy(source: str, destination: str) -> None:
  """Copies a file, replacing destination."""
  _gfile().copy(source, destination, overwrite=True)


def link_or_copy(source: str, destination: str) -> None:
  """A hard link where the filesystem has them (it costs nothing, and the
  file stays readable when the source is deleted), else a copy.

  Raises:
    NotFoundError or FileNotFoundError: the source is gone.
  """
  if is_local(source) and is_local(destination):
    try:
      os.link(source, destination)
      return
    except FileExistsError:
      os.remove(destination)
      os.link(source, destination)
      return
    except FileNotFoundError:
      raise
    except OSError:  # Another filesystem.
      pass
  copy(source, destination)


def rename(source: str, destination: str) -> None:
  """Renames a file, replacing destination (on an object store: a copy,
  then the source deleted)."""
  _gfile().rename(source, destination, overwrite=True)


def open_binary(path: str):
  """A file opened for reading bytes (seekable)."""
  return _gfile().GFile(path, 'rb')


def read_text(path: str) -> str | None:
  """A file's text, or None when it does not exist."""
  if _is_plain(path):
    try:
      with open(path, encoding='utf-8') as file:
        return file.read()
    except (FileNotFoundError, NotADirectoryError):  # Not a folder: a file.
      return None
  try:
    with _gfile().GFile(path) as file:
      return file.read()
  except _tf_errors().NotFoundError:
    return None
  except _tf_errors().FailedPreconditionError as error:
    if 'Not a directory' in str(error):  # A file where a folder would be.
      return None
    raise


def read_json(path: str) -> dict | None:
  """A JSON file's content, or None when it does not exist."""
  text = read_text(path)
  return None if text is None else json.loads(text)


def write_json(path: str, content: dict) -> None:
  """Writes JSON atomically: readers see the old file or the whole new one."""
  write_text(path, json.dumps(content, indent=2, sort_keys=True) + '\n')


def write_text(path: str, text: str) -> None:
  """Writes a file atomically: readers see the old file or the whole new one.

  Locally, a temporary file named after its writer
  (`<path>.tmp-<host>-<pid>`: what a kill left of it is removed by
  workdir.remove_leftovers) is renamed over it; on an object store, the
  file is one upload, which appears whole or not at all.
  """
  if not is_local(path):
    with _gfile().GFile(path, 'w') as file:
      file.write(text)
    return
  temporary = f'{path}.tmp-{socket.gethostname()}-{os.getpid()}'
  with open(temporary, 'w') as file:
    file.write(text)
  os.replace(temporary, path)


def sync(paths: list[str]) -> None:
  """Flushes local files and folders (a folder: its entries, e.g. a
  rename into it) to the disk, so that a power cut keeps them; nothing on
  an object store, where an upload is durable once it returns."""
  for path in paths:
    if not is_local(path):
      continue
    descriptor = os.open(path.removeprefix('file://'), os.O_RDONLY)
    try:
      os.fsync(descriptor)
    finally:
      os.close(descriptor)


def write_bytes(path: str, data: bytes) -> None:
  """Writes a file (one upload on an object store)."""
  with _gfile().GFile(path, 'wb') as file:
    file.write(data)


def append_text(path: str, text: str) -> None:
  """Appends to a file (rewritten whole on an object store, which cannot
  append: keep such files small)."""
  if is_local(path):
    with open(path, 'a', encoding='utf-8') as file:
      file.write(text)
    return
  write_text(path, (read_text(path) or '') + text)


def rename_local_folder(source: str, destination: str) -> None:
  """Renames a local folder, atomically.

  Raises:
    OSError: destination exists (another writer's).
  """
  os.rename(source, destination)


def publish_folder(staging: str, final: str, marker: str) -> None:
  """Puts folder `staging` (local) at `final`, replacing what was there:
  readers check for file `marker` in it, which is written last.

  Locally a rename (atomic); on an object store the old folder's marker
  goes first, then the old folder, then the files, the marker last.
  """
  if is_local(final):
    # Named after its process: a kill's leftover is found by that name
    # (serving/export._remove_leftovers).
    old = f'{final}.old-{os.getpid()}-{socket.gethostname()}-replaced'
    try:
      if os.path.exists(final):
        os.replace(final, old)
      os.replace(staging, final)
    finally:
      shutil.rmtree(old, ignore_errors=True)
    return
  remove(join(final, marker))
  remove(final)
  for directory, _, files in _gfile().walk(staging):
    relative = os.path.relpath(directory, staging)
    target = final if relative == '.' else join(final, relative)
    makedirs(target)
    for name in files:
      if directory != staging or name != marker:
        copy(join(directory, name), join(target, name))
  copy(join(staging, marker), join(final, marker))
