"""What a run changes in its process, and how to put it back for the next.

A process that runs one ctl command after another (ctl/warm.py)
must start each from the state a fresh process would have, or a run's
results would depend on the runs before it. `restored_after()` records
that state, lets one run change it, and puts it back:

- Keras: its session (`keras.backend.clear_session()`: layer names, the
  global seed generator, the graph), the dtype policy (a mixed-precision
  run sets `mixed_float16`), floatx, epsilon and the image data format.
- TensorFlow: op determinism (`config.deterministic` turns it on; only a
  private call turns it off), the global seed (`keras.utils.set_random_seed`
  sets it), eager execution of functions, Grappler's options and XLA's
  auto-clustering.
- Python: the `random` and NumPy generators, the environment, the working
  directory, `sys.path`, `sys.argv`, the warnings filters and "once"
  registries (a run's deprecation warning shows again in the next), the
  signal handlers, the root logger's and absl's handler, filters and
  verbosity (ctl adds a filter and may wrap the stream for the progress
  line), and `sys.dont_write_bytecode`.
- The user's modules: every module first imported during the run whose
  file is neither in ctl/ nor in the installed packages is dropped from
  `sys.modules`, so that the next run imports its own `experiments.text`,
  not the one before's.

- TensorFlow's gradient registry: the gradient functions a run's
  `tf.custom_gradient` registered (one a trace, each holding its traced
  graph) and those of the user's modules (`tf.RegisterGradient`, run
  again when the next run imports them) are dropped.
- TensorFlow's collective keys: the next run's MirroredStrategy numbers
  its collectives past those of the runs before (the runtime remembers
  each it ran, with its shapes).

Not restored, so a caller must keep such runs out (warm.py refuses them):
what TensorFlow sets once per process (logical devices, the collective
runtime of a multi-worker cluster, thread pools). Exit handlers a run
registers run when the process exits, as they would have.
"""

import contextlib
import importlib
import logging as std_logging
import os
import random
import signal
import sys
import sysconfig
from typing import Any, Iterator
import warnings

from absl import logging
import numpy as np


@contextlib.contextmanager
def restored_after() -> Iterator[None]:
  """Within it, a run may change the process; on leaving, it is as before."""
  importlib.invalidate_caches()  # Files written since the last run.
  saved = _python_state()
  keras_saved = _keras_state() if 'keras' in sys.modules else None
  tf_saved = _tensorflow_state() if 'tensorflow' in sys.modules else None
  try:
    with warnings.catch_warnings():  # Also forgets which warned "once".
      yield
  finally:
    _restore_tensorflow(tf_saved)
    _restore_keras(keras_saved)
    _restore_python(saved)


def _python_state() -> dict[str, Any]:
  """The interpreter's process-wide state a run may change."""
  absl_handler = logging.get_absl_handler()
  root = std_logging.getLogger()
  return {
      'modules': set(sys.modules),
      'environ': dict(os.environ),
      'cwd': os.getcwd(),
      'path': list(sys.path),
      'argv': list(sys.argv),
      'dont_write_bytecode': sys.dont_write_bytecode,
      'random': random.getstate(),
      'numpy': np.random.get_state(),
      'signals': {signum: signal.getsignal(signum)
                  for signum in _catchable_signals()},
      'verbosity': logging.get_verbosity(),
      # absl's logger's own level, NOTSET unless set: set_verbosity alone
      # would pin it to the effective level, hiding INFO from the root's
      # handlers (pytest's caplog) where the root's level says INFO.
      'absl_level': (logging.get_absl_logger().level,
                     logging.get_absl_logger().propagate),
      'absl_filters': list(absl_handler.filters),
      'absl_stream': absl_handler.python_handler.stream,
      'root': (root.level, list(root.handlers), list(root.filters)),
  }


def _restore_python(saved: dict[str, Any]) -> None:
  """Puts back what `_python_state` recorded; drops the run's modules."""
  _drop_user_modules(saved['modules'])
  os.environ.clear()
  os.environ.update(saved['environ'])
  os.chdir(saved['cwd'])
  sys.path[:] = saved['path']
  sys.argv[:] = saved['argv']
  sys.dont_write_bytecode = saved['dont_write_bytecode']
  random.setstate(saved['random'])
  np.random.set_state(saved['numpy'])
  for signum, handler in saved['signals'].items():
    if signal.getsignal(signum) is not handler and handler is not None:
      signal.signal(signum, handler)
  logging.set_verbosity(saved['verbosity'])
  absl_logger = logging.get_absl_logger()
  absl_logger.setLevel(saved['absl_level'][0])  # Clears logging's cache.
  absl_logger.propagate = saved['absl_level'][1]
  absl_handler = logging.get_absl_handler()
  absl_handler.filters[:] = saved['absl_filters']
  absl_handler.python_handler.stream = saved['absl_stream']
  root = std_logging.getLogger()
  root.level, root.handlers[:], root.filters[:] = (
      saved['root'][0], saved['root'][1], saved['root'][2])


