"""Every past release's projects run on today's ctl, or are refused at start,
as CHANGELOG.md says (tests/compat/README.md).

Each release's folder holds its own `configs/` and `experiments/` (from its
tag) and the projects its README showed (`user/`). Every release's
projects run one after another in one warm process (ctl/warm.py), each
from a clean state, each from its own folder, unchanged, shrunk by
overrides only where its smoke variant is large; a project whose files are
the same bytes in both releases runs once. Each test then reads one
project's outcome. Sweep files are planned (each trial's overrides
checked), not run.
"""

import dataclasses
import pathlib
import re
import shutil

import pytest

import ctl
from ctl import errors as ctl_errors
import helpers
from ctl.runtime import warm_client

COMPAT = helpers.REPO / 'tests' / 'compat'
V0_1_0 = COMPAT / 'v0_1_0'
V0_2_0 = COMPAT / 'v0_2_0'
PRE_0_2_0 = COMPAT / 'pre_0_2_0'
# Shrinks a digits run (the fixture workdirs were trained with them).
SMALL_DIGITS = ('--config.model.filters=4', '--config.model.width=8',
                '--config.num_epochs=1', '--config.export.at_end=False')
SMALL_TEXT = ('--config.data.num_train=64', '--config.data.num_eval=32',
              '--config.num_epochs=1', '--config.export.at_end=False')
SMALL_REGRESSION = ('--config.data.num_train=256', '--config.data.num_eval=128',
                    '--config.eval_batch_size=128', '--config.num_epochs=1')


@dataclasses.dataclass(frozen=True)
class Project:
  """One command of a release: `python -m ctl.main args --workdir=...`
  from `cwd` (relative to the release's folder); `{tmp}` in an argument is
  a folder of the run's own; `workdir` copies a saved workdir first."""
  args: tuple[str, ...]
  cwd: str = '.'
  workdir: pathlib.Path | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What a project's run did: its exit code, its log, its workdir."""
  exit_code: int
  log: str
  workdir: pathlib.Path
  stamps_before: dict

  def results(self) -> dict:
    assert self.exit_code == 0, self.log[-3000:]
    return helpers.read_results(self.workdir)

  def warnings(self) -> list[str]:
    return [line for line in self.log.splitlines()
            if 'CtlDeprecationWarning' in line]

  def error_lines(self) -> list[str]:
    return [line for line in self.log.splitlines()
            if line.startswith('ctl: error:')]


def _smoke(config: str, *overrides: str) -> Project:
  return Project((f'--config=configs/{config}.py:smoke', *overrides))


# The user projects of README (both releases show the same): `my_task.py`
# trained from its folder; my_project/parts.py's model and data, and its
# compiled model under the keras_model task, with the release's digits.
README_PROJECTS = {
    'readme_my_task': Project(('--config=my_task.py', '--config.num_epochs=1',
                               '--config.export.at_end=False'), cwd='user'),
    'readme_my_model_and_data': Project((
        '--config=../configs/digits.py:smoke', '--config.num_epochs=1',
        '--config.model.name=my_project.parts:my_model',
        '--config.data.name=my_project.parts:my_data'), cwd='user'),
    'readme_keras_model': Project((
        '--config=../configs/digits.py:smoke', '--config.num_epochs=1',
        '--config.task=keras_model', '--config.export.at_end=False',
        '--config.model.name=my_project.parts:compiled_model'), cwd='user'),
}

SHARED_SMOKES = {
    'digits': _smoke('digits', *SMALL_DIGITS),
    'regression': _smoke('regression', *SMALL_REGRESSION),
    'text': _smoke('text', *SMALL_TEXT),
    'clip_ema': _smoke('clip_ema', '--config.num_epochs=1',
                       '--config.export.at_end=False'),
    'gan': _smoke('gan', '--config.data.num_train=1024',
                  '--config.num_epochs=1'),
    'mnist': _smoke('mnist', '--config.export.at_end=False'),
    'digits_tfrecord': _smoke('digits_tfrecord', *SMALL_DIGITS,
                              '--config.data.tfrecord.dir={tmp}/shards'),
    'tfds_mnist': _smoke('tfds_mnist', '--config.export.at_end=False',
                         '--config.data.tfds.data_dir={tmp}/tfds'),
}

