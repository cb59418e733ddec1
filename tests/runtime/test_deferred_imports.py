"""Keras's scikit-learn and matplotlib integrations load when first used,
not when ctl imports TensorFlow (ctl/runtime/deferred_imports.py)."""

import json
import subprocess
import sys

import pytest

import helpers
from ctl.runtime import deferred_imports

_IMPORTS_THEN_USES = '''
import importlib.machinery, inspect, json, sys
from ctl.runtime import tf_process
tf_process.import_tensorflow()
import keras
import tensorflow as tf

runs = []  # The modules whose code runs from now on.
run_module = importlib.machinery.SourceFileLoader.exec_module
def counted(loader, module):
  runs.append(module.__name__)
  return run_module(loader, module)
importlib.machinery.SourceFileLoader.exec_module = counted

def loaded():
  return {name: name in sys.modules for name in ('sklearn', 'matplotlib')}

after_import = loaded()

@tf.function
def clipped(x):  # AutoGraph converts it: it reads every module's __file__.
  if tf.reduce_sum(x) > 0:
    return x
  return -x

clipped(tf.constant([1.0]))
inspect.getmodule(clipped.python_function)  # Reads them too.
after_tracing = loaded()
import sklearn.base
import keras.src.visualization.draw_bounding_boxes
from keras.src.visualization import plot_image_gallery
import matplotlib.pyplot
print(json.dumps({
    'after_import': after_import, 'after_tracing': after_tracing,
    'wrappers_are_estimators': issubclass(keras.wrappers.SKLearnClassifier,
                                          sklearn.base.BaseEstimator),
    'gallery_has_pyplot': plot_image_gallery.plt is matplotlib.pyplot,
    'module_is_plain': type(keras.wrappers) is type(sys),
    'submodule_runs': runs.count('keras.src.visualization.draw_bounding_boxes'),
}))
'''


def test_keras_integrations_load_at_first_use_and_then_work(tmp_path):
  script = tmp_path / 'uses.py'  # A file: AutoGraph reads the source.
  script.write_text(_IMPORTS_THEN_USES)
  run = subprocess.run([sys.executable, str(script)],
                       cwd=helpers.REPO, env=helpers.env_with(),
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  seen = json.loads(run.stdout.splitlines()[-1])
  nothing = {'sklearn': False, 'matplotlib': False}
  assert seen == {'after_import': nothing, 'after_tracing': nothing,
                  'wrappers_are_estimators': True, 'gallery_has_pyplot': True,
                  'module_is_plain': True, 'submodule_runs': 1}


def test_a_deferred_module_whose_code_raises_runs_again_at_its_next_use(
    tmp_path, monkeypatch):
  runs = tmp_path / 'runs.txt'
  (tmp_path / 'flaky.py').write_text(
      f'with open({str(runs)!r}, "a") as file:\n'
      '  file.write("run\\n")\n'
      f'if open({str(runs)!r}).read().count("run") == 1:\n'
      '  raise RuntimeError("its first run fails")\n'
      'VALUE = 42\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(deferred_imports, 'DEFERRED', ('flaky',))
  monkeypatch.delitem(sys.modules, 'flaky', raising=False)
  with deferred_imports.keras_integrations_deferred():
    import flaky  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  assert not runs.exists()  # Deferred: its code has not run.
  assert flaky.__file__ == str(tmp_path / 'flaky.py')  # Nor now.
  assert not runs.exists()
  with pytest.raises(RuntimeError, match='its first run fails'):
    flaky.VALUE  # pylint: disable=pointless-statement
  assert flaky.VALUE == 42
  assert runs.read_text() == 'run\nrun\n'
  monkeypatch.delitem(sys.modules, 'flaky')
