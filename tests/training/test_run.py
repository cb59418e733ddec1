"""train_and_evaluate in this process, on one device: the loop's contract."""

import json
import shutil
import threading

import numpy as np
import pytest

from ctl import errors
from ctl import task as task_lib
from ctl.training import run
from ctl.training import state as state_lib
import helpers


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  """A 2-epoch digits run: (config, workdir, results)."""
  config = helpers.digits()
  workdir = tmp_path_factory.mktemp('finished')
  return config, workdir, run.train_and_evaluate(config, str(workdir))


@pytest.fixture(scope='module')
def one_epoch(tmp_path_factory):
  """A 1-epoch digits run, trained once for the tests that start from it
  (each on a copy, `_copy`): (workdir, results)."""
  workdir = tmp_path_factory.mktemp('one_epoch')
  return workdir, run.train_and_evaluate(helpers.digits(num_epochs=1),
                                         str(workdir))


@pytest.fixture(scope='module')
def narrow_one_epoch(tmp_path_factory):
  """A 1-epoch digits run of a narrower model (model.width=16): its
  workdir, left as it is by the tests that read it."""
  workdir = tmp_path_factory.mktemp('narrow')
  run.train_and_evaluate(helpers.digits(num_epochs=1, **{'model.width': 16}),
                         str(workdir))
  return workdir


def _copy(workdir, destination):
  """A copy of a finished run's workdir (times kept) to train on; its path.

  Nothing in a workdir names its own path: the copy resumes as the run
  itself would.
  """
  shutil.copytree(workdir, destination)
  return destination


def test_writes_checkpoints_summaries_config_and_results(finished_run):
  config, workdir, results = finished_run
  assert (results['step'], results['epoch']) == (88, 2)
  assert results['eval']['accuracy'] > 0.8
  assert helpers.read_results(workdir) == results
  assert json.loads((workdir / 'config.json').read_text()) == json.loads(
      config.to_json())
  checkpoints = sorted(path.name for path in
                       (workdir / 'checkpoints').glob('*.index'))
  assert checkpoints == ['ckpt-44.index', 'ckpt-88.index']  # Epoch ends.

  train_scalars = helpers.read_scalars(workdir / 'train')
  assert set(train_scalars) == {'loss', 'accuracy', 'learning_rate',
                                'steps_per_second', 'examples_per_second'}
  assert [step for step, _ in train_scalars['loss']] == list(range(11, 89, 11))
  losses = [loss for _, loss in train_scalars['loss']]
  assert losses[-1] < losses[0] / 2
  eval_scalars = helpers.read_scalars(workdir / 'eval')
  assert [step for step, _ in eval_scalars['accuracy']] == [44, 88]
  assert eval_scalars['accuracy'][-1][1] == results['eval']['accuracy']


def test_a_finished_run_is_not_trained_again(finished_run):
  config, workdir, results = finished_run
  before = helpers.file_stamps(workdir)
  assert run.train_and_evaluate(config, str(workdir)) == results
  assert helpers.file_stamps(workdir) == before


def test_a_finished_run_without_results_only_evaluates(one_epoch, tmp_path):
  config = helpers.digits(num_epochs=1)
  source, results = one_epoch
  workdir = _copy(source, tmp_path / 'run')
  (workdir / 'results.json').unlink()
  checkpoints = helpers.file_stamps(workdir / 'checkpoints')
  again = run.train_and_evaluate(config, str(workdir))
  assert again['timing'] == {}  # This process trained nothing.
  assert {**again, 'timing': results['timing']} == results
  assert helpers.file_stamps(workdir / 'checkpoints') == checkpoints


