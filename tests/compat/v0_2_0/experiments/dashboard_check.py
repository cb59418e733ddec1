"""Checks that optuna-dashboard shows a search's study as the study holds it.

    pip install optuna-dashboard        # and a Chromium: apt-get install chromium
    python experiments/dashboard_check.py /tmp/sweeps/digits_search
    python experiments/dashboard_check.py /shared/sweeps/digits_search \
        --storage=postgresql://ctl@dbhost:5432/ctl_sweeps

Starts optuna-dashboard on a free local port, on the sweep's storage (its
`study.journal`, or --storage), renders the study's trial list in headless
Chromium, and checks each trial of the study appears there with its state
(`Trial 3 Pruned`). Prints one line per trial and exits 0, or 1 naming what
the page lacks. Every wait is bounded.
"""

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import portpicker

from ctl.runtime import studies
from ctl.sweep import study as study_lib

_START_SECONDS = 180  # optuna-dashboard's start on a loaded machine.
_RENDER_MS = 20000  # Chromium's virtual time for the page's scripts.


def _dashboard(storage: str, port: int) -> subprocess.Popen:
  """optuna-dashboard serving storage on 127.0.0.1:port."""
  command = [os.path.join(os.path.dirname(sys.executable), 'optuna-dashboard'),
             '--port', str(port), '--host', '127.0.0.1']
  if '://' not in storage:
    command += ['--storage-class', 'JournalFileStorage']
  return subprocess.Popen([*command, storage], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)


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
  dom = subprocess.run(
      [chromium, '--headless', '--no-sandbox', '--disable-gpu',
       f'--virtual-time-budget={_RENDER_MS}', '--dump-dom', url],
      capture_output=True, text=True, timeout=180, check=True).stdout
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
  storage = study_lib.storage_url(args.storage, args.workdir)
  name = args.study or os.path.basename(os.path.normpath(args.workdir))
  optuna = studies.import_optuna()
  trials = optuna.load_study(
      study_name=name, storage=studies.open_storage(storage)).trials
  port = portpicker.pick_unused_port()
  server = _dashboard(storage, port)
  try:
    study_id = _study_id(port, name, server)
    text = _page_text(f'http://127.0.0.1:{port}/dashboard/studies/'
                      f'{study_id}/trials')
  finally:
    server.terminate()
    server.wait(timeout=30)
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
