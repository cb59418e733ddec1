"""Export and ctl.load: a trained run served without ctl."""

import json
import subprocess
import sys

import numpy as np
import pytest

import ctl
from ctl.data import datasets
from ctl.training import run
import helpers

# Loads the SavedModel in a process that does not import ctl, predicts on
# raw digits (0..16, as scikit-learn ships them) and prints the accuracy.
_SERVE = '''
import sys
import numpy as np
import tensorflow as tf
saved_model, examples = sys.argv[1:]
data = np.load(examples)
serve = tf.saved_model.load(saved_model).signatures['serving_default']
out = serve(features=tf.constant(data['features'], tf.float32))
assert 'ctl' not in sys.modules
print('accuracy', np.mean(out['class'].numpy() == data['labels']))
'''


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('trained')
  config = helpers.digits(1)
  results = run.train_and_evaluate(config, str(workdir))
  return config, workdir, results


@pytest.mark.slow
def test_the_saved_model_serves_raw_digits_without_ctl(trained, tmp_path):
  config, workdir, _ = trained
  # --mode=export, as a user runs it, over the export training wrote.
  export = helpers.run_ctl(f'--config={helpers.DIGITS}', '--config.num_epochs=1',
                           f'--workdir={workdir}', '--mode=export',
                           timeout=300)
  assert export.returncode == 0, export.stderr[-3000:]
  info = json.loads((workdir / 'export' / 'export.json').read_text())
  best = json.loads((workdir / 'best' / 'best.json').read_text())
  assert (info['which'], info['step']) == ('best', best['step'])
  assert (workdir / 'export' / 'model.keras').exists()

  eval_split = datasets.load(config.data).eval
  assert eval_split.features.max() == 16  # Raw, as scikit-learn ships them.
  examples = tmp_path / 'examples.npz'
  np.savez(examples, features=eval_split.features, labels=eval_split.labels)
  served = subprocess.run(
      [sys.executable, '-c', _SERVE, str(workdir / 'export' / 'saved_model'),
       str(examples)], cwd=tmp_path, capture_output=True, text=True,
      timeout=300, env=helpers.env_with())
  assert served.returncode == 0, served.stderr[-3000:]
  accuracy = float(served.stdout.split('accuracy')[-1])
  assert accuracy == pytest.approx(best['eval']['accuracy'], abs=1e-6)


def test_ctl_load_restores_the_best_checkpoint_for_predict(trained):
  config, workdir, _ = trained
  best = json.loads((workdir / 'best' / 'best.json').read_text())
  loaded = ctl.load(str(workdir))
  assert loaded.step == best['step']
  eval_split = datasets.load(config.data).eval
  logits = loaded.model.predict(eval_split.features / 16, verbose=0)
  assert np.mean(logits.argmax(-1) == eval_split.labels) == pytest.approx(
      best['eval']['accuracy'], abs=1e-6)
  served = loaded.serve(eval_split.features.astype(np.float32))
  np.testing.assert_array_equal(served['class'].numpy(), logits.argmax(-1))

  latest = ctl.load(str(workdir), checkpoint='latest')
  assert latest.step == 44  # One epoch.


@pytest.mark.slow
def test_an_export_cut_short_by_a_kill_is_completed_by_the_same_command(
    tmp_path):
  workdir = tmp_path / 'run'
  command = helpers.ctl_command(f'--config={helpers.DIGITS}:smoke',
                                f'--workdir={workdir}')
  job = subprocess.Popen(command, cwd=helpers.REPO, env=helpers.env_with(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    # The export starts with its temporary folders in the workdir.
    helpers.wait_for_glob(workdir, '.export-*', job)
  finally:
    job.kill()
    job.wait()
  print('Killed with the export whole:', (workdir / 'export' /
                                            'export.json').exists())
  results = (workdir / 'results.json').read_text()
  rerun = helpers.run_ctl(f'--config={helpers.DIGITS}:smoke',
                          f'--workdir={workdir}')
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert 'Training already finished' in rerun.stderr
  exported = json.loads((workdir / 'export' / 'export.json').read_text())
  assert exported['which'] == 'best'
  assert (workdir / 'export' / 'saved_model' / 'saved_model.pb').exists()
  assert not list(workdir.glob('.export-*'))
  assert not list(workdir.glob('export.old-*'))
  assert (workdir / 'results.json').read_text() == results


def test_a_model_of_two_inputs_is_told_why_and_what_to_write(tmp_path):
  run = helpers.run_ctl('--config=tests/configs/noisy_regression.py',
                        '--config.task=faulty_tasks:TwoInputs',
                        '--config.total_steps=2', f'--workdir={tmp_path}')
  assert run.returncode == 0, run.stderr[-3000:]
  [warned] = [line for line in run.stderr.splitlines()
              if 'No SavedModel' in line]
  assert ('TwoInputs has no serving_signature() of its own and its model '
          'takes 2 inputs (left, right), and the default serves a model of '
          'one input: write one in TwoInputs, e.g. `def serving_signature('
          'self): return tf.function(lambda left, right: self.model([left, '
          "right], training=False), input_signature=[tf.TensorSpec([None, "
          "2], tf.float32, name='left'), tf.TensorSpec([None, 2], "
          "tf.float32, name='right')])`") in warned, warned
  assert (tmp_path / 'export' / 'model.keras').exists()
  assert not (tmp_path / 'export' / 'saved_model').exists()


def test_the_serving_signature_the_message_shows_serves_the_model():
  import faulty_tasks  # pylint: disable=g-import-not-at-top
  from ctl import task as task_lib  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  task = faulty_tasks.TwoInputs(helpers.load_config_file(
      helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'))
  task.build()
  example = task_lib.missing_signature(task).split('`')[1]
  namespace = {'tf': tf}
  exec(example, namespace)  # pylint: disable=exec-used
  signature = namespace['serving_signature'](task)
  left, right = tf.ones([3, 2]), tf.zeros([3, 2])
  np.testing.assert_allclose(signature(left, right),
                             task.model([left, right]), rtol=1e-6)
