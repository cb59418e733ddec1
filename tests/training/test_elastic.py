"""Elastic resume: files read in ctl's global order (TFRecordSource.
global_batches, and the built-in TFRecord and TFDS tasks by default) resume
on another number of workers with the same global batches.

A task over TFRecord records that carry their id (tests/user_modules.py:
IdRecords) prints each replica's ids at each step: the ids of every global
batch after the resume step must equal an uninterrupted 2-worker run's,
and the final weights must agree within float tolerance (the same global
batches, summed in another order). The stop step is drawn from a seed
printed by each test; CTL_ELASTIC_SEED=<seed> reproduces it. The resume on
one worker, which no signal stops, trains in this process.
"""

import collections
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
import user_modules

pytestmark = pytest.mark.slow

SEED = int(os.environ.get('CTL_ELASTIC_SEED', random.randrange(10**6)))
CONFIG = str(helpers.REPO / 'tests' / 'configs' / 'id_records.py')
TOTAL_STEPS = 36  # 3 epochs of 600 // 48 steps.
ATOL = 1e-5


def _stop_step(name: str) -> int:
  print(f'seed {SEED} (CTL_ELASTIC_SEED={SEED} reproduces it)')
  return random.Random(f'{SEED}-{name}').randint(6, 20)  # Of 36.


@pytest.fixture(scope='module')
def records(tmp_path_factory) -> str:
  return user_modules.write_id_records(tmp_path_factory.mktemp('records'))


def _args(records: str, workdir) -> tuple[str, ...]:
  return (f'--config={CONFIG}', f'--config.data.path={records}',
          f'--workdir={workdir}')


def _workers(records, workdir, count: int) -> list[helpers.Watched]:
  command = helpers.ctl_command(*_args(records, workdir))
  return [helpers.Watched(command, env) for env in helpers.cluster_envs(count)]


def _wait(jobs) -> list[int]:
  return [job.wait() for job in jobs]


def global_batches(output: str) -> dict[int, list[int]]:
  """{step: the sorted ids of its global batch}, from every replica's
  "ids <step> [...]" lines (of one run, any number of workers)."""
  ids = collections.defaultdict(list)
  for step, values in re.findall(r'ids (\d+) \[([\d ]*)\]', output):
    ids[int(step)] += [int(value) for value in values.split()]
  return {step: sorted(values) for step, values in ids.items()}


@pytest.fixture(scope='module')
def reference(records, tmp_path_factory):
  """An uninterrupted 2-worker run: (its global batches, its workdir)."""
  workdir = tmp_path_factory.mktemp('reference')
  jobs = _workers(records, workdir, 2)
  assert _wait(jobs) == [0, 0], jobs[0].output[-3000:]
  batches = global_batches(''.join(job.output for job in jobs))
  assert sorted(batches) == list(range(TOTAL_STEPS))
  assert all(len(ids) == 48 for ids in batches.values())
  epoch = [i for step in range(12) for i in batches[step]]
  assert len(set(epoch)) == 12 * 48  # No record twice in an epoch.
  return batches, workdir


def _check_resumed(jobs, workdir, reference, stopped: int, written_by: int):
  """The resumed run read the reference's global batches from `stopped`
  on, and ended with its weights."""
  batches, reference_dir = reference
  output = ''.join(job.output for job in jobs)
  assert f'Training from step {stopped} to {TOTAL_STEPS}' in jobs[0].output
  assert (f'Resumed on {len(jobs)} worker(s); the checkpoint was written by '
          f'{written_by}; same data order') in jobs[0].output
  resumed = global_batches(output)
  assert sorted(resumed) == list(range(stopped, TOTAL_STEPS))
  for step, ids in resumed.items():
    assert ids == batches[step], f'global batch of step {step}'
  final = f'checkpoints/ckpt-{TOTAL_STEPS}'
  assert helpers.assert_same_model(workdir / final, reference_dir / final,
                                   atol=ATOL)


def test_stopped_on_two_workers_resumes_on_one(
    records, reference, tmp_path, caplog, capfd):
  target = _stop_step('sigterm')
  stopped_dir = tmp_path / 'stopped'
  jobs = _workers(records, stopped_dir, 2)
  jobs[1].wait_for(rf'step {target}/')
  jobs[1].process.send_signal(signal.SIGTERM)
  assert _wait(jobs) == [errors.EXIT_PREEMPTED] * 2, jobs[0].output[-3000:]
  stopped = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                          jobs[0].output)[1])
  assert target <= stopped < TOTAL_STEPS

  # 48 examples do not divide across 5 replicas: refused, nothing written.
  before = helpers.file_stamps(stopped_dir)
  split = helpers.Watched([sys.executable, str(helpers.REPO / 'tests' /
                                               'split_cpu.py'), '5',
                           *_args(records, stopped_dir),
                           '--config.distribution.strategy=mirrored'])
  assert split.wait() == errors.EXIT_USAGE, split.output[-3000:]
  [line] = [line for line in split.output.splitlines()
            if line.startswith('ctl: ')]
  assert ('config.batch_size=48 does not divide across the 5 replicas of '
          'this job') in line and '1, 2, 3, 4, 6, 8,' in line, line
  assert helpers.file_stamps(stopped_dir) == before

  # On three: the test below, from a kill.
  capfd.readouterr()
  # On absl's logger: a run in this process may leave it at WARNING.
  with caplog.at_level(logging.INFO, logger='absl'):
    run.train_and_evaluate(helpers.config_from_flags(
        f'--config={CONFIG}', f'--config.data.path={records}'),
                           str(stopped_dir))
  # Its log, and the ids its step printed (tf.print: file descriptor 2).
  resumed = _Output(caplog.text + capfd.readouterr().err)
  _check_resumed([resumed], stopped_dir, reference, stopped, written_by=2)


def test_a_worker_killed_under_launch_resumes_on_three(records, reference,
                                                       tmp_path):
  target = _stop_step('sigkill')
  workdir = tmp_path / 'run'

  def launch(num_workers: int) -> helpers.Watched:
    return helpers.Watched([
        *helpers.ctl_command()[:2], 'ctl.launch',
        f'--num_workers={num_workers}', '--max_restarts=0', '--',
        *_args(records, workdir)])

  first = launch(2)
  pids = first.wait_for(r'started workers with pids \[(\d+), (\d+)\]')
  first.wait_for(rf'\[worker 1\] .*step {target}/')
  os.kill(int(pids[2]), signal.SIGKILL)
  assert first.wait() != 0, first.output[-3000:]
  stopped = helpers.latest_checkpoint_step(workdir)
  assert stopped

  second = launch(3)
  assert second.wait() == 0, second.output[-3000:]
  # The launcher prefixes each worker's lines with "[worker i] ".
  outputs = ['', '', '']
  for line in second.output.splitlines():
    match = re.match(r'\[worker (\d)\] (.*)', line)
    if match:
      outputs[int(match[1])] += match[2] + '\n'
  _check_resumed([_Output(text) for text in outputs], workdir, reference,
                 stopped, written_by=2)


class _Output:
  """A finished worker's output, as _check_resumed reads it."""

  def __init__(self, output: str):
    self.output = output
