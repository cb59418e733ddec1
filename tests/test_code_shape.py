"""Every module of ctl/ reads whole: at most 350 lines, and every function
(methods and nested ones too) at most 60, config literals aside (issue 42:
"Small parts with seams")."""

import ast

import helpers

PACKAGE = helpers.REPO / 'ctl'
MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 60
# Functions that are a config's literal: one field a line, each with its
# comment, read as a table rather than as code.
CONFIG_LITERALS = {
    'ctl/config.py:base_config',
    'ctl/config.py:classification_config',
}
def _modules() -> dict[str, str]:
  """{path under the repository: source} of every module of ctl/."""
  return {str(path.relative_to(helpers.REPO)): path.read_text()
          for path in sorted(PACKAGE.rglob('*.py'))}


def _long_functions(path: str, source: str) -> list[str]:
  """The functions of a module over MAX_FUNCTION_LINES, literals aside."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      lines = node.end_lineno - node.lineno + 1
      if (lines > MAX_FUNCTION_LINES and
          f'{path}:{node.name}' not in CONFIG_LITERALS):
        found.append(f'{path}:{node.lineno} {node.name}: {lines} lines')
  return found


def test_no_module_over_350_lines():
  long_modules = [f'{path}: {len(source.splitlines())} lines'
                  for path, source in _modules().items()
                  if len(source.splitlines()) > MAX_MODULE_LINES]
  assert not long_modules, 'split these (one idea per module)'


def test_no_function_over_60_lines():
  long_functions = [found for path, source in _modules().items()
                    for found in _long_functions(path, source)]
  assert not long_functions, 'cut these into functions that read whole'


def test_the_lists_name_what_exists():
  paths = set(_modules())
  assert {name.partition(':')[0] for name in CONFIG_LITERALS} <= paths
