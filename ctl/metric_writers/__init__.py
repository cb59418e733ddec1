"""Metric writers: every place a run's values go, behind one interface.

    MetricWriter     write_scalars / write_images / write_histograms, flush,
                     close: subclass it and override what the sink takes
    MultiWriter      several writers as one
    NullWriter       writes nothing: what a worker other than the chief gets

The sinks, one class each: the log line (`log_line.LogLineWriter`, on every
worker), TensorBoard (`tensorboard.TensorBoardWriter`), metrics.csv
(`csv_file.CsvWriter`), MLflow (`mlflow_writer.MlflowWriter`), and a task's
own (`Task.metric_writers()`); `mlflow_run.py` keeps a workdir's MLflow
run. Which sinks a process gets is decided once, in
ctl/training/report.py: the chief gets them all, the other workers
only their log lines, so that no sink asks whether it runs on the chief.
(CLU's `clu/metric_writers` is the model: one interface, one writer per
back end, a writer per collection of values.)
"""

from collections.abc import Mapping, Sequence
import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Image:
  """A result shown as an image: [height, width, channels] or a batch of
  them, uint8 or float in [0, 1]."""

  pixels: np.ndarray


@dataclasses.dataclass(frozen=True)
class Histogram:
  """A result shown as a histogram of these values."""

  values: np.ndarray


class MetricWriter:
  """Where values go: a sink overrides what it takes; the rest is ignored.

  Values of one step are written together; a writer that is not closed (a
  run preempted or failed) must have lost nothing already written.
  """

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes numbers ({name: value}) of `step`."""
    del step, scalars

  def write_images(self, step: int, images: Mapping[str, Image]) -> None:
    """Writes images ({name: Image}) of `step`."""
    del step, images

  def write_histograms(self, step: int,
                       histograms: Mapping[str, Histogram]) -> None:
    """Writes histograms ({name: Histogram}) of `step`."""
    del step, histograms

  def flush(self) -> None:
    """Shows or stores for good everything written so far."""

  def close(self) -> None:
    """No more values come: flushes, and lets go of what it holds."""
    self.flush()


class NullWriter(MetricWriter):
  """Writes nothing: the sinks of a worker other than the chief."""


class MultiWriter(MetricWriter):
  """Writes to each of several writers, in their order."""

  def __init__(self, writers: Sequence[MetricWriter]):
    self.writers = tuple(writers)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for writer in self.writers:
      writer.write_scalars(step, scalars)

  def write_images(self, step: int, images: Mapping[str, Image]) -> None:
    for writer in self.writers:
      writer.write_images(step, images)

  def write_histograms(self, step: int,
                       histograms: Mapping[str, Histogram]) -> None:
    for writer in self.writers:
      writer.write_histograms(step, histograms)

  def flush(self) -> None:
    for writer in self.writers:
      writer.flush()

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


def write_results(writer: MetricWriter, step: int,
                  results: Mapping[str, Any]) -> None:
  """Writes an evaluation's results: numbers as scalars, Image and
  Histogram as such; arrays are left out (eval outputs eval_end reduced)."""
  images = {name: value for name, value in results.items()
            if isinstance(value, Image)}
  histograms = {name: value for name, value in results.items()
                if isinstance(value, Histogram)}
  scalars = {name: value for name, value in results.items()
             if name not in images and name not in histograms and
             np.ndim(value) == 0}
  if scalars:
    writer.write_scalars(step, scalars)
  if images:
    writer.write_images(step, images)
  if histograms:
    writer.write_histograms(step, histograms)


def json_ready(results):
  """Results with images, histograms and arrays left out, for JSON."""
  if isinstance(results, dict):
    return {key: json_ready(value) for key, value in results.items()
            if not isinstance(value, (Image, Histogram, np.ndarray))}
  return results
