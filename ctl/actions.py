"""Actions: the work done between loops of steps, ctl's and a task's alike.

An action says *when* it is due (`When`: every N steps, every N epochs,
once after given steps, every N seconds, after each evaluation, at the end
of training) and *what*
it does (`Action.run(event)`). ctl's own periodic work is a list of
actions (the log line and summaries, evaluation, the best checkpoint, the
profiler, the checkpoint); a task adds its own with `Task.actions()`, and
config fields add the built-in ones (ctl/training/builtin_actions.py).

Actions run in the Python loop between loops of `steps_per_loop` steps:
they cost nothing inside a step. Loops end at every step where some
action is due by its step or epoch count, so every worker runs it after
the same step. An action may ask, through its event, to stop training
cleanly, to save a checkpoint now, or to evaluate now. An action that runs
on every worker (`on_every_worker`) decides from values every worker has
alike (the train logs and eval results are all-reduced), so its requests
take effect at once; a chief-only action's requests reach the other
workers with the next loop's agreement, and take effect after it.

An action's `state()` is saved in every checkpoint and given back by
`restore(state)` on resume, so that a resumed run makes the same decisions
at the same steps as an uninterrupted one.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import json
import time
from typing import Any

import tensorflow as tf

from ctl import errors

# What an action may request, in the order the workers agree on them.
REQUESTS = ('stop', 'checkpoint', 'evaluate', 'rollback')


@dataclasses.dataclass(frozen=True)
class When:
  """When an action is due; it is due if any of the fields says so.

  Attributes:
    steps: every N steps (counted from step 0, so the same steps on every
      worker and after every restart); several intervals as a tuple.
    epochs: at the end of every N-th epoch.
    at_steps: once after each of these steps (one-off: loops end there and
      at no multiple of them; a run resumed past one does not run it
      again, one resumed before it does, after the same step).
    secs: once N seconds passed since it last ran (on some worker's clock:
      the workers agree, so they all run it after the same loop).
    after_log: after each log line, with its values.
    after_eval: after each evaluation, with its results.
    at_end: at the end of training, or when an action stopped it.
    every_loop: after every loop of steps (with its logs: a check that
      must see them all).
    on_request: also when an action requests it ('checkpoint' or
      'evaluate'); ctl's own checkpoint and evaluation use this.
  """

  steps: int | tuple[int, ...] = ()
  epochs: int = 0
  secs: float = 0.0
  after_log: bool = False
  after_eval: bool = False
  at_end: bool = False
  every_loop: bool = False
  on_request: str = ''
  # Last, so that the fields before it keep their positions.
  at_steps: int | tuple[int, ...] = ()

  def step_intervals(self, steps_per_epoch: int) -> tuple[int, ...]:
    """The step counts at whose multiples it is due (loops end there)."""
    steps = self.steps if isinstance(self.steps, tuple) else (self.steps,)
    return tuple(every for every in (*steps, self.epochs * steps_per_epoch)
                 if every)

  def one_off_steps(self) -> tuple[int, ...]:
    """The steps after which it is due once (loops end there)."""
    return (self.at_steps if isinstance(self.at_steps, tuple) else
            (self.at_steps,))

  def due_at(self, step: int, steps_per_epoch: int, end: bool) -> bool:
    """Whether it is due after `step` by its counts, or as the end."""
    return (any(step % every == 0
                for every in self.step_intervals(steps_per_epoch)) or
            step in self.one_off_steps() or (self.at_end and end))


class Event:
  """What an action sees after a loop, and the requests it can make.

  Attributes:
    step: the global steps finished.
    epoch: the epochs finished (a fraction mid-epoch is not counted).
    total_steps: the steps training runs for.
    train_logs: the latest logged training values ({name: float}): the
      task's logs averaged since the previous log line, train metrics.
    eval_results: the latest evaluation's results in this process (the
      one set's, or {set name: results}); None before the first.
    loop_means: the task's logs averaged over this loop's steps
      ({name: float}).
    first_step: the step this loop started from.
    logged: whether the log line was written after this loop.
    evaluated: whether an evaluation ran after this loop.
    task: the ctl.Task.
    workdir: the run's workdir.
    is_chief: whether this process writes the workdir.
    worker_timings: on the chief of a job of several workers, after the
      log line: each worker's phase timings of the reports since the
      previous log line that every worker's status file holds
      ({step: {'workers/<i>/<phase>_ms': milliseconds}},
      ctl/cluster/worker_timings.py); else empty.
  """

  def __init__(self, *, step: int, steps_per_epoch: int, total_steps: int,
               task: Any, workdir: str, is_chief: bool,
               train_logs: Mapping[str, float],
               eval_results: Mapping[str, Any] | None,
               loop_means: Mapping[str, float] | None = None,
               first_step: int | None = None):
    self.step = step
    self.loop_means = dict(loop_means or {})
    self.first_step = step if first_step is None else first_step
    self.epoch = step // steps_per_epoch
    self.total_steps = total_steps
    self.task = task
    self.workdir = workdir
    self.is_chief = is_chief
    self.train_logs = dict(train_logs)
    self.eval_results = eval_results
    self.logged = False
    self.evaluated = False
    self.requests: dict[str, str] = {}  # {request: reason}
    self.worker_timings: dict[int, dict[str, float]] = {}

  @property
  def end(self) -> bool:
    """Whether training ends after this loop (its last step, or a stop)."""
    return self.step >= self.total_steps or 'stop' in self.requests

  def request_stop(self, reason: str) -> None:
    """Stops training after this loop: a checkpoint, the final evaluation
    and export, exit 0, the reason in results.json and the log."""
    self.requests.setdefault('stop', reason)

  def request_checkpoint(self) -> None:
    """Saves a checkpoint after this loop."""
    self.requests.setdefault('checkpoint', '')

  def request_evaluation(self) -> None:
    """Evaluates after this loop (then the after_eval actions run)."""
    self.requests.setdefault('evaluate', '')

  def request_rollback(self, reason: str) -> None:
    """Puts back the weights of the latest checkpoint at once, before the
    actions after this one; the step and the data go on from here, so the
    steps since that checkpoint are skipped."""
    self.requests.setdefault('rollback', reason)


class Action:
  """Work between loops of steps: subclass it, set `when`, write `run`.

      class SaySomething(ctl.Action):
        when = ctl.When(steps=100)

        def run(self, event):
          print(event.step, event.train_logs['loss'])

  Attributes:
    when: when it is due.
    on_every_worker: run it on every worker (needed for one that reads
      collectives or whose requests must take effect at once), not only on
      the chief.
  """

  when: When = When()
  on_every_worker: bool = False
  # Whether it handles a non-finite loss itself (otherwise the loop stops
  # the run at once, saving nothing more).
  handles_divergence: bool = False

  @property
  def name(self) -> str:
    """Its name in the checkpoint's action states: unique in a run."""
    return type(self).__name__

  def run(self, event: Event) -> None:
    raise NotImplementedError(f'{type(self).__name__} must define run(event)')

  def state(self) -> dict[str, Any]:
    """What a resumed run needs to decide as this one would (JSON-able)."""
    return {}

  def restore(self, state: dict[str, Any]) -> None:
    """Takes back what state() returned when the checkpoint was saved."""


