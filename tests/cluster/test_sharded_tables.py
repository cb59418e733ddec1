"""distribution.min_shard_bytes: embedding tables sharded over parameter
servers (experiments/recommend_sharded.py), trained by a chief, a worker
and 2 servers started by ctl.launch, stopped by SIGTERM and resumed, then
restored on one server and on one device, and exported to a SavedModel
that serves without ctl; a Keras table that would be sharded, and
sharding without servers, refused at start."""

import dataclasses
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from ctl import config as config_lib
from ctl import errors
from ctl.cluster import ps_cluster
import helpers

SHARDED = str(helpers.REPO / 'configs' / 'recommend_sharded.py') + ':smoke'
KERAS_TABLES = str(helpers.REPO / 'configs' / 'recommend.py') + ':smoke'
TOTAL_STEPS = 156  # 2 epochs of 20,000 interactions in batches of 256.


def _launch(workdir: pathlib.Path, *args: str, num_ps: int = 2,
            config: str = SHARDED) -> helpers.Watched:
  """ctl.launch of a chief, one worker and num_ps servers, a log line
  every 13 steps."""
  return helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=1',
      f'--num_ps={num_ps}', '--max_restarts=0', '--', f'--config={config}',
      f'--workdir={workdir}', '--config.intervals.log_steps=13', *args])


def _table(checkpoint: pathlib.Path, name: str) -> np.ndarray:
  """A table of the task in a checkpoint (saved whole, or as the slices of
  its shards: read back whole either way)."""
  [value] = [value for key, value in helpers.checkpoint_tensors(
      checkpoint).items() if key.startswith(f'task/{name}/')]
  return value


@dataclasses.dataclass
class Trained:
  """The sharded job: its first attempt (SIGTERMed) and the rerun."""

  workdir: pathlib.Path
  stopped: helpers.Watched
  stopped_code: int
  resumed: helpers.Watched
  resumed_code: int


@pytest.fixture(scope='module')
def trained(tmp_path_factory) -> Trained:
  """The tables sharded over 2 servers: SIGTERM to the chief after step
  26, then the same command again, to the end."""
  workdir = tmp_path_factory.mktemp('sharded') / 'job'
  stopped = _launch(workdir)
  chief = int(stopped.wait_for(r'started workers with pids \[(\d+)')[1])
  stopped.wait_for(rf'\[chief\] .*step 26/{TOTAL_STEPS}', timeout=300)
  os.kill(chief, signal.SIGTERM)
  stopped_code = stopped.wait()
  resumed = _launch(workdir)
  return Trained(workdir, stopped, stopped_code, resumed, resumed.wait())


@pytest.mark.slow
def test_tables_sharded_over_two_servers_train_stop_and_resume(trained):
  stopped, resumed = trained.stopped, trained.resumed
  assert trained.stopped_code == errors.EXIT_PREEMPTED, stopped.output[-3000:]
  assert trained.resumed_code == 0, resumed.output[-3000:]
  # Each table, and its Adagrad accumulator, 2,000 and 1,000 rows, half on
  # each server; the MLP's variables whole.
  for job in (stopped, resumed):
    shards = dict(re.findall(
        r'\[chief\] .*Sharded over the servers: RecommendSharded\.(\S+), '
        r'(.*)', job.output))
    assert sorted(shards) == [
        'item_table', 'table_optimizer.accumulators[0]',
        'table_optimizer.accumulators[1]', 'user_table'], job.output[-3000:]
    for name, rows in (('user_table', 1000), ('item_table', 500)):
      assert sorted(re.findall(r'(\d+) rows on (ps:\d)', shards[name])) == [
          (str(rows), 'ps:0'), (str(rows), 'ps:1')], shards[name]
  # The same command resumed from the step SIGTERM saved.
  [saved] = re.findall(rf'Stopped by SIGTERM after step (\d+) of '
                       rf'{TOTAL_STEPS}', stopped.output)
  assert 26 <= int(saved) < TOTAL_STEPS
  assert (f'Training from step {saved} to {TOTAL_STEPS}' in
          resumed.output), resumed.output[-3000:]
  assert helpers.latest_checkpoint_step(trained.workdir) == TOTAL_STEPS
  results = helpers.read_results(trained.workdir)
  assert results['step'] == TOTAL_STEPS
  # A guess scores AUC 0.5 and accuracy about 0.5.
  assert results['eval']['auc'] > 0.75, results
  assert results['eval']['accuracy'] > 0.65, results


