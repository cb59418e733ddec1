"""ctl/warm.py and fresh_state.py: commands run one after another in
one process equal the same commands run each in a fresh process."""

import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import weakref

from absl import logging
import pytest

import helpers
from ctl.runtime import warm_client
from ctl.runtime import fresh_state
from ctl.runtime import tf_internals
# In sys.modules for test_the_modules_kept_are_ctl_s_and_the_installed_ones.
from ctl import warm  # pylint: disable=unused-import

# A task that changes what a process shares: Keras's dtype policy and
# epsilon, op determinism, the global seed, an environment variable.
_CHANGES_THE_PROCESS = '''
"""Trains a few steps after changing the process's global state."""
import os
import keras
import numpy as np
import tensorflow as tf
import ctl


def get_config():
  """python -m ctl.main --config=changes.py --workdir=/tmp/ctl/changes"""
  config = ctl.base_config()
  config.task = 'changes:Changes'
  config.batch_size = 32
  config.num_epochs = 1
  return config


class Changes(ctl.Task):

  def build(self):
    keras.mixed_precision.set_global_policy('mixed_float16')
    keras.config.set_epsilon(0.1)
    tf.config.experimental.enable_op_determinism()
    tf.random.set_seed(1234)
    os.environ['CTL_TEST_CHANGED'] = '1'
    self.model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    self.optimizer = keras.optimizers.SGD(0.1)
    self.optimizer.build(self.model.trainable_variables)

  def train_data(self, context):
    rng = np.random.default_rng(0)
    return ctl.InMemory((rng.normal(size=(64, 2)).astype(np.float32),
                         rng.integers(0, 2, 64).astype(np.int32)))

  def train_step(self, batch, ctx):
    points, labels = batch
    with tf.GradientTape() as tape:
      logits = tf.cast(self.model(points, training=True), tf.float32)
      loss = tf.nn.compute_average_loss(
          keras.losses.sparse_categorical_crossentropy(
              labels, logits, from_logits=True),
          global_batch_size=ctx.global_batch_size)
    variables = self.model.trainable_variables
    self.optimizer.apply_gradients(zip(tape.gradient(loss, variables),
                                       variables))
    return {'loss': loss}
'''

# README's "a task of your own", whose layers take Keras's global policy.
_CIRCLE = '''
"""Tells 2-D points inside a circle from those outside it."""
import keras
import numpy as np
import tensorflow as tf
import ctl


def get_config():
  """python -m ctl.main --config=circle.py --workdir=/tmp/ctl/circle"""
  config = ctl.base_config()
  config.task = 'circle:Circle'
  config.batch_size = 64
  config.num_epochs = 1
  config.deterministic = True
  return config


class Circle(ctl.Task):

  def build(self):
    self.model = keras.Sequential([keras.Input((2,)),
                                   keras.layers.Dense(8, activation='relu'),
                                   keras.layers.Dense(2)])
    self.optimizer = keras.optimizers.Adam(1e-2)
    self.optimizer.build(self.model.trainable_variables)

  def train_data(self, context):
    points = np.random.default_rng(0).uniform(-1, 1, (512, 2))
    inside = (points**2).sum(axis=1) < 0.5
    return ctl.InMemory((points.astype(np.float32), inside.astype(np.int32)))

  def train_step(self, batch, ctx):
    points, labels = batch
    with tf.GradientTape() as tape:
      logits = self.model(points, training=True)
      per_example_loss = keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True)
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=ctx.global_batch_size)
    variables = self.model.trainable_variables
    self.optimizer.apply_gradients(zip(tape.gradient(loss, variables),
                                       variables))
    return {'loss': tf.reduce_mean(per_example_loss)}
'''

DIGITS = ('--config.deterministic=True', '--config.num_epochs=1',
          '--config.model.filters=4', '--config.model.width=8',
          '--config.export.at_end=False')


def _write_project(tmp_path):
  project = tmp_path / 'project'
  project.mkdir()
  (project / 'changes.py').write_text(textwrap.dedent(_CHANGES_THE_PROCESS))
  (project / 'circle.py').write_text(textwrap.dedent(_CIRCLE))
  return project


def _sha256(workdir) -> str:
  return helpers.read_results(workdir)['weights_sha256']


