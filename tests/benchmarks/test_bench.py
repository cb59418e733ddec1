"""The benchmark's parts work; its speeds are never asserted here."""

import dataclasses
import pathlib
import random
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

# benchmarks/ is not installed: it runs from the repository root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import bench
from benchmarks import preemption
from benchmarks import profile
from benchmarks import ps_tutorial
from benchmarks import search
from benchmarks import tfrecord
from benchmarks import timeslice
from benchmarks import user_task
from benchmarks import workloads as bw
from ctl import config as config_lib
from ctl.training import steps as steps_lib
# pylint: enable=g-import-not-at-top,wrong-import-position


def test_every_lever_is_a_valid_config():
  for workload_name, groups in bench._LEVERS.items():  # pylint: disable=protected-access
    workload = bw.WORKLOADS.get(workload_name, bw.WORKLOADS['cnn'])
    for settings in groups['ctl'].values():
      bw.ctl_config(workload, **settings)
  for workload_name, settings in bench.BEST.items():
    bw.ctl_config(bw.WORKLOADS[workload_name], **settings)
  config_lib.validate(user_task.ctl_config())


def test_a_misspelt_lever_fails():
  with pytest.raises(KeyError, match='steps_per_lop'):
    bw.ctl_config(bw.WORKLOADS['mlp'], steps_per_lop=10)
  with pytest.raises(KeyError, match='steps_per_lop'):
    user_task.ctl_config(steps_per_lop=10)


def test_the_default_sections_exist_and_include_user_task():
  sections = bench._SECTIONS.default  # pylint: disable=protected-access
  assert set(sections) <= set(bench._SECTION_FUNCTIONS)  # pylint: disable=protected-access
  assert 'user_task' in sections


@pytest.mark.slow
def test_every_contender_trains_and_reports_a_speed():
  tiny = dataclasses.replace(bw.WORKLOADS['mlp'], measure_steps=200,
                             ctl_steps=300)
  for measure in (bw.ctl_speed(tiny), bw.hand_loop_speed(tiny),
                  bw.hand_loop_speed(tiny, cache=True),
                  bw.compute_only_speed(tiny),
                  bw.compute_only_speed(tiny, jit_compile='auto'),
                  bw.compute_only_speed(tiny, jit_compile='step'),
                  bw.compute_only_speed(tiny, jit_compile='auto', gather=True),
                  bw.keras_fit_speed(tiny, 10),
                  bw.keras_fit_speed(tiny, 10, jit_compile=True)):
    assert measure() > 0
  for train in (user_task.ctl_progress(total_steps=300),
                user_task.hand_loop_progress(total_steps=300),
                bw.ctl_progress('mlp', 300),
                bw.compute_only_progress('mlp', 300, gather=True),
                bw.keras_fit_progress('mlp', 300, steps_per_execution=100)):
    _assert_progress_to(train(), 300)
  assert bw.tf_data_element_microseconds(100) > 0
  assert bw.report_milliseconds('ctl', 2) > 0
  assert bw.report_milliseconds('tf.summary', 2) > 0


def _assert_progress_to(progress, total_steps):
  steps, times = zip(*progress)
  assert steps[-1] == total_steps and len(steps) >= 3
  assert list(steps) == sorted(set(steps)) and list(times) == sorted(times)


@pytest.mark.slow
def test_the_tfrecord_contenders_train_and_the_data_save_is_measured(
    tmp_path):
  directory = str(tmp_path / 'shards')
  tfrecord.write_shards(directory)
  _assert_progress_to(tfrecord.ctl_progress(directory, total_steps=300)(), 300)
  _assert_progress_to(
      tfrecord.hand_loop_progress(directory, total_steps=300)(), 300)
  milliseconds, size = tfrecord.data_position_save(directory, saves=2,
                                                   steps_between=5)
  assert len(milliseconds) == 2 and min(milliseconds) > 0
  assert 1000 < size < 100_000  # About 12 KB: positions, not records.


@pytest.mark.slow
def test_the_elastic_section_s_measures_run(tmp_path):
  directory = str(tmp_path / 'shards')
  tfrecord.write_shards(directory)
  _assert_progress_to(tfrecord.ctl_progress(
      directory, total_steps=300, **{'data.tfrecord.order': 'by_file'})(), 300)
  many = str(tmp_path / 'many')
  tfrecord.write_elastic_shards(many)
  for order in ('global', 'by_file'):
    assert tfrecord.pipeline_rate(many, order, 4, batches=20) > 0
    assert 0 < tfrecord.restart_seconds(many, order) < 60


