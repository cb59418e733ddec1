"""The values queued for MLflow, in workdir/mlflow_pending.jsonl until sent.

The loop adds a step's values here (a local append: training never waits on
the server); the MLflow writer's sender thread (mlflow_writer.py) sends the
oldest and removes what MLflow acknowledged. What a killed run left is read
back by the next run in the workdir, which sends it first.
"""

from collections.abc import Mapping
import json
import threading
import time

from absl import logging

from ctl import storage

MAX_PENDING = 100_000  # Values kept while the server is unreachable.


class PendingValues:
  """The values queued for MLflow that it has not acknowledged yet: in
  memory, and in workdir/mlflow_pending.jsonl (a value a line), so that
  those of a killed run are sent by the next one. Shared by the loop,
  which adds, and the sender thread, which removes what MLflow took.

  Each value is (key, value, timestamp in ms, step): sent again as it was
  first sent, which MLflow's SQL store keeps once.
  """

  def __init__(self, path: str):
    self._path = path
    self._lock = threading.Lock()
    self._entries = _read_pending(path)
    self._dropped = 0  # Oldest values dropped over MAX_PENDING.
    # {metric: the last step queued}, by this process and those before it.
    self._queued = {}
    self._note_queued(self._entries)

  def add(self, step: int, values: Mapping[str, float]) -> None:
    """Queues the values of a step not queued before (a resumed run
    computes again the steps after its checkpoint)."""
    now = int(time.time() * 1000)
    with self._lock:
      new = [(key, float(value), now, step) for key, value in values.items()
             if step > self._queued.get(key, -1)]
      self._note_queued(new)
      self._entries += new
      if len(self._entries) > MAX_PENDING:
        self._dropped += len(self._entries) - MAX_PENDING
        del self._entries[:-MAX_PENDING]
        self._write()
      elif new:
        storage.append_text(self._path, ''.join(map(_line, new)))

  def head(self, count: int) -> list[tuple]:
    """The oldest `count` values, in the order they were queued."""
    with self._lock:
      return self._entries[:count]

  def remove(self, taken: list[tuple]) -> None:
    """Forgets values MLflow acknowledged."""
    taken = set(taken)
    with self._lock:
      self._entries = [entry for entry in self._entries
                       if entry not in taken]
      self._write()

  def drop_logged(self, logged: Mapping[str, int]) -> None:
    """Forgets values of steps MLflow has ({metric: its last step}), and
    queues no more of them."""
    with self._lock:
      kept = [entry for entry in self._entries
              if entry[3] > logged.get(entry[0], -1)]
      for key, step in logged.items():
        self._queued[key] = max(step, self._queued.get(key, -1))
      if len(kept) != len(self._entries):
        self._entries = kept
        self._write()

  def __len__(self) -> int:
    """How many values wait to be sent."""
    with self._lock:
      return len(self._entries)

  def take_dropped(self) -> int:
    """How many values were dropped over the bound since the last call."""
    with self._lock:
      dropped, self._dropped = self._dropped, 0
      return dropped

  def _note_queued(self, entries) -> None:
    """Records the last step queued of each metric among entries."""
    for key, _, _, step in entries:
      self._queued[key] = max(step, self._queued.get(key, -1))

  def _write(self) -> None:
    """The file as the entries are (none: no file); under the lock."""
    if self._entries:
      storage.write_text(self._path, ''.join(map(_line, self._entries)))
    elif storage.exists(self._path):
      storage.remove(self._path)


def _line(entry: tuple) -> str:
  """A value as a line of the pending file."""
  key, value, timestamp, step = entry
  return json.dumps({'key': key, 'value': value, 'timestamp': timestamp,
                     'step': step}) + '\n'


def _read_pending(path: str) -> list[tuple]:
  """The values a run before this one left unsent; a line cut by a kill
  (the last) is skipped."""
  entries = []
  for line in (storage.read_text(path) or '').splitlines():
    try:
      item = json.loads(line)
      entries.append((item['key'], float(item['value']),
                      int(item['timestamp']), int(item['step'])))
    except (ValueError, KeyError, TypeError):
      continue
  if entries:
    logging.info('MLflow: %d values a run before this one did not send are '
                 'sent first (%s).', len(entries), path)
  return entries