@pytest.mark.slow  # Two fresh processes and a warm one of three runs.
def test_warm_runs_after_one_that_changed_the_process_equal_fresh_ones(
    tmp_path):
  project = _write_project(tmp_path)
  digits = (f'--config={helpers.DIGITS}:smoke', *DIGITS)
  fresh = [
      helpers.run_ctl(*digits, f'--workdir={tmp_path / "fresh_digits"}'),
      subprocess.run(helpers.ctl_command('--config=circle.py',
                                         f'--workdir={tmp_path / "fresh_circle"}'),
                     cwd=project, env=helpers.env_with(), capture_output=True,
                     text=True, timeout=600)]
  for run in fresh:
    assert run.returncode == 0, run.stderr[-3000:]
  process = warm_client.WarmProcess(env=helpers.env_with())
  try:
    answers = [
        process.run(['--config=changes.py', f'--workdir={tmp_path / "changes"}'],
                    tmp_path / 'changes.log', cwd=str(project)),
        process.run([*digits, f'--workdir={tmp_path / "warm_digits"}'],
                    tmp_path / 'digits.log'),
        process.run(['--config=circle.py', f'--workdir={tmp_path / "warm_circle"}'],
                    tmp_path / 'circle.log', cwd=str(project)),
    ]
  finally:
    assert process.close() == 0
  assert answers == [{'exit_code': 0}] * 3, [
      (tmp_path / name).read_text()[-3000:]
      for name in ('changes.log', 'digits.log', 'circle.log')]
  assert _sha256(tmp_path / 'warm_digits') == _sha256(tmp_path / 'fresh_digits')
  assert _sha256(tmp_path / 'warm_circle') == _sha256(tmp_path / 'fresh_circle')
  # The run's whole output is in its log, TensorFlow's C++ lines included.
  assert 'Final weights sha256' in (tmp_path / 'circle.log').read_text()


@pytest.mark.slow  # A warm process on two CPU devices, two runs.
def test_mirrored_runs_of_other_shapes_follow_each_other_in_a_warm_process(
    tmp_path):
  # Before, the second strategy reused the first's collective keys, and the
  # runtime, which remembers each key's shapes, failed it: "Shape mismatch
  # in the collective instance 101".
  process = warm_client.WarmProcess(cpu_devices=2, env=helpers.env_with())
  try:
    answers = [process.run(
        [f'--config={helpers.DIGITS}:smoke', *DIGITS,
         '--config.distribution.strategy=mirrored',
         f'--config.model.width={width}', f'--workdir={tmp_path / str(width)}'],
        tmp_path / f'{width}.log', cpu_devices=2) for width in (32, 64)]
  finally:
    assert process.close() == 0
  assert answers == [{'exit_code': 0}] * 2, (
      tmp_path / '64.log').read_text()[-3000:]
  for width in (32, 64):
    assert helpers.read_results(tmp_path / str(width))['step'] > 0


def test_a_warm_run_s_start_up_is_timed_from_its_own_start(tmp_path):
  # The second run's first step comes within the time from sending it to
  # its answer; counted from the process's start (as before), it held the
  # process's own start-up and the whole first run too.
  digits = (f'--config={helpers.DIGITS}:smoke', *DIGITS,
            '--config.total_steps=1')
  process = warm_client.WarmProcess(env=helpers.env_with())
  try:
    first = process.run([*digits, f'--workdir={tmp_path / "first"}'],
                        tmp_path / 'first.log')
    sent = time.monotonic()
    second = process.run([*digits, f'--workdir={tmp_path / "second"}'],
                         tmp_path / 'second.log')
    answered = time.monotonic()
  finally:
    assert process.close() == 0
  assert first == second == {'exit_code': 0}, (
      tmp_path / 'second.log').read_text()[-3000:]
  timing = helpers.read_results(tmp_path / 'second')['timing']
  print('timing of the second run:', timing, 'answered after',
        answered - sent)
  assert 0 < timing['first_step_seconds'] <= answered - sent
  phases = timing['start_up_seconds']
  assert list(phases) == sorted(['python', 'flags', 'tensorflow', 'ctl',
                                 'building', 'first_loop'])
  assert phases['python'] == 0  # Python had started before the run.
  assert sum(phases.values()) == pytest.approx(timing['first_step_seconds'])


def test_a_warm_process_refuses_what_needs_a_process_of_its_own(tmp_path):
  process = warm_client.WarmProcess(env=helpers.env_with())
  digits = (f'--config={helpers.DIGITS}:smoke', *DIGITS)
  tf_config = json.dumps({'cluster': {'worker': ['localhost:1', 'localhost:2']},
                          'task': {'type': 'worker', 'index': 0}})
  try:
    in_cluster = process.run([*digits, f'--workdir={tmp_path / "cluster"}'],
                             tmp_path / 'cluster.log',
                             env={'TF_CONFIG': tf_config})
    two_devices = process.run([*digits, f'--workdir={tmp_path / "devices"}'],
                              tmp_path / 'devices.log', cpu_devices=2)
    misspelt = process.run([*digits, '--config.nmu_epochs=1',
                            f'--workdir={tmp_path / "misspelt"}'],
                           tmp_path / 'misspelt.log')
  finally:
    assert process.close() == 0
  assert 'multi-worker run' in in_cluster['refused']
  assert 'Run it in a fresh process' in in_cluster['refused']
  assert '2 CPU device(s)' in two_devices['refused']
  assert misspelt == {'exit_code': 2}
  errors = [line for line in (tmp_path / 'misspelt.log').read_text()
            .splitlines() if line.startswith('ctl: error:')]
  assert len(errors) == 1 and 'nmu_epochs' in errors[0], errors
  for name in ('cluster', 'devices', 'misspelt'):
    assert not (tmp_path / name).exists()