@pytest.mark.slow
def test_processes_in_turns_run_only_in_their_own_windows():
  # Two real processes, each stopped (SIGSTOP) outside its turns.
  # About 3-7 s of work each: several measured turns of 0.3 s each in the
  # runs' second halves, however fast (with 1-3 s, a fresh clone once had
  # no two adjacent windows measured).
  contender = ('benchmarks.timeslice:python_loop_progress',
               {'total_steps': 30_000})
  windows, progress = timeslice.run_in_turns(
      {'one': contender, 'two': contender}, window_seconds=0.3)
  for name in ('one', 'two'):
    _assert_progress_to(progress[name], 30_000)
  margin = 0.05  # A signal takes effect within microseconds.
  for window in windows:
    for other in {'one', 'two'} - {window.contender}:
      assert not [when for _, when in progress[other]
                  if window.start + margin < when < window.end - margin]
  speeds = timeslice.window_speeds(windows, progress)
  assert [w.contender for w in windows[:4]] == ['one', 'two', 'one', 'two']
  assert timeslice.paired_ratios(windows, speeds, 'one', 'two')


def test_the_compute_only_loop_gathers_batches_and_returns_its_loss():
  data = bw.cnn_data(None)
  read = bw.batch_reader(data, 64, gather=True)
  features, labels = read(tf.constant(3))
  rows = np.random.default_rng(0).permutation(937 * 64)[3 * 64:4 * 64]
  np.testing.assert_allclose(features, data.train.features[rows] / 255,
                             rtol=1e-6)
  np.testing.assert_array_equal(labels, data.train.labels[rows])
  # The loss is the loop's output: XLA cannot leave its L2 penalty out.
  loop = bw.step_loop(lambda i: tf.cast(i, tf.float32), 'step')
  assert float(loop(tf.constant(2), tf.constant(3))) == 2 + 3 + 4


@pytest.mark.slow
def test_three_contenders_in_turns_pair_each_with_each_other():
  contender = ('benchmarks.timeslice:python_loop_progress',
               {'total_steps': 20_000})  # Several turns each.
  comparison = timeslice.compare(
      {'one': contender, 'two': contender, 'three': contender}, rounds=1,
      window_seconds=0.2, log=lambda line: None)
  assert set(comparison.ratios_to) == {'two', 'three'}
  assert comparison.ratio_to('two') > 0 and comparison.ratio_to('three') > 0
  assert comparison.ratios == comparison.ratios_to['two']
  # The second and third take adjacent turns too (the ceiling against fit).
  assert set(comparison.pairs) == {('one', 'two'), ('one', 'three'),
                                   ('two', 'three')}
  assert comparison.ratio_between('two', 'three') > 0


@pytest.mark.slow
def test_the_profile_traces_each_loop_s_steps_op_by_op():
  for contender in ('ctl', 'compute'):
    traced = profile.trace(contender, 'mlp', steps=100)
    assert traced['total'] > 0
    # The XLA program's operations, each once a step.
    assert traced['ops'] and max(traced['ops'].values()) < traced['total']


def test_windows_are_measured_in_the_second_half_between_their_reports():
  windows = [timeslice.Window('a', 0, 10), timeslice.Window('b', 10, 20),
             timeslice.Window('a', 20, 30), timeslice.Window('b', 30, 40)]
  progress = {
      'a': [(1, 1), (100, 5), (200, 9), (300, 21), (400, 25), (450, 29)],
      'b': [(1, 11), (100, 12), (400, 31), (500, 35)]}
  speeds = timeslice.window_speeds(windows, progress)
  # The first windows are in each one's first half (a: 200 of 450 steps;
  # b: 100 of 500); then 150 steps in 8 s and 100 steps in 4 s.
  assert speeds == [None, None, 150 / 8, 100 / 4]
  assert timeslice.paired_ratios(windows, speeds, 'a', 'b') == [
      (150 / 8) / (100 / 4)]
  assert timeslice.paired_ratios(windows, speeds, 'b', 'a') == [
      (100 / 4) / (150 / 8)]


