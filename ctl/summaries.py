"""Where scalars go: TensorBoard event files on the chief, nowhere elsewhere.

Events are built in Python with TensorBoard's own writer (the format
tf.summary writes) and written to disk on its thread: a report costs the
training thread about 0.3 ms, where eager tf.summary.scalar calls cost it
about 3 ms (14% of a small MLP's time at one report per 100 steps,
BENCHMARKS.md).
"""

from collections.abc import Mapping
import time
from typing import Protocol

from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.summary.writer import event_file_writer


class MetricWriter(Protocol):
  """Writes scalar summaries."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    ...

  def close(self) -> None:
    """Returns once everything written so far is on disk."""
    ...


class TensorBoardWriter:
  """Writes scalars as TensorBoard events under logdir."""

  def __init__(self, logdir: str, flush_secs: float = 10):
    self._writer = event_file_writer.EventFileWriter(logdir,
                                                     flush_secs=flush_secs)

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    values = [value for name, number in scalars.items()
              for value in scalar_summary.scalar_pb(name, number).value]
    self._writer.add_event(event_pb2.Event(
        wall_time=time.time(), step=step,
        summary=summary_pb2.Summary(value=values)))

  def close(self) -> None:
    self._writer.close()


class NullWriter:
  """Writes nothing: the writer of every worker but the chief."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    del step, scalars

  def close(self) -> None:
    pass


def make_writer(logdir: str, is_chief: bool) -> MetricWriter:
  """A TensorBoard writer for the chief, a NullWriter for other workers."""
  return TensorBoardWriter(logdir) if is_chief else NullWriter()
