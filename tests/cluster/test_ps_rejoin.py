"""A parameter-server job's lost worker, started again by ctl.launch on its
own address, rejoins: TensorFlow's coordinator takes it back and it runs
steps (real processes: a chief, 2 workers and a server on localhost)."""

import os
import random
import re
import signal

import pytest

import helpers

# The coordinator's error line for a lost worker (TensorFlow 2.21,
# tensorflow/python/distribute/coordinator/cluster_coordinator.py; its INFO
# line for a worker back is not shown).
_FAILED = 'Worker /job:worker/replica:0/task:{} failed with'
# 44 steps an epoch. The last check must hold before the end, with steps
# left: it held at step 66 in a run whose first kill came after step 11
# (that step is at most 44; then come a loop of worker 0 alone and 4 loops
# after the losses). Its step is printed.
_EPOCHS = 6
_TOTAL = 44 * _EPOCHS


def _launch(workdir) -> helpers.Watched:
  """ctl.launch of a chief, 2 workers and one server training the digits
  task, each worker started again at most once, a log line every 11
  steps."""
  return helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2',
      '--num_ps=1', '--max_restarts=1', '--', f'--config={helpers.DIGITS}',
      f'--workdir={workdir}', f'--config.num_epochs={_EPOCHS}',
      '--config.intervals.log_steps=11'])


def _chief_steps_after(job: helpers.Watched, workers: tuple[int, ...],
                       since: int = 0) -> list[int]:
  """Lines of the chief's (indices among its lines) that log a step, after
  its last line saying the coordinator lost one of these workers, and past
  since; [] until it said so for each of them."""
  chief = [line for line in job.output.splitlines()
           if line.startswith('[chief] ')]
  lost = [max((index for index, line in enumerate(chief)
               if _FAILED.format(worker) in line and index >= since),
              default=None) for worker in workers]
  if None in lost:
    return []
  return [index for index, line in enumerate(chief)
          if index > max(lost) and re.search(rf'step \d+/{_TOTAL}', line)]


def _wait_for_two_loops_after(job: helpers.Watched,
                              workers: tuple[int, ...]) -> int:
  """Waits until the chief logged two loops after it lost these workers;
  returns the index of the second among its lines.

  Each loop ends at a log line (every 11 steps) and the next is scheduled
  after it is written: the second loop logged after the loss started
  after it, so only workers the coordinator has (back) ran it.
  """
  while len(steps := _chief_steps_after(job, workers)) < 2:
    done = re.findall(rf'\[chief\] .*step (\d+)/{_TOTAL}', job.output)
    job.wait_for(rf'\[chief\] .*step {int(done[-1]) + 11}/{_TOTAL}',
                 timeout=300)
  return steps[1]


@pytest.mark.slow
def test_a_lost_worker_started_again_rejoins_and_trains_alone(tmp_path):
  # Both workers are SIGKILLed, worker 1 first: with no worker to run them,
  # no steps pass while ctl.launch starts them again, however long that
  # takes, and the steps after can only run on workers started again.
  # Then worker 0 is SIGKILLed again, its one restart spent: the steps the
  # chief counts after its coordinator lost worker 0 again ran on the
  # restarted worker 1 alone.
  seed = random.randrange(2**31)
  print(f'seed {seed}')
  kill_at = random.Random(seed).randrange(11, 55, 11)
  workdir = tmp_path / 'job'
  job = _launch(workdir)
  try:
    _, worker_0, worker_1 = [int(pid) for pid in job.wait_for(
        r'started workers with pids \[(\d+), (\d+), (\d+)').groups()]
    job.wait_for(rf'\[chief\] .*step {kill_at}/{_TOTAL}', timeout=300)
    os.kill(worker_1, signal.SIGKILL)
    job.wait_for(r'\[launch\] .*worker 1 exited with -9; started again '
                 r'\(1 of 1\)')
    os.kill(worker_0, signal.SIGKILL)
    worker_0 = int(job.wait_for(r'\[launch\] .*worker 0 exited with -9; '
                                r'started again \(1 of 1\) with pid (\d+)')[1])
    resumed = _wait_for_two_loops_after(job, (0, 1))
    os.kill(worker_0, signal.SIGKILL)
    job.wait_for(r'\[launch\] .*worker 0 exited with -9; not started again: '
                 r'no restarts left \(--max_restarts=1\)')
    assert job.wait() == 0, job.output[-3000:]
  finally:
    job.kill()
  assert helpers.read_results(workdir)['step'] == _TOTAL
  assert 'attempt 2' not in job.output  # The job itself never restarted.
  # The coordinator lost worker 0 again after the restarted workers ran
  # loops, and the chief logged two more loops: worker 1's.
  after = _chief_steps_after(job, (0,), since=resumed)
  assert len(after) >= 2, job.output[-3000:]
  chief = [line for line in job.output.splitlines()
           if line.startswith('[chief] ')]
  print('the last check held at the chief\'s line: ' + chief[after[1]])
