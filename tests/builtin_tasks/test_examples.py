"""The example tasks in experiments/ train from their configs, and each does
what it shows: float targets learnt, clipping after the all-reduce and an
EMA evaluated, a GAN's two networks trained, and a tf.data pipeline of
variable-length text padded per batch. That the text pipeline stopped
mid-epoch resumes bit for bit is a case of
tests/training/test_resume_conformance.py.
"""

import sys, pathlib  # pylint: disable=g-multiple-import
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import json
import math
import subprocess

import numpy as np
import pytest

import helpers

EXAMPLES = ('regression', 'clip_ema', 'gan', 'text', 'mixed_precision',
            'recommend')


def _train(name: str, workdir: pathlib.Path) -> dict:
  """Trains configs/<name>.py:smoke in workdir; returns its results."""
  run = helpers.run_ctl(f'--config=configs/{name}.py:smoke',
                        f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  return helpers.read_results(workdir)


def _train_scalars(workdir: pathlib.Path) -> dict[str, list[float]]:
  """{tag: values in step order} of the training summaries."""
  return {tag: [value for _, value in sorted(points)]
          for tag, points in helpers.read_scalars(workdir / 'train').items()}


# The configs.


def _config_module(name: str):
  """configs/<name>.py, imported."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = helpers.REPO / 'configs' / f'{name}.py'
  spec = importlib.util.spec_from_file_location(f'configs_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('name', EXAMPLES)
def test_config_names_its_task_its_command_and_a_smoke_variant(name):
  module = _config_module(name)
  config, smoke = module.get_config(), module.get_config('smoke')
  assert config.task.partition(':')[0] == f'experiments.{name}'
  assert (helpers.REPO / 'experiments' / f'{name}.py').is_file()
  assert module.get_config.__doc__.startswith(
      f'python -m ctl.main --config=configs/{name}.py '
      f'--workdir=/tmp/ctl/{name}\n')
  assert smoke.to_dict() != config.to_dict()
  with pytest.raises(ValueError, match='Unknown variant'):
    module.get_config('nope')


# Each example trains.


@pytest.mark.slow
def test_regression_learns_the_function(tmp_path):
  results = _train('regression', tmp_path)
  assert results['step'] == 320
  # Predicting the mean scores MAE 0.70 and R² 0; the noise alone 0.08, 1.
  assert results['eval']['mae'] < 0.5
  assert results['eval']['r2'] > 0.5
  losses = _train_scalars(tmp_path)['loss']  # Each epoch's mean.
  assert losses[-1] < 0.8 * losses[0]


@pytest.mark.slow
def test_clip_ema_trains_and_evaluates_the_average(tmp_path):
  results = _train('clip_ema', tmp_path)
  assert results['eval']['accuracy'] > 0.9  # The EMA's; chance is 0.1.
  assert 0 < results['eval']['raw_accuracy'] <= 1
  scalars = _train_scalars(tmp_path)
  assert scalars['loss'][-1] < scalars['loss'][0]
  # Early gradients are larger than the clip norm: some steps were clipped.
  assert max(scalars['clipped']) > 0 and min(scalars['gradient_norm']) > 0


@pytest.mark.slow
def test_gan_trains_both_networks(tmp_path):
  results = _train('gan', tmp_path)
  scalars = _train_scalars(tmp_path)
  for name in ('discriminator_loss', 'generator_loss'):
    assert scalars[name] and all(map(math.isfinite, scalars[name])), name
  evaluation = results['eval']
  # The untrained generator's samples lie near the centre, about 1.8 from
  # the ring's modes; a few hundred steps bring them out towards it.
  assert evaluation['mean_distance'] < 1.3
  assert 0 <= evaluation['good_samples'] <= 1
  assert 0 <= evaluation['modes_covered'] <= 8


@pytest.mark.slow
def test_text_classifier_learns_from_batches_padded_per_batch(tmp_path):
  results = _train('text', tmp_path)
  assert results['step'] == 100
  assert results['eval']['accuracy'] > 0.9  # Chance is about 0.5.
  scalars = _train_scalars(tmp_path)
  assert scalars['loss'][-1] < 0.5 * scalars['loss'][0]
  # Padded to each batch's longest sentence, not to the longest possible.
  max_length = helpers.load_config('text', 'smoke').data.max_length
  assert max(scalars['padded_length']) < max_length


# What the examples show.


def test_text_pipeline_pads_per_batch_and_is_the_same_each_time(monkeypatch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  monkeypatch.syspath_prepend(str(helpers.REPO))  # As ctl.main finds it.
  from experiments import text  # pylint: disable=g-import-not-at-top
  config = helpers.load_config('text', 'smoke')
  context = tf.distribute.InputContext(num_input_pipelines=1,
                                       input_pipeline_id=0,
                                       num_replicas_in_sync=2)

  def first_batches():
    return list(text.TextClassifier(config).train_data(context).take(8))

  batches = first_batches()
  widths = set()
  for features, labels in batches:
    assert features['tokens'].dtype == tf.int32
    assert features['tokens'].shape[0] == labels.shape[0] == 16  # Per replica.
    # Each batch is as wide as its longest sentence, padded with 0.
    lengths = features['length'].numpy()
    assert features['tokens'].shape[1] == lengths.max()
    real = np.arange(lengths.max()) < lengths[:, None]
    assert (features['tokens'].numpy()[~real] == text.PADDING).all()
    assert (features['tokens'].numpy()[real] != text.PADDING).all()
    widths.add(int(lengths.max()))
  assert len(widths) > 1
  for (features, labels), (again, again_labels) in zip(batches,
                                                       first_batches()):
    np.testing.assert_array_equal(features['tokens'], again['tokens'])
    np.testing.assert_array_equal(labels, again_labels)


# Run in a fresh process: the CPU is split in two before TensorFlow starts
# (two replicas in one process), or one process per worker (TF_CONFIG set).
_CLIP_AFTER_ALL_REDUCE = '''
import json
import os
import tensorflow as tf

WORKER = (json.loads(os.environ['TF_CONFIG'])['task']['index']
          if 'TF_CONFIG' in os.environ else None)
if WORKER is None:
  [cpu] = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import ctl
from ctl import config as config_lib
from experiments import clip_ema


class KnownGradients(clip_ema.ClipEma):
  """The example's steps on a model whose loss gradient is its input."""

  def build_model(self):
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer='zeros')])

  def per_example_loss(self, labels, logits):
    del labels
    return logits[:, 0]  # x . w, whose gradient is x.


