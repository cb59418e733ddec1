"""The checks a config must pass, how two configs differ, the builders a
config names found (`resolve_builder`: a built-in one, or a user's
`package.module:function`), and the fields a config file of an earlier
release lacks, filled in as it loads.

ctl/config.py loads a config (its fields, the flags) and names these too
(`config.validate`, ...), as callers have always called them.

A config starts from `base_config()` or `classification_config()`, which
bring every field ctl added since; but the built-in TFRecord and TFDS
tasks read a section the config file writes itself (`config.data.tfrecord`,
`config.data.tfds`), and a file of an earlier release lacks the fields
those sections gained. They are added, with their defaults, as the file is
loaded and before `--config.*` overrides apply (`define_config_file`), so
that an override of one works too; a CtlDeprecationWarning names them.
"""

from collections.abc import Callable, Mapping
import importlib
from typing import Any

from absl import flags
import ml_collections
from ml_collections import config_flags

from ctl import errors

STRATEGIES = ('auto', 'default', 'one_device', 'mirrored', 'multi_worker',
              'parameter_server')
CLUSTER_RESOLVERS = ('auto', 'tf_config', 'slurm')
COLLECTIVES = ('AUTO', 'RING', 'NCCL')
SCHEDULES = ('constant', 'cosine', 'linear')
DTYPE_POLICIES = ('float32', 'mixed_float16', 'mixed_bfloat16')
ALL_REDUCE_DTYPES = ('float32', 'bfloat16', 'float16')
JIT_COMPILES = ('auto', 'off', 'step', 'loop')
BEST_MODES = ('max', 'min')


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first field that cannot work.

  Fields a task's config does not have (a task of your own needs no
  `model` section) are not checked.
  """
  check_type(config)
  for key, value in leaves(config.to_dict()).items():
    check_utf8(f'config.{key}', value)
  if not config.task:
    raise errors.ConfigError(
        "Set config.task: 'classification', or your own ctl.Task subclass as "
        "'package.module:ClassName'.")
  _check_choice(config, 'distribution.strategy', STRATEGIES)
  _check_choice(config, 'distribution.cluster_resolver', CLUSTER_RESOLVERS)
  _check_choice(config, 'distribution.collective', COLLECTIVES)
  _check_choice(config, 'optimizer.schedule', SCHEDULES)
  _check_choice(config, 'model.dtype_policy', DTYPE_POLICIES)
  _check_choice(config, 'distribution.all_reduce_dtype', ALL_REDUCE_DTYPES)
  _check_choice(config, 'jit_compile', JIT_COMPILES)
  _check_choice(config, 'evaluation.best_mode', BEST_MODES)
  _check_choice(config, 'early_stopping.mode', BEST_MODES)
  for key in ('batch_size', 'accumulate_steps', 'steps_per_loop',
              'intervals.keep_checkpoints',
              'early_stopping.patience', 'rollback.window'):
    _check(config, key, lambda value: value >= 1, 'must be at least 1')
  for key in ('eval_batch_size', 'num_epochs', 'steps_per_epoch',
              'total_steps', 'optimizer.warmup_steps', 'intervals.log_steps',
              'intervals.summary_steps', 'intervals.eval_steps',
              'intervals.checkpoint_steps', 'intervals.checkpoint_epochs',
              'intervals.checkpoint_secs', 'distribution.bytes_per_pack',
              'distribution.timeout_seconds',
              'distribution.startup_timeout_seconds', 'profile.start_step',
              'evaluation.timeout_seconds', 'rollback.max_rollbacks',
              'rollback.factor', 'distribution.min_shard_bytes',
              'distribution.slurm_num_ps', 'profile.num_steps'):
    _check(config, key, lambda value: value >= 0, 'must not be negative')
  for key in ('optimizer.learning_rate', 'diagnostics.straggler_seconds'):
    _check(config, key, lambda value: value > 0, 'must be positive')
  _check(config, 'diagnostics.straggler_factor',
         lambda value: value == 0 or value > 1,
         'must be above 1 (or 0: no straggler check)')
  _check(config, 'optimizer.ema_momentum', lambda value: 0 <= value < 1,
         'must be in [0, 1)')
  _check(config, 'data.eval_fraction', lambda value: 0 < value < 1,
         'must be between 0 and 1')
  _check(config, 'model.dropout', lambda value: 0 <= value < 1,
         'must be in [0, 1)')
  if config.num_epochs == 0 and config.total_steps == 0:
    raise errors.ConfigError(
        'Set num_epochs or total_steps: both are 0, so there is nothing to '
        'train.')
  check_run_length(config, config.get('steps_per_epoch') or 1)
  if _get(config, 'distribution.strategy') == 'parameter_server':
    check_parameter_server(config)


def check_parameter_server(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for what parameter-server training cannot do: the
  workers update the variables asynchronously, each step on its own
  worker, in an order no run can repeat."""
  if config.get('deterministic'):
    raise errors.ConfigError(
        "config.deterministic=True cannot work with distribution.strategy="
        "'parameter_server': the workers update the weights asynchronously, "
        'in an order (and with data) no run can repeat. Set '
        "config.deterministic=False, or use another strategy.")
  if config.get('jit_compile') in ('step', 'loop'):
    raise errors.ConfigError(
        f'config.jit_compile={config.jit_compile!r} cannot work with '
        "distribution.strategy='parameter_server' yet: a step reads and "
        "writes variables on the servers. Use 'off' or 'auto'.")
  if config.get('accumulate_steps', 1) > 1:
    raise errors.ConfigError(
        f'config.accumulate_steps={config.accumulate_steps} cannot work with '
        "distribution.strategy='parameter_server' yet: set it to 1 (each "
        'worker applies its own steps; a larger batch_size does what '
        'accumulation would).')