def test_resumes_from_the_latest_checkpoint(one_epoch, tmp_path):
  workdir = _copy(one_epoch[0], tmp_path / 'run')
  results = run.train_and_evaluate(helpers.digits(num_epochs=2), str(workdir))
  assert results['step'] == 88
  # Two runs, two event files; the second starts after the first's last step.
  steps = [step for step, _ in helpers.read_scalars(workdir / 'train')['loss']]
  assert steps == list(range(11, 89, 11))
  # The changed config is saved; the one the workdir started with is kept.
  kept = list(workdir.glob('config.*.json'))
  assert len(kept) == 1
  assert json.loads(kept[0].read_text())['num_epochs'] == 1
  assert json.loads((workdir / 'config.json').read_text())['num_epochs'] == 2


def _async_save_threads() -> set[threading.Thread]:
  return {thread for thread in threading.enumerate()
          if getattr(getattr(thread, '_target', None), '__name__', '') ==
          '_async_save'}


def test_a_run_leaves_no_thread_of_its_asynchronous_saves_behind(tmp_path):
  # TensorFlow's exit handler kept each run's checkpoint thread, and with
  # it the run's model and optimizer, alive until the process ended: one
  # more of each per trial in a sweep's warm slot.
  before = _async_save_threads()
  config = helpers.digits(num_epochs=1)
  assert config.intervals.async_checkpoint  # What this test is about.
  run.train_and_evaluate(config, str(tmp_path / 'run'))
  assert _async_save_threads() <= before


def test_a_checkpoint_of_another_model_is_refused_and_kept(narrow_one_epoch,
                                                          tmp_path):
  workdir = _copy(narrow_one_epoch, tmp_path / 'run')
  before = helpers.file_stamps(workdir)
  config_before = (workdir / 'config.json').read_text()
  with pytest.raises(errors.CtlError, match='does not match this model') as e:
    run.train_and_evaluate(helpers.digits(num_epochs=2), str(workdir))
  assert 'left untouched' in str(e.value)
  # No earlier checkpoint restores into this model either: no false hint.
  assert 'previous checkpoint' not in str(e.value)
  # A start that failed changed nothing, config.json included.
  assert helpers.file_stamps(workdir) == before
  assert (workdir / 'config.json').read_text() == config_before


def test_a_config_that_cuts_epochs_differently_is_refused(one_epoch,
                                                          tmp_path):
  workdir = _copy(one_epoch[0], tmp_path / 'run')
  with pytest.raises(errors.ConfigError, match='22 steps per epoch'):
    run.train_and_evaluate(helpers.digits(num_epochs=2, batch_size=64),
                             str(workdir))


def test_a_diverging_loss_stops_before_saving(one_epoch, tmp_path):
  workdir = _copy(one_epoch[0], tmp_path / 'run')
  before = helpers.file_stamps(workdir)
  # A resumed run's loops end where an uninterrupted run's do (the summary
  # interval, 11): the loop of steps 45..55 diverged, nothing after 44 saved.
  with pytest.raises(errors.CtlError, match=r'diverged in steps 45\.\.55\. '
                     r'Nothing was saved after step 44\.'):
    run.train_and_evaluate(helpers.digits(num_epochs=2,
                                     loss='user_modules:nan_loss'),
                             str(workdir))
  after = helpers.file_stamps(workdir)
  # Only the worker's status file says what became of the run.
  assert {name: after[name] for name in before
          if not name.startswith(('config', 'workers/'))} == {
              name: stamp for name, stamp in before.items()
              if not name.startswith(('config', 'workers/'))}
  status = json.loads((workdir / 'workers' / 'worker-0.json').read_text())
  assert (status['state'], status['exit_code']) == ('failed', 1)
  assert 'diverged in steps 45..55' in status['reason']
  new_files = set(after) - set(before)
  assert not [name for name in new_files
              if name.startswith(('checkpoints/', 'results'))], new_files


