"""README.md and BUILD.md name only what exists: every path, module,
`module.symbol`, config field and command-line flag in backticks."""

import ast
import pathlib
import re

import pytest

import helpers

REPO = helpers.REPO
DOCS = ('README.md', 'BUILD.md')
# Top-level folders of the repository: a span starting with one is a path.
TOP = ('.ci', 'ctl', 'configs', 'experiments', 'tests', 'benchmarks')
# Flags of other programs that the docs show (sbatch, srun, pip, pytest;
# XLA's, in XLA_FLAGS).
OTHER_PROGRAMS_FLAGS = {'--ntasks-per-node', '--gpus-per-task', '--requeue',
                        '--signal', '--open-mode', '--distribution',
                        '--logdir', '--durations', '--host', '--port',
                        '--storage-class',
                        '--xla_cpu_use_onednn',
                        '--xla_cpu_experimental_onednn_custom_call',
                        '--xla_cpu_use_xnnpack', '--xla_dump_to'}
# A placeholder, and a field misspelt on purpose (to show the error).
NOT_FIELDS = {'key', 'optimizer.learning_rat'}
# ctl's packages: `training/run.py` and `data/in_memory.InMemory` are
# named from inside ctl/.
PACKAGES = ('training', 'runtime', 'data', 'serving', 'builtin_tasks', 'sweep',
            'checkpoints', 'cluster')
# Names of files, not of config fields or symbols: `config.json`.
FILE_NAME = re.compile(r'.*\.(json|py|md|cfg|csv|txt|keras|yaml|sbatch|journal|'
                       r'conf|npz|png|pb)')


def _spans(doc: str) -> list[str]:
  """What the doc puts in backticks, and the lines of its code blocks."""
  text = (REPO / doc).read_text()
  blocks = re.findall(r'```[a-z]*\n(.*?)```', text, re.DOTALL)
  inline = re.findall(r'`([^`\n]+)`', re.sub(r'```.*?```', '', text,
                                                flags=re.DOTALL))
  return inline + [line for block in blocks for line in block.splitlines()]


def _all_spans():
  return [(doc, span) for doc in DOCS for span in _spans(doc)]


def _words(span: str) -> list[str]:
  return re.findall(r'[^\s()\[\]{},"\']+', span)


