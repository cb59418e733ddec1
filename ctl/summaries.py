"""Where scalars go: TensorBoard event files on the chief, nowhere elsewhere."""

from collections.abc import Mapping
from typing import Protocol

import tensorflow as tf


class MetricWriter(Protocol):
  """Writes scalar summaries."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    ...

  def flush(self) -> None:
    ...


class TensorBoardWriter:
  """Writes scalars as TensorBoard events under logdir."""

  def __init__(self, logdir: str):
    self._writer = tf.summary.create_file_writer(logdir)

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    with self._writer.as_default(step=step):
      for name, value in scalars.items():
        tf.summary.scalar(name, value)

  def flush(self) -> None:
    self._writer.flush()


class NullWriter:
  """Writes nothing: the writer of every worker but the chief."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    del step, scalars

  def flush(self) -> None:
    pass


def make_writer(logdir: str, is_chief: bool) -> MetricWriter:
  """A TensorBoard writer for the chief, a NullWriter for other workers."""
  return TensorBoardWriter(logdir) if is_chief else NullWriter()
