"""The best checkpoint, and --mode=evaluate, in this process."""

import json
import shutil

import pytest

from ctl import errors
from ctl.checkpoints import lookup
from ctl.training import checkpoint_evaluation
from ctl.training import run
import helpers


def _eval_accuracies(workdir):
  """[(step, accuracy)] of every evaluation that training summarised."""
  return helpers.read_scalars(workdir / 'eval')['accuracy']


def test_the_best_checkpoint_survives_rotation_and_a_restart(tmp_path):
  # Evaluated and saved every 11 steps, one checkpoint kept: the best is
  # rotated out of checkpoints/ long before the end.
  fields = {'intervals.eval_steps': 11, 'intervals.checkpoint_steps': 11,
            'intervals.keep_checkpoints': 1, 'export.at_end': False}
  run.train_and_evaluate(helpers.digits(1, **fields), str(tmp_path))
  first = json.loads((tmp_path / 'best' / 'best.json').read_text())
  accuracies = _eval_accuracies(tmp_path)
  best_step, best_value = max(accuracies, key=lambda pair: pair[1])
  # The first evaluation that reached the highest value.
  best_step = min(step for step, value in accuracies if value == best_value)
  assert (first['step'], first['value']) == (best_step, best_value)
  assert first['metric'] == 'accuracy' and first['eval']['accuracy'] == best_value
  assert sorted(path.name for path in (tmp_path / 'best').iterdir()) == [
      'best.json', f'ckpt-{best_step}.data-00000-of-00001',
      f'ckpt-{best_step}.index']

  # A restart that trains on: the best so far is the one to beat.
  run.train_and_evaluate(helpers.digits(3, **fields), str(tmp_path))
  final = json.loads((tmp_path / 'best' / 'best.json').read_text())
  accuracies = _eval_accuracies(tmp_path)
  best_value = max(value for _, value in accuracies)
  assert final['value'] == best_value >= first['value']
  assert final['step'] == min(step for step, value in accuracies
                              if value == best_value)
  kept = tmp_path / 'best' / f'ckpt-{final["step"]}'
  assert kept.with_suffix('.index').exists()
  # results.json holds the best's record (a sweep's 'best.eval.accuracy'),
  # here not the last evaluation's.
  results = json.loads((tmp_path / 'results.json').read_text())
  assert results['best'] == final
  assert results['eval']['accuracy'] == accuracies[-1][1]

  # The kept checkpoint is the evaluated state: evaluating it again gives
  # the same accuracy, and changes nothing but eval/.
  before = helpers.file_stamps(tmp_path)
  again = checkpoint_evaluation.evaluate_checkpoint(helpers.digits(3, **fields),
                                       str(tmp_path), str(kept))
  assert again['step'] == final['step']
  assert again['eval']['accuracy'] == final['value']
  after = helpers.file_stamps(tmp_path)
  changed = {path for path in after.keys() | before.keys()
             if before.get(path) != after.get(path)}
  assert changed and all(path.startswith('eval/') for path in changed), changed
  assert json.loads((tmp_path / 'eval' / 'results.json').read_text())[
      'step'] == final['step']


def test_a_best_metric_the_task_does_not_log_is_named(tmp_path):
  config = helpers.digits(1, **{'evaluation.best_metric': 'auc'})
  with pytest.raises(errors.ConfigError, match=r"'auc'.*\['accuracy', 'loss'\]"):
    run.train_and_evaluate(config, str(tmp_path))


def test_evaluate_without_a_checkpoint_says_to_train_first(tmp_path):
  with pytest.raises(errors.CtlError, match='train first'):
    checkpoint_evaluation.evaluate_checkpoint(helpers.digits(1), str(tmp_path))
  assert not list(tmp_path.iterdir())


