"""A live progress line on an interactive terminal.

When stderr is a terminal, `install()` wraps the log handler's stream: the
training log's progress reports rewrite one line in place (`show`), and
every other log line is printed above it, the progress line redrawn
below. Files and pipes keep one log line per report.
"""

from typing import TextIO

from absl import logging

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


