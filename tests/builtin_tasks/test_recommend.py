"""The recommendation example (experiments/recommend.py): its interactions
are the same each time and carry a signal; `:smoke` trains well past
chance, stops on SIGTERM and resumes, and its export serves clicks'
probabilities in a process that never imports ctl.
"""

import sys, pathlib  # pylint: disable=g-multiple-import
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import json
import re
import subprocess

import numpy as np
import pytest

import helpers

CONFIG = '--config=configs/recommend.py:smoke'


@pytest.fixture
def recommend(monkeypatch):
  """experiments.recommend, imported as ctl.main finds it."""
  monkeypatch.syspath_prepend(str(helpers.REPO))
  from experiments import recommend  # pylint: disable=g-import-not-at-top
  return recommend


def test_interactions_are_the_same_each_time_and_half_are_clicks(recommend):
  data = helpers.load_config('recommend', 'smoke').data
  ids, clicks = recommend.make_interactions(data, 5000, seed=7)
  again, clicks_again = recommend.make_interactions(data, 5000, seed=7)
  assert all((ids[key] == again[key]).all() for key in ('user', 'item'))
  assert (clicks == clicks_again).all()
  assert ids['user'].max() < data.num_users
  assert ids['item'].max() < data.num_items
  assert 0.3 < clicks.mean() < 0.7


@pytest.mark.slow
def test_smoke_trains_resumes_and_its_export_serves_without_ctl(
    tmp_path, recommend):
  total_steps = 156  # 2 epochs of 20,000 interactions in batches of 256.

  def start(attempt):
    return helpers.Watched(helpers.ctl_command(
        CONFIG, f'--workdir={tmp_path / str(attempt)}'))

  job, code, attempt = helpers.sigterm_after(start, 'First step done',
                                             total_steps)
  assert code == 42, job.output[-3000:]
  workdir = tmp_path / str(attempt)
  saved = helpers.latest_checkpoint_step(workdir)
  assert 0 < saved < total_steps
  run = helpers.run_ctl(CONFIG, f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  assert re.search(rf'Training from step {saved} to {total_steps}\b',
                   run.stderr), run.stderr[-3000:]
  results = helpers.read_results(workdir)
  assert results['step'] == total_steps
  # A guess scores AUC 0.5 and accuracy about 0.5.
  assert results['eval']['auc'] > 0.75
  assert results['eval']['accuracy'] > 0.65

  data = helpers.load_config('recommend', 'smoke').data
  ids, clicks = recommend.make_interactions(data, data.num_eval,
                                            recommend._EVAL_SEED)  # pylint: disable=protected-access
  np.savez(tmp_path / 'pairs.npz', **ids)
  served = subprocess.run(
      [sys.executable, '-c', helpers.SERVE_RECOMMEND,
       str(workdir / 'export' / 'saved_model'), str(tmp_path / 'pairs.npz')],
      cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert served.returncode == 0, served.stderr[-3000:]
  probability = np.array(json.loads(served.stdout))
  best = json.loads((workdir / 'best' / 'best.json').read_text())
  accuracy = np.mean((probability > 0.5) == (clicks[:, 0] > 0.5))
  assert accuracy == pytest.approx(best['eval']['accuracy'], abs=0.01)