@pytest.mark.slow
@pytest.mark.parametrize('where', ['one_server', 'one_device'])
def test_the_sharded_checkpoint_resumes_on_one_server_or_one_device(
    trained, tmp_path, monkeypatch, caplog, where):
  # 4 steps more: the rows those steps did not read come back bit for bit
  # (about 60% of the users), whatever holds the table now.
  workdir = tmp_path / 'job'
  shutil.copytree(trained.workdir, workdir)
  if where == 'one_server':
    job = _launch(workdir, f'--config.total_steps={TOTAL_STEPS + 4}',
                  '--config.export.at_end=False', num_ps=1)
    code, output = job.wait(), job.output
  else:  # This process's one device (a TensorFlow start saved).
    monkeypatch.syspath_prepend(str(helpers.REPO))  # As ctl.main finds it.
    from ctl.training import run as run_lib  # pylint: disable=g-import-not-at-top
    config = helpers.override(
        helpers.load_config_file(*SHARDED.split(':')), **{
            'total_steps': TOTAL_STEPS + 4, 'export.at_end': False,
            'distribution.min_shard_bytes': 0})
    caplog.clear()
    # On absl's logger: a run in this process may leave it at WARNING.
    with caplog.at_level(logging.INFO, logger='absl'):
      run_lib.train_and_evaluate(config, str(workdir))
    code, output = 0, caplog.text
  assert code == 0, output[-3000:]
  assert f'Training from step {TOTAL_STEPS} to {TOTAL_STEPS + 4}' in output
  assert 'Sharded over the servers' not in output  # Whole on one.
  checkpoints = workdir / 'checkpoints'
  before = _table(checkpoints / f'ckpt-{TOTAL_STEPS}', 'user_table')
  after = _table(checkpoints / f'ckpt-{TOTAL_STEPS + 4}', 'user_table')
  assert before.shape == after.shape == (2000, 16)
  same_rows = np.mean(np.all(before == after, axis=1))
  assert 0.4 < same_rows < 1.0, same_rows
  assert helpers.read_results(workdir)['eval']['auc'] > 0.75


@pytest.mark.slow
def test_the_export_serves_the_trained_tables_without_ctl(
    trained, tmp_path, monkeypatch):
  assert trained.resumed_code == 0, trained.resumed.output[-3000:]
  monkeypatch.syspath_prepend(str(helpers.REPO))  # As ctl.main finds it.
  import ctl  # pylint: disable=g-import-not-at-top
  from experiments import recommend  # pylint: disable=g-import-not-at-top
  exported = json.loads(
      (trained.workdir / 'export' / 'export.json').read_text())
  # The exported checkpoint, restored on this process's one device: the
  # tables as the servers held them.
  run = ctl.load(str(trained.workdir), exported['checkpoint'])
  np.testing.assert_array_equal(
      run.task.user_table.numpy(),
      _table(pathlib.Path(exported['checkpoint']), 'user_table'))
  data = helpers.load_config('recommend', 'smoke').data
  ids, _ = recommend.make_interactions(data, 1000, seed=9)
  expected = run.serve(ids['user'], ids['item'])['probability'].numpy()
  np.savez(tmp_path / 'pairs.npz', **ids)
  served = subprocess.run(
      [sys.executable, '-c', helpers.SERVE_RECOMMEND,
       str(trained.workdir / 'export' / 'saved_model'),
       str(tmp_path / 'pairs.npz')],
      cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert served.returncode == 0, served.stderr[-3000:]
  probability = np.array(json.loads(served.stdout))
  np.testing.assert_allclose(probability, expected, atol=1e-6)
  assert 0.05 < probability.mean() < 0.95  # Not one constant.


@pytest.mark.slow
def test_keras_tables_that_would_be_sharded_are_refused_at_start(tmp_path):
  # Keras 3 fails on a sharded variable at the first gradient (an
  # AttributeError deep in the step); ctl names it right after build.
  workdir = tmp_path / 'job'
  job = _launch(workdir, '--config.distribution.min_shard_bytes=32768',
                config=KERAS_TABLES)
  assert job.wait() == errors.EXIT_USAGE, job.output[-3000:]
  [line] = [line for line in job.output.splitlines()
            if line.startswith('[chief] ctl: error:')]
  assert 'sharded the Keras variable(s) ' in line, line
  assert 'Recommend.model (user_embedding/embeddings) (2 shards)' in line
  assert 'experiments/recommend_sharded.py' in line
  assert not (workdir / 'checkpoints').exists()
  assert not (workdir / 'config.json').exists()


def test_sharding_without_parameter_servers_is_refused_at_start(tmp_path):
  run = helpers.run_ctl(f'--config={SHARDED}', f'--workdir={tmp_path / "w"}')
  assert run.returncode == errors.EXIT_USAGE, run.stderr[-3000:]
  assert run.stderr.strip().splitlines()[-1].startswith(
      'ctl: error: distribution.min_shard_bytes=32768 shards variables over '
      "parameter servers, and this run has none (distribution.strategy="
      "'auto')"), run.stderr[-3000:]
  assert not (tmp_path / 'w').exists()


def test_a_negative_min_shard_bytes_is_refused():
  config = helpers.load_config_file(SHARDED.split(':')[0])
  config.distribution.min_shard_bytes = -1
  with pytest.raises(errors.ConfigError, match='must not be negative'):
    config_lib.validate(config)


def test_variables_are_split_by_size_at_most_one_shard_a_server():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  config = helpers.load_config_file(SHARDED.split(':')[0]).distribution
  partition = ps_cluster.partitioner(config, num_servers=2)
  assert partition(tf.TensorShape([2000, 16]), tf.float32) == [2, 1]
  assert partition(tf.TensorShape([48, 32]), tf.float32) == [1, 1]
  assert ps_cluster.partitioner(config, num_servers=1) is None
  config.min_shard_bytes = 0
  assert ps_cluster.partitioner(config, num_servers=2) is None
