"""Where results go: TensorBoard event files on the chief, nowhere elsewhere.

Events are built in Python (the protos tf.summary writes) and written by
tf.io.TFRecordWriter, flushed at each report: a report of 3 scalars costs
the training thread about 0.2 ms between loops, where eager
tf.summary.scalar calls cost it about 3 ms (BENCHMARKS.md). A task's own
`tf.summary` calls inside its step go through `step_summary_writer`, the
chief's alone.
"""

from collections.abc import Mapping
import dataclasses
import itertools
import math
import os
import socket
import time
from typing import Any, Protocol

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.histogram import summary_v2 as histogram_summary
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import encoder
from tensorboard.util import tensor_util
import tensorflow as tf

from ctl import storage


@dataclasses.dataclass(frozen=True)
class Image:
  """A result shown as an image: [height, width, channels] or a batch of
  them, uint8 or float in [0, 1]."""

  pixels: np.ndarray


@dataclasses.dataclass(frozen=True)
class Histogram:
  """A result shown as a histogram of these values."""

  values: np.ndarray


class MetricWriter(Protocol):
  """Writes results: scalars, and images or histograms of eval passes."""

  def write(self, step: int, results: Mapping[str, Any]) -> None:
    ...

  def close(self) -> None:
    """Returns once everything written so far is on disk."""
    ...


class TensorBoardWriter:
  """Writes results as TensorBoard events under logdir, on disk at once.

  Numbers become scalars, Image images, Histogram histograms; arrays are
  skipped (they are eval outputs for eval_end to reduce).

  An event file is a TFRecord file of `Event`s, written here by
  tf.io.TFRecordWriter: its checksums are computed in C++. TensorBoard's
  own EventFileWriter computes them in Python on a thread of its own,
  which held the GIL for about 0.5 ms a report while the training thread
  waited.
  """

  _files = itertools.count()  # Keeps this process's file names apart.

  def __init__(self, logdir: str):
    storage.makedirs(logdir)
    self._records = tf.io.TFRecordWriter(os.path.join(
        logdir, f'events.out.tfevents.{int(time.time()):010d}.'
        f'{socket.gethostname()}.{os.getpid()}.{next(self._files)}'))
    self._add(event_pb2.Event(wall_time=time.time(),
                              file_version='brain.Event:2'))

  def write(self, step: int, results: Mapping[str, Any]) -> None:
    values = []
    for name, result in results.items():
      values.extend(_summary_values(name, result))
    if values:
      self._add(event_pb2.Event(wall_time=time.time(), step=step,
                                summary=summary_pb2.Summary(value=values)))

  def close(self) -> None:
    self._records.close()

  def _add(self, event: event_pb2.Event) -> None:
    self._records.write(event.SerializeToString())
    self._records.flush()  # TensorBoard shows it now; a kill loses nothing.


class NullWriter:
  """Writes nothing: the writer of every worker but the chief."""

  def write(self, step: int, results: Mapping[str, Any]) -> None:
    del step, results

  def close(self) -> None:
    pass


def json_ready(results):
  """Results with images, histograms and arrays left out, for JSON."""
  if isinstance(results, dict):
    return {key: json_ready(value) for key, value in results.items()
            if not isinstance(value, (Image, Histogram, np.ndarray))}
  return results


def make_writer(logdir: str, is_chief: bool) -> MetricWriter:
  """A TensorBoard writer for the chief, a NullWriter for other workers."""
  return TensorBoardWriter(logdir) if is_chief else NullWriter()


def step_summary_writer(logdir: str, is_chief: bool) -> tf.summary.SummaryWriter:
  """The default writer for tf.summary calls in a task's step: the chief's
  events go to logdir, other workers' nowhere."""
  if is_chief:
    return tf.summary.create_file_writer(logdir)
  return tf.summary.create_noop_writer()


def _summary_values(name: str, result: Any) -> list:
  if isinstance(result, Image):
    pixels = np.asarray(result.pixels)
    if pixels.ndim == 3:
      pixels = pixels[None]
    if pixels.dtype != np.uint8:
      pixels = (np.clip(pixels, 0, 1) * 255).astype(np.uint8)
    # TensorBoard's image format: [width, height, PNG, PNG, ...] as strings.
    height, width = pixels.shape[1:3]
    encoded = [str(width).encode(), str(height).encode(),
               *(encoder.encode_png(image) for image in pixels)]
    return [summary_pb2.Summary.Value(
        tag=name, metadata=image_metadata.create_summary_metadata(
            display_name=name, description=''),
        tensor=tensor_util.make_tensor_proto(encoded))]
  if isinstance(result, Histogram):
    return list(histogram_summary.histogram_pb(
        name, np.asarray(result.values, np.float64)).value)
  if np.ndim(result) == 0:
    return [_scalar_value(name, float(result))]
  return []


# What TensorBoard's scalar_pb writes, built directly: that took 20
# microseconds a scalar, through generic tensor conversion.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(
        plugin_name=scalar_metadata.PLUGIN_NAME))
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()


def _scalar_value(name: str, value: float) -> summary_pb2.Summary.Value:
  return summary_pb2.Summary.Value(
      tag=name, metadata=_SCALAR_METADATA, tensor=tensor_pb2.TensorProto(
          dtype=types_pb2.DT_FLOAT, tensor_shape=_SCALAR_SHAPE,
          float_val=[value]))


def format_scalars(results: Mapping[str, Any]) -> str:
  """'name value' pairs of the scalar results, for a log line."""
  return ' '.join(f'{name} {format_number(value)}'
                  for name, value in results.items()
                  if isinstance(value, (int, float, np.number)))


def format_number(value: float) -> str:
  """Four significant digits, never in scientific notation: 0.0001234, 18820."""
  value = float(value)
  if not math.isfinite(value):
    return str(value)
  return np.format_float_positional(value, precision=4, unique=False,
                                    fractional=False, trim='-')
