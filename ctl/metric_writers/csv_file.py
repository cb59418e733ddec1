"""metrics.csv: every logged value as a `step,name,value` row.

    step,name,value
    100,train/loss,0.512
    100,eval/accuracy,0.93        (eval/<set>/<metric> for several sets)
    96,workers/1/input_wait_ms,12.5   (several workers: the chief's
                                        ctl/cluster/worker_timings.py)

`pandas.read_csv(path).pivot(index='step', columns='name')` gives a table.
"""

from collections.abc import Mapping
import csv
import io
from typing import Any

from absl import logging

from ctl import metric_writers
from ctl import storage


class CsvWriter(metric_writers.MetricWriter):
  """Appends each number written to a CSV file, one row each.

  Rows wait in memory until `flush()` (the action that writes them
  flushes after each report and evaluation: one append, one upload to an
  object store). Its row count is in every checkpoint (it is tracked as an action's state
  is, under `name`): a resumed run first drops the rows written after the
  checkpoint it resumes from, so that no step appears twice.
  """

  # Its state's key in the checkpoint, as ctl 0.2.0's CsvLogger saved it.
  name = 'CsvLogger'

  def __init__(self, path: str):
    self._path = path
    self._rows = 0  # Rows written (and checkpointed).
    self._trimmed = False
    self._unwritten = []  # Rows not appended yet.

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    self._unwritten += [(step, name, value) for name, value in scalars.items()
                        if isinstance(value, (int, float))]

  def flush(self) -> None:
    """Appends the rows written since the last flush, at once."""
    if not self._unwritten:
      return
    if not self._trimmed:
      self._trim()
    text = io.StringIO()
    csv.writer(text, lineterminator='\n').writerows(self._unwritten)
    storage.append_text(self._path, text.getvalue())
    self._rows += len(self._unwritten)
    self._unwritten = []

  def _trim(self) -> None:
    """Keeps the header and the rows of the checkpoint resumed from."""
    self._trimmed = True
    lines = []
    text = storage.read_text(self._path)
    if text is not None:
      lines = text.splitlines(keepends=True)[1:self._rows + 1]
    if len(lines) < self._rows:
      logging.warning('%s has %d rows, fewer than the %d its checkpoint '
                      'counted: keeping them.', self._path, len(lines),
                      self._rows)
      self._rows = len(lines)
    storage.write_text(self._path, 'step,name,value\n' + ''.join(lines))

  def state(self) -> dict[str, Any]:
    """Its row count, for the checkpoint."""
    return {'rows': self._rows}

  def restore(self, state: dict[str, Any]) -> None:
    """Takes back the row count of the checkpoint resumed."""
    self._rows = state['rows']