PROJECTS_0_1_0 = {
    **SHARED_SMOKES,
    **README_PROJECTS,
    'user_scalar_eval': Project((
        '--config=configs/regression.py',
        '--config.task=user.scalar_eval:ScalarEval',
        '--config.data.num_train=256', '--config.data.num_eval=128',
        '--config.eval_batch_size=64', '--config.num_epochs=2',
        '--config.export.at_end=False')),
    # Workdirs that ctl 0.1.0 wrote (README.md here), one more epoch.
    'workdir_digits': Project((
        '--config=configs/digits.py:smoke', *SMALL_DIGITS[:2],
        '--config.intervals.keep_checkpoints=1', '--config.export.at_end=False',
        '--config.num_epochs=2'), workdir=V0_1_0 / 'workdirs' / 'digits'),
    'workdir_text': Project((
        '--config=configs/text.py:smoke', *SMALL_TEXT[:2],
        '--config.intervals.keep_checkpoints=1', '--config.export.at_end=False',
        '--config.num_epochs=2'), workdir=V0_1_0 / 'workdirs' / 'text'),
}

# The workdir of the global order before 0.2.0, resumed on today's
# configs/digits_tfrecord.py (README.md here) for one more epoch.
_RESUME_GLOBAL_ORDER = (
    f'--config={helpers.REPO / "configs" / "digits_tfrecord.py"}:smoke',
    *SMALL_DIGITS[:2], '--config.intervals.keep_checkpoints=1',
    '--config.export.at_end=False', '--config.num_epochs=2',
    '--config.data.tfrecord.dir={tmp}/shards')

# Projects whose every file is the same bytes in 0.2.0 as in 0.1.0 (its
# config, the experiments/ module its task names, its user/ files:
# test_a_project_run_once_has_the_same_files_in_both_releases checks): they
# run once, from 0.1.0's folder, and are 0.2.0's outcomes too.
SAME_IN_BOTH_RELEASES = {
    'digits': ('configs/digits.py',),
    'text': ('configs/text.py', 'experiments/text.py'),
    'clip_ema': ('configs/clip_ema.py', 'experiments/clip_ema.py'),
    'mnist': ('configs/mnist.py',),
    'readme_my_task': ('user/my_task.py',),
    'readme_my_model_and_data': ('configs/digits.py',
                                 'user/my_project/parts.py'),
    'readme_keras_model': ('configs/digits.py', 'user/my_project/parts.py'),
}

PROJECTS_0_2_0 = {
    **{name: project for name, project in {**SHARED_SMOKES,
                                           **README_PROJECTS}.items()
       if name not in SAME_IN_BOTH_RELEASES},
    'finetune_pretrain': Project((
        '--config=configs/finetune.py:pretrain', '--config.num_epochs=1')),
    'finetune': Project(('--config=configs/finetune.py:smoke',
                         '--config.finetune.freeze_steps=10',
                         '--config.init_from={tmp}/../finetune_pretrain')),
    'mixed_precision': _smoke('mixed_precision', '--config.num_epochs=1',
                              '--config.export.at_end=False'),
    'readme_loss_file': Project(('--config=loss_file.py',
                                 '--config.num_epochs=1',
                                 '--config.export.at_end=False'), cwd='user'),
    'global_order_in_one_partition': Project(
        (*_RESUME_GLOBAL_ORDER, '--config.data.tfrecord.partitions=1'),
        workdir=PRE_0_2_0 / 'workdirs' / 'digits_tfrecord'),
    'global_order_in_partitions': Project(
        _RESUME_GLOBAL_ORDER,
        workdir=PRE_0_2_0 / 'workdirs' / 'digits_tfrecord'),
}


