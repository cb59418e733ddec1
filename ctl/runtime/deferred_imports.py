"""Keras's optional integrations, loaded when first used rather than when
TensorFlow is imported.

Keras's import imports scikit-learn (for `keras.wrappers`, its scikit-learn
estimators) and matplotlib's pyplot (for `keras.visualization`) whenever
they are installed, and ctl installs both (the digits data, the sweep
plot). A run uses neither, yet every ctl process paid for them: about a
fifth of TensorFlow's import (BENCHMARKS.md, "Start-up: Keras's
scikit-learn and matplotlib deferred").

Within `keras_integrations_deferred()` those Keras modules are created
empty, and their code (with scikit-learn's or matplotlib's import) runs at
the first attribute a program reads from them, as Python's
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
import importlib.machinery
import sys
import types

# The Keras modules that import scikit-learn or matplotlib when imported,
# and that Keras's own import only binds to a name.
DEFERRED = ('keras.wrappers', 'keras.visualization', 'keras.src.visualization')
# What a deferred module answers before it is loaded. Not `__path__` (a
# submodule's import reads it, and needs the package's code run first) nor
# `__dict__`.
_METADATA = frozenset(('__name__', '__file__', '__spec__', '__loader__',
                       '__package__', '__cached__', '__class__'))


class _DeferredModule(types.ModuleType):
  """A module whose code runs at the first read of an attribute other than
  its _METADATA."""

  def __getattribute__(self, name):
    if name in _METADATA:
      return super().__getattribute__(name)
    # Reads from now on are plain. As with LazyLoader (Python 3.11), a
    # second thread reading meanwhile may find the module half run.
    self.__class__ = types.ModuleType
    self.__spec__.loader.exec_module(self)
    return getattr(self, name)


class _DeferringLoader(importlib.abc.Loader):
  """Creates the module with `loader`, and leaves its code to the first
  read (`_DeferredModule`)."""

  def __init__(self, loader: importlib.abc.Loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    module.__spec__.loader = module.__loader__ = self._loader
    module.__class__ = _DeferredModule


class _DeferringFinder(importlib.abc.MetaPathFinder):
  """Finds DEFERRED modules as Python would, to be loaded on first use."""

  def find_spec(self, fullname, path, target=None):
    if fullname not in DEFERRED:
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None and spec.loader is not None:
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
