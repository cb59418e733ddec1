"""Finds builders by name: a built-in one, or a user's `package.module:function`."""

import importlib
from collections.abc import Callable, Mapping

from ctl import errors


def resolve(name: str, builtins: Mapping[str, Callable | str],
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


def _imported(name: str, what: str) -> Callable:
  """The callable `package.module:function` names, imported."""
  module_name, _, attribute = name.partition(':')
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