def _config_fields() -> set[str]:
  """Every field of every shipped config, dotted ('intervals.log_steps')."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  fields = set()

  def walk(config, prefix=''):
    for key, value in config.items():
      fields.add(prefix + key)
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, f'{prefix}{key}.')

  for path in sorted((REPO / 'configs').glob('*.py')):
    module = path.stem
    walk(helpers.load_config_file(path))
    del module
  import ctl  # pylint: disable=g-import-not-at-top
  walk(ctl.classification_config())
  return fields


def _flags() -> set[str]:
  """Every flag the commands define (absl's DEFINE_*)."""
  found = set()
  for path in [*REPO.glob('ctl/**/*.py'), *REPO.glob('benchmarks/*.py')]:
    found.update(re.findall(r"DEFINE_\w+\(\s*'(\w+)'", path.read_text()))
  return found | {'config', 'helpfull', 'help'}


def _defined_names(path: pathlib.Path) -> frozenset[str]:
  """What the module at path defines: its functions, classes, module-level
  names, methods and attributes set on self (and any other name it
  assigns)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      names.add(node.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
      names.add(node.attr)
    elif isinstance(node, ast.AnnAssign) and hasattr(node.target, 'id'):
      names.add(node.target.id)
  return frozenset(names)


class _Known:
  """What exists: config fields, flags, ctl's modules and classes, and what
  each module defines (a module is parsed once, at the first question about
  it: the docs ask about the same modules hundreds of times)."""

  def __init__(self):
    self.fields = _config_fields()
    self.sections = {name for name in self.fields if '.' not in name}
    self.flags = _flags()
    self.modules = _ctl_modules()
    self.classes = _classes()
    self._names = {}

  def defines(self, path: pathlib.Path, name: str) -> bool:
    """Whether the module at path defines name."""
    if path not in self._names:
      self._names[path] = _defined_names(path)
    return name in self._names[path]


def _ctl_modules() -> dict[str, list[pathlib.Path]]:
  """ctl's modules by their last name ('checkpointing': [...])."""
  modules = {}
  for path in (REPO / 'ctl').rglob('*.py'):
    modules.setdefault(path.stem, []).append(path)
  return modules


def _classes() -> dict[str, list[pathlib.Path]]:
  found = {}
  for path in (REPO / 'ctl').rglob('*.py'):
    for name in re.findall(r'^class (\w+)', path.read_text(), re.MULTILINE):
      found.setdefault(name, []).append(path)
  return found


def _problem(span: str, known: _Known) -> str | None:
  """What in span does not exist; None if everything it names does."""
  words = _words(span)
  for word in words:
    word = word.rstrip('.:;')
    if '<' in word or '*' in word or '...' in word or word.startswith('$'):
      continue
    problem = _word_problem(word, len(words) == 1 and word == span.strip(),
                            known)
    if problem:
      return problem
  return None


def _word_problem(word, alone, known):
  """What a word names that does not exist; alone: the whole span is this
  word (only then is `a.b` taken for a module and its symbol)."""
  fields, modules, classes = known.fields, known.modules, known.classes
  if word.startswith('--'):
    name = word[2:].partition('=')[0]
    if name.startswith('config.'):
      field = name[len('config.'):]
      if field not in fields and field not in NOT_FIELDS:
        return f'config field {field}'
    elif name and f'--{name}' not in OTHER_PROGRAMS_FLAGS and (
        name not in known.flags):
      return f'flag --{name}'
    return None
  if re.fullmatch(r'(\.ci|ctl|configs|experiments|tests|benchmarks)'
                  r'(/[\w.-]+)*/?(:\w+)?', word):
    path = word.split(':')[0]
    return None if (REPO / path).exists() else f'path {path}'
  if FILE_NAME.fullmatch(word) and not word.startswith(PACKAGES):
    return None
  match = re.fullmatch(r'((?:[a-z_]+/)+[a-z_]+)\.(py|[A-Za-z_]\w*)', word)
  if match and match[1].startswith(PACKAGES):
    module = REPO / 'ctl' / f'{match[1]}.py'
    if not module.exists():
      return f'module ctl/{match[1]}.py'
    if match[2] != 'py' and not known.defines(module, match[2]):
      return f'{match[2]} in ctl/{match[1]}.py'
    return None
  if re.fullmatch(r'ctl(\.\w+)+', word):
    return _importable(word, known)
  if word.startswith('config.') and re.fullmatch(r'[\w.]+', word):
    field = word[len('config.'):]
    in_module = known.defines(REPO / 'ctl' / 'config.py', field)  # load
    return (None if field in fields or field in NOT_FIELDS or in_module
            else f'config field {field}')
  sections = known.sections
  if re.fullmatch(r'[a-z_]+(\.[a-z_]\w*)+', word) and (
      word.split('.')[0] in sections) and (
          word in fields or word in NOT_FIELDS or _keras_attribute(word)):
    return None
  match = re.fullmatch(r'(\w+)\.(\w+)', word)
  if match and match[1] in sections and not (
      alone and match[1] in modules and
      any(known.defines(path, match[2]) for path in modules[match[1]])):
    return f'config field {word}'
  if not alone or not match:
    return None
  if match[1] in modules:
    if not any(known.defines(path, match[2])
               for path in modules[match[1]]):
      return f'{match[2]} in a module named {match[1]}'
  elif match[1] in classes:
    if not any(known.defines(path, match[2])
               for path in classes[match[1]]):
      return f'{match[2]} of class {match[1]}'
  return None


def _keras_attribute(word: str) -> bool:
  """`model.metrics`, `optimizer.apply_gradients`: Keras's own names."""
  import keras  # pylint: disable=g-import-not-at-top
  owner, _, name = word.partition('.')
  kinds = {'model': keras.Model, 'optimizer': keras.optimizers.Optimizer}
  return owner in kinds and hasattr(kinds[owner], name)


def _importable(dotted: str, known: _Known) -> str | None:
  """None if ctl.a.b(.attribute) names a module of ctl and something it
  defines (read, not imported: commands define flags at import); else
  what does not exist."""
  parts = dotted.split('.')
  for cut in range(len(parts), 0, -1):
    base = REPO.joinpath(*parts[:cut])
    module = (base / '__init__.py' if base.is_dir()
              else base.with_suffix('.py'))
    if module.exists():
      break
  else:
    return f'module {dotted}'
  rest = parts[cut:]
  if not rest:
    return None
  public = re.findall(r"'(\w+)': 'ctl", module.read_text())
  if len(rest) > 1 or not (known.defines(module, rest[0]) or
                           rest[0] in public):
    return f'{dotted} ({".".join(rest)} not in {module.relative_to(REPO)})'
  return None


@pytest.fixture(scope='module')
def known():
  return _Known()


@pytest.mark.parametrize('doc', DOCS)
def test_every_name_in_the_doc_exists(doc, known):
  problems = sorted({f'`{span}`: no {problem}' for span in _spans(doc)
                     if (problem := _problem(span, known))})
  assert not problems, f'{doc} names what does not exist:\n' + '\n'.join(
      problems)


def test_the_check_finds_names_that_do_not_exist(known):
  # Each kind of name, misspelt: a check that passes everything is no check.
  for span in ('ctl/trainig/run.py', 'training/run._no_such_function',
               '--config.intervals.log_stepz=1', 'config.no_such_field',
               '--no_such_flag', 'ctl.data.no_such_module',
               'manager.no_such_symbol', 'TrainLoop.no_such_method'):
    assert _problem(span, known), span


def test_builds_map_lists_every_module():
  text = (REPO / 'BUILD.md').read_text()
  layout = text[text.index('## Layout'):text.index('### One run, top to bottom')]
  listed = set(re.findall(r'`(ctl/[\w/]+\.py)`', layout))
  modules = {str(path.relative_to(REPO))
             for path in (REPO / 'ctl').rglob('*.py')}
  # A package's __init__.py says what it holds; the map needs not name it.
  required = {module for module in modules
              if not module.endswith('/__init__.py') or module.count('/') == 1}
  assert not required - listed, (
      f'BUILD.md\'s map leaves out {sorted(required - listed)}')
  assert not listed - modules, (
      f'BUILD.md\'s map names {sorted(listed - modules)}')


def _function_source(path: pathlib.Path, name: str) -> str:
  """The source of function `name` ('f' or 'Class.method') in path."""
  tree = ast.parse(path.read_text())
  owner, _, function = name.rpartition('.')
  scope = tree.body
  if owner:
    scope = next(node for node in tree.body
                 if isinstance(node, ast.ClassDef) and node.name == owner).body
  node = next(node for node in scope if isinstance(node, ast.FunctionDef)
              and node.name == function)
  return ast.get_source_segment(path.read_text(), node)


# Each step of BUILD.md's walk, the module it is in, and what it calls
# that leads to the next step.
WALK = [
    ('main.main', 'ctl/main.py', 'main', 'modes.run('),
    ('modes.run', 'ctl/modes.py', 'run', 'train_and_evaluate('),
    ('run.train_and_evaluate', 'ctl/training/run.py', 'train_and_evaluate',
     'Trainer('),
    ('Trainer.__init__', 'ctl/training/trainer.py', 'Trainer.__init__',
     'assemble('),
    ('Trainer.restore_or_start', 'ctl/training/trainer.py',
     'Trainer.restore_or_start', 'restore_latest('),
    ('Trainer.train', 'ctl/training/trainer.py', 'Trainer.train',
     'TrainLoop('),
    ('TrainLoop.run', 'ctl/training/loop.py', 'TrainLoop.run', '_train('),
    ('TrainingCheckpoint.save', 'ctl/checkpoints/manager.py',
     'TrainingCheckpoint.save', 'self.checkpointer.save('),
    ('Trainer.finish', 'ctl/training/trainer.py', 'Trainer.finish',
     'results_path('),
]


def test_the_walk_names_the_functions_in_the_order_they_run():
  text = (REPO / 'BUILD.md').read_text()
  walk = text[text.index('### One run, top to bottom'):]
  walk = walk[:walk.index('\n## ')]
  steps = re.findall(r'^\d+\. `([\w.]+)`', walk, re.MULTILINE)
  assert steps == [step for step, *_ in WALK]
  # Trainer.run calls restore_or_start, train and finish, in that order.
  run = _function_source(REPO / 'ctl/training/trainer.py', 'Trainer.run')
  calls = [run.index(call) for call in ('self.restore_or_start()',
                                         'self.train()', 'self.finish(')]
  assert calls == sorted(calls)
  for step, path, function, call in WALK:
    assert call in _function_source(REPO / path, function), (step, call)
