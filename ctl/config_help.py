"""Prints a resolved config with each field's comment from ctl/config.py.

`python -m ctl.main --config=configs/digits.py --print_config` shows every
field a run would use, what it means, and where it differs from the
default. The comments are read from ctl/config.py's source, so they are
written once, beside the defaults.
"""

import inspect
import io
import re
import tokenize

import ml_collections

from ctl import config as config_lib
from ctl import config_checks

# Built-in tasks whose configs start from classification_config().
_CLASSIFICATION_TASKS = ('classification', 'keras_model')
_ASSIGNMENT = re.compile(r'\s*config((?:\.\w+)+)\s*=')


def field_comments(config_functions) -> dict[str, str]:
  """{'optimizer.learning_rate': 'Peak learning rate.', ...} from the source
  of config functions (ctl/config.py's)."""
  source = ''.join(inspect.getsource(function)
                   for function in config_functions)
  trailing = _trailing_comments(source)
  comments, pending = {}, []
  for number, line in enumerate(source.splitlines(), start=1):
    stripped = line.strip()
    if stripped.startswith('#'):
      pending.append(stripped.lstrip('#').strip())
      continue
    match = _ASSIGNMENT.match(line)
    if match:
      text = ' '.join(pending + [trailing.get(number, '')]).strip()
      if text:
        comments[match.group(1)[1:]] = text
    pending = []
  return comments


def _trailing_comments(source: str) -> dict[int, str]:
  """{line number: comment} for comments after code on the same line."""
  found = {}
  tokens = tokenize.generate_tokens(io.StringIO(source).readline)
  for token in tokens:
    if token.type == tokenize.COMMENT and token.line.strip() != token.string:
      found[token.start[0]] = token.string.lstrip('#').strip()
  return found


def describe(config: ml_collections.ConfigDict) -> str:
  """The config as `key = value` lines, each under its comment.

  Defaults and comments are the built-in classification task's for its
  configs, else the framework's (base_config()) alone: a task's own
  fields are its config file's.
  """
  reference = config_lib.base_config
  if config.task in _CLASSIFICATION_TASKS:
    reference = config_lib.classification_config
  comments = field_comments([config_lib.base_config, reference])
  defaults = config_checks.leaves(reference().to_dict())
  lines, sections_seen = [], set()
  for key, value in config_checks.leaves(config.to_dict()).items():
    section = key.rpartition('.')[0]
    if section in comments and section not in sections_seen:
      lines.append(f'# {section}: {comments[section]}')
    sections_seen.add(section)
    if key in comments:
      lines.append(f'# {comments[key]}')
    line = f'{key} = {value!r}'
    if key in defaults and defaults[key] != value:
      line += f'  # default: {defaults[key]!r}'
    elif key not in defaults:
      line += '  # set by this config file (the task\'s own)'
    lines.append(line)
  return '\n'.join(lines)