def test_the_xla_ceiling_is_what_ctl_compiles_by_default():
  # (c) "compute only, XLA as ctl's default" follows ctl's choice for the
  # classification task: a whole loop for the MLP, each step for the CNN.
  for name, expected in (('mlp', 'loop'), ('cnn', 'step')):
    task = bw.build_task(bw.WORKLOADS[name])
    assert steps_lib.resolve_xla('auto', num_replicas=1, task=task,
                                 in_memory=True) == expected


def test_targets_say_whether_they_are_met():
  assert bench.Target('a', 1.5, 1.3).row().endswith('| met |')
  assert bench.Target('a', 1.2, 1.3).row().endswith('| NOT met |')
  assert bench.Target('a', 0.5, 1.0, at_most=True).row().endswith('| met |')
  assert bench.Target('a', 2.0, 1.0, at_most=True).row().endswith(
      '| NOT met |')


def test_ratios_pair_the_measurements_of_each_repetition():
  ours = bench.Measured('ours', 1, [300, 120, 150])
  theirs = bench.Measured('theirs', 1, [100, 60, 300])
  assert ours.ratio_to(theirs) == 2.0  # Pairs: 3, 2, 0.5.
  assert ours.median / theirs.median == 1.5


@pytest.mark.slow  # A fresh ctl run and a bare script, one each.
def test_the_startup_section_splits_each_contender_s_first_step():
  # pylint: disable=protected-access
  ctl_run, bare_run = bench._ctl_first_step(), bench._bare_first_step()
  print('ctl:', ctl_run, 'bare script:', bare_run)
  for run in (ctl_run, bare_run):
    assert run['total'] > 0
    assert sum(seconds for phase, seconds in run.items()
               if phase != 'total') == pytest.approx(run['total'], rel=1e-3)
  # Every phase a row names was measured.
  for _, ctl_phases, bare_phase in bench._START_UP_ROWS:
    assert set(ctl_phases) <= set(ctl_run), ctl_phases
    assert not bare_phase or bare_phase in bare_run, bare_phase
  assert set(ctl_run) == {
      phase for _, phases, _ in bench._START_UP_ROWS for phase in phases}


def test_markdown_keeps_what_surrounds_the_generated_section(tmp_path):
  path = tmp_path / 'BENCHMARKS.md'
  path.write_text('# Head\n<!-- bench:begin -->\nold\n<!-- bench:end -->\n'
                  'Analysis\n')
  bench._write_markdown(path, 'new')  # pylint: disable=protected-access
  assert path.read_text() == ('# Head\n<!-- bench:begin -->\nnew\n'
                              '<!-- bench:end -->\nAnalysis\n')


@pytest.mark.slow
def test_the_two_worker_contenders_run_and_report_a_speed():
  # Each is two real worker processes on localhost.
  assert bench._two_worker_ceiling(steps_per_call=5) > 0  # pylint: disable=protected-access
  # One epoch of the benchmark's three: it runs; the benchmark times it.
  assert bench._two_worker_tutorial(num_epochs=1) > 0  # pylint: disable=protected-access


@pytest.mark.slow
def test_the_parameter_server_contenders_run_and_report_a_speed():
  # Each a chief, 2 workers and a server: real processes on localhost.
  # pylint: disable=protected-access
  assert bench._ps_ctl(**{'steps_per_epoch': 20, 'intervals.log_steps': 10,
                          'intervals.summary_steps': 10,
                          'export.at_end': False}) > 0  # Not timed.
  assert bench._ps_tutorial('2', '10') > 0  # 2 epochs of 10 steps.


def test_the_ps_tutorial_times_the_second_half_between_joins():
  # Joins after 100, 200, 300 and 400 steps: 200 steps from 2 s to 3 s.
  ends = [(100, 1.0), (200, 2.0), (300, 2.4), (400, 3.0)]
  assert ps_tutorial.second_half_speed(ends) == 200 / 1.0
  # Two joins: the second alone.
  assert ps_tutorial.second_half_speed([(10, 1.0), (20, 1.5)]) == 10 / 0.5


# 'ctl:2' is 'ctl:1' (search._run_ctl) but for ctl.sweep's --parallel=2,
# which tests/sweeps/test_sweep.py's end-to-end sweep runs; 'ctl:2:no_pruner'
# is its search with pruner=None, which tests/sweeps/test_search.py runs;
# 'ctl:2:gp' runs here.
@pytest.mark.slow
@pytest.mark.parametrize('contender', sorted(
    set(search.CONTENDERS.values()) - {'ctl:2', 'ctl:2:no_pruner'}))
