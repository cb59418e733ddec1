"""ctl's imports go one way: from the commands down to the errors, never
up, and no module imports itself through others (BUILD.md, "Layout"); a
default run imports no code it does not need (TFRecord, TFDS, export)."""

import ast
import json
import pathlib
import subprocess
import sys

import helpers

PACKAGE = helpers.REPO / 'ctl'
# Each part of ctl and its layer: a part imports only parts of lower layers.
LAYERS = {
    'errors': 0,
    'config_checks': 1,
    'config': 2, 'actions': 2, 'storage': 2,
    'config_help': 3, 'runtime': 3, 'data': 3, 'hyper': 3,
    'step_context': 4, 'metric_writers': 4,
    'task': 5, 'cluster': 5,
    'checkpoints': 6,
    'builtin_tasks': 6, 'task_hooks': 6,
    'training': 7,
    'serving': 8,
    'modes': 9, 'launch': 9, 'sweep': 9, 'status': 9,
    'main': 10,
    'warm': 11,
}


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imports(path: pathlib.Path) -> set[str]:
  """The ctl modules a file imports (a `from ctl.x import y` names ctl.x.y
  when y is a module)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith(
        'ctl'):
      for alias in node.names:
        name = f'{node.module}.{alias.name}'
        found.add(name if _exists(name) else node.module)
    elif isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names
                if alias.name.startswith('ctl')}
  return found


def _exists(module: str) -> bool:
  path = PACKAGE.parent / module.replace('.', '/')
  return path.with_suffix('.py').exists() or path.is_dir()


def _graph() -> dict[str, set[str]]:
  return {_module(path): _imports(path) - {_module(path)}
          for path in PACKAGE.rglob('*.py')}


def _part(module: str) -> str:
  return module.split('.')[1] if '.' in module else 'ctl'


def test_every_part_has_a_layer():
  assert {_part(module) for module in _graph()} - {'ctl'} == set(LAYERS)


def test_imports_go_down_the_layers():
  upward = sorted(
      f'{module} imports {imported}'
      for module, imports in _graph().items() for imported in imports
      # `import ctl` (the package, for ctl.IMPORT_TIME) imports nothing.
      if imported != 'ctl' and _part(module) != 'ctl' and
      _part(imported) != _part(module) and
      LAYERS[_part(imported)] >= LAYERS[_part(module)])
  assert not upward


def test_no_module_imports_itself_through_others():
  graph = _graph()
  state = {}

  def cycle_from(module, path):
    state[module] = 'open'
    for imported in sorted(graph.get(module, ())):
      if state.get(imported) == 'open':
        return path[path.index(imported):] + [imported]
      if imported in graph and imported not in state:
        found = cycle_from(imported, path + [imported])
        if found:
          return found
    state[module] = 'done'
    return None

  for module in sorted(graph):
    if module not in state:
      assert cycle_from(module, [module]) is None


# Built, and its training input made, as a run of configs/digits.py does.
_BUILD_THE_DEFAULT_TASK = '''
import json
import sys
import tensorflow as tf
from ctl import config as config_lib
from ctl.data import inputs
from ctl.training import assemble
from ctl import modes  # What `python -m ctl.main` runs.
from ctl.training import steps
strategy = tf.distribute.get_strategy()
built = assemble.assemble_locally(config_lib.load('configs/digits.py'),
                                  strategy)
inputs.train_input(strategy, built.train_data, seed=0, length=built.length,
                   pad_loops_to=None, num_local_replicas=1,
                   context=built.context)
print(json.dumps(sorted(sys.modules)))
'''
# What a task that reads no files, or a run that exports nothing, does not
# need: imported only when a config names such a task.
_NOT_NEEDED = (
    'tensorflow_datasets', 'ctl.data.tfds', 'ctl.data.tfrecord',
    'ctl.data.tfrecord_files', 'ctl.data.write_tfrecords',
    'ctl.data.global_batches', 'ctl.builtin_tasks.tfrecord_classification',
    'ctl.builtin_tasks.tfds_classification', 'ctl.builtin_tasks.keras_model',
    'ctl.serving.export')


def test_the_default_task_imports_no_file_or_export_code():
  run = subprocess.run([sys.executable, '-c', _BUILD_THE_DEFAULT_TASK],
                       capture_output=True, text=True, timeout=300,
                       cwd=helpers.REPO, env=helpers.env_with())
  assert run.returncode == 0, run.stderr[-3000:]
  imported = set(json.loads(run.stdout.splitlines()[-1]))
  assert 'ctl.builtin_tasks.classification' in imported  # It ran.
  assert sorted(imported & set(_NOT_NEEDED)) == []
