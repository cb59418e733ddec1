"""Resume conformance: the paths users take, each stopped at a random step
and run again, end bit-identical to an uninterrupted run.

Every task kind (the built-in classifier on in-memory data, `keras_model`,
a task's own tf.data pipeline, TFRecord files, and the example tasks),
every topology (1 replica, 2 replicas in one process, 2 workers) and both
signals (SIGTERM: save and exit 42; SIGKILL: resume from the latest
checkpoint) appear, pairwise: each topology meets each signal. The step at
which the signal is sent is drawn from a seed printed with the matrix;
CTL_CONFORMANCE_SEED=<seed> reproduces a run. On one replica only the
stopped run is a process of its own (a signal is under test there): the
uninterrupted run and the resume train in this process, as ctl.main
would, a TensorFlow start saved each.

Also: a changed number of workers is refused (exit 2, the workdir as it
was), and a stateful op before or after a shuffle is caught before
training (in this process).
"""

import dataclasses
import logging
import os
import random
import re
import signal
import sys

import pytest

from ctl import errors
from ctl.training import run
import helpers

pytestmark = pytest.mark.slow

SEED = int(os.environ.get('CTL_CONFORMANCE_SEED', random.randrange(10**6)))
NOISY = str(helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py')
TFRECORD = str(helpers.REPO / 'configs' / 'digits_tfrecord.py')
# In-memory tasks: 40 steps of 25 an epoch, a checkpoint every 4 steps.
SHORT = ('--config.total_steps=40', '--config.steps_per_epoch=25')
COMMON = ('--config.deterministic=True', '--config.intervals.log_steps=1',
          '--config.intervals.checkpoint_steps=4')


@dataclasses.dataclass(frozen=True)
class Case:
  task: str
  topology: str  # 'one_replica', 'two_replicas' or 'two_workers'.
  signal: str  # 'SIGTERM' or 'SIGKILL'.
  args: tuple[str, ...]


CASES = [
    Case('classification', 'two_replicas', 'SIGKILL',
         (f'--config={helpers.DIGITS}', *SHORT,
          '--config.model.dropout=0.3')),
    Case('keras_model', 'two_workers', 'SIGTERM',
         (f'--config={helpers.DIGITS}', *SHORT, '--config.task=keras_model',
          '--config.data.name=user_modules:blobs',
          '--config.model.name=user_modules:counting_model',
          '--config.evaluation.best_metric=acc')),
    Case('tf_data', 'two_workers', 'SIGKILL', (f'--config={NOISY}',)),
    # Dropout: the SIGTERM save of two replicas holds their random layers'
    # state (tests/training/test_mirrored.py leaves this case to here).
    Case('tfrecord', 'two_replicas', 'SIGTERM',
         (f'--config={TFRECORD}:smoke', '--config.data.tfrecord.shift=1',
          '--config.model.dropout=0.3')),
    Case('regression', 'one_replica', 'SIGKILL',
         ('--config=configs/regression.py:smoke', *SHORT)),
    Case('clip_ema', 'two_replicas', 'SIGKILL',
         ('--config=configs/clip_ema.py:smoke', *SHORT)),
    # On one replica: its two optimizers resume whatever the topology, and
    # keras_model stops two workers by SIGTERM (3 process starts fewer).
    Case('gan', 'one_replica', 'SIGTERM',
         ('--config=configs/gan.py:smoke', *SHORT)),
    # 100 steps an epoch and 80 in all: every stop is mid-epoch, where the
    # pipeline's iterator, shuffle buffer and all, is what the checkpoint
    # must bring back (this case is also the text example's resume test).
    Case('text', 'one_replica', 'SIGTERM',
         ('--config=configs/text.py:smoke', '--config.data.num_train=3200',
          '--config.total_steps=80')),
]


def _name(case: Case) -> str:
  return f'{case.task}-{case.topology}-{case.signal}'


def _print_matrix() -> None:
  print(f'\nResume conformance, seed {SEED} '
        f'(CTL_CONFORMANCE_SEED={SEED} reproduces it):')
  for case in CASES:
    print(f'  {case.task:15} {case.topology:13} {case.signal}')


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
  """Where the TFRecord case writes its shards, at its first run."""
  return tmp_path_factory.mktemp('data') / 'shards'


@dataclasses.dataclass(frozen=True)
class Reference:
  """A case's uninterrupted run."""
  workdir: object
  fingerprint: list[str]  # The final weights' SHA-256 (worker 0's log).
  total_steps: int
  num_processes: int


@pytest.fixture(scope='module')
def references(tmp_path_factory, shards):
  """reference(case): the case's uninterrupted run, run once a module (the
  tf_data case's workdir also serves the changed number of workers test,
  which must leave it as it was)."""
  runs = {}

  def reference(case: Case) -> Reference:
    if case not in runs:
      workdir = tmp_path_factory.mktemp(case.task) / 'reference'
      if case.topology == 'one_replica':
        results = run.train_and_evaluate(_config(case, shards), str(workdir))
        runs[case] = Reference(workdir, [results['weights_sha256']],
                               results['step'], 1)
      else:
        log, fingerprints = _run_to_end(case, workdir, shards)
        total_steps = int(re.search(r'Training from step 0 to (\d+)',
                                    log)[1])
        runs[case] = Reference(workdir, fingerprints[0], total_steps,
                               len(fingerprints))
    return runs[case]

  return reference


def _config(case: Case, shards):
  """The case's config, as ctl.main makes it of the case's flags (for a run
  in this process)."""
  return helpers.config_from_flags(*_args(case, shards))


def _args(case: Case, shards, *extra) -> tuple[str, ...]:
  """The case's flags."""
  tfrecord_dir = ((f'--config.data.tfrecord.dir={shards}',)
                  if case.task == 'tfrecord' else ())
  mirrored = (('--config.distribution.strategy=mirrored',)
              if case.topology == 'two_replicas' else ())
  return (*case.args, *COMMON, *tfrecord_dir, *mirrored, *extra)


def _start(case: Case, workdir, shards) -> list[helpers.Watched]:
  """The case's job: one process, or one per worker."""
  args = _args(case, shards, f'--workdir={workdir}')
  env = helpers.env_with()
  env['PYTHONPATH'] += f':{helpers.REPO}'  # experiments/ importable.
  if case.topology == 'two_workers':
    return [helpers.Watched(helpers.ctl_command(*args), worker_env)
            for worker_env in helpers.cluster_envs(2, PYTHONPATH=env[
                'PYTHONPATH'])]
  if case.topology == 'two_replicas':
    return [helpers.Watched([
        sys.executable, str(helpers.REPO / 'tests' / 'split_cpu.py'), '2',
        *args], env)]
  return [helpers.Watched(helpers.ctl_command(*args), env)]


def _run_to_end(case: Case, workdir,
                shards) -> tuple[str, list[list[str]]]:
  """Runs the case's job in workdir to its end, unstopped: worker 0's log,
  and each process's final weights' SHA-256."""
  jobs = _start(case, workdir, shards)
  assert _wait(jobs) == [0] * len(jobs), jobs[0].output[-3000:]
  return jobs[0].output, [helpers.fingerprint(job.output) for job in jobs]


def _wait(jobs) -> list[int]:
  return [job.wait() for job in jobs]


def _kill_step(case: Case, total_steps: int) -> int:
  """The step after which the signal is sent, drawn from the seed."""
  draw = random.Random(f'{SEED}-{_name(case)}')
  return draw.randint(total_steps // 4, total_steps * 3 // 4)


def _stop(case: Case, tmp_path, shards, target: int, pattern: str,
          total_steps: int, attempts: int = 3):
  """Runs the case and signals process `target` once a line matches
  pattern; the workdir, the jobs and their exit codes.

  A job's last steps take well under a second, so under load it can finish
  before a SIGTERM lands (this process reads its output late): only that,
  every process exiting 0 after the log line of step total_steps, runs it
  again in a new workdir, at most `attempts` times. A job that ignores
  SIGTERM still fails the test.
  """
  for attempt in range(attempts):
    workdir = tmp_path / f'stopped-{attempt}'
    jobs = _start(case, workdir, shards)
    try:
      # At a load of 17 on 2 cores, a worker logged no step in 120 s.
      jobs[target].wait_for(pattern, timeout=300)
      jobs[target].process.send_signal(getattr(signal, case.signal))
      codes = _wait(jobs)
    finally:
      for job in jobs:
        job.kill()
    finished = all(code == 0 and f'step {total_steps}/{total_steps} ' in
                   job.output for code, job in zip(codes, jobs))
    if case.signal != 'SIGTERM' or not finished:
      break
    print(f'attempt {attempt}: the job finished before the SIGTERM landed')
  return workdir, jobs, codes


def _resumable_step(workdir, num_workers: int) -> int:
  """The newest checkpoint with every worker's data position (a SIGKILL
  between a worker's log line and its save leaves the newest without it:
  the run then resumes from the one before); 0 before the first."""
  state_file = workdir / 'checkpoints' / 'checkpoint'
  if not state_file.exists():
    return 0
  steps = [int(step) for step in re.findall(
      r'all_model_checkpoint_paths: "ckpt-(\d+)"', state_file.read_text())]
  positions = workdir / 'checkpoints' / 'data'
  for step in sorted(steps, reverse=True):
    if not positions.exists() or all(
        (positions / f'pipeline-{index}-of-{num_workers}' /
         f'ckpt-{step}.index').exists() for index in range(num_workers)):
      return step
  return 0


def _resume(case: Case, workdir, shards,
            caplog) -> tuple[str, list[list[str]]]:
  """Runs the case again in workdir, to its end: worker 0's log, and each
  process's final weights' SHA-256 (1 replica: in this process)."""
  if case.topology != 'one_replica':
    return _run_to_end(case, workdir, shards)
  caplog.clear()
  # On absl's logger: a run in this process may leave it at WARNING.
  with caplog.at_level(logging.INFO, logger='absl'):
    results = run.train_and_evaluate(_config(case, shards), str(workdir))
  return caplog.text, [[results['weights_sha256']]]


@pytest.mark.parametrize('case', CASES, ids=_name)
def test_a_stop_at_a_random_step_resumes_bit_identical(tmp_path, shards,
                                                       references, case,
                                                       caplog):
  if case is CASES[0]:
    _print_matrix()
  reference = references(case)
  total_steps = reference.total_steps
  kill_step = _kill_step(case, total_steps)
  target = random.Random(f'{SEED}-{_name(case)}-target').randrange(
      reference.num_processes)
  print(f'{_name(case)}: seed {SEED}, {case.signal} to process {target} '
        f'after step {kill_step} of {total_steps}')

  workdir, jobs, codes = _stop(case, tmp_path, shards, target,
                               rf'step {kill_step}/{total_steps} ',
                               total_steps)
  output = '\n'.join(job.output for job in jobs)
  if case.signal == 'SIGTERM':
    assert codes == [errors.EXIT_PREEMPTED] * len(jobs), output[-3000:]
    stopped = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                            output)[1])
    assert kill_step <= stopped < total_steps
    assert helpers.latest_checkpoint_step(workdir) == stopped
  else:
    assert codes[target] == -signal.SIGKILL
    assert all(code == errors.EXIT_PEER_FAILED
               for index, code in enumerate(codes) if index != target), codes
    stopped = _resumable_step(workdir, len(jobs))
    newest = helpers.latest_checkpoint_step(workdir)

  log, fingerprints = _resume(case, workdir, shards, caplog)
  if case.signal == 'SIGKILL' and stopped < newest:
    assert "lacks a worker's data position" in log
  assert f'Training from step {stopped} to {total_steps}' in log
  for fingerprint in fingerprints:
    assert fingerprint == reference.fingerprint, _name(case)


