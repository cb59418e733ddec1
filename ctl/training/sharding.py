"""Variables sharded over the parameter servers (distribution.min_shard_bytes).

With min_shard_bytes set, TensorFlow's ParameterServerStrategy splits each
variable over that size by rows, a shard on each of up to every server
(ctl/cluster/ps_cluster.py builds the partitioner). What a task can do with
such a variable depends on who holds it (BUILD.md, "Parameter servers"):

- a plain tf.Variable (a task's attribute, or in a tf.Module of its own)
  trains, saves and exports: read with tf.nn.embedding_lookup, its
  gradients taken of its shards (`variables`) and applied by the task
  (experiments/recommend_sharded.py). A checkpoint of it restores onto any
  number of servers, or into one variable without a cluster.
- a Keras 3 variable cannot: Keras 3.15 fails on it at the gradient, the
  checkpoint and the SavedModel. `check_task` refuses it right after the
  task's build, naming it, instead of Keras's AttributeError in the first
  step.

`check_strategy` refuses min_shard_bytes where nothing would be sharded:
a run that is not on parameter servers.
"""

from collections.abc import Iterator
from typing import Any

from absl import logging
import keras
import ml_collections
import tensorflow as tf

from ctl import errors
from ctl import task as task_lib
from ctl.cluster import distribution

# Keras objects, whose variables are Keras variables: a sharded one is
# refused.
_KERAS_HOLDERS = (keras.layers.Layer, keras.optimizers.Optimizer,
                  keras.metrics.Metric)


def check_strategy(config: ml_collections.ConfigDict,
                   strategy: tf.distribute.Strategy | None,
                   role: distribution.Role) -> None:
  """Refuses distribution.min_shard_bytes in a run that is not on
  parameter servers (where no variable would be split).

  Args:
    config: the `distribution` section.
    strategy: the run's strategy; None for a parameter-server job's worker
      or server.
    role: this task's place in the job (the cluster's evaluator restores
      sharded checkpoints into whole variables: not refused).

  Raises:
    ConfigError: the run is not on parameter servers.
  """
  if (strategy is None or role.task_type == 'evaluator' or
      distribution.is_parameter_server(strategy)):
    return
  raise errors.ConfigError(
      f'distribution.min_shard_bytes={config.min_shard_bytes} shards '
      'variables over parameter servers, and this run has none '
      f'(distribution.strategy={config.strategy!r}): start it with '
      'parameter servers (ctl.launch --num_ps=K, or a TF_CONFIG with "ps" '
      'tasks), or set --config.distribution.min_shard_bytes=0 to train '
      'without sharding (a sharded checkpoint restores into it).')


def check_task(task: task_lib.Task, config: ml_collections.ConfigDict) -> None:
  """Refuses a Keras variable TensorFlow sharded, and logs the variables
  that are sharded and where their shards are.

  Args:
    task: the task, just built under the parameter-server strategy.
    config: the `distribution` section.

  Raises:
    ConfigError: naming the Keras variables that were sharded.
  """
  keras_sharded, sharded = [], []
  for path, variable in _variables(task, type(task).__name__):
    held = variable.value if isinstance(variable, keras.Variable) else variable
    shards = shards_of(held)
    if shards:
      (keras_sharded if held is not variable else sharded).append(
          (path, shards))
  if keras_sharded:
    raise errors.ConfigError(_keras_refusal(keras_sharded, config))
  for path, shards in sharded:
    logging.info('Sharded over the servers: %s, %s', path, ', '.join(
        f'{shard.shape[0]} rows on {_server(shard)}' for shard in shards))


def shards_of(value: Any) -> list[tf.Variable] | None:
  """The shards of a variable TensorFlow split over the servers; None for
  anything else.

  A split variable is a ShardedVariable
  (tensorflow/python/distribute/sharded_variable.py, whose class is not in
  TensorFlow's public API): not a tf.Variable, its shards in `variables`.
  """
  # Lists and dicts a tf.Module tracks have `variables` too.
  if isinstance(value, (tf.Variable, tf.Module, list, tuple, dict,
                        *_KERAS_HOLDERS)):
    return None
  shards = getattr(value, 'variables', None)
  return list(shards) if isinstance(shards, (list, tuple)) and shards else None


def _variables(value: Any, path: str,
               seen: set[int] | None = None) -> Iterator[tuple[str, Any]]:
  """(where, variable) for every variable the task holds: its attributes,
  in lists, dicts and tf.Modules, and the variables of its Keras objects."""
  seen = set() if seen is None else seen
  if id(value) in seen:
    return
  seen.add(id(value))
  if isinstance(value, _KERAS_HOLDERS):
    for variable in value.variables:
      yield f'{path} ({variable.path})', variable
  elif isinstance(value, (keras.Variable, tf.Variable)) or shards_of(value):
    yield path, value
  elif isinstance(value, dict):
    for key, item in value.items():
      yield from _variables(item, f'{path}[{key!r}]', seen)
  elif isinstance(value, (list, tuple)):
    for index, item in enumerate(value):
      yield from _variables(item, f'{path}[{index}]', seen)
  elif isinstance(value, tf.Module):
    for name, item in vars(value).items():
      if not name.startswith('_'):  # tf.Module's own tracking.
        yield from _variables(item, f'{path}.{name}', seen)


def _keras_refusal(found: list[tuple[str, list]],
                   config: ml_collections.ConfigDict) -> str:
  """The one-line refusal of Keras variables that were sharded."""
  named = ', '.join(f'{path} ({len(shards)} shards)'
                    for path, shards in found[:4])
  more = f' and {len(found) - 4} more' if len(found) > 4 else ''
  return (
      f'distribution.min_shard_bytes={config.min_shard_bytes} sharded the '
      f'Keras variable(s) {named}{more} over the parameter servers, and '
      'Keras 3 cannot train, save or export a sharded variable (its '
      'gradient, checkpoint and SavedModel fail). Hold such a table as a '
      'plain tf.Variable read with tf.nn.embedding_lookup '
      '(experiments/recommend_sharded.py), or raise '
      'distribution.min_shard_bytes above the largest Keras variable.')


def _server(shard: tf.Variable) -> str:
  """The server a shard lives on, as 'ps:1'."""
  device = tf.DeviceSpec.from_string(shard.device)
  return f'{device.job}:{device.task}' if device.job else shard.device