class Call(Action):
  """An action of a function of the event (ctl's own work)."""

  def __init__(self, name: str, when: When, function: Callable[[Event], Any],
               on_every_worker: bool = True):
    self._name = name
    self.when = when
    self.on_every_worker = on_every_worker
    self._function = function

  @property
  def name(self) -> str:
    return self._name

  def run(self, event: Event) -> None:
    self._function(event)


class Clock:
  """Whether `secs` passed since an action last ran, on this process's
  clock; the workers agree on it inside train_loop."""

  def __init__(self, secs: float, clock: Callable[[], float] = time.monotonic):
    self._secs = secs
    self._clock = clock
    self._last = clock()

  def due(self) -> bool:
    return bool(self._secs) and self._clock() - self._last >= self._secs

  def reset(self) -> None:
    self._last = self._clock()


class ActionStates:
  """The actions' states in the checkpoint: one string variable holding
  {action name: state} as JSON, filled just before each save (a string
  variable, unlike a Python state, is copied whole by asynchronous saves).

  Created outside the strategy's scope: each worker holds its own copy
  (every worker runs the actions that decide alike), and the chief's is
  saved.
  """

  def __init__(self):
    self.variable = tf.Variable('', dtype=tf.string, trainable=False,
                                name='action_states')

  def capture(self, actions: Sequence[Action], stopped: str | None) -> None:
    """Records every action's state now, for the next save, and the reason
    training stops at this step, if an action stopped it."""
    states = {action.name: action.state() for action in actions}
    self.variable.assign(json.dumps({'actions': states, 'stopped': stopped}))

  def restore(self, actions: Sequence[Action]) -> str | None:
    """Gives each action the state restored into the variable; returns why
    training stopped at the restored step, if an action stopped it."""
    text = self.variable.numpy().decode()
    saved = json.loads(text) if text else {'actions': {}, 'stopped': None}
    for action in actions:
      if action.name in saved['actions']:
        action.restore(saved['actions'][action.name])
    return saved['stopped']


def check_names(actions: Sequence[Action]) -> None:
  """Raises ConfigError if two actions share a name (their states would)."""
  names = [action.name for action in actions]
  repeated = sorted({name for name in names if names.count(name) > 1})
  if repeated:
    raise errors.ConfigError(
        f'Two actions of this run are named {repeated[0]!r}: give each a '
        'name of its own (an Action subclass overrides the name property), '
        "so that a checkpoint keeps each one's state.")