def test_a_changed_number_of_workers_is_refused_and_changes_nothing(
    shards, references):
  # A task's own tf.data pipeline: each worker saved its own position.
  case = next(case for case in CASES if case.task == 'tf_data')
  workdir = references(case).workdir
  before = helpers.file_stamps(workdir)
  single = dataclasses.replace(case, topology='one_replica')
  # In this process (no signal is under test): the ConfigError that
  # ctl.main prints as one `ctl: error:` line, exit code 2.
  with pytest.raises(errors.ConfigError) as raised:
    run.train_and_evaluate(_config(single, shards), str(workdir))
  assert raised.value.exit_code == errors.EXIT_USAGE
  line = f'ctl: {raised.value.label}: {raised.value}'
  assert re.match(r'ctl: error: The checkpoint of step 48 was saved by 2 '
                  r'worker\(s\), and this job has 1: .* Resume with 2 '
                  r'worker\(s\), or train in a new --workdir starting from '
                  r'these weights with --config.init_from=', line), line
  assert helpers.file_stamps(workdir) == before


def _refusal(task: str, workdir, caplog) -> str:
  """The `ctl:` line ctl.main prints for the error that stops the run of
  NOISY's task (in this process, no signal is under test), which must stop
  it before training."""
  # On absl's logger: a run in this process may leave it at WARNING.
  with caplog.at_level(logging.INFO, logger='absl'):
    with pytest.raises(errors.CtlError) as raised:
      run.train_and_evaluate(helpers.config_from_flags(
          f'--config={NOISY}:{task}'), str(workdir))
  assert raised.value.exit_code == errors.EXIT_FAILURE
  assert 'replica(s) in sync' in caplog.text  # The log is read.
  assert 'Training from step' not in caplog.text
  assert not (workdir / 'checkpoints').exists()
  return f'ctl: {raised.value.label}: {raised.value}'


@pytest.mark.parametrize('task', ['StatefulBeforeShuffle',
                                  'StatefulPipeline'],
                         ids=['before_shuffle', 'after_shuffle'])
def test_a_stateful_op_in_the_pipeline_is_caught_before_training(tmp_path,
                                                                 task,
                                                                 caplog):
  line = _refusal(task, tmp_path, caplog)
  assert line.startswith("ctl: error: The training pipeline's position "
                         'cannot be saved: RandomUniform is stateful'), line


def test_a_reshuffled_shuffle_below_a_shuffle_is_refused_before_training(
    tmp_path, caplog):
  line = _refusal('ShufflesTwice', tmp_path, caplog)
  assert line.startswith('ctl: error: The training pipeline has a shuffle '
                         'that reshuffles each pass (ShuffleDatasetV3) below '
                         'another shuffle (ShuffleDatasetV3)'), line
  assert 'reshuffle_each_iteration=False' in line