def test_each_search_contender_runs_a_tiny_search(contender, tmp_path):
  if contender.startswith('kt_'):
    # Keras Tuner is the benchmark's alone, not a dependency of ctl.
    pytest.importorskip('keras_tuner')
  row = search.summary(search.run(contender, tmp_path, trials=2, epochs=1))
  assert row['trials'] == 2 and row['wall'] > 0
  assert 0 < row['best'] <= 1


def test_the_search_table_says_what_pruning_saved_and_what_was_skipped():
  result = {'total': 30.0, 'evaluations': [(5.0, 0.5), (9.0, 0.98)],
            'trials': [('COMPLETE', 10.0), ('COMPLETE', 12.0),
                       ('PRUNED', 4.0), ('PRUNED', 3.0)]}
  row = search.summary(result)
  assert row['saved'] == (11.0 - 4.0) + (11.0 - 3.0)
  assert (row['to_0.97'], row['to_0.99'], row['pruned']) == (9.0, None, 2)
  text = search.table({'ctl': row, 'Keras Tuner': {'skipped': search.SKIPPED}})
  assert '| ctl | 30 | 0.9800 | 9 / not reached | 4 (2) | 15 ' in text
  assert 'skipped: keras-tuner not installed' in text


def test_a_trials_phases_are_read_from_its_log():
  log = '\n'.join([
      '=== 2026-11-28 12:29:48: python -m ctl.main --workdir=/tmp/t',
      'I1128 12:30:33.500000 1 run.py:118] Task single of 1 worker(s)',
      'I1128 12:30:35.500000 1 loop.py:169] Training from step 0 to 44',
      'I1128 12:30:36.000000 1 loop.py:202] First step done 2.0 s after',
      'I1128 12:30:37.000000 1 log_line.py:49] step 44/44 epoch 1/1',
      'I1128 12:30:39.250000 1 log_line.py:49] eval at step 44: accuracy 0.5',
      'I1128 12:30:40.000000 1 trainer.py:341] Results written to /tmp/t',
      'I1128 12:30:41.000000 1 export.py:127] Exported the best checkpoint'])
  assert search.trial_phases(log) == {
      'start': 45.5, 'build': 2.0, 'first step': 0.5,
      'train, eval, saves': 4.0, 'export': 1.0, 'eval': 2.25}


def test_the_search_section_judges_no_time_to_099_that_neither_reached(
    monkeypatch):
  row = {'wall': 100.0, 'best': 0.98, 'to_0.97': 50.0, 'to_0.99': None,
         'trials': 16, 'pruned': 0, 'saved': 0.0, 'mean_complete': 6.0,
         'mean_pruned': None}
  monkeypatch.setattr(
      search, 'run_all',
      lambda seed: {name: dict(row, wall=100.0 + seed)
                    for name in search.CONTENDERS})
  text, targets = bench._search([0, 1])  # pylint: disable=protected-access
  assert [t.what for t in targets] == [
      "search: ctl.sweep's whole search (best of --parallel=1 and 2) / "
      "plain Optuna's"]
  assert 'No target on the time to 0.99 (best of --parallel=1 and 2): ' \
      'nothing to compare.' in text
  assert 'No target on the time to 0.99 (--parallel=2, sampler=gp): ' \
      'nothing to compare.' in text
  assert '### A search, seed 1: ' in text


def test_the_time_to_099_counts_a_search_that_never_reached_it():
  reached = {'wall': 100.0, 'to_0.99': 50.0}
  never = {'wall': 80.0, 'to_0.99': None}
  summaries = {'ctl.sweep, --parallel=1': never,
               'ctl.sweep, --parallel=2': never,
               'plain Optuna, trials in one process': reached,
               'Keras Tuner, BayesianOptimization': reached}
  assert search.wall_ratio(summaries) == 0.8
  assert search.to_099_ratio(summaries) == float('inf')  # Not left out.
  summaries['ctl.sweep, --parallel=2'] = {'wall': 90.0, 'to_0.99': 25.0}
  assert search.to_099_ratio(summaries) == 0.5
  # The GP's search is judged apart.
  summaries['ctl.sweep, --parallel=2, sampler=gp'] = never
  assert search.to_099_ratio(summaries, search.TARGET_GP) == float('inf')
  summaries['Keras Tuner, BayesianOptimization'] = never
  assert search.to_099_ratio(summaries) == 0.0