def _catchable_signals() -> list[int]:
  """The signals a Python handler can be installed for."""
  return [signum for signum in signal.valid_signals()
          if signum not in (signal.SIGKILL, signal.SIGSTOP)]


def _drop_user_modules(before: set[str]) -> None:
  """Forgets the modules first imported since `before` that are the user's:
  neither ctl's nor an installed package's (those stay imported)."""
  kept_roots = _kept_roots()
  for name in set(sys.modules) - before:
    if not _is_kept(sys.modules.get(name), kept_roots):
      sys.modules.pop(name, None)


def _kept_roots() -> tuple[str, ...]:
  """Folders whose modules stay imported: ctl's and the installed ones."""
  ctl_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  installed = {sysconfig.get_paths()[key]
               for key in ('stdlib', 'platstdlib', 'purelib', 'platlib')}
  installed.update(path for path in sys.path if 'site-packages' in path)
  return tuple(os.path.join(os.path.abspath(path), '')
               for path in (ctl_root, *installed))


def _is_kept(module, kept_roots: tuple[str, ...]) -> bool:
  """Whether a module is ctl's, an installed package's or built in."""
  if module is None:
    return False
  files = [getattr(module, '__file__', None)]
  files += list(getattr(module, '__path__', None) or [])  # Namespace packages.
  files = [path for path in files if path]
  if not files:
    return True  # Built in, or made in memory (AutoGraph's are unnamed).
  return all(os.path.abspath(path).startswith(kept_roots) for path in files)


def _keras_state() -> dict[str, Any]:
  """Keras's global settings a run may change."""
  import keras  # pylint: disable=g-import-not-at-top
  return {
      'dtype_policy': keras.config.dtype_policy().name,
      'floatx': keras.config.floatx(),
      'epsilon': keras.config.epsilon(),
      'image_data_format': keras.config.image_data_format(),
  }


def _restore_keras(saved: dict[str, Any] | None) -> None:
  """A new Keras session with the recorded settings."""
  if 'keras' not in sys.modules:
    return
  import keras  # pylint: disable=g-import-not-at-top
  keras.backend.clear_session()
  if saved is None:
    saved = {'dtype_policy': 'float32', 'floatx': 'float32',
             'epsilon': 1e-7, 'image_data_format': 'channels_last'}
  keras.config.set_dtype_policy(saved['dtype_policy'])
  keras.config.set_floatx(saved['floatx'])
  keras.config.set_epsilon(saved['epsilon'])
  keras.config.set_image_data_format(saved['image_data_format'])


def _tensorflow_state() -> dict[str, Any]:
  """TensorFlow's settings a run may change and a later run may read."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from ctl.runtime import tf_internals  # pylint: disable=g-import-not-at-top
  return {
      'op_determinism': tf_internals.op_determinism_enabled(),
      'functions_run_eagerly': tf.config.functions_run_eagerly(),
      'optimizer_options': tf.config.optimizer.get_experimental_options(),
      'jit': tf.config.optimizer.get_jit(),
      'gradients': tf_internals.registered_gradients(),
  }


def _restore_tensorflow(saved: dict[str, Any] | None) -> None:
  """Puts back what `_tensorflow_state` recorded, and no global seed."""
  if 'tensorflow' not in sys.modules:
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from ctl.runtime import tf_internals  # pylint: disable=g-import-not-at-top
  saved = saved or {'op_determinism': False, 'functions_run_eagerly': False,
                    'optimizer_options': {}, 'jit': '',
                    'gradients': set()}
  tf_internals.set_op_determinism(saved['op_determinism'])
  tf.random.set_seed(None)  # A fresh process has none.
  tf.config.run_functions_eagerly(saved['functions_run_eagerly'])
  tf.config.optimizer.set_experimental_options(_all_options(saved))
  tf.config.optimizer.set_jit(saved['jit'] or False)
  tf_internals.move_past_used_collective_keys()
  roots = _kept_roots()
  tf_internals.forget_gradients(saved['gradients'], lambda function: _is_kept(
      sys.modules.get(getattr(function, '__module__', None)), roots))


def _all_options(saved: dict[str, Any]) -> dict[str, Any]:
  """Grappler's options as recorded, any set since then back to default
  (TensorFlow has no call that forgets one)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  options = {name: None for name in
             tf.config.optimizer.get_experimental_options()}
  options.update(saved['optimizer_options'])
  return options
