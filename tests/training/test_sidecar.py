"""The side-car evaluator as real processes, beside training; the side-cars
that start after training ended run in the pytest process (a TensorFlow
start saved each)."""

import json
import logging

import portpicker
import pytest

from ctl import modes
import helpers

pytestmark = pytest.mark.slow

# Checkpoints every 11 steps of 88, 2 kept: the trainer rotates them away
# while the side-car reads.
ARGS = (f'--config={helpers.DIGITS}', '--config.num_epochs=2',
        '--config.intervals.checkpoint_steps=11',
        '--config.intervals.keep_checkpoints=2')


def _evaluated_steps(output: str) -> list[int]:
  return [int(line.split('eval at step ')[1].split(':')[0])
          for line in output.splitlines() if 'eval at step ' in line]


def _side_car_here(workdir, caplog) -> str:
  """Runs ARGS' side-car on workdir in this process to its end; its log."""
  caplog.clear()
  config = helpers.override(helpers.digits(2), **{
      'intervals.checkpoint_steps': 11, 'intervals.keep_checkpoints': 2})
  # On absl's logger: a run in this process may leave it at WARNING.
  with caplog.at_level(logging.INFO, logger='absl'):
    modes.run('evaluate_continuously', config, str(workdir))
  return caplog.text


def test_a_side_car_evaluates_checkpoints_as_training_writes_them(tmp_path,
                                                                   caplog):
  workdir = tmp_path / 'workdir'
  command = helpers.ctl_command(*ARGS, f'--workdir={workdir}')
  side_car = helpers.Watched([*command, '--mode=evaluate_continuously',
                              '--config.intervals.eval_steps=0'])
  side_car.wait_for('Evaluating each new checkpoint')
  # Beside a side-car started by hand, the trainer leaves the best and the
  # export to it (README, "Evaluate, export and serve").
  trainer = helpers.Watched([*command, '--config.evaluation.best_metric=',
                             '--config.export.at_end=False'])
  assert trainer.wait() == 0, trainer.output[-3000:]
  # It stops by itself once it has evaluated the final checkpoint.
  assert side_car.wait(timeout=300) == 0, side_car.output[-3000:]
  steps = _evaluated_steps(side_car.output)
  assert len(steps) > 1 and steps[-1] == 88 and steps == sorted(steps)
  assert all(step % 11 == 0 for step in steps)
  # Its summaries carry the checkpoints' steps (the trainer's own
  # evaluations are at the epoch ends, 44 and 88).
  eval_steps = {step for step, _ in
                helpers.read_scalars(workdir / 'eval')['accuracy']}
  assert set(steps) <= eval_steps
  results = json.loads((workdir / 'eval' / 'results.json').read_text())
  assert results['step'] == 88

  # A side-car that was down since step 11 finds 77 and 88 kept, and says
  # that the checkpoints between were rotated away unread.
  (workdir / 'eval' / 'results.json').write_text(json.dumps(
      {**results, 'step': 11}))
  late = _side_car_here(workdir, caplog)
  assert ('Skipped any checkpoints written after step 11 and before step 77: '
          'training rotated them away') in late
  assert _evaluated_steps(late) == [77, 88]

  # A checkpoint deleted before the side-car read it is skipped, with a
  # log line; a new side-car goes on after the last it evaluated.
  (workdir / 'eval' / 'results.json').unlink()
  for path in (workdir / 'checkpoints').glob('ckpt-77.*'):
    path.unlink()
  again = _side_car_here(workdir, caplog)
  assert 'Skipped checkpoint' in again and 'ckpt-77' in again
  assert _evaluated_steps(again) == [88]


def test_the_evaluator_task_of_tf_config_evaluates_beside_two_workers(
    tmp_path):
  workdir = tmp_path / 'workdir'
  workers = [f'localhost:{portpicker.pick_unused_port()}' for _ in range(3)]
  cluster = {'worker': workers[:2], 'evaluator': workers[2:]}
  processes = [
      helpers.Watched(
          helpers.ctl_command(*ARGS, f'--workdir={workdir}'),
          helpers.env_with(TF_CONFIG=json.dumps(
              {'cluster': cluster, 'task': {'type': job, 'index': index}})))
      for job, index in (('evaluator', 0), ('worker', 0), ('worker', 1))]
  codes = [process.wait(timeout=400) for process in processes]
  assert codes == [0, 0, 0], [p.output[-2000:] for p in processes]
  evaluator, chief, _ = processes
  assert len(_evaluated_steps(evaluator.output)) > 1
  assert _evaluated_steps(evaluator.output)[-1] == 88
  # Training left the evaluation to it...
  assert not _evaluated_steps(chief.output)
  assert 'training does not evaluate' in chief.output
  # ... and it wrote nothing into checkpoints/: only the chief's files.
  names = {path.name for path in (workdir / 'checkpoints').iterdir()}
  assert names <= {'checkpoint', 'data'} | {
      f'ckpt-{step}.{suffix}' for step in range(11, 89, 11)
      for suffix in ('index', 'data-00000-of-00001')}
  assert json.loads((workdir / 'best' / 'best.json').read_text())['step'] > 0
  assert json.loads((workdir / 'export' / 'export.json').read_text())[
      'which'] == 'best'


def test_the_evaluator_task_of_a_parameter_server_job_evaluates_beside_it(
    tmp_path):
  # A chief (the coordinator), a worker, a server and an evaluator, as a
  # TFJob's Chief, Worker, PS and Evaluator replicas: the evaluator
  # evaluates the chief's checkpoints, the chief none inline.
  workdir = tmp_path / 'workdir'
  ports = iter(portpicker.pick_unused_port() for _ in range(4))
  cluster = {job: [f'localhost:{next(ports)}']
             for job in ('chief', 'worker', 'ps', 'evaluator')}
  processes = {
      job: helpers.Watched(
          helpers.ctl_command(*ARGS, f'--workdir={workdir}'),
          helpers.env_with(TF_CONFIG=json.dumps(
              {'cluster': cluster, 'task': {'type': job, 'index': 0}})))
      for job in cluster}
  codes = {job: process.wait(timeout=400)
           for job, process in processes.items()}
  assert codes == dict.fromkeys(cluster, 0), {
      job: process.output[-2000:] for job, process in processes.items()}
  evaluator, chief = processes['evaluator'], processes['chief']
  assert 'Coordinating 1 worker(s) and 1 parameter server(s)' in chief.output
  steps = _evaluated_steps(evaluator.output)
  assert len(steps) > 1 and steps[-1] == 88 and steps == sorted(steps)
  assert not _evaluated_steps(chief.output)
  assert 'training does not evaluate' in chief.output
  assert helpers.read_results(workdir)['step'] == 88
  results = json.loads((workdir / 'eval' / 'results.json').read_text())
  assert results['step'] == 88 and results['eval']['accuracy'] > 0.9, results
  assert json.loads((workdir / 'export' / 'export.json').read_text())[
      'which'] == 'best'