def test_a_killed_all_reduce_job_counts_from_its_checkpoint_until_it_logs():
  # pylint: disable=line-too-long
  progress = preemption.Progress(preemption.Job('all_reduce'))
  for line in [
      '[launch] attempt 1: started workers with pids [11, 12, 13, 14]',
      '[worker 0] I1128 12:30:35.500000 1 loop.py:169] Training from step 0 to 1000000 (epoch 1 of 1, 1000000 steps each)',
      '[worker 0] I1128 12:30:37.000000 1 log_line.py:49] step 64/1000000 epoch 1/1 (step 64 of 1000000) | loss 1.2 | ETA 0:10:02',
      '[worker 0] I1128 12:30:37.100000 1 manager.py:205] Saved /tmp/x/workdir/checkpoints/ckpt-64',
      '[worker 1] I1128 12:30:38.000000 1 log_line.py:49] step 256/1000000 epoch 1/1 (step 256 of 1000000) | loss 1.1 | ETA 0:10:01',
      '[worker 0] I1128 12:30:38.000000 1 log_line.py:49] step 128/1000000 epoch 1/1 (step 128 of 1000000) | loss 1.1 | ETA 0:10:01']:
    progress.read(line)
  assert (progress.step, progress.logged) == (128, True)  # The chief's.
  progress.killed()
  assert progress.step == 64
  progress.read('[worker 0] I1128 12:30:39.000000 1 log_line.py:49] step 192/1000000 epoch 1/1 (step 192 of 1000000) | loss 1 | ETA 0:10:00')
  assert progress.step == 64  # The killed attempt's last loop is lost.
  progress.read('[launch] attempt 2: started workers with pids [21, 22, 23, 24]')
  progress.read('[worker 0] I1128 12:31:05.500000 1 loop.py:169] Training from step 64 to 1000000 (epoch 1 of 1, 1000000 steps each)')
  progress.read('[worker 0] I1128 12:31:09.000000 1 log_line.py:49] step 128/1000000 epoch 1/1 (step 128 of 1000000) | loss 1 | ETA 0:10:00')
  assert progress.step == 128
  # A parameter-server job loses no steps to a worker's kill.
  progress = preemption.Progress(preemption.Job('parameter_servers'))
  progress.read('[chief] I1128 12:30:37.000000 1 log_line.py:49] step 64/1000000 epoch 1/1 (step 64 of 1000000) | loss 1.2 | ETA 0:10:02')
  progress.killed()
  assert progress.step == 64


def test_the_same_seed_gives_the_same_kills_before_the_window_s_end():
  schedule = preemption.Schedule.seeded(7, 4, window_seconds=120,
                                        kill_every_seconds=30)
  assert [seconds for seconds, _ in schedule.kills] == [30, 60, 90]
  assert schedule == preemption.Schedule.seeded(7, 4, 120, 30)
  assert all(0 <= worker < 4 for _, worker in schedule.kills)


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(preemption.KINDS))
def test_the_preemption_section_kills_a_worker_the_launcher_restarts(
    kind, tmp_path):
  # A real ctl.launch job of 2 workers (and, for parameter servers, a chief
  # and a server), one of them killed 6 s into a window of 12 s: the
  # all-reduce job saves a checkpoint a second, and its steps from the
  # window's start to the kill count only once one is saved.
  seed = random.randrange(2**16)
  print('seed', seed)
  schedule = preemption.Schedule.seeded(seed, 2, window_seconds=12,
                                        kill_every_seconds=6)
  job = preemption.Job(kind, num_workers=2, checkpoint_seconds=1)
  run = preemption.measure(job, str(tmp_path), schedule)
  print(run)
  assert run.steps_per_second > 0
  (_, victim), = schedule.kills
  (_, name, _), = run.kills
  assert name == f'worker {victim}'
  restart, = run.restarts  # The launcher's line that started it again.
  if kind == 'parameter_servers':
    assert f'{name} exited with -9; started again' in restart
  else:  # Every worker restarted: the killed one's code is -9.
    codes = re.search(r'workers exited with \[(.*)\]; restarting', restart)
    assert int(codes[1].split(',')[victim]) == -9
