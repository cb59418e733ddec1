"""Checks that optuna-dashboard shows a search's study as the study holds it.

    pip install optuna-dashboard        # and a Chromium: apt-get install chromium
    python experiments/dashboard_check.py /tmp/sweeps/digits_search
    python experiments/dashboard_check.py /shared/sweeps/digits_search \
        --storage=postgresql://ctl@dbhost:5432/ctl_sweeps

Starts optuna-dashboard (the one on PATH, which may belong to another
Python environment, else the one beside this Python) on a free local port,
on the sweep's storage (its `study.journal`, or --storage), renders the
study's trial list in headless Chromium, and checks each trial of the study
appears there with its state (`Trial 3 Pruned`). Prints one line per trial
and exits 0, or 1 with one line naming what the page lacks or what is
missing to look. Every wait is bounded.
"""

import argparse
import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

try:
  from ctl import errors
  from ctl.runtime import tf_process
except ImportError as import_error:
  sys.exit(f'{import_error}: run this with the Python where ctl is '
           'installed; optuna-dashboard may be in another environment.')

# TensorFlow, which ctl.storage imports, prints its start-up lines whatever
# TF_CPP_MIN_LOG_LEVEL says: imported first, without them.
tf_process.import_tensorflow()

from ctl.runtime import studies  # pylint: disable=g-import-not-at-top,wrong-import-position

_START_SECONDS = 180  # optuna-dashboard's start on a loaded machine.
_RENDER_MS = 20000  # Chromium's virtual time for the page's scripts.


def _dashboard_command() -> str:
  """The optuna-dashboard to run: on PATH (any environment's: it only
  reads the storage), else beside this Python (a venv not activated)."""
  beside = os.path.join(os.path.dirname(sys.executable), 'optuna-dashboard')
  found = shutil.which('optuna-dashboard') or shutil.which(beside)
  if not found:
    sys.exit('No optuna-dashboard on PATH or beside this Python: pip install '
             'optuna-dashboard (in any environment), or put it on PATH.')
  return found


def _dashboard(command: str, storage: str, port: int) -> subprocess.Popen:
  """optuna-dashboard serving storage on 127.0.0.1:port."""
  arguments = [command, '--port', str(port), '--host', '127.0.0.1']
  if '://' not in storage:
    arguments += ['--storage-class', 'JournalFileStorage']
  try:
    return subprocess.Popen([*arguments, storage], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
  except OSError as error:
    sys.exit(f'Cannot start {command}: {error.strerror}')


def _load_trials(storage: str, name: str) -> list:
  """The study's trials, read without writing to its storage."""
  if '://' not in storage and not os.path.isfile(storage):
    sys.exit(f'No study journal {storage}: give the sweep\'s --workdir (and '
             'its --storage, if it had one).')
  try:
    optuna = studies.import_optuna()
    study_storage = studies.open_storage(storage)
  except errors.CtlError as error:
    sys.exit(str(error))
  try:
    return optuna.load_study(study_name=name, storage=study_storage).trials
  except KeyError:
    names = [summary.study_name
             for summary in optuna.get_all_study_summaries(study_storage)]
    sys.exit(f'No study {name!r} in {studies.shown(storage)} (it has '
             f'{names}): give the sweep\'s --study, if it had one.')


def _free_port() -> int:
  """A local port nothing listens on (portpicker is for ctl's tests only)."""
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


def _study_id(port: int, name: str, server: subprocess.Popen) -> int:
  """The dashboard's id of the study named name, once it answers."""
  deadline = time.monotonic() + _START_SECONDS
  while True:
    if server.poll() is not None:
      sys.exit(f'optuna-dashboard exited with code {server.returncode}')
    try:
      with urllib.request.urlopen(
          f'http://127.0.0.1:{port}/api/studies', timeout=5) as answer:
        summaries = json.load(answer)['study_summaries']
      break
    except OSError:
      if time.monotonic() > deadline:
        sys.exit(f'optuna-dashboard did not answer in {_START_SECONDS} s')
      time.sleep(0.5)
  for summary in summaries:
    if summary['study_name'] == name:
      return summary['study_id']
  sys.exit(f'optuna-dashboard lists no study {name!r}: '
           f'{[s["study_name"] for s in summaries]}')


def _page_text(url: str) -> str:
  """The page's text as headless Chromium renders it."""
  chromium = shutil.which('chromium') or shutil.which('chromium-browser')
  if not chromium:
    sys.exit('No Chromium found: apt-get install chromium')
  try:
    dom = subprocess.run(
        [chromium, '--headless', '--no-sandbox', '--disable-gpu',
         f'--virtual-time-budget={_RENDER_MS}', '--dump-dom', url],
        capture_output=True, text=True, timeout=180, check=True).stdout
  except subprocess.SubprocessError as error:  # Failed, or timed out.
    sys.exit(f'{chromium} did not render {url}: {error}')
  dom = re.sub(r'<style[^<]*</style>', ' ', dom)
  return re.sub(r'\s+', ' ', html.unescape(re.sub(r'<[^>]+>', ' ', dom)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('workdir', help="the sweep's --workdir")
  parser.add_argument('--storage', default='',
                      help="the sweep's --storage, if it had one")
  parser.add_argument('--study', default='',
                      help="the sweep's --study, if it had one")
  args = parser.parse_args()
  try:
    # Imported here: it imports Optuna, which may be missing (a ConfigError).
    from ctl.sweep import study as study_lib  # pylint: disable=g-import-not-at-top
    storage = study_lib.storage_url(args.storage, args.workdir)
  except errors.CtlError as error:
    sys.exit(str(error))
  name = args.study or os.path.basename(os.path.normpath(args.workdir))
  trials = _load_trials(storage, name)
  command = _dashboard_command()
  port = _free_port()
  server = _dashboard(command, storage, port)
  try:
    study_id = _study_id(port, name, server)
    text = _page_text(f'http://127.0.0.1:{port}/dashboard/studies/'
                      f'{study_id}/trials')
  finally:
    server.terminate()
    try:
      server.wait(timeout=30)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait()
  missing = []
  for trial in trials:
    shown = f'Trial {trial.number} {trial.state.name.capitalize()}'
    print(('shown:   ' if shown in text else 'MISSING: ') + shown)
    if shown not in text:
      missing.append(shown)
  if missing or not trials:
    sys.exit(f'optuna-dashboard does not show {missing or "any trial"}')
  print(f'optuna-dashboard shows the {len(trials)} trials of study {name!r}.')


if __name__ == '__main__':
  main()
