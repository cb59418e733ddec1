"""Config files of earlier releases: the fields they lack, filled in.

A config starts from `base_config()` or `classification_config()`, which
bring every field ctl added since; but the built-in TFRecord and TFDS
tasks read a section the config file writes itself (`config.data.tfrecord`,
`config.data.tfds`), and a file of an earlier release lacks the fields
those sections gained. They are added, with their defaults, as the file is
loaded and before `--config.*` overrides apply, so that an override of one
works too; a CtlDeprecationWarning names them.
"""


from absl import flags
import ml_collections
from ml_collections import config_flags

from ctl import errors

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
