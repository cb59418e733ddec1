"""Several replicas in one process: MirroredStrategy over a split CPU.

tests/split_cpu.py splits this machine's CPU into two devices, standing in
for a machine with two GPUs; everything else is `python -m ctl.main`. The
one-replica runs they are compared with train in this process (no process
or signal is under test there: a TensorFlow start saved each). Two
replicas stopped by SIGTERM (and by SIGKILL), random layers' state and all,
resume bit-identical in tests/training/test_resume_conformance.py.
"""

import json
import logging
import sys

import numpy as np
import pytest

from ctl.training import run as run_lib
import helpers

pytestmark = pytest.mark.slow

ARGS = (f'--config={helpers.DIGITS}', '--config.num_epochs=2',
        '--config.intervals.log_steps=1')
MIRRORED = '--config.distribution.strategy=mirrored'
NOISY = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'


def _train_here(config_file, workdir, *args, **fields) -> None:
  """One replica's run of config_file (get_config(*args)), fields
  overridden, in this process."""
  run_lib.train_and_evaluate(helpers.override(
      helpers.load_config_file(config_file, *args), **fields), str(workdir))


def _on_two_devices(*args: str) -> list[str]:
  return [sys.executable, str(helpers.REPO / 'tests' / 'split_cpu.py'), '2',
          *args]


def test_two_replicas_train_what_one_replica_trains(tmp_path, caplog):
  mirrored, single = tmp_path / 'mirrored', tmp_path / 'single'
  run = helpers.Watched(_on_two_devices(*ARGS, MIRRORED,
                                        f'--workdir={mirrored}'))
  assert run.wait() == 0, run.output[-3000:]
  assert '2 replica(s) in sync' in run.output
  results = helpers.read_results(mirrored)
  assert results['step'] == 88 and results['eval']['accuracy'] > 0.9

  # On absl's logger: a run in this process may leave it at WARNING.
  with caplog.at_level(logging.INFO, logger='absl'):
    _train_here(helpers.DIGITS, single, num_epochs=2,
                **{'intervals.log_steps': 1})
  assert '1 replica(s) in sync' in caplog.text
  assert helpers.assert_same_model(mirrored / 'checkpoints' / 'ckpt-88',
                                   single / 'checkpoints' / 'ckpt-88',
                                   atol=1e-5) == 6


def test_two_replicas_evaluate_each_example_once_in_order(tmp_path):
  # 13 examples in batches of 4, 2 a replica: the last batch has one
  # example, on the first replica; the second gets an empty batch.
  args = (f'--config={NOISY}:EvalInOrder', '--config.total_steps=4',
          '--config.eval_batch_size=4', f'--workdir={tmp_path}')
  _train_here(NOISY, tmp_path, 'EvalInOrder', total_steps=4,
              eval_batch_size=4)
  one_replica = helpers.read_results(tmp_path)['eval']

  evaluated = helpers.Watched(_on_two_devices(*args, MIRRORED,
                                              '--mode=evaluate'))
  assert evaluated.wait() == 0, evaluated.output[-3000:]
  two_replicas = json.loads(
      (tmp_path / 'eval' / 'results.json').read_text())['eval']
  assert one_replica['in_order'] == two_replicas['in_order'] == 1.0
  for name in ('mse', 'mae'):
    np.testing.assert_allclose(two_replicas[name], one_replica[name],
                               rtol=1e-6, err_msg=name)


def test_a_replica_past_the_end_of_an_eval_set_gets_no_eval_step(tmp_path):
  # tests/sequence_tasks.py: a Keras GRU over token sequences padded per
  # batch. 80 eval examples in batches of 30 a replica: the last batch's
  # second replica has no examples, an empty batch of length 0, on which the
  # GRU fails (TensorListStack); ctl does not call eval_step there.
  gru_file = helpers.REPO / 'tests' / 'configs' / 'gru.py'
  gru = f'--config={gru_file}'
  two = helpers.Watched(_on_two_devices(gru, MIRRORED,
                                        f'--workdir={tmp_path / "two"}'))
  assert two.wait() == 0, two.output[-3000:]
  assert '2 replica(s) in sync' in two.output
  _train_here(gru_file, tmp_path / 'one')
  two_replicas = helpers.read_results(tmp_path / 'two')['eval']
  one_replica = helpers.read_results(tmp_path / 'one')['eval']
  assert two_replicas['examples'] == one_replica['examples'] == 80
  assert two_replicas['labels_in_order'] == 1.0
  for name in ('loss', 'accuracy'):
    np.testing.assert_allclose(two_replicas[name], one_replica[name],
                               rtol=1e-4, err_msg=name)
