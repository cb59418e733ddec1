"""The in-process contenders of the search benchmark, one per process.

    python -m benchmarks.search_contenders --contender=optuna \
        --trials=16 --epochs=6 --seed=0 --out=/tmp/optuna.json

Run by benchmarks/search.py (`python -m benchmarks.bench --sections=search`),
each in a fresh process timed from its start. Each searches the space of
benchmarks/search.py over the same Keras model (ctl's digits CNN,
ctl.builtin_tasks.classification), the same training and held-out digits (ctl's
split, ctl.data.datasets) and the same budget, as a user would write it:
  optuna: plain Optuna, trials in this process: a Keras model built and
    trained per trial, its eval accuracy after each epoch reported to
    trial.report and trial.should_prune (TPE, the median pruner);
  kt_random, kt_bayesian: Keras Tuner's RandomSearch and
    BayesianOptimization (`pip install keras-tuner`: for this benchmark
    only, not a dependency of ctl).
It writes to --out each evaluation (time.time(), accuracy) and each
trial's state and seconds.
"""

import json
import pathlib
import time

from absl import app
from absl import flags

from benchmarks import search

_CONTENDER = flags.DEFINE_enum('contender', None,
                               ['optuna', 'kt_random', 'kt_bayesian'],
                               'The search to run in this process.')
_TRIALS = flags.DEFINE_integer('trials', 16, 'Trials of the search.')
_EPOCHS = flags.DEFINE_integer('epochs', search.EPOCHS, 'Epochs per trial.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seeds the sampler and Keras.')
_OUT = flags.DEFINE_string('out', None, 'Where the JSON record goes.')


def _load_data():
  """The digits config and its training and held-out arrays, as ctl splits them."""
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  from ctl.data import datasets  # pylint: disable=g-import-not-at-top
  config = config_lib.load(str(search.CONFIG), search.FIXED)
  data = datasets.load(config.data)
  scale = data.feature_scale
  return config, data, (data.train.features.astype('float32') * scale,
                        data.train.labels,
                        data.eval.features.astype('float32') * scale,
                        data.eval.labels)


def _make_build(config, data, input_shape):
  """build(learning_rate, width): the compiled Keras model of one trial."""
  import keras  # pylint: disable=g-import-not-at-top
  from ctl.builtin_tasks import classification  # pylint: disable=g-import-not-at-top

  def build(learning_rate: float, width: int):
    model_config = config.model.copy_and_resolve_references()
    model_config.width = width
    model = classification.build_model(model_config, input_shape,
                                       data.num_classes)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=['accuracy'], jit_compile=False)
    return model
  return build


def _optuna(arrays, build, record: dict) -> None:
  """Plain Optuna: TPE and the median pruner, a Keras model per trial."""
  import keras  # pylint: disable=g-import-not-at-top
  import optuna  # pylint: disable=g-import-not-at-top
  train_x, train_y, eval_x, eval_y = arrays

  def objective(trial):
    started = time.monotonic()
    keras.backend.clear_session()
    model = build(
        trial.suggest_float('learning_rate', *search.LEARNING_RATES, log=True),
        trial.suggest_categorical('width', list(search.WIDTHS)))
    best = 0.0
    for epoch in range(_EPOCHS.value):
      model.fit(train_x, train_y, batch_size=search.BATCH_SIZE, epochs=1,
                verbose=0)
      accuracy = model.evaluate(eval_x, eval_y, batch_size=len(eval_x),
                                verbose=0)[1]
      record['evaluations'].append((time.time(), accuracy))
      best = max(best, accuracy)
      trial.report(accuracy, epoch)
      if trial.should_prune():
        record['trials'].append(('PRUNED', time.monotonic() - started))
        raise optuna.TrialPruned()
    record['trials'].append(('COMPLETE', time.monotonic() - started))
    return best  # The best epoch's, as Keras Tuner and ctl's search rank.

  optuna.logging.set_verbosity(optuna.logging.WARNING)
  study = optuna.create_study(
      direction='maximize',
      sampler=optuna.samplers.TPESampler(seed=_SEED.value),
      pruner=optuna.pruners.MedianPruner(**search.PRUNER_OPTIONS))
  study.optimize(objective, n_trials=_TRIALS.value)


def _keras_tuner(arrays, build, record: dict, directory: str) -> None:
  """Keras Tuner's RandomSearch or BayesianOptimization (no pruning)."""
  import keras  # pylint: disable=g-import-not-at-top
  import keras_tuner  # pylint: disable=g-import-not-at-top
  train_x, train_y, eval_x, eval_y = arrays

  class Record(keras.callbacks.Callback):
    """Each epoch's eval accuracy, with the time it was known."""

    def on_train_begin(self, logs=None):
      self.started = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
      record['evaluations'].append((time.time(), float(logs['val_accuracy'])))

    def on_train_end(self, logs=None):
      record['trials'].append(('COMPLETE', time.monotonic() - self.started))

  tuner_class = {'kt_random': keras_tuner.RandomSearch,
                 'kt_bayesian': keras_tuner.BayesianOptimization}[
                     _CONTENDER.value]
  tuner = tuner_class(
      lambda hp: build(
          hp.Float('learning_rate', *search.LEARNING_RATES, sampling='log'),
          hp.Choice('width', list(search.WIDTHS))),
      objective='val_accuracy', max_trials=_TRIALS.value, seed=_SEED.value,
      directory=directory, project_name='keras_tuner', overwrite=True)
  tuner.search(train_x, train_y, batch_size=search.BATCH_SIZE,
               epochs=_EPOCHS.value, validation_data=(eval_x, eval_y),
               callbacks=[Record()], verbose=0)


def main(argv: list[str]) -> None:
  """Runs the one contender, then writes its record."""
  del argv
  import keras  # pylint: disable=g-import-not-at-top
  config, data, arrays = _load_data()
  keras.utils.set_random_seed(_SEED.value)
  build = _make_build(config, data, arrays[0].shape[1:])
  record = {'evaluations': [], 'trials': []}
  out = pathlib.Path(_OUT.value)
  if _CONTENDER.value == 'optuna':
    _optuna(arrays, build, record)
  else:
    _keras_tuner(arrays, build, record, str(out.parent / _CONTENDER.value))
  out.write_text(json.dumps(record))


if __name__ == '__main__':
  flags.mark_flags_as_required(['contender', 'out'])
  app.run(main)
