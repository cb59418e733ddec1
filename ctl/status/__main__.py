"""`python -m ctl.status WORKDIR [--watch]`: a run's state at a glance
(ctl/status/__init__.py).

Exit codes: 0 when it could read the workdir, 2 when it holds no ctl run.
"""

import signal
import sys
import threading
import time

from absl import app
from absl import flags

from ctl import errors
from ctl import storage
from ctl.status import view

_WATCH = flags.DEFINE_bool('watch', False,
                           'Show the state again every --every seconds, '
                           'until Ctrl-C or SIGTERM.')
_EVERY = flags.DEFINE_float('every', 5.0, 'Seconds between two --watch '
                            'views.', lower_bound=0.5)


def main(argv: list[str]) -> None:
  """Shows the state of the workdir in argv (again and again with --watch)."""
  # A path that is not UTF-8 is shown with \x escapes, not raised on.
  for stream in (sys.stdout, sys.stderr):
    stream.reconfigure(errors='backslashreplace')
  if len(argv) != 2:
    _fail_usage('Pass one workdir: python -m ctl.status WORKDIR [--watch]')
  workdir = argv[1]
  if not storage.is_local(workdir):  # gs://: TensorFlow reads it.
    from ctl.runtime import tf_process  # pylint: disable=g-import-not-at-top
    with tf_process.quiet_start_up():
      import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
  stop = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stop.set())
  try:
    while True:
      try:
        shown = view.render(workdir)
      except errors.CtlError as error:
        _fail_usage(str(error))
      if _WATCH.value:
        print(f'\n{time.strftime("%H:%M:%S")}', flush=True)
      print(_printable(shown), flush=True)
      if not _WATCH.value or stop.wait(_EVERY.value):
        return
  except KeyboardInterrupt:
    return


def _printable(text: str) -> str:
  """Text whose undecodable bytes (a path's) read as \\x escapes."""
  try:
    return text.encode('utf-8', 'surrogateescape').decode(
        'utf-8', 'backslashreplace')
  except UnicodeEncodeError:  # Other lone surrogates (a file's JSON).
    return text  # The streams show them as escapes.


def _fail_usage(message: str) -> None:
  print(f'ctl: error: {_printable(message)}', file=sys.stderr, flush=True)
  sys.exit(errors.EXIT_USAGE)


if __name__ == '__main__':
  app.run(main)
