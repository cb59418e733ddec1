"""Projects and workdirs of ctl 0.1.0, of main before 0.2.0 and of 0.2.0 run
on today's ctl, or are refused at start, as CHANGELOG.md says
(tests/compat/README.md)."""

import dataclasses
import pathlib
import shutil
import subprocess

import pytest

import ctl
from ctl import errors as ctl_errors
import helpers

V0_1_0 = helpers.REPO / 'tests' / 'compat' / 'v0_1_0'
# The overrides the fixture workdirs were trained with (README.md here),
# but for num_epochs: a resume trains one more epoch.
DIGITS = ('--config=configs/digits.py:smoke', '--config.model.filters=4',
          '--config.model.width=8', '--config.intervals.keep_checkpoints=1',
          '--config.export.at_end=False')
TEXT = ('--config=configs/text.py:smoke', '--config.data.num_train=64',
        '--config.data.num_eval=32', '--config.intervals.keep_checkpoints=1',
        '--config.export.at_end=False')


def _run_0_1_0(*args: str) -> subprocess.CompletedProcess:
  """`python -m ctl.main args` from the 0.1.0 project's folder (its
  `experiments.*` tasks import from there, as they did from the repo's)."""
  return subprocess.run(helpers.ctl_command(*args), cwd=V0_1_0,
                        env=helpers.env_with(), capture_output=True,
                        text=True, timeout=600)


def _copy_workdir(name: str, tmp_path) -> pathlib.Path:
  workdir = tmp_path / name
  shutil.copytree(V0_1_0 / 'workdirs' / name, workdir)
  return workdir