def _run_projects(process: warm_client.WarmProcess, folder: pathlib.Path,
                  projects: dict[str, Project],
                  base: pathlib.Path) -> dict[str, Outcome]:
  """Runs each project in the warm process, in order; their outcomes."""
  outcomes = {}
  for name, project in projects.items():
    tmp, workdir = base / f'{name}.tmp', base / name
    tmp.mkdir()
    if project.workdir:
      shutil.copytree(project.workdir, workdir)
    stamps = helpers.file_stamps(workdir) if project.workdir else {}
    args = [arg.replace('{tmp}', str(tmp)) for arg in project.args]
    answer = process.run([*args, f'--workdir={workdir}'],
                         base / f'{name}.log', cwd=str(folder / project.cwd))
    assert 'exit_code' in answer, (name, answer)
    outcomes[name] = Outcome(answer['exit_code'],
                             (base / f'{name}.log').read_text(), workdir,
                             stamps)
  return outcomes


@pytest.fixture(scope='module')
def releases(tmp_path_factory) -> dict[str, dict[str, Outcome]]:
  """{release: {project: outcome}}, every release's run in one warm process
  (one TensorFlow start, not one a release)."""
  process = warm_client.WarmProcess(env=helpers.env_with())
  try:
    first = _run_projects(process, V0_1_0, PROJECTS_0_1_0,
                          tmp_path_factory.mktemp('v0_1_0'))
    second = _run_projects(process, V0_2_0, PROJECTS_0_2_0,
                           tmp_path_factory.mktemp('v0_2_0'))
  finally:
    assert process.close() == 0
  same = {name: first[name] for name in SAME_IN_BOTH_RELEASES}
  return {'0_1_0': first, '0_2_0': {**same, **second}}


@pytest.fixture
def release_0_1_0(releases) -> dict[str, Outcome]:
  """0.1.0's projects' outcomes."""
  return releases['0_1_0']


@pytest.fixture
def release_0_2_0(releases) -> dict[str, Outcome]:
  """0.2.0's projects' outcomes (those run once: 0.1.0's)."""
  return releases['0_2_0']


def test_a_project_run_once_has_the_same_files_in_both_releases():
  for name, paths in SAME_IN_BOTH_RELEASES.items():
    assert name in PROJECTS_0_1_0 and name not in PROJECTS_0_2_0, name
    for path in paths:
      assert (V0_1_0 / path).read_bytes() == (V0_2_0 / path).read_bytes(), (
          name, path)
  # What those projects' configs name: no other module of the releases.
  for name in ('digits', 'text', 'clip_ema', 'mnist'):
    config = (V0_1_0 / 'configs' / f'{name}.py').read_text()
    named = set(re.findall(r"'(experiments|user)\.(\w+)", config))
    assert {f'{folder}/{module}.py' for folder, module in named} <= set(
        SAME_IN_BOTH_RELEASES[name]), (name, named)


@pytest.fixture(params=['0_1_0', '0_2_0'])
def release(request) -> dict[str, Outcome]:
  return request.getfixturevalue(f'release_{request.param}')


TRAINED_TO = {  # Steps of each run that trains (its overrides').
    'digits': 44, 'clip_ema': 44, 'gan': 8, 'mnist': 5, 'tfds_mnist': 5,
    'text': 2, 'regression': 4, 'readme_my_task': 64,
    'readme_my_model_and_data': 43, 'readme_keras_model': 44,
}


@pytest.mark.slow  # The release's warm process (a few minutes).
@pytest.mark.parametrize('name', sorted(TRAINED_TO))
def test_each_release_s_project_trains(release, name):
  results = release[name].results()
  assert results['step'] == TRAINED_TO[name]
  assert results['eval'], results


@pytest.mark.parametrize('name, accuracy', [
    ('readme_my_task', 0.8),
    # One epoch of a linear model at the digits' learning rate: above chance.
    ('readme_keras_model', 0.15), ('readme_my_model_and_data', 0.15)])