def test_a_best_checkpoint_write_cut_short_is_cleared_by_the_next_best(
    tmp_path):
  # A kill (or a full disk) while TensorFlow wrote the best checkpoint's
  # parts leaves its ckpt-<step>_temp folder: it once failed every later run.
  leftover = tmp_path / 'best' / 'ckpt-999_temp'
  leftover.mkdir(parents=True)
  (leftover / 'part-00000-of-00001.data-00000-of-00001').write_bytes(b'x')
  results = run.train_and_evaluate(helpers.digits(1), str(tmp_path))
  assert results['step'] == 44
  assert not leftover.exists()
  kept = json.loads((tmp_path / 'best' / 'best.json').read_text())
  assert (tmp_path / 'best' / f'{kept["checkpoint"]}.index').exists()


def test_a_checkpoint_write_cut_short_is_removed_by_the_next_run(tmp_path):
  # A full disk (or a kill) while TensorFlow wrote a checkpoint's parts
  # left checkpoints/ckpt-<step>_temp, which stayed there for good (on
  # gs:// an object), unless a later save of that very step replaced it.
  leftover = tmp_path / 'checkpoints' / 'ckpt-999_temp'
  leftover.mkdir(parents=True)
  (leftover / 'part-00000-of-00001.data-00000-of-00001').write_bytes(b'x')
  run.train_and_evaluate(helpers.digits(1, **{'export.at_end': False}),
                         str(tmp_path))
  assert sorted(path.name for path in (tmp_path / 'checkpoints').iterdir()
                if path.name.startswith('ckpt-')) == [
                    'ckpt-44.data-00000-of-00001', 'ckpt-44.index']


def test_a_new_best_is_logged_at_the_evaluation_that_found_it(tmp_path,
                                                              caplog):
  caplog.set_level('INFO')
  run.train_and_evaluate(helpers.digits(2), str(tmp_path))
  lines = [record.getMessage() for record in caplog.records]
  evaluations = [index for index, line in enumerate(lines)
                 if line.startswith('eval at step ')]
  assert len(evaluations) == 2  # At the end of each epoch.
  assert any(line.startswith('New best accuracy') for line in lines)
  for index, line in enumerate(lines):
    if line.startswith('New best accuracy'):
      step = line.split(' at step ')[1].split(':')[0]
      # The last evaluation before it is the one of its step.
      last = max(i for i in evaluations if i < index)
      assert lines[last].startswith(f'eval at step {step}:'), line


def test_a_best_checkpoint_whose_files_were_lost_is_repaired_or_replaced(
    tmp_path):
  # best.json naming files that are not whole (an older ctl wrote it after
  # a failed write on a full disk; or files deleted): readers use the
  # training checkpoint of that step, a rerun copies it back, and without
  # it one line says what to do and the next evaluation keeps a new best.
  fields = {'evaluation.best_metric': 'loss', 'evaluation.best_mode': 'max',
            'export.at_end': False}  # The first evaluation stays best.
  run.train_and_evaluate(helpers.digits(2, **fields), str(tmp_path))
  best = tmp_path / 'best'
  kept = json.loads((best / 'best.json').read_text())
  assert kept['step'] == 44
  (best / 'ckpt-44.data-00000-of-00001').unlink()
  assert lookup.find(str(tmp_path)) == (
      str(tmp_path / 'checkpoints' / 'ckpt-44'), 'best')
  run.train_and_evaluate(helpers.digits(3, **fields), str(tmp_path))
  assert json.loads((best / 'best.json').read_text()) == kept
  assert sorted(path.name for path in best.iterdir()) == [
      'best.json', 'ckpt-44.data-00000-of-00001', 'ckpt-44.index']
  assert lookup.find(str(tmp_path)) == (str(best / 'ckpt-44'), 'best')

  for path in best.glob('ckpt-44.*'):
    path.unlink()
  shutil.rmtree(tmp_path / 'checkpoints')
  (tmp_path / 'results.json').unlink()
  with pytest.raises(errors.CtlError, match=(
      r'best/ckpt-44 \(step 44, loss .*\), is not whole .*'
      r'\(--checkpoint=latest\)')):
    lookup.find(str(tmp_path))
  results = run.train_and_evaluate(helpers.digits(1, **fields), str(tmp_path))
  new = json.loads((best / 'best.json').read_text())
  assert (new['step'], new['value']) == (44, results['eval']['loss'])
  assert lookup.find(str(tmp_path)) == (str(best / 'ckpt-44'), 'best')
