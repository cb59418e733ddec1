"""The files of a workdir, written only by the chief.

    workdir/config.json        the resolved config (config.<time>.json: earlier ones)
    workdir/checkpoints/       tf.train.CheckpointManager's ckpt-<step> files
    workdir/checkpoints/data/pipeline-<i>-of-<n>/   each worker's data position, per step
    workdir/train/, eval/      TensorBoard events; eval/results.json: the
                               side-car's or --mode=evaluate's last results
    workdir/results.json       final metrics, written when training finishes
    workdir/best/              the best checkpoint and best.json (training/best.py)
    workdir/export/            SavedModel and .keras files (serving/export.py)
"""

import json
import os
import time

from absl import logging
import ml_collections

from ctl import config as config_lib
from ctl import errors

CONFIG_FILE = 'config.json'
RESULTS_FILE = 'results.json'


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, 'checkpoints')


def data_position_dir(workdir: str) -> str:
  return os.path.join(checkpoint_dir(workdir), 'data')


def summary_dir(workdir: str, phase: str) -> str:
  return os.path.join(workdir, phase)


def results_path(workdir: str) -> str:
  return os.path.join(workdir, RESULTS_FILE)


def prepare(workdir: str) -> None:
  """Creates the workdir, or fails with a clear message if it cannot be written."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f'.write-test-{os.getpid()}')
    with open(probe, 'w') as file:
      file.write('ok')
    os.remove(probe)
  except OSError as error:
    raise errors.CtlError(
        f'Cannot write to workdir {workdir}: {error}. Pass a --workdir this '
        'user can write to.') from error


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Saves the config as JSON; keeps an earlier, different one beside it."""
  path = os.path.join(workdir, CONFIG_FILE)
  new = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    with open(path) as file:
      old = json.load(file)
    changes = config_lib.differences(old, new)
    if not changes:
      return
    kept = os.path.join(workdir, f'config.{time.strftime("%Y%m%d-%H%M%S")}.json')
    os.replace(path, kept)
    logging.warning('The config differs from the one this workdir was started '
                    'with (kept as %s):\n  %s', kept, '\n  '.join(changes))
  write_json(path, new)


def read_results(workdir: str) -> dict | None:
  """Returns results.json's content, or None if training has not finished."""
  return read_json(results_path(workdir))


def read_json(path: str) -> dict | None:
  """A JSON file's content, or None when it does not exist."""
  try:
    with open(path) as file:
      return json.load(file)
  except (FileNotFoundError, NotADirectoryError):
    return None


def write_json(path: str, content: dict) -> None:
  """Writes JSON atomically: readers see the old file or the whole new one."""
  temporary = f'{path}.tmp-{os.getpid()}'
  with open(temporary, 'w') as file:
    json.dump(content, file, indent=2, sort_keys=True)
    file.write('\n')
  os.replace(temporary, path)