def test_what_a_run_changes_in_its_process_is_put_back(tmp_path):
  # pylint: disable=g-import-not-at-top
  import keras
  import tensorflow as tf
  project = tmp_path / 'project'
  # A package no other test imports (a test before this one in the same
  # process may have imported the repo's `experiments`).
  (project / 'warm_probe_project').mkdir(parents=True)
  (project / 'warm_probe_project' / '__init__.py').write_text('')
  (project / 'warm_probe_project' / 'text.py').write_text('RELEASE = 1\n')
  before = (os.getcwd(), list(sys.path), dict(os.environ),
            signal.getsignal(signal.SIGTERM), keras.config.dtype_policy().name,
            keras.config.epsilon(), tf_internals.op_determinism_enabled(),
            list(logging.get_absl_handler().filters), random.getstate(),
            logging.get_absl_logger().level)
  with fresh_state.restored_after():
    os.chdir(project)
    sys.path.insert(0, str(project))
    os.environ['CTL_TEST_CHANGED'] = '1'
    signal.signal(signal.SIGTERM, lambda *_: None)
    keras.mixed_precision.set_global_policy('mixed_float16')
    keras.config.set_epsilon(0.1)
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(3)
    logging.get_absl_handler().addFilter(lambda record: True)
    logging.set_verbosity(logging.INFO)  # As ctl.main does.
    import warm_probe_project.text  # pylint: disable=unused-import
  after = (os.getcwd(), list(sys.path), dict(os.environ),
           signal.getsignal(signal.SIGTERM), keras.config.dtype_policy().name,
           keras.config.epsilon(), tf_internals.op_determinism_enabled(),
           list(logging.get_absl_handler().filters), random.getstate(),
           logging.get_absl_logger().level)
  assert after == before
  assert tf.compat.v1.get_seed(None) == (None, None)  # No global seed.
  assert 'warm_probe_project.text' not in sys.modules
  assert 'warm_probe_project' not in sys.modules


def test_a_run_s_traced_graphs_do_not_outlive_it():
  # tf.custom_gradient, traced, registers its gradient function (holding
  # the graph) in TensorFlow's global registry: ctl's L2 penalty kept each
  # warm run's step graphs, about 4 MB a run, for the process's life.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with fresh_state.restored_after():

    @tf.custom_gradient
    def square(x):
      return x * x, lambda upstream: upstream * 2.0 * x

    @tf.function
    def gradient(x):
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = square(x)
      return tape.gradient(y, x)

    assert float(gradient(tf.constant(3.0))) == 6.0
    graph = weakref.ref(
        gradient.get_concrete_function(tf.constant(3.0)).graph)
    del gradient, square
  gc.collect()
  assert graph() is None


def test_a_user_module_registering_a_gradient_imports_again_in_the_next_run(
    tmp_path):
  # The next run imports the module anew: TensorFlow refused a second
  # registration of the name ("Registering two gradient with name").
  (tmp_path / 'warm_probe_gradient.py').write_text(textwrap.dedent("""
      import tensorflow as tf

      @tf.RegisterGradient('WarmProbeSquare')
      def _gradient(op, upstream):
        return upstream * 2.0 * op.inputs[0]
      """))
  for _ in range(2):
    with fresh_state.restored_after():
      sys.path.insert(0, str(tmp_path))
      import warm_probe_gradient  # pylint: disable=g-import-not-at-top,unused-import
      assert 'WarmProbeSquare' in tf_internals.registered_gradients()
  assert 'WarmProbeSquare' not in tf_internals.registered_gradients()
  assert 'Square' in tf_internals.registered_gradients()  # TensorFlow's.


@pytest.mark.parametrize('name, kept', [
    ('json', True), ('numpy', True), ('ctl.warm', True),
    ('helpers', False)])
def test_the_modules_kept_are_ctl_s_and_the_installed_ones(name, kept):
  roots = fresh_state._kept_roots()  # pylint: disable=protected-access
  assert fresh_state._is_kept(sys.modules[name], roots) is kept  # pylint: disable=protected-access


def test_a_command_s_overrides_do_not_reach_the_next(capsys):
  # pylint: disable=g-import-not-at-top
  from ctl import main
  printed = []
  for overrides in (['--config.batch_size=7'], [], ['--config.batch_size=9'],
                    ['--config.batch_sise=7']):
    with fresh_state.restored_after():
      code = main.run_in_process(['ctl.main', f'--config={helpers.DIGITS}',
                                  *overrides, '--print_config'])
    output = capsys.readouterr()
    printed.append((code, [line for line in output.out.splitlines()
                           if line.startswith('batch_size =')],
                    output.err.strip().splitlines()[-1:]))
  assert printed[0] == (0, ['batch_size = 7  # default: 64'], [])
  assert printed[1] == (0, ['batch_size = 32  # default: 64'], [])  # The file's.
  assert printed[2] == (0, ['batch_size = 9  # default: 64'], [])
  assert printed[3][0] == 2 and 'batch_sise' in printed[3][2][0], printed[3]
