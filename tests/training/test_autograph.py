"""A task's steps with Python control flow on tensors (AutoGraph) train
alike on 1 replica, 2 replicas in one process and 2 workers."""

import csv
import sys

import pytest

from ctl import errors
from ctl.training import run
import helpers

NOISY = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'
ARGS = (f'--config={NOISY}:PythonControlFlow', '--config.deterministic=True',
        '--config.num_epochs=1', '--config.log_csv=True',
        '--config.intervals.log_steps=1')


def _train_here(workdir, task: str = 'PythonControlFlow', **fields) -> None:
  """ARGS' run of task on one replica in this process (no process or
  signal is under test there: a TensorFlow start saved), fields
  overridden."""
  run.train_and_evaluate(helpers.override(
      helpers.load_config_file(NOISY, task), deterministic=True, num_epochs=1,
      log_csv=True, **{'intervals.log_steps': 1}, **fields), str(workdir))


def _logged(workdir, name: str) -> dict[int, float]:
  with open(workdir / 'metrics.csv', newline='') as file:
    return {int(row['step']): float(row['value'])
            for row in csv.DictReader(file) if row['name'] == f'train/{name}'}


def _check_flow(workdir, steps: int) -> None:
  # 3 (for) + 2 (while) + 1 while frozen (if), at every logged step.
  assert _logged(workdir, 'flow') == {
      step: 6.0 if step <= 4 else 5.0 for step in range(1, steps + 1)}
  # Frozen for steps 1..4: steps 1..5 start from the same weights.
  kernel = _logged(workdir, 'kernel')
  assert len({kernel[step] for step in range(1, 6)}) == 1, kernel
  assert kernel[6] != kernel[5]


@pytest.mark.slow
def test_python_control_flow_on_one_and_two_replicas_and_two_workers(
    tmp_path):
  _train_here(tmp_path / 'one')
  _check_flow(tmp_path / 'one', 16)

  two = helpers.Watched([
      sys.executable, str(helpers.REPO / 'tests' / 'split_cpu.py'), '2',
      *ARGS, '--config.distribution.strategy=mirrored',
      f'--workdir={tmp_path / "replicas"}'])
  assert two.wait() == 0, two.output[-3000:]
  assert '2 replica(s) in sync' in two.output
  _check_flow(tmp_path / 'replicas', 16)

  codes = helpers.run_workers([*ARGS, f'--workdir={tmp_path / "workers"}'],
                              helpers.cluster_envs(2), tmp_path)
  assert codes == [0, 0], (tmp_path / 'worker1.log').read_text()[-3000:]
  _check_flow(tmp_path / 'workers', 16)


@pytest.mark.slow
def test_without_autograph_python_control_flow_is_a_clear_error(tmp_path):
  # A CtlError: ctl.main prints it as one `ctl: error:` line, exit code 1.
  with pytest.raises(errors.CtlError, match='config.autograph') as raised:
    _train_here(tmp_path, autograph=False)
  assert raised.value.exit_code == errors.EXIT_FAILURE == 1
  assert raised.value.label == 'error'


@pytest.mark.slow
def test_a_train_step_wrapped_in_tf_function_trains_with_the_default_config(
    tmp_path):
  # Its tf.function exposes no __code__ for ctl's AutoGraph to convert (a
  # ConversionError before); it converts its own body when ctl traces it.
  _train_here(tmp_path, 'TfFunctionStep')
  _check_flow(tmp_path, 16)