# TensorFlow counts steps and numbers examples in 64-bit integers.
INT64_MAX = 2**63 - 1


def check_run_length(config: ml_collections.ConfigDict,
                     steps_per_epoch: int) -> None:
  """Raises ConfigError when the run's steps or examples do not fit in
  int64 (TensorFlow's step counter and example numbers would overflow).

  Args:
    config: the whole config (num_epochs, total_steps, batch_size).
    steps_per_epoch: the epoch's length, as far as it is known (from the
      data, or at least 1 before it is read).
  """
  batch_size = config.get('batch_size') or 1
  total_steps = (config.get('total_steps') or
                 (config.get('num_epochs') or 0) * steps_per_epoch)
  for steps, what in ((steps_per_epoch, 'an epoch'), (total_steps, 'the run')):
    if steps * batch_size > INT64_MAX:
      raise errors.ConfigError(
          f'{what.capitalize()} would take {steps} steps of '
          f'config.batch_size={batch_size} examples: more than the '
          f'{INT64_MAX} examples TensorFlow can number (int64). Lower '
          'config.num_epochs, config.total_steps or config.steps_per_epoch.')


def check_type(config: Any) -> None:
  """Raises ConfigError unless a config file's get_config() gave a ConfigDict."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise errors.ConfigError(
        f'get_config() returned a {type(config).__name__}; it must return an '
        'ml_collections.ConfigDict: start from ctl.base_config() (or '
        'ctl.classification_config()) and set its fields.')


def check_utf8(name: str, value: Any) -> None:
  """Raises ConfigError if a text value (or one in a tuple) is not UTF-8.

  A byte the shell passed that is not UTF-8 arrives as a lone surrogate
  ('\\udcff'), which TensorFlow's file and string functions cannot encode.
  """
  for text in value if isinstance(value, (tuple, list)) else [value]:
    if not isinstance(text, str):
      continue
    try:
      text.encode('utf-8')
    except UnicodeEncodeError:
      raise errors.ConfigError(
          f'{name}={_shown_bytes(text)} is not UTF-8 text: TensorFlow takes '
          'paths and text in UTF-8 only. Rename the file or folder, or pass '
          'the value in UTF-8.') from None


def _shown_bytes(text: str) -> str:
  """The bytes the shell passed, as b'...'; the text's repr if it cannot say."""
  try:
    return repr(text.encode('utf-8', 'surrogateescape'))
  except UnicodeEncodeError:  # A surrogate that no byte decoded to.
    return repr(text)


def differences(old: dict, new: dict) -> list[str]:
  """Returns 'key: old -> new' for each leaf that differs between two configs.

  Both are plain dicts as read from JSON (`json.loads(config.to_json())`).
  """
  old_leaves, new_leaves = leaves(old), leaves(new)
  return [
      f'{key}: {old_leaves.get(key)!r} -> {new_leaves.get(key)!r}'
      for key in sorted(old_leaves.keys() | new_leaves.keys())
      if old_leaves.get(key) != new_leaves.get(key)
  ]