@pytest.mark.slow  # The release's warm process (a few minutes).
def test_readme_s_projects_learn(release, name, accuracy):
  assert release[name].results()['eval']['accuracy'] > accuracy


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_a_task_with_the_0_1_0_eval_end_trains_warned_once(release_0_1_0):
  # experiments/regression.py of 0.1.0: eval_end(self, name, outputs), a
  # config built on ctl's config_lib.base_config(); exported at the end,
  # which finds the task class again.
  outcome = release_0_1_0['regression']
  results = outcome.results()
  warned = outcome.warnings()
  assert len(warned) == 1, outcome.log[-3000:]
  assert ('Regression.eval_end(self, name: str, outputs: dict) -> dict is '
          'the form of ctl 0.1.0') in warned[0]
  assert '`def eval_end(self, name, outputs, results)`' in warned[0]
  assert -1 < results['eval']['r2'] < 1  # eval_end's, without results.
  assert (outcome.workdir / 'export' / 'export.json').exists()


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_a_0_1_0_eval_end_is_not_called_without_per_example_outputs(
    release_0_1_0):
  # user/scalar_eval.py: a 0.1.0 task whose eval_step returns scalars only,
  # with the two-argument eval_end it inherits, which reads outputs that
  # are not there: 0.1.0 never called it, nor does ctl now.
  results = release_0_1_0['user_scalar_eval'].results()
  assert results['step'] == 8
  assert 'mae' in results['eval'] and 'r2' not in results['eval']


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_the_0_1_0_tfrecord_config_trains_in_the_global_order_warned(
    release_0_1_0):
  # configs/digits_tfrecord.py of 0.1.0 has no data.tfrecord.order nor
  # .partitions (0.2.0's): they take their defaults, with one warning that
  # names the override giving 0.1.0's order.
  outcome = release_0_1_0['digits_tfrecord']
  assert outcome.results()['step'] == 44
  warned = outcome.warnings()
  assert len(warned) == 1, outcome.log[-3000:]
  assert ('config.data.tfrecord has no order, partitions' in warned[0] and
          '--config.data.tfrecord.order=by_file' in warned[0]), warned[0]


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_the_0_2_0_tfrecord_config_trains_unwarned(release_0_2_0):
  outcome = release_0_2_0['digits_tfrecord']
  assert outcome.results()['step'] == 44
  assert not outcome.warnings(), outcome.warnings()


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


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_a_workdir_of_0_1_0_resumes(release_0_1_0):
  # Its checkpoint lacks what 0.2.0 added (the workers' count, the
  # actions' states): they start at their initial values.
  outcome = release_0_1_0['workdir_digits']
  assert outcome.results()['step'] == 88
  assert f'Restored {outcome.workdir}/checkpoints/ckpt-44' in outcome.log
  assert 'Training from step 44 to 88' in outcome.log


def _assert_refused(outcome: Outcome, exit_code: int) -> str:
  """The run was refused at start: one `ctl: error:` line, nothing written."""
  assert outcome.exit_code == exit_code, outcome.log[-3000:]
  errors = outcome.error_lines()
  assert len(errors) == 1, outcome.log[-3000:]
  assert helpers.file_stamps(outcome.workdir) == outcome.stamps_before
  return errors[0]


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_a_0_1_0_workdir_of_a_tf_data_pipeline_is_refused_at_start(
    release_0_1_0):
  # experiments/text.py of 0.1.0 reads a tf.data pipeline, whose saved
  # position ctl now reads another way: exit 2, nothing written.
  outcome = release_0_1_0['workdir_text']
  error = _assert_refused(outcome, 2)
  assert 'was written by ctl 0.1.0' in error
  assert f'--config.init_from={outcome.workdir}/checkpoints' in error


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_a_0_2_0_workdir_of_the_global_order_resumes_in_one_partition(
    release_0_2_0):
  # the global order of ctl before 0.2.0 is today's with one partition, bit for bit.
  outcome = release_0_2_0['global_order_in_one_partition']
  assert outcome.results()['step'] == 88
  assert 'Training from step 44 to 88' in outcome.log


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_a_0_2_0_workdir_of_the_global_order_is_refused_in_partitions(
    release_0_2_0):
  outcome = release_0_2_0['global_order_in_partitions']
  error = _assert_refused(outcome, 2)
  assert ('was written by ctl before 0.2.0, whose global order of the '
          'files is this one with 1 partition') in error, error
  assert 'Resume with partitions=1' in error and 'on 1 worker' in error
  assert f'--config.init_from={outcome.workdir}/checkpoints' in error


