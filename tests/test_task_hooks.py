"""Every hook of a task is checked against what ctl passes it, at start
(ctl/task_hooks.py): old forms warned of and called their way, others
refused with the signature to write."""

import functools
import inspect
import warnings

import pytest
import tensorflow as tf

import ctl
from ctl import errors
from ctl import task_hooks


class _Base(ctl.Task):
  """The required hooks, as README writes them."""

  def build(self):
    pass

  def train_data(self, context):
    del context

  def train_step(self, batch, ctx):
    del batch, ctx


class OldEvalEnd(_Base):
  """eval_end as ctl 0.1.0 called it."""

  def eval_end(self, name, outputs):
    return {'name': name, 'count': len(outputs)}


class NewEvalEnd(_Base):

  def eval_end(self, name, outputs, results):
    return {'seen': dict(results)}


@pytest.fixture(autouse=True)
def _warnings_of_a_new_process():
  """Each test sees the warnings a new process would: ctl shows each once
  per process (in warnings.onceregistry)."""
  saved = dict(warnings.onceregistry)
  warnings.onceregistry.clear()
  yield
  warnings.onceregistry.clear()
  warnings.onceregistry.update(saved)


def _check(task_class) -> list[str]:
  """task_hooks.check's warnings (each shown, as Python shows them)."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('default')
    task_hooks.check(task_class)
  return [str(warning.message) for warning in caught
          if warning.category is task_hooks.CtlDeprecationWarning]


def test_the_table_names_every_hook_task_defines():
  defined = {name for name, value in vars(ctl.Task).items()
             if not name.startswith('_') and inspect.isfunction(value)}
  assert defined == set(task_hooks.HOOKS)


@pytest.mark.parametrize('name', sorted(task_hooks.BUILT_IN))
def test_built_in_tasks_pass_without_a_warning(name):
  assert _check(task_hooks.resolve(name)) == []


def test_task_itself_passes():
  assert _check(ctl.Task) == []


def test_the_old_eval_end_is_warned_of_naming_the_new_form():
  warned = _check(OldEvalEnd)
  assert len(warned) == 1
  assert 'OldEvalEnd.eval_end(self, name, outputs)' in warned[0]
  assert '`def eval_end(self, name, outputs, results)`' in warned[0]
  assert 'ctl 0.1.0' in warned[0] and 'ctl 0.3.0' in warned[0]


def test_the_old_eval_end_is_warned_of_once_per_process():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('default')
    task_hooks.check(OldEvalEnd)
    task_hooks.check(OldEvalEnd)
  assert len(caught) == 1


def test_the_old_eval_end_is_warned_of_once_though_the_filters_change():
  # ctl checks the task again to export it; scikit-learn's functions
  # change the warnings filters meanwhile (warnings.catch_warnings), which
  # empties the registry Python keeps per module: it was shown twice.
  import sklearn.metrics  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('default')
    task_hooks.check(OldEvalEnd)
    sklearn.metrics.r2_score([1.0, 2.0, 3.0], [1.0, 2.0, 2.5])
    task_hooks.check(OldEvalEnd)
  assert len(caught) == 1


def test_the_old_eval_end_is_called_without_results():
  task = OldEvalEnd.__new__(OldEvalEnd)
  eval_end = task_hooks.eval_end_of(task)
  assert eval_end('test', {'a': 1}, {'loss': 0.5}) == {'name': 'test',
                                                      'count': 1}


def test_the_new_eval_end_gets_the_results():
  task = NewEvalEnd.__new__(NewEvalEnd)
  assert task_hooks.eval_end_of(task)('', {}, {'loss': 0.5}) == {
      'seen': {'loss': 0.5}}
  assert _check(NewEvalEnd) == []


def test_a_step_without_ctx_is_refused_naming_the_signature():

  class NoCtx(_Base):

    def train_step(self, batch):
      del batch

  with pytest.raises(errors.ConfigError) as raised:
    task_hooks.check(NoCtx)
  message = str(raised.value)
  assert raised.value.exit_code == 2
  assert 'NoCtx.train_step(self, batch) cannot take what ctl passes' in message
  assert '`def train_step(self, batch, ctx)`' in message
  assert 'since ctl 0.1.0' in message
  assert '\n' not in message


def test_an_eval_end_of_neither_form_is_refused_naming_both():

  class OneArgument(_Base):

    def eval_end(self, name):
      del name

  with pytest.raises(errors.ConfigError) as raised:
    task_hooks.check(OneArgument)
  message = str(raised.value)
  assert '`def eval_end(self, name, outputs, results)`' in message
  assert 'since ctl 0.2.0' in message
  assert 'eval_end(self, name, outputs) in ctl 0.1.0' in message


def test_every_refused_hook_is_named_at_once():

  class TwoWrong(_Base):

    def train_data(self):
      pass

    def eval_step(self, batch, ctx, extra):
      del batch, ctx, extra

  with pytest.raises(errors.ConfigError) as raised:
    task_hooks.check(TwoWrong)
  assert 'TwoWrong.train_data(self)' in str(raised.value)
  assert 'TwoWrong.eval_step(self, batch, ctx, extra)' in str(raised.value)


def _logged(function):
  @functools.wraps(function)
  def wrapper(*args, **kwargs):
    return function(*args, **kwargs)
  return wrapper


def test_other_ways_to_write_a_hook_are_accepted():

  class Varied(_Base):

    def train_step(self, *args):  # Anything.
      del args

    def eval_step(self, batch, ctx=None, **kwargs):
      del batch, ctx, kwargs

    @_logged
    def eval_data(self, context):
      del context

    @tf.function
    def loop_logs(self):
      return {}

    @staticmethod
    def train_steps_per_epoch():
      return None

    @classmethod
    def actions(cls):
      return []

    @_logged
    def eval_end(self, name, outputs, results=None):
      del name, outputs, results

  assert _check(Varied) == []


def test_wrapped_old_forms_are_found_through_their_wrappers():

  class Wrapped(_Base):

    @_logged
    def eval_end(self, name, outputs):
      del name, outputs

    @tf.function
    def train_step(self, batch):
      del batch

  with pytest.raises(errors.ConfigError, match='Wrapped.train_step'):
    task_hooks.check(Wrapped)
  assert task_hooks.accepted_form(Wrapped, 'eval_end') == task_hooks.OLD


def test_a_hook_that_cannot_be_inspected_is_let_through():

  class Builtin(_Base):
    loop_logs = dict  # A builtin: no signature to read.

  assert _check(Builtin) == []