def leaves(tree: dict, prefix: str = '') -> dict:
  """Flattens nested dicts to {'a.b': value}."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(leaves(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def _get(config: ml_collections.ConfigDict, dotted_key: str):
  """Returns config.a.b for dotted_key 'a.b'; _MISSING if it has none."""
  value = config
  for part in dotted_key.split('.'):
    if part not in value:
      return _MISSING
    value = value[part]
  return value


_MISSING = object()


def _check(config, key, is_valid, requirement):
  value = _get(config, key)
  if value is not _MISSING and not is_valid(value):
    raise errors.ConfigError(f'config.{key}={value!r} {requirement}.')


def _check_choice(config, key, choices):
  _check(config, key, lambda value: value in choices,
         f'must be one of {list(choices)}')


# For each built-in task that reads a section of the config file's own:
# the section, and the fields it gained since 0.1.0 with their defaults.
ADDED_FIELDS = {
    'tfrecord_classification': ('data.tfrecord',
                                {'order': 'global', 'partitions': 0}),
    'tfds_classification': ('data.tfds', {'order': 'global', 'partitions': 0}),
}


def define_config_file(name: str, help_string: str, *,
                       flag_values: flags.FlagValues, sys_argv: list | None):
  """ml_collections' DEFINE_config_file (locked), whose file, once loaded,
  gets the fields it lacks before the overrides apply."""
  holder = config_flags.DEFINE_config_file(
      name, None, help_string, flag_values=flag_values, lock_config=True,
      sys_argv=sys_argv)
  flag = flag_values[name]
  flag.parser = FillingParser(flag.parser)
  return holder


class FillingParser(flags.ArgumentParser):
  """--config's parser: ml_collections' own, then the missing fields."""

  def __init__(self, parser: flags.ArgumentParser):
    self._parser = parser

  def parse(self, argument):
    """The config file's get_config(), with the fields it lacks added."""
    config = self._parser.parse(argument)
    if isinstance(config, ml_collections.ConfigDict):
      add_missing_fields(config, str(argument).split(':', 1)[0])
    return config

  def flag_type(self) -> str:
    return self._parser.flag_type()


def add_missing_fields(config: ml_collections.ConfigDict, source: str) -> None:
  """Adds the fields its built-in task's section lacks; warns naming them."""
  section_key, defaults = ADDED_FIELDS.get(config.get('task'), ('', {}))
  section = _section(config, section_key)
  missing = {key: value for key, value in defaults.items()
             if section is not None and key not in section}
  if not missing:
    return
  with section.unlocked():
    section.update(missing)
  message = (
      f'config.{section_key} has no {", ".join(missing)} (fields of ctl '
      '0.2.0, which a config of an earlier release lacks): they default to '
      f'{", ".join(f"{key}={value!r}" for key, value in missing.items())}.')
  if 'order' in missing:
    message += (" With order='global' the batches differ from ctl 0.1.0's; "
                f'--config.{section_key}.order=by_file reads each worker\'s '
                'own files as 0.1.0 did.')
  message += ' Set them in the config file to say which.'
  # At the file's first line (it has no line of its own to show).
  errors.warn_deprecated(message, source, 0, __name__)


def _section(config: ml_collections.ConfigDict,
             dotted_key: str) -> ml_collections.ConfigDict | None:
  """config.a.b for 'a.b' if it is a section; None otherwise."""
  value = config
  for part in dotted_key.split('.'):
    if not isinstance(value, ml_collections.ConfigDict) or part not in value:
      return None
    value = value[part]
  return value if isinstance(value, ml_collections.ConfigDict) else None


def resolve_builder(name: str, builtins: Mapping[str, Callable | str],
            what: str) -> Callable:
  """Returns the builder called `name`.

  Args:
    name: a key of `builtins`, or `package.module:function` naming a user's
      callable (importable from the current directory or the installed
      packages).
    builtins: the built-in builders by name, each a callable or its own
      `package.module:function`, imported only when named.
    what: what the builder builds, for error messages ("model", "dataset").

  Raises:
    ConfigError: when the name is unknown or cannot be imported.
  """
  if name in builtins:
    builtin = builtins[name]
    return _imported(builtin, what) if isinstance(builtin, str) else builtin
  module_name, colon, attribute = name.partition(':')
  if not colon or not module_name or not attribute:
    raise errors.ConfigError(
        f'Unknown {what} {name!r}: use one of {sorted(builtins)} or '
        "'package.module:function' for your own.")
  return _imported(name, what)


_MOVED = {f'ctl.builtin_tasks.{old}': 'ctl.builtin_tasks.classification'
          for old in ('models', 'optimizers', 'losses', 'metrics')}  # Before.


def _imported(name: str, what: str) -> Callable:
  """The callable `package.module:function` names, imported."""
  module_name, _, attribute = name.partition(':')
  if module_name in _MOVED:
    module_name = _MOVED[module_name]
    errors.warn_deprecated(
        f'{what} {name!r}: that module is now {module_name}: write '
        f"'{module_name}:{attribute}' (or the builder's short name).",
        '<config>', 0, __name__)
  try:
    module = importlib.import_module(module_name)
  except ImportError as error:
    raise errors.ConfigError(
        f'Cannot import module {module_name!r} named by {what} {name!r}: '
        f'{error}') from error
  builder = getattr(module, attribute, None)
  if not callable(builder):
    raise errors.ConfigError(
        f'Module {module_name!r} has no function {attribute!r} '
        f'(named by {what} {name!r}).')
  return builder
