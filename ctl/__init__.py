"""ctl: TensorFlow 2 custom training loops, from one CPU to preemptible clusters.

What a user's code needs, importable as `ctl.<name>`:

    ctl.Task, ctl.StepContext     the task API (ctl/task.py, ctl/step_context.py)
    ctl.InMemory                  arrays that ctl batches and resumes exactly
    ctl.TFRecordSource            TFRecord files; .global_batches() resumes on
                                  any number of workers that divides its
                                  partitions (ctl/data/tfrecord.py)
    ctl.Image, ctl.Histogram      eval_end results shown in TensorBoard
    ctl.Action, ctl.When,         work between loops of steps, and what it
    ctl.Event                     sees and requests (ctl/actions.py)
    ctl.EarlyStopping,            built-in actions
    ctl.Rollback, ctl.CsvLogger   (ctl/training/builtin_actions.py)
    ctl.MetricWriter              a sink of logged values, from
                                  Task.metric_writers() (ctl/metric_writers/)
    ctl.base_config()             the framework's config fields (ctl/config.py)
    ctl.classification_config()   ... and the built-in classifier's
    ctl.load(workdir)             a run's task and models, restored (ctl/serving/load.py)

They are imported on first use, so that `python -m ctl.main` reports a bad
flag before TensorFlow loads.
"""

import importlib
import time

# The release; setup.cfg reads it (CHANGELOG.md lists what each changed).
__version__ = '0.2.0'
# time.monotonic() when this process imported ctl (runtime/tf_process.py).
IMPORT_TIME = time.monotonic()

_PUBLIC = {
    'Task': 'ctl.task',
    'StepContext': 'ctl.step_context',
    'InMemory': 'ctl.task',
    'TFRecordSource': 'ctl.data.tfrecord',
    'Image': 'ctl.task',
    'Histogram': 'ctl.task',
    'Action': 'ctl.actions',
    'When': 'ctl.actions',
    'Event': 'ctl.actions',
    'EarlyStopping': 'ctl.training.builtin_actions',
    'CsvLogger': 'ctl.training.builtin_actions',
    'Rollback': 'ctl.training.builtin_actions',
    'MetricWriter': 'ctl.metric_writers',
    'base_config': 'ctl.config',
    'classification_config': 'ctl.config',
    'load': 'ctl.serving.load',
}


def __getattr__(name: str):
  if name in _PUBLIC:
    return getattr(importlib.import_module(_PUBLIC[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted([*globals(), *_PUBLIC])
