"""Every module of ctl/ reads whole: at most 350 lines, and every function
(methods and nested ones too) at most 60, config literals aside (issue 42:
"Small parts with seams"); every function, constructor and dataclass takes
at most 8 parameters, the public ctl.Action/ctl.Event API aside, and the
training loop's run reads in at most 40 lines; and the default run, one
device in one worker, runs few of them before its first checkpoint
(issue 49)."""

import ast
import json
import subprocess
import sys

import pytest

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
# The ctl modules that may run a function before the default run's first
# checkpoint save: 59 did with the cluster's machinery (watchdog, worker
# timings, input wait, stall meter, Slurm detection) in a one-worker run,
# 54 without it, 56 with the metric writers (one module a sink, and the
# run's choice of them). 35 (issue 49) once work the default run does not
# ask for is not called (a search's report, built-in actions no config
# field asks for, data positions of in-memory data, the SIGUSR1 dump until
# the signal comes) and pieces of one concept share its module (the
# process and its signals; the classification task and its parts by name;
# the report, its speed and the run's writers; ...). 36 with
# ctl/runtime/deferred_imports.py, which keeps Keras from importing
# scikit-learn and matplotlib with TensorFlow (a fifth to a quarter of the
# import).
MAX_MODULES_BEFORE_FIRST_SAVE = 36
MAX_PARAMETERS = 8
# The public API users' actions are written against (ctl.When's fields,
# ctl.Event's constructor): kept as they are, so that users' code runs.
PUBLIC_API = {
    'ctl/actions.py:When',
    'ctl/actions.py:Event.__init__',
}
# The training loop: train a loop of steps, then the work due, and again.
LOOP_RUN = ('ctl/training/loop.py', 'TrainLoop', 'run')
MAX_LOOP_RUN_LINES = 40


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


def _is_dataclass(node: ast.ClassDef) -> bool:
  """Whether a class is decorated @dataclass or @dataclasses.dataclass(...)."""
  for decorator in node.decorator_list:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if (getattr(target, 'attr', None) or getattr(target, 'id', None)) == (
        'dataclass'):
      return True
  return False


