"""`python -m ctl.main` as users run it: exit codes, messages, files."""

import os
import pty
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import helpers


def test_readme_default_command_trains_digits_and_a_rerun_does_nothing(
    tmp_path):
  workdir = tmp_path / 'digits'
  run = helpers.run_ctl(f'--config={helpers.DIGITS}', f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  assert helpers.read_results(workdir)['eval']['accuracy'] >= 0.97
  # Progress as it goes: a line per epoch end and an evaluation per epoch.
  assert 'step 44/880 epoch 1/20 (step 44 of 44)' in run.stderr
  assert run.stderr.count('eval at step') == 20
  assert 'ETA' in run.stderr

  before = helpers.file_stamps(workdir)
  rerun = helpers.run_ctl(f'--config={helpers.DIGITS}', f'--workdir={workdir}')
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert 'Training already finished at step 880 of 880' in rerun.stderr
  assert helpers.file_stamps(workdir) == before


@pytest.mark.slow
def test_the_same_command_again_resumes_an_interrupted_run(tmp_path):
  workdir = tmp_path / 'digits'
  args = (f'--config={helpers.DIGITS}', f'--workdir={workdir}')
  first = subprocess.Popen(helpers.ctl_command(*args), cwd=helpers.REPO,
                           env=helpers.env_with(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  helpers.wait_for_checkpoint(workdir, first)
  first.send_signal(signal.SIGKILL)
  first.wait()
  # A later save may have completed before the kill landed.
  latest = helpers.latest_checkpoint_step(workdir)

  second = helpers.run_ctl(*args)
  assert second.returncode == 0, second.stderr[-3000:]
  resumed_at = int(re.search(r'Training from step (\d+) to 880',
                             second.stderr).group(1))
  assert resumed_at == latest and 0 < latest < 880 and latest % 44 == 0
  assert f'ckpt-{resumed_at}' in second.stderr  # "Restored .../ckpt-N".
  assert helpers.read_results(workdir)['step'] == 880


@pytest.mark.parametrize('override, message', [
    ('--config.no_such_key=1', "Unknown config key in --config.no_such_key=1"),
    ('--config.optimizer.learning_rat=1', 'Did you mean "learning_rate"'),
    ('--config.optimizer.learning_rate=abc',
     "--config.optimizer.learning_rate=abc: could not convert string to "
     "float: 'abc'"),
    ('--config.batch_size=1.5', '--config.batch_size=1.5'),
    ('--config.optimizer.schedule=cosin',
     "config.optimizer.schedule='cosin' must be one of"),
    ('--config.model.name=resnet', "Unknown model 'resnet'"),
])
def test_a_bad_override_exits_2_naming_the_key_and_writes_nothing(
    tmp_path, override, message):
  workdir = tmp_path / 'never'
  run = helpers.run_ctl(f'--config={helpers.DIGITS}', f'--workdir={workdir}',
                        override)
  assert run.returncode == 2, run.stderr[-3000:]
  assert message in run.stderr
  assert not workdir.exists()


@pytest.mark.parametrize('override, message', [
    ('--config.optimizer.schedule=cosin',
     "config.optimizer.schedule='cosin' must be one of"),
    ('--config.batch_size=0', 'config.batch_size=0 must be at least 1'),
    ('--config.total_steps=-1', 'config.total_steps=-1 must not be negative'),
])
def test_a_value_out_of_range_is_refused_before_tensorflow_loads(
    tmp_path, override, message):
  # A TensorFlow that cannot be imported: the refusal must not need it.
  blocked = tmp_path / 'blocked' / 'tensorflow'
  blocked.mkdir(parents=True)
  (blocked / '__init__.py').write_text(
      'raise ImportError("TensorFlow was imported")\n')
  env = helpers.env_with()
  env['PYTHONPATH'] = os.pathsep.join([str(blocked.parent),
                                       env['PYTHONPATH']])
  workdir = tmp_path / 'never'
  run = helpers.run_ctl(f'--config={helpers.DIGITS}', f'--workdir={workdir}',
                        override, env=env)
  assert run.returncode == 2, run.stderr[-3000:]
  assert message in run.stderr
  assert 'TensorFlow was imported' not in run.stderr
  assert not workdir.exists()


def test_an_existing_workdir_is_not_changed_by_a_bad_override(tmp_path):
  (tmp_path / 'notes.txt').write_text('mine')
  before = helpers.file_stamps(tmp_path)
  run = helpers.run_ctl(f'--config={helpers.DIGITS}', f'--workdir={tmp_path}',
                        '--config.no_such_key=1')
  assert run.returncode == 2
  assert helpers.file_stamps(tmp_path) == before


@pytest.mark.parametrize('args, message', [
    (['--config=configs/no_such.py', '--workdir=/tmp/x'],
     'Cannot load --config'),
    ([f'--config={helpers.DIGITS}'], '--workdir must name the directory'),
    ([f'--config={helpers.DIGITS}:smok', '--workdir=/tmp/x'],
     "Cannot load --config=" + helpers.DIGITS +
     ":smok: ValueError: Unknown variant 'smok'"),
    ([f'--config={helpers.DIGITS}', '--workdir=/tmp/x', 'stray'],
     'Unexpected arguments: stray'),
])
def test_bad_flags_exit_2(args, message):
  run = helpers.run_ctl(*args)
  assert run.returncode == 2
  assert message in run.stderr
  assert 'Traceback' not in run.stderr
  assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def _garbage_checkpoint_state(directory):
  """A workdir whose checkpoints/checkpoint is binary garbage."""
  (directory / 'source' / 'checkpoints').mkdir(parents=True)
  (directory / 'source' / 'checkpoints' / 'checkpoint').write_bytes(
      b'\x00\xa5\xff garbage \xfe')
  return [f'--config={helpers.DIGITS}:smoke',
          f'--config.init_from={directory / "source"}']


def _config_returning_a_dict(directory):
  (directory / 'as_dict.py').write_text(
      'def get_config():\n  return {"task": "classification"}\n')
  return [f'--config={directory / "as_dict.py"}']


_NOT_UTF8 = b'\xff'  # A byte no UTF-8 text holds, as a shell passes it.


@pytest.mark.parametrize('make_args, workdir, exit_code, says', [
    (_garbage_checkpoint_state, 'run', 1,
     'Cannot warm-start from config.init_from='),
    (_config_returning_a_dict, 'run', 2,
     'get_config() returned a dict'),
    (lambda directory: [
        f'--config={helpers.REPO / "configs" / "digits_tfrecord.py"}:smoke',
        f'--config.data.tfrecord.dir={directory / "shards"}',
        b'--config.data.tfrecord.train_pattern=train-*' + _NOT_UTF8],
     'run', 2, "train_pattern=b'train-*\\xff' is not UTF-8"),
    (lambda directory: [f'--config={helpers.DIGITS}:smoke'],
     b'run' + _NOT_UTF8, 2, "--workdir=b'"),
    (lambda directory: [f'--config={helpers.DIGITS}:smoke',
                        '--config.mlflow.tracking_uri=http://[::1'],
     'run', 2, "config.mlflow.tracking_uri='http://[::1' is not a URI"),
    (lambda directory: ['--config=tests/configs/noisy_regression.py:'
                        'FailsToBuild'],
     'run', 1, 'user_modules.FailsToBuild.build() raised ValueError'),
    (lambda directory: ['--config=tests/configs/noisy_regression.py:'
                        'FailsToReadData'],
     'run', 1, "user_modules.FailsToReadData.train_data() raised KeyError"),
], ids=['init_from_garbage', 'config_dict', 'pattern_not_utf8',
        'workdir_not_utf8', 'mlflow_uri', 'build_raises',
        'train_data_raises'])
def test_hostile_input_is_one_error_line_and_writes_nothing(
    tmp_path, make_args, workdir, exit_code, says):
  args = make_args(tmp_path)
  before = sorted(tmp_path.rglob('*'))
  workdir = os.fsencode(tmp_path) + b'/' + (
      workdir if isinstance(workdir, bytes) else workdir.encode())
  # As in a user's shell (and CI): Python writes bytecode where it may.
  env = helpers.env_with()
  env.pop('PYTHONDONTWRITEBYTECODE', None)
  run = subprocess.run(helpers.ctl_command(*args, b'--workdir=' + workdir),
                       cwd=helpers.REPO, env=env,
                       capture_output=True, text=True, timeout=600)
  errors = [line for line in run.stderr.splitlines()
            if line.startswith('ctl: error: ')]
  assert len(errors) == 1 and says in errors[0], run.stderr[-3000:]
  assert run.returncode == exit_code, run.stderr[-3000:]
  if 'raised' in says:  # The task's own bug: its traceback, then the line.
    assert run.stderr.index('Traceback') < run.stderr.index('ctl: error: ')
    assert run.stderr.rstrip().endswith(errors[0])
  else:
    assert 'Traceback' not in run.stderr, run.stderr[-3000:]
  assert sorted(tmp_path.rglob('*')) == before


def test_help_lists_every_flag_ctl_defines():
  run = helpers.run_ctl('--help')  # absl's --help exits with code 1.
  for flag in ('--config', '--workdir', '--print_config'):
    assert flag in run.stdout


def test_print_config_shows_every_field_with_its_comment(tmp_path):
  run = helpers.run_ctl(f'--config={helpers.DIGITS}', '--print_config',
                        '--config.optimizer.learning_rate=0.01')
  assert run.returncode == 0, run.stderr
  lines = run.stdout.splitlines()
  assert '# Peak learning rate.' in lines
  assert 'optimizer.learning_rate = 0.01  # default: 0.001' in lines
  config = helpers.load_config('digits')
  fields = [line.split(' = ')[0] for line in lines if ' = ' in line
            and not line.startswith('#')]
  assert len(fields) == len(_leaves(config.to_dict()))
  assert 'tensorflow' not in run.stderr.lower()  # Printed without loading TF.


def _leaves(tree, prefix=''):
  found = []
  for key, value in tree.items():
    found += (_leaves(value, f'{prefix}{key}.') if isinstance(value, dict)
              else [prefix + key])
  return found


@pytest.mark.parametrize('log_level', [None, '2'])
def test_the_log_is_one_line_per_report_without_tensorflows_start_up(
    tmp_path, log_level):
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  env = helpers.env_with(TMPDIR=str(scratch))
  for variable in ('TF_CPP_MIN_LOG_LEVEL', 'PYTHONDONTWRITEBYTECODE'):
    env.pop(variable, None)
  if log_level:  # A user who asked for fewer of TensorFlow's lines.
    env['TF_CPP_MIN_LOG_LEVEL'] = log_level
  run = helpers.run_ctl(f'--config={helpers.DIGITS}:smoke',
                        f'--workdir={tmp_path / "workdir"}', env=env)
  assert run.returncode == 0, run.stderr[-3000:]
  # AutoGraph's temporary files, and the bytecode Python caches beside them.
  assert not list(scratch.iterdir())
  for noise in ('oneDNN', 'cuInit', 'cpu_feature_guard', 'cudart_stub',
                'InitializeLog'):
    assert noise not in run.stderr
  reports = [line for line in run.stderr.splitlines() if '| loss ' in line]
  assert len(reports) == 8  # Each 11 steps of 88.
  assert not [line for line in run.stderr.splitlines() if 'e+' in line]
  assert len(run.stderr.splitlines()) < 30, run.stderr


def test_an_unwritable_workdir_exits_1_with_a_clear_message(tmp_path):
  (tmp_path / 'file').write_text('')
  run = helpers.run_ctl(f'--config={helpers.DIGITS}',
                        f'--workdir={tmp_path / "file" / "workdir"}')
  assert run.returncode == 1
  assert 'ctl: error: Cannot write to workdir' in run.stderr
  assert 'Traceback' not in run.stderr


def test_mnist_config_reads_the_keras_cache_offline(tmp_path):
  (tmp_path / 'keras' / 'datasets').mkdir(parents=True)
  rng = np.random.default_rng(0)
  np.savez(tmp_path / 'keras' / 'datasets' / 'mnist.npz',
           x_train=rng.integers(0, 256, (256, 28, 28), dtype=np.uint8),
           y_train=rng.integers(0, 10, 256, dtype=np.uint8),
           x_test=rng.integers(0, 256, (100, 28, 28), dtype=np.uint8),
           y_test=rng.integers(0, 10, 100, dtype=np.uint8))
  workdir = tmp_path / 'mnist'
  run = helpers.run_ctl(
      f'--config={helpers.REPO / "configs" / "mnist.py"}',
      f'--workdir={workdir}', '--config.num_epochs=1',
      '--config.steps_per_epoch=4',
      env=helpers.env_with(KERAS_HOME=str(tmp_path / 'keras')))
  assert run.returncode == 0, run.stderr[-3000:]
  assert helpers.read_results(workdir)['step'] == 4
  assert 'eval at step 4' in run.stderr


def test_missing_mnist_exits_1_before_writing(tmp_path):
  workdir = tmp_path / 'mnist'
  run = helpers.run_ctl(
      f'--config={helpers.REPO / "configs" / "mnist.py"}',
      f'--workdir={workdir}',
      env=helpers.env_with(KERAS_HOME=str(tmp_path / 'empty')))
  assert run.returncode == 1
  assert 'MNIST file not found' in run.stderr
  assert not workdir.exists()


@pytest.mark.slow
def test_start_up_is_counted_from_python_not_from_the_shell_before_it(
    tmp_path):
  # The README's one-liner runs pip first; bash execs its last command in
  # its own process, whose start time is then the shell's. The start-up
  # ctl reports fits in the time from the exec to the line; counted from
  # the shell's start it would hold the 12 s of sleep before.
  exec_time = tmp_path / 'exec_time'
  command = ' '.join([
      f'sleep 12 && date +%s.%N > {exec_time} &&', 'exec',
      *helpers.ctl_command(f'--config={helpers.DIGITS}:smoke',
                           f'--workdir={tmp_path}/run',
                           '--config.total_steps=1')])
  run = helpers.Watched(['bash', '-c', command])
  line = run.wait_for(r'First step done ([\d.]+) s', timeout=300)
  seen = time.time()
  # The line rounds to 0.1 s: 6.8 may be 6.75 (a CI run saw 6.8 against
  # 6.79 s since the exec).
  assert float(line[1]) - 0.05 <= seen - float(exec_time.read_text()), (
      line[0])
  assert run.wait() == 0, run.output[-3000:]


def test_on_a_terminal_the_progress_is_one_line_rewritten(tmp_path):
  # A pseudo-terminal, as an interactive shell gives.
  terminal, child_end = pty.openpty()
  process = subprocess.Popen(
      helpers.ctl_command(f'--config={helpers.DIGITS}:smoke',
                          '--config.intervals.log_steps=4',
                          f'--workdir={tmp_path}'),
      cwd=helpers.REPO, env=helpers.env_with(), stdin=subprocess.DEVNULL,
      stdout=child_end, stderr=child_end)
  os.close(child_end)
  chunks = []
  while True:
    try:
      chunk = os.read(terminal, 65536)
    except OSError:  # EIO: the process closed the terminal.
      break
    if not chunk:
      break
    chunks.append(chunk)
  os.close(terminal)
  assert process.wait() == 0
  text = b''.join(chunks).decode().replace('\r\n', '\n')
  # Reports mid-epoch rewrite the live line; epoch ends stay, one line each.
  assert '\r\x1b[Kstep 4/88 epoch 1/2 (step 4 of 44)' in text
  # What stays on the screen of each line: after the last erasure.
  shown = [line.rsplit('\x1b[K', 1)[-1] for line in text.split('\n')]
  kept = [line for line in shown if ' epoch ' in line]
  assert [re.search(r'step (\d+)/88', line)[1] for line in kept] == [
      '44', '88'], kept
  assert all(re.match(r'I\d{4} ', line) for line in kept)
  # Other lines start at the start of a line, above the live one.
  assert any(re.match(r'I\d{4} .* eval at step 44: ', line)
             for line in shown)
  assert text.endswith('\n')


def test_a_folder_named_ctl_where_it_runs_does_not_hide_the_installed_ctl(
    tmp_path):
  # The quick start's workdirs under /tmp/ctl, run from /tmp; or a clone
  # named ctl, run from its parent: Python takes the folder (no
  # __init__.py) for a namespace package `ctl`, which wins over an
  # editable install's import hook, not over a path on sys.path
  # (setup.cfg's package_dir).
  (tmp_path / 'ctl' / 'digits').mkdir(parents=True)
  env = helpers.env_with()
  del env['PYTHONPATH']  # ctl as installed, as a user's shell finds it.
  run = subprocess.run([sys.executable, '-m', 'ctl.main', '--version'],
                       cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.startswith('ctl ')


def test_version_prints_the_release_setup_cfg_installs():
  from setuptools.config import setupcfg  # pylint: disable=g-import-not-at-top
  release = setupcfg.read_configuration(
      helpers.REPO / 'setup.cfg')['metadata']['version']
  run = helpers.run_ctl('--version')  # No --config: it needs none.
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout == f'ctl {release}\n'
  assert release == '0.2.0'