@pytest.mark.parametrize('name', ['finetune_pretrain', 'finetune',
                                  'mixed_precision', 'readme_loss_file'])
@pytest.mark.slow  # The release's warm process (a few minutes).
def test_the_0_2_0_projects_train(release_0_2_0, name):
  results = release_0_2_0[name].results()
  assert results['step'] > 0 and results['eval'], results


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_the_0_2_0_finetune_starts_from_the_pretrained_backbone(
    release_0_2_0):
  assert 'finetune_pretrain' in release_0_2_0['finetune'].log


@pytest.mark.slow  # The release's warm process (a few minutes).
def test_the_0_2_0_readme_action_appends_its_loss_file(release_0_2_0):
  outcome = release_0_2_0['readme_loss_file']
  steps = [int(line.split()[0]) for line in
           (outcome.workdir / 'loss.txt').read_text().splitlines()]
  assert steps and all(step % 22 == 0 for step in steps), steps


@pytest.mark.parametrize('folder, sweep_file, num_trials', [
    (V0_1_0, 'digits_lr.py', 8), (V0_1_0, 'digits_random.py', 8),
    (V0_2_0, 'digits_lr.py', 8), (V0_2_0, 'digits_random.py', 8)])
def test_each_release_s_sweep_file_plans_its_trials(folder, sweep_file,
                                                    num_trials, tmp_path):
  from ctl.sweep import trials as trials_lib  # pylint: disable=g-import-not-at-top
  sweep, config_file = trials_lib.load_sweep(
      str(folder / 'experiments' / sweep_file))
  assert config_file == str(folder / 'configs' / 'digits.py')
  trials = trials_lib.plan(sweep, config_file, str(tmp_path))
  assert len(trials) == num_trials


def test_the_0_2_0_search_file_passes_its_checks():
  # pylint: disable=g-import-not-at-top
  from ctl.sweep import search
  from ctl.sweep import trials as trials_lib
  sweep, config_file = trials_lib.load_sweep(
      str(V0_2_0 / 'experiments' / 'digits_search.py'))
  assert sweep.search.num_trials == 12
  search.check(sweep, config_file)  # Raises ConfigError naming a problem.


def test_the_0_2_0_dashboard_check_finds_what_it_uses_of_ctl():
  # experiments/dashboard_check.py is a tool (optuna-dashboard in a
  # browser), not a project: what it calls of ctl must still be there.
  # pylint: disable=g-import-not-at-top
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      'dashboard_check', V0_2_0 / 'experiments' / 'dashboard_check.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for name in ('import_optuna', 'open_storage'):
    assert callable(getattr(module.studies, name))
  assert callable(module.study_lib.storage_url)


@pytest.mark.parametrize('name', [
    'Task', 'StepContext', 'InMemory', 'Image', 'Histogram', 'base_config',
    'classification_config', 'load'])
def test_the_public_names_of_0_1_0_are_there(name):
  assert getattr(ctl, name) is not None


def test_a_0_2_0_study_is_joined_named_and_resumed_with_its_sweep_file(
    tmp_path):
  # Its description of the search has no sampler_options (0.2.0 had none),
  # nor metric names.
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
  # It resumes with the config's seed it started with, not one of its own,
  # and the values it started with (nothing is drawn again).
  assert study_lib.kept_seed(study.trials[1]) == {}
  assert study_lib.drawn(study, sweep.search, study.trials[1]).params == (
      study.trials[1].params)
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