config = config_lib.load('configs/clip_ema.py', {
    'batch_size': 2, 'optimizer.learning_rate': 0.1,
    'optimizer.momentum': 0.0, 'optimizer.clip_norm': 1.0,
    'ema.decay': 0.99})
strategy = (tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
            if WORKER is None else tf.distribute.MultiWorkerMirroredStrategy())
task = KnownGradients(config)
with strategy.scope():
  task.build()


def per_replica(rows):
  """rows[r] as replica r's batch of one example, with a dummy label."""
  return strategy.experimental_distribute_values_from_function(
      lambda context: (tf.constant([rows[context.replica_id_in_sync_group]]),
                       tf.constant([0]))) if WORKER is None else (
          tf.constant([rows[WORKER]]), tf.constant([0]))


def context(training):
  return ctl.StepContext(global_batch_size=2, step=tf.constant(0), seed=0,
                         training=training)


@tf.function(autograph=False)
def train(batch):
  return strategy.run(lambda b: task.train_step(b, context(True)),
                      args=(batch,))


@tf.function(autograph=False)
def evaluate(batch):
  return strategy.run(lambda b: task.eval_step(b, context(False)),
                      args=(batch,))


# Divided by the global batch of 2, replica 0's gradient is [3, 0] and
# replica 1's [0, 4].
logs = train(per_replica([[6.0, 0.0], [0.0, 8.0]]))
eval_logs = evaluate(per_replica([[1.0, 1.0], [1.0, 1.0]]))


def local(value):
  return [v.numpy().tolist() for v in strategy.experimental_local_results(value)]


print('RESULT ' + json.dumps({
    'weights': local(task.model.weights[0].value),
    'ema': local(task.ema_model.weights[0].value),
    'logs': {name: local(value) for name, value in logs.items()},
    'eval_loss': local(eval_logs['loss']),
}))
'''

def _clip_ema_results(topology):
  """Each process's RESULT: one of two replicas, or of two workers (each
  process's lists then hold its one replica's values)."""
  envs = ([helpers.env_with()] if topology == 'two_replicas' else
          helpers.cluster_envs(2))
  runs = [subprocess.Popen([sys.executable, '-c', _CLIP_AFTER_ALL_REDUCE],
                           cwd=helpers.REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for env in envs]
  results = []
  for run in runs:
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr[-3000:]
    [line] = [line for line in stdout.splitlines()
              if line.startswith('RESULT ')]
    results.append(json.loads(line.removeprefix('RESULT ')))
  return {key: ({name: sum((r[key][name] for r in results), [])
                 for name in results[0][key]} if key == 'logs' else
                sum((r[key] for r in results), []))
          for key in results[0]}


@pytest.mark.slow
@pytest.mark.parametrize('topology', ['two_replicas', 'two_workers'])
def test_clip_ema_clips_the_sum_of_two_replicas_and_evaluates_the_ema(
    topology):
  result = _clip_ema_results(topology)

  learning_rate = 0.1
  # The sum [3, 4] has norm 5, clipped to 1: [0.6, 0.8]. Clipping each
  # replica's share first would give [1, 0] + [0, 1] = [1, 1].
  clipped_sum = -learning_rate * np.array([[0.6], [0.8]])
  clipped_parts = -learning_rate * np.array([[1.0], [1.0]])
  for weights in result['weights']:  # Each replica's copy.
    np.testing.assert_allclose(weights, clipped_sum, rtol=1e-6)
    assert not np.allclose(weights, clipped_parts)
  for name, value in (('gradient_norm', 5.0), ('clipped', 1.0)):
    np.testing.assert_allclose(result['logs'][name], [value, value],
                               rtol=1e-6, err_msg=name)

  # The first step's decay is 0.1 (the warm-up): the average moved 0.9 of
  # the way from the initial zeros, not all the way.
  for ema in result['ema']:
    np.testing.assert_allclose(ema, 0.9 * clipped_sum, rtol=1e-6)
    assert not np.allclose(ema, clipped_sum)
  # eval_step's loss is x . w of the average's weights, for x = [1, 1].
  np.testing.assert_allclose(result['eval_loss'],
                             [0.9 * clipped_sum.sum()] * 2, rtol=1e-6)

