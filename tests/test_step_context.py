"""ctx.apply: Keras's own sum in float32, the sum first otherwise (a
LossScaleOptimizer checks it; a 16-bit all-reduce sends it), on two
replicas of a MirroredStrategy in a process of its own (two logical CPUs
must be set before TensorFlow starts)."""

import json
import subprocess
import sys

import pytest

import helpers

# Each case: fresh weights [0, 1], replica 1's gradient [inf or 1e-8, 1]
# and replica 0's [1e-8, 1], applied once by ctx.apply.
_APPLY_ON_TWO_REPLICAS = '''
import json
import tensorflow as tf
[cpu] = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import ctl
strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])


def case(loss_scale, all_reduce_dtype, overflow):
  with strategy.scope():
    weights = tf.Variable([0.0, 1.0])
    optimizer = keras.optimizers.SGD(0.5)
    if loss_scale:
      optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build([weights])

  def step():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    tiny = float('inf') if overflow else 1e-8
    gradient = tf.where(tf.equal(replica, 1), [tiny, 1.0], [1e-8, 1.0])
    ctx = ctl.StepContext(global_batch_size=2, step=tf.constant(0), seed=0,
                          training=True, all_reduce_dtype=all_reduce_dtype)
    ctx.apply(optimizer, [(gradient, weights)])

  tf.function(lambda: strategy.run(step))()
  return {'weights': [float(w) for w in weights.numpy()],
          'iterations': int(optimizer.iterations.numpy())}


print(json.dumps({
    'keras_sum': case(False, 'float32', False),
    'float16_sum': case(False, 'float16', False),
    'loss_scale_overflow': case(True, 'float32', True),
}))
'''


def test_apply_sums_as_the_optimizer_and_all_reduce_dtype_need():
  run = subprocess.run([sys.executable, '-c', _APPLY_ON_TWO_REPLICAS],
                       capture_output=True, text=True, timeout=300,
                       cwd=helpers.REPO, env=helpers.env_with())
  assert run.returncode == 0, run.stderr[-3000:]
  cases = json.loads(run.stdout.splitlines()[-1])
  # float32: Keras sums over the replicas (1e-8 twice kept), once.
  assert cases['keras_sum']['weights'][0] == pytest.approx(-0.5 * 2e-8)
  assert cases['keras_sum']['weights'][1] == 0.0  # 1 - 0.5 * (1 + 1).
  assert cases['keras_sum']['iterations'] == 1
  # float16: the sum sent in 16 bits, where 1e-8 is 0.
  assert cases['float16_sum'] == {'weights': [0.0, 0.0], 'iterations': 1}
  # A loss scale checks the sum: replica 1's inf skips the step everywhere
  # (Keras's own check of replica 0's gradients would apply it).
  assert cases['loss_scale_overflow'] == {'weights': [0.0, 1.0],
                                          'iterations': 0}