def test_a_task_with_the_0_1_0_eval_end_trains_warned_once(tmp_path):
  # experiments/regression.py of 0.1.0: eval_end(self, name, outputs), a
  # config built on ctl's config_lib.base_config(); exported at the end,
  # which finds the task class again.
  workdir = tmp_path / 'regression'
  run = _run_0_1_0('--config=configs/regression.py',
                   '--config.data.num_train=256', '--config.data.num_eval=128',
                   '--config.eval_batch_size=128', '--config.num_epochs=1',
                   f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  warned = [line for line in run.stderr.splitlines()
            if 'CtlDeprecationWarning' in line]
  assert len(warned) == 1, run.stderr[-3000:]
  assert ('Regression.eval_end(self, name: str, outputs: dict) -> dict is '
          'the form of ctl 0.1.0') in warned[0]
  assert '`def eval_end(self, name, outputs, results)`' in warned[0]
  results = helpers.read_results(workdir)
  assert results['step'] == 4
  assert -1 < results['eval']['r2'] < 1  # eval_end's, without results.
  assert (workdir / 'export' / 'export.json').exists()


def test_a_0_1_0_eval_end_is_not_called_without_per_example_outputs(
    tmp_path):
  # user/scalar_eval.py: a 0.1.0 task whose eval_step returns scalars only,
  # with the two-argument eval_end it inherits, which reads outputs that
  # are not there: 0.1.0 never called it, nor does ctl now.
  workdir = tmp_path / 'scalar_eval'
  run = _run_0_1_0('--config=configs/regression.py',
                   '--config.task=user.scalar_eval:ScalarEval',
                   '--config.data.num_train=256', '--config.data.num_eval=128',
                   '--config.eval_batch_size=64', '--config.num_epochs=2',
                   '--config.export.at_end=False', f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  results = helpers.read_results(workdir)
  assert results['step'] == 8
  assert 'mae' in results['eval'] and 'r2' not in results['eval']


def test_the_0_1_0_tfrecord_config_trains_in_the_global_order_warned(
    tmp_path):
  # configs/digits_tfrecord.py of 0.1.0 has no data.tfrecord.order nor
  # .partitions (0.2.0's): they take their defaults, with one warning that
  # names the override giving 0.1.0's order.
  workdir = tmp_path / 'digits_tfrecord'
  run = _run_0_1_0('--config=configs/digits_tfrecord.py:smoke',
                   f'--config.data.tfrecord.dir={tmp_path / "shards"}',
                   '--config.model.filters=4', '--config.model.width=8',
                   '--config.num_epochs=1', '--config.export.at_end=False',
                   f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  warned = [line for line in run.stderr.splitlines()
            if 'CtlDeprecationWarning' in line]
  assert len(warned) == 1, run.stderr[-3000:]
  assert ('config.data.tfrecord has no order, partitions' in warned[0] and
          '--config.data.tfrecord.order=by_file' in warned[0]), warned[0]
  assert helpers.read_results(workdir)['step'] == 44


@pytest.mark.parametrize('config_file, section', [
    ('digits_tfrecord.py', 'tfrecord'), ('tfds_mnist.py', 'tfds')])
def test_the_0_1_0_order_of_files_is_an_override_as_changelog_says(
    config_file, section):
  # pylint: disable=g-import-not-at-top
  from ctl import config as config_lib
  from ctl import errors
  with pytest.warns(errors.CtlDeprecationWarning,
                    match=f'config.data.{section} has no order, partitions'):
    config = config_lib.load(f'{V0_1_0 / "configs" / config_file}:smoke',
                             {f'data.{section}.order': 'by_file'})
  assert config.data[section].order == 'by_file'
  assert config.data[section].partitions == 0


def test_a_workdir_of_0_1_0_resumes(tmp_path):
  # Its checkpoint lacks what 0.2.0 added (the workers' count, the
  # actions' states): they start at their initial values.
  workdir = _copy_workdir('digits', tmp_path)
  run = _run_0_1_0(*DIGITS, '--config.num_epochs=2', f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  assert f'Restored {workdir}/checkpoints/ckpt-44' in run.stderr
  assert 'Training from step 44 to 88' in run.stderr
  assert helpers.read_results(workdir)['step'] == 88


def test_a_0_1_0_workdir_of_a_tf_data_pipeline_is_refused_at_start(tmp_path):
  # experiments/text.py of 0.1.0 reads a tf.data pipeline, whose saved
  # position ctl now reads another way: exit 2, nothing written.
  workdir = _copy_workdir('text', tmp_path)
  before = helpers.file_stamps(workdir)
  run = _run_0_1_0(*TEXT, '--config.num_epochs=2', f'--workdir={workdir}')
  assert run.returncode == 2, run.stderr[-3000:]
  errors = [line for line in run.stderr.splitlines()
            if line.startswith('ctl: error:')]
  assert len(errors) == 1, run.stderr[-3000:]
  assert 'was written by ctl 0.1.0' in errors[0]
  assert f'--config.init_from={workdir}/checkpoints' in errors[0]
  assert helpers.file_stamps(workdir) == before


def test_the_0_1_0_sweep_file_plans_its_trials(tmp_path):
  from ctl.sweep import trials as trials_lib  # pylint: disable=g-import-not-at-top
  sweep, config_file = trials_lib.load_sweep(
      str(V0_1_0 / 'experiments' / 'digits_lr.py'))
  assert config_file == str(V0_1_0 / 'configs' / 'digits.py')
  trials = trials_lib.plan(sweep, config_file, str(tmp_path))
  assert len(trials) == 8
  assert {trial.overrides['batch_size'] for trial in trials} == {32, 64}


@pytest.mark.parametrize('name', [
    'Task', 'StepContext', 'InMemory', 'Image', 'Histogram', 'base_config',
    'classification_config', 'load'])
def test_the_public_names_of_0_1_0_are_there(name):
  assert getattr(ctl, name) is not None


PRE_0_2_0 = helpers.REPO / 'tests' / 'compat' / 'pre_0_2_0'
# configs/digits_tfrecord.py's overrides of the fixture (README.md here).
DIGITS_TFRECORD = ('--config=configs/digits_tfrecord.py:smoke',
                   '--config.model.filters=4', '--config.model.width=8',
                   '--config.intervals.keep_checkpoints=1',
                   '--config.export.at_end=False', '--config.num_epochs=2')


def _resume_0_2_0_global_order(workdir, shards, *args: str):
  """`python -m ctl.main` resuming the workdir of the global order before 0.2.0
  (copied to workdir) for one more epoch, on shards written at first use
  (as ctl before 0.2.0 wrote them)."""
  return subprocess.run(helpers.ctl_command(
      *DIGITS_TFRECORD, f'--config.data.tfrecord.dir={shards}',
      f'--workdir={workdir}', *args), env=helpers.env_with(),
                        capture_output=True, text=True, timeout=600)


def _copy_0_2_0(tmp_path) -> pathlib.Path:
  workdir = tmp_path / 'digits_tfrecord'
  shutil.copytree(PRE_0_2_0 / 'workdirs' / 'digits_tfrecord', workdir)
  return workdir


def test_a_0_2_0_workdir_of_the_global_order_resumes_in_one_partition(
    tmp_path):
  # the global order of ctl before 0.2.0 is today's with one partition, bit for bit.
  workdir = _copy_0_2_0(tmp_path)
  run = _resume_0_2_0_global_order(workdir, tmp_path / 'shards',
                                   '--config.data.tfrecord.partitions=1')
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'Training from step 44 to 88' in run.stderr
  assert helpers.read_results(workdir)['step'] == 88


def test_a_0_2_0_workdir_of_the_global_order_is_refused_in_partitions(
    tmp_path):
  workdir = _copy_0_2_0(tmp_path)
  before = helpers.file_stamps(workdir)
  run = _resume_0_2_0_global_order(workdir, tmp_path / 'shards')
  assert run.returncode == 2, run.stderr[-3000:]
  errors = [line for line in run.stderr.splitlines()
            if line.startswith('ctl: error:')]
  assert len(errors) == 1, run.stderr[-3000:]
  assert ('was written by ctl before 0.2.0, whose global order of the '
          'files is this one with 1 partition') in errors[0], errors[0]
  assert 'Resume with partitions=1' in errors[0] and 'on 1 worker' in errors[0]
  assert f'--config.init_from={workdir}/checkpoints' in errors[0]
  assert helpers.file_stamps(workdir) == before


V0_2_0 = helpers.REPO / 'tests' / 'compat' / 'v0_2_0'


def test_a_0_2_0_study_is_joined_named_and_resumed_with_its_sweep_file(
    tmp_path):
  # Its description of the search has no sampler_options (0.2.0 had none),
  # nor metric names.
  from ctl import hyper  # pylint: disable=g-import-not-at-top
  from ctl.runtime import studies  # pylint: disable=g-import-not-at-top
  from ctl.sweep import study as study_lib  # pylint: disable=g-import-not-at-top
  from ctl.sweep import trials as trials_lib  # pylint: disable=g-import-not-at-top
  journal = tmp_path / 'study.journal'
  shutil.copy(V0_2_0 / 'studies' / 'digits_search.journal', journal)
  sweep_file = str(V0_2_0 / 'experiments' / 'digits_search.py')
  sweep, _ = trials_lib.load_sweep(sweep_file)
  study = study_lib.open_study(sweep, str(journal), 'digits_search')
  description = study.user_attrs[studies.SEARCH]
  assert 'sampler_options' not in description  # As 0.2.0 wrote it.
  assert study.metric_names == ['eval.accuracy']
  study = study_lib.open_study(sweep, str(journal), 'digits_search')
  assert journal.read_text().count('metric_names') == 1  # Named once.
  assert study.user_attrs[studies.SEARCH] == description
  # Its trial left RUNNING by a sweep process gone is taken over; the next
  # is sampled from the trials 0.2.0 ran.
  leases = study_lib.Leases(study, lease_seconds=60.0)
  assert [(trial.state.name, leases.is_free(trial))
          for trial in study.trials[1:]] == [('RUNNING', True)]
  trial = study.ask()
  values = study_lib.sample(study, sweep.search, trial)
  assert values.keys() == sweep.search.space.keys()
  # The same file with sampler options searches differently: refused.
  other = dataclasses.replace(sweep, search=dataclasses.replace(
      sweep.search, sampler_options={'multivariate': True}))
  with pytest.raises(ctl_errors.ConfigError,
                     match="sampler_options 'multivariate': absent in the "
                     'study, True in the sweep file'):
    study_lib.open_study(other, str(journal), 'digits_search')
