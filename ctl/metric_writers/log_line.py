"""The log line: a report's or an evaluation's numbers as one line of the
log, on every worker.

    step 44/88 epoch 1/2 (step 44 of 44) | loss 0.3141 ... | ETA 0:00:02
    eval at step 44: accuracy 0.9667 loss 0.1304

On an interactive terminal the training's lines within an epoch rewrite
one live line; epoch ends and the end scroll. When stderr is a terminal,
`install()` (by ctl/main.py) wraps the log handler's stream: the live line
is rewritten in place (`LiveLineStream.show`), every other log line is
printed above it and the live line redrawn below. Files and pipes keep one
log line per report.
"""

from collections.abc import Callable, Mapping
import datetime
import math
from typing import Any, TextIO

from absl import logging
import numpy as np

from ctl import metric_writers


class LogLineWriter(metric_writers.MetricWriter):
  """Writes each step's numbers as one log line.

  Args:
    line: the line, from the step and its numbers as 'name value' pairs.
    live: whether the line of a step may be shown on the live line of a
      terminal (then the lines not shown there replace it); None: the
      lines never touch the live line.
  """

  def __init__(self, line: Callable[[int, str], str],
               live: Callable[[int], bool] | None = None):
    self._line = line
    self._live = live
    self._shown = None  # The line on the live line, not logged yet.

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    line = self._line(step, format_scalars(scalars))
    stream = live_stream() if self._live else None
    if stream and self._live(step):
      stream.show(line)  # On a terminal; epoch ends and the end scroll.
      self._shown = line
      return
    if stream:
      stream.show('')
    self._shown = None
    logging.info('%s', line)

  def flush(self) -> None:
    """The line on the live line, logged for good (at the end)."""
    stream = live_stream()
    if self._shown is not None and stream:
      stream.show('')
      logging.info('%s', self._shown)
    self._shown = None


def train_line(length, eta_seconds: Callable[[int], float | None]
               ) -> LogLineWriter:
  """The training's log line: where in the run, the numbers, the ETA.

  Args:
    length: the run's state.TrainingLength.
    eta_seconds: the seconds left after a step (None: not known yet).
  """

  def line(step: int, numbers: str) -> str:
    # Counted from 1: "epoch 1, step 22 of 22" is the end of the first epoch.
    epoch = -(-step // length.steps_per_epoch)
    step_in_epoch = step - (epoch - 1) * length.steps_per_epoch
    return 'step %d/%d epoch %d/%d (step %d of %d) | %s | ETA %s' % (
        step, length.total_steps, epoch, length.num_epochs, step_in_epoch,
        length.steps_per_epoch, numbers, eta_text(eta_seconds(step)))

  def live(step: int) -> bool:
    return (step % length.steps_per_epoch != 0 and
            step < length.total_steps)

  return LogLineWriter(line, live)


def eval_line(set_name: str) -> LogLineWriter:
  """An eval set's log line ('eval <set> at step N: ...')."""
  heading = f'eval{f" {set_name}" if set_name else ""}'
  return LogLineWriter(lambda step, numbers: (
      f'{heading} at step {step}: {numbers}'))


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


def eta_text(seconds: float | None) -> str:
  """The time left as H:MM:SS (or 'N days, H:MM:SS'); '?' when unknown, and
  a bound past what a timedelta holds (a run of billions of years)."""
  if seconds is None:
    return '?'
  if not seconds < _LONGEST_ETA.total_seconds():  # Also inf and nan.
    return f'over {_LONGEST_ETA.days} days'
  return str(datetime.timedelta(seconds=round(max(seconds, 0))))


_LONGEST_ETA = datetime.timedelta(days=999_999_999)


# Erases the line the cursor is on, from its start.
_CLEAR = '\r\x1b[K'


class LiveLineStream:
  """A terminal stream with one line kept at its bottom."""

  def __init__(self, stream: TextIO):
    self._stream = stream
    self._line = ''

  def write(self, text: str) -> int:
    if self._line:
      self._stream.write(_CLEAR)
    written = self._stream.write(text)
    if self._line and text.endswith('\n'):
      self._stream.write(self._line)
    return written

  def flush(self) -> None:
    self._stream.flush()

  def show(self, line: str) -> None:
    """Replaces the live line with `line` (cut to one line)."""
    self._line = line.splitlines()[0] if line else ''
    self._stream.write(_CLEAR + self._line)
    self._stream.flush()

  def end(self) -> None:
    """Leaves the live line as it is and moves below it."""
    if self._line:
      self._line = ''
      self._stream.write('\n')
      self._stream.flush()

  def __getattr__(self, name):  # isatty, fileno, encoding...
    return getattr(self._stream, name)


def install() -> None:
  """Makes absl's log handler write through a LiveLineStream when it
  writes to a terminal; nothing otherwise."""
  handler = logging.get_absl_handler().python_handler
  stream = handler.stream
  if isinstance(stream, LiveLineStream) or not _is_terminal(stream):
    return
  handler.stream = LiveLineStream(stream)


def live_stream() -> LiveLineStream | None:
  """The installed LiveLineStream, or None (not a terminal)."""
  stream = logging.get_absl_handler().python_handler.stream
  return stream if isinstance(stream, LiveLineStream) else None


def finish_line() -> None:
  """Moves below the live line, if there is one (before exiting)."""
  stream = live_stream()
  if stream is not None:
    stream.end()


def _is_terminal(stream) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False