def test_an_unwritable_workdir_is_a_clear_error(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  with pytest.raises(errors.CtlError, match='Cannot write to workdir'):
    run.train_and_evaluate(helpers.digits(num_epochs=1), str(blocker / 'workdir'))


def test_a_batch_larger_than_the_data_is_a_config_error(tmp_path):
  with pytest.raises(errors.ConfigError, match='larger than the 1438'):
    run.train_and_evaluate(helpers.digits(batch_size=2048), str(tmp_path / 'w'))
  assert not (tmp_path / 'w').exists()


@pytest.mark.slow
def test_trains_a_users_own_dataset_and_model(tmp_path):
  config = helpers.digits(num_epochs=10, **{
      'data.name': 'user_modules:blobs', 'model.name': 'user_modules:linear',
      'eval_batch_size': 0, 'optimizer.learning_rate': 0.05,
      'optimizer.schedule': 'constant'})
  results = run.train_and_evaluate(config, str(tmp_path))
  assert results['step'] == 10 * (320 // 32)
  assert results['eval']['accuracy'] > 0.9


def test_training_length_resolves_defaults():
  config = helpers.digits(num_epochs=3)
  steps_per_epoch = state_lib.in_memory_steps_per_epoch(config, 1000)
  length = state_lib.training_length(config, steps_per_epoch)
  assert (length.steps_per_epoch, length.total_steps, length.num_epochs) == (
      31, 93, 3)
  config.total_steps = 40
  assert state_lib.training_length(config, 31).num_epochs == 2
  state_lib.check_batch_sizes(config, num_replicas=4)
  with pytest.raises(errors.ConfigError, match='does not divide across the 3'):
    state_lib.check_batch_sizes(config, num_replicas=3)


def test_weights_fingerprint_sees_every_weight():
  import keras  # pylint: disable=g-import-not-at-top

  class Holder(task_lib.Task):
    pass

  task = Holder(helpers.digits())
  task.model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
  before = state_lib.weights_fingerprint(task)
  kernel = task.model.weights[0]
  kernel.assign(kernel.numpy() + np.float32(1e-7))
  assert state_lib.weights_fingerprint(task) != before


@pytest.mark.parametrize('damage', ['truncated data', 'garbage state file'])
@pytest.mark.slow
def test_a_corrupted_checkpoint_is_refused_and_kept(one_epoch, tmp_path,
                                                    damage):
  workdir = _copy(one_epoch[0], tmp_path / 'run')
  checkpoints = workdir / 'checkpoints'
  if damage == 'truncated data':
    data = checkpoints / 'ckpt-44.data-00000-of-00001'
    data.write_bytes(data.read_bytes()[:1000])
  else:
    (checkpoints / 'checkpoint').write_text('model_checkpoint_path: {{{')
  before = helpers.file_stamps(workdir)
  with pytest.raises(errors.CtlError, match='untouched'):
    run.train_and_evaluate(helpers.digits(num_epochs=2), str(workdir))
  assert helpers.file_stamps(workdir) == before


def test_a_damaged_latest_checkpoint_names_the_previous_one(finished_run,
                                                            tmp_path):
  workdir = _copy(finished_run[1], tmp_path / 'run')
  checkpoints = workdir / 'checkpoints'
  data = checkpoints / 'ckpt-88.data-00000-of-00001'
  data.write_bytes(data.read_bytes()[:1000])
  before = helpers.file_stamps(workdir)
  with pytest.raises(errors.CtlError) as error:
    run.train_and_evaluate(helpers.digits(num_epochs=3), str(workdir))
  message = str(error.value)
  assert 'ckpt-88 does not match this model' in message
  assert 'previous checkpoint' in message and 'ckpt-44' in message
  assert f'move {checkpoints}/ckpt-88.* out of {checkpoints}' in message
  assert helpers.file_stamps(workdir) == before

  # Done as the message says, the same run resumes from ckpt-44.
  aside = workdir / 'damaged'
  aside.mkdir()
  for path in checkpoints.glob('ckpt-88.*'):
    path.rename(aside / path.name)
  results = run.train_and_evaluate(helpers.digits(num_epochs=3), str(workdir))
  assert results['step'] == 132
  assert helpers.latest_checkpoint_step(workdir) == 132


def test_warm_start_takes_model_weights_and_starts_at_step_0(one_epoch,
                                                            tmp_path):
  source = one_epoch[0]  # Only read.
  # A negligible learning rate leaves the warm-started weights as they are.
  target = tmp_path / 'target'
  results = run.train_and_evaluate(
      helpers.digits(num_epochs=1, init_from=str(source), **{
          'optimizer.name': 'sgd', 'optimizer.learning_rate': 1e-30}),
      str(target))
  assert results['step'] == 44
  helpers.assert_same_model(target / 'checkpoints' / 'ckpt-44',
                            source / 'checkpoints' / 'ckpt-44', atol=1e-20)


def test_warm_start_is_ignored_once_the_workdir_has_a_checkpoint(
    one_epoch, tmp_path, caplog):
  _copy(one_epoch[0], tmp_path / 'own')
  caplog.set_level('INFO')
  run.train_and_evaluate(
      helpers.digits(num_epochs=2, init_from=str(tmp_path / 'no_such_dir')),
      str(tmp_path / 'own'))
  assert 'Restored' in caplog.text and 'Warm start' not in caplog.text


def test_warm_start_from_another_model_is_a_clear_error(narrow_one_epoch,
                                                        tmp_path):
  with pytest.raises(errors.CtlError, match='Cannot warm-start'):
    run.train_and_evaluate(
        helpers.digits(num_epochs=1, init_from=str(narrow_one_epoch)),
        str(tmp_path / 'wide'))


def test_checkpoints_on_a_time_interval_at_loop_ends(tmp_path):
  config = helpers.digits(num_epochs=1, steps_per_loop=5, **{
      'intervals.checkpoint_secs': 1e-9, 'intervals.checkpoint_epochs': 0,
      'intervals.summary_steps': 0, 'intervals.keep_checkpoints': 100})
  run.train_and_evaluate(config, str(tmp_path))
  saved = sorted(int(path.name[5:-6]) for path in
                 (tmp_path / 'checkpoints').glob('ckpt-*.index'))
  # Loops end after the first step, then at multiples of 5 steps, and at
  # the epoch end.
  assert saved == [1, 5, 10, 15, 20, 25, 30, 35, 40, 44]


def _traces(workdir) -> int:
  """How many profiler traces the workdir holds."""
  return len(list((workdir / 'train' / 'plugins' / 'profile').rglob(
      '*.xplane.pb')))


def test_a_profiler_trace_of_the_chosen_steps_ends_loops_only_at_its_edges(
    tmp_path):
  # A checkpoint after every loop shows where loops end: without a profile
  # at 1 (the first step) and every 11 steps (the summaries).
  config = helpers.digits(1, **{
      'profile.start_step': 5, 'profile.num_steps': 3,
      'intervals.checkpoint_secs': 1e-9, 'intervals.checkpoint_epochs': 0,
      'intervals.keep_checkpoints': 100})
  run.train_and_evaluate(config, str(tmp_path))
  assert _traces(tmp_path) == 1
  saved = sorted(int(path.name[5:-6]) for path in
                 (tmp_path / 'checkpoints').glob('ckpt-*.index'))
  assert saved == [1, 5, 8, 11, 22, 33, 44]


@pytest.mark.slow
def test_a_profile_cut_by_the_end_is_written_and_not_stopped_again(tmp_path):
  # Steps 41..50: the first run ends at 44, the second resumes there.
  profile = {'profile.start_step': 40, 'profile.num_steps': 10}
  run.train_and_evaluate(helpers.digits(1, **profile), str(tmp_path))
  assert _traces(tmp_path) == 1
  results = run.train_and_evaluate(helpers.digits(2, **profile),
                                   str(tmp_path))
  assert results['step'] == 88
  assert _traces(tmp_path) == 1
