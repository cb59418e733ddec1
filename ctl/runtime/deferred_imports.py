"""Keras's optional integrations, loaded when first used rather than when
TensorFlow is imported.

Keras's import imports scikit-learn (for `keras.wrappers`, its scikit-learn
estimators) and matplotlib's pyplot (for `keras.visualization`) whenever
they are installed, and ctl installs both (the digits data, the sweep
plot). A run uses neither, yet every ctl process paid for them: a fifth to a
quarter of TensorFlow's import (BENCHMARKS.md, "Start-up: Keras's
scikit-learn and matplotlib deferred").

Within `keras_integrations_deferred()` those Keras modules are created
empty, and their code (with scikit-learn's or matplotlib's import) runs at
the first attribute a program reads (or writes) on them, as Python's
`importlib.util.LazyLoader` does, so `keras.wrappers.SKLearnClassifier`
and `keras.visualization.plot_image_gallery` work as before, only later.
Unlike LazyLoader's, a deferred module answers what describes it
(`__file__`, `__spec__`: `_METADATA`) without loading: AutoGraph reads
`__file__` of every module in `sys.modules` each time it converts a
function. pandas, which Keras's data adapters read at their import, is not
deferred: ctl does not install it.
"""

import contextlib
import importlib.abc
import sys
import types

# The Keras modules that import scikit-learn or matplotlib when imported,
# and that Keras's own import only binds to a name.
DEFERRED = ('keras.wrappers', 'keras.visualization', 'keras.src.visualization')
# What a deferred module answers, and lets be set, before it is loaded:
# what describes it. `__path__` too: a submodule's import reads it, and
# loading the package then would import that submodule twice (its
# `__init__` imports it, then the import system does).
_METADATA = frozenset(('__name__', '__file__', '__spec__', '__loader__',
                       '__package__', '__cached__', '__path__', '__class__'))


class _DeferredModule(types.ModuleType):
  """A module whose code runs at the first read, write or deletion of an
  attribute other than its _METADATA."""

  def __getattribute__(self, name):
    if name in _METADATA:
      return super().__getattribute__(name)
    _load(self)
    return getattr(self, name)

  def __setattr__(self, name, value):
    if name in _METADATA:
      super().__setattr__(name, value)
    else:  # Loaded first, so that its code does not overwrite the value.
      _load(self)
      setattr(self, name, value)

  def __delattr__(self, name):
    _load(self)
    delattr(self, name)


def _load(module: _DeferredModule) -> None:
  """Runs a deferred module's code; from then on it is a plain module. If
  the code raises, the module stays deferred: the next use runs it again,
  as the next import of a module that failed would. As with LazyLoader
  (Python 3.11), a second thread using the module meanwhile may find it
  half run."""
  module.__class__ = types.ModuleType
  try:
    module.__spec__.loader.exec_module(module)
  except BaseException:
    module.__class__ = _DeferredModule
    raise


class _DeferringLoader(importlib.abc.Loader):
  """Creates the module with `loader`, and leaves its code to its first
  use (`_DeferredModule`)."""

  def __init__(self, loader: importlib.abc.Loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    module.__spec__.loader = module.__loader__ = self._loader
    module.__class__ = _DeferredModule


class _DeferringFinder(importlib.abc.MetaPathFinder):
  """Finds DEFERRED modules as the other finders would, to be loaded on
  first use."""

  def find_spec(self, fullname, path, target=None):
    if fullname not in DEFERRED:
      return None
    for finder in sys.meta_path:
      if finder is not self and hasattr(finder, 'find_spec'):
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
          break
    else:
      return None
    if spec.loader is not None:
      spec.loader = _DeferringLoader(spec.loader)
    return spec


@contextlib.contextmanager
def keras_integrations_deferred():
  """Within it, DEFERRED modules imported for the first time are deferred."""
  finder = _DeferringFinder()
  sys.meta_path.insert(0, finder)
  try:
    yield
  finally:
    sys.meta_path.remove(finder)