def _parameters(node) -> int:
  """A function's parameters, self, cls and *args/**kwargs counted too
  (self and cls not)."""
  arguments = node.args
  names = [argument.arg for argument in (
      *arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
  return (len([name for name in names if name not in ('self', 'cls')]) +
          bool(arguments.vararg) + bool(arguments.kwarg))


def _wide(path: str, source: str) -> list[str]:
  """The functions and dataclasses of a module with over MAX_PARAMETERS
  parameters (a dataclass: its fields), the public API aside."""
  found = []
  tree = ast.parse(source)
  scopes = [('', tree)]
  while scopes:
    prefix, scope = scopes.pop()
    for node in ast.iter_child_nodes(scope):
      name = f'{prefix}{getattr(node, "name", "")}'
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        count = _parameters(node)
        scopes.append((f'{name}.', node))
      elif isinstance(node, ast.ClassDef):
        count = (sum(isinstance(item, ast.AnnAssign) for item in node.body)
                 if _is_dataclass(node) else 0)
        scopes.append((f'{name}.', node))
      else:
        scopes.append((prefix, node))
        continue
      if count > MAX_PARAMETERS and f'{path}:{name}' not in PUBLIC_API:
        found.append(f'{path}:{node.lineno} {name}: {count} parameters')
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


def test_no_function_constructor_or_dataclass_over_8_parameters():
  wide = [found for path, source in _modules().items()
          for found in _wide(path, source)]
  assert not wide, 'group these options in small dataclasses named for them'


def test_the_counts_see_what_they_count():
  # The public API aside only: When has 9 fields, Event's constructor 10.
  source = _modules()['ctl/actions.py']
  assert [found.split()[1] for found in _wide('elsewhere.py', source)] == [
      'When:', 'Event.__init__:']
  assert _wide('ctl/actions.py', source) == []


def test_the_loops_run_reads_in_40_lines():
  path, owner, name = LOOP_RUN
  tree = ast.parse((helpers.REPO / path).read_text())
  [run] = [node for node in ast.walk(tree)
           if isinstance(node, ast.ClassDef) and node.name == owner
           for node in node.body
           if isinstance(node, ast.FunctionDef) and node.name == name]
  assert run.end_lineno - run.lineno + 1 <= MAX_LOOP_RUN_LINES


def test_the_lists_name_what_exists():
  paths = set(_modules())
  assert {name.partition(':')[0] for name in CONFIG_LITERALS} <= paths
  assert {name.partition(':')[0] for name in PUBLIC_API} <= paths


# Run as `python -c`: the default command, with every thread's calls
# profiled until the first checkpoint is saved (Checkpointer.save logs
# "Saved <path>"), then {ctl module: its first function run} and the
# threads that ran them written out, and the process ended. A module's or
# a class's body (no CO_OPTIMIZED flag), or a call made by the import
# system (a package's __getattr__ asked for a submodule), is importing,
# not running.
_MODULES_RUN = r'''
import inspect, json, logging, os, runpy, sys, threading
import ctl
PACKAGE = os.path.dirname(ctl.__file__) + os.sep
OUT = sys.argv[1]
run, threads = {}, set()
def profile(frame, event, arg):
  code = frame.f_code
  if (event == 'call' and code.co_filename.startswith(PACKAGE) and
      code.co_flags & inspect.CO_OPTIMIZED and
      not frame.f_back.f_code.co_filename.startswith('<frozen importlib')):
    module = 'ctl/' + os.path.relpath(code.co_filename, PACKAGE)
    thread = threading.current_thread().name
    run.setdefault(module, f'{code.co_name} ({thread})')
    threads.add(thread)
class AtSave(logging.Handler):
  def emit(self, record):
    if record.getMessage().startswith('Saved '):
      sys.setprofile(None)
      with open(OUT, 'w') as file:
        json.dump({'run': run, 'threads': sorted(threads)}, file)
      os._exit(0)
logging.getLogger('absl').addHandler(AtSave())
threading.setprofile(profile)
sys.setprofile(profile)
sys.argv = ['ctl.main', *sys.argv[2:]]
runpy.run_module('ctl.main', run_name='__main__', alter_sys=True)
'''


@pytest.mark.slow
def test_the_default_run_runs_few_modules_before_its_first_save(tmp_path):
  modules_file = tmp_path / 'modules.json'
  process = subprocess.run(
      [sys.executable, '-c', _MODULES_RUN, str(modules_file),
       f'--config={helpers.DIGITS}', f'--workdir={tmp_path / "run"}'],
      capture_output=True, text=True, timeout=600, check=False,
      env=helpers.env_with())
  assert process.returncode == 0, process.stderr[-3000:]
  traced = json.loads(modules_file.read_text())
  run = traced['run']
  print(f'{len(run)} ctl modules ran a function before the first save, '
        'each with the first it ran:',
        *(f'{module}: {first}' for module, first in sorted(run.items())),
        sep='\n  ')
  assert 'ctl/main.py' in run and 'ctl/checkpoints/manager.py' in run
  # One worker waits on no peer: none of the cluster's machinery runs.
  cluster = {'ctl/cluster/watchdog.py', 'ctl/cluster/slurm.py',
             'ctl/cluster/stall_meter.py', 'ctl/cluster/worker_timings.py',
             'ctl/cluster/input_wait.py', 'ctl/cluster/peer_evidence.py',
             'ctl/cluster/stragglers.py', 'ctl/cluster/greetings.py'}
  assert not cluster & set(run), sorted(cluster & set(run))
  assert not {'ctl-watchdog', 'ctl-worker-status', 'ctl-stall-meter'} & set(
      traced['threads']), traced['threads']
  assert len(run) <= MAX_MODULES_BEFORE_FIRST_SAVE, len(run)
