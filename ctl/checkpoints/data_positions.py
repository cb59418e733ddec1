"""Each input pipeline's data position, saved beside the checkpoint of the
same step (workdir/checkpoints/data/pipeline-<i>-of-<n>/)."""

import os

import tensorflow as tf

import ctl
from ctl import errors
from ctl import storage
from ctl.checkpoints import contents
from ctl.checkpoints import files
from ctl.runtime import tf_internals


class DataPositions:
  """Each input pipeline's data position (its tf.data iterator), per step.

  The chief's checkpoint cannot hold the other workers' iterators, so every
  worker writes its own pipeline's, `<directory>/pipeline-<i>-of-<n>/
  ckpt-<step>`, before the checkpoint of the same step, and keeps as many
  as the checkpoints. The name says which shard of how many it is: a
  position saved by another number of workers is another shard, and a
  worker's name (chief or worker) does not matter.
  """

  def __init__(self, trackables: dict, directory: str, *, max_to_keep: int,
               pipeline: int = 0, num_pipelines: int = 1):
    """Args as named; pipeline: this worker's input pipeline (its worker
    index) of num_pipelines (the training workers)."""
    self._root = directory
    self._num_pipelines = num_pipelines
    self._checkpoint = tf.train.Checkpoint(**trackables)
    self._directory = os.path.join(directory,
                                   _pipeline_dir(pipeline, num_pipelines))
    self._max_to_keep = max_to_keep
    self.enabled = bool(trackables)

  def _prefix(self, step: int) -> str:
    return os.path.join(self._directory, f'ckpt-{step}')

  def problem(self, step: int) -> str | None:
    """Why the data positions of checkpoint `step` cannot resume this job's
    pipelines; None when every pipeline's is there.

    Raises:
      ConfigError: they were saved, whole, by another number of pipelines.
    """
    if not self.enabled:
      return None
    saved = self._saved_at(step)
    if len(saved.get(self._num_pipelines, ())) == self._num_pipelines:
      return None
    for count, pipelines in saved.items():
      if len(pipelines) == count:
        raise errors.ConfigError(
            f'The checkpoint of step {step} was saved by {count} worker(s), '
            f'and this job has {self._num_pipelines}: each worker reads its '
            'own shard of the task\'s tf.data pipeline and saved its own '
            'position in it, so the shards cannot resume on another number '
            f'of workers. Nothing was written. Resume with {count} '
            'worker(s), or train in a new --workdir starting from these '
            'weights with --config.init_from='
            f'{os.path.dirname(self._root)}')
    if saved:
      return ('lacks a worker\'s data position (a worker was killed while '
              'the workers saved it)')
    return (f'has no data position in {self._root} (a task that reads a '
            'tf.data pipeline saves one per worker beside every checkpoint)')

  def _saved_at(self, step: int) -> dict[int, set[int]]:
    """{number of pipelines: the pipelines with a position at `step`}."""
    saved = {}
    for index in storage.glob(os.path.join(
        self._root, 'pipeline-*-of-*', f'ckpt-{step}.index')):
      name = os.path.basename(os.path.dirname(index))
      _, pipeline, _, count = name.split('-')
      saved.setdefault(int(count), set()).add(int(pipeline))
    return saved

  def check_savable(self, dataset: tf.data.Dataset | None) -> None:
    """Fails now, before training, if the position of `dataset` (the
    pipeline the iterator reads) could not be saved: a stateful op anywhere
    in it fails the save once the iterator has reached it, before or after
    a shuffle.

    Raises:
      CtlError: naming the op that makes the pipeline's state unsavable.
    """
    if not self.enabled or dataset is None:
      return
    problems = _stateful_problems(dataset)
    problems.append(tf_internals.symbolic_checkpoint_hazard(dataset))
    reseeding = tf_internals.reseeding_below_shuffle(dataset)
    problems.append(reseeding and _not_resumable(*reseeding))
    problems = [problem for problem in problems if problem]
    if len(problems) == 1:
      raise errors.CtlError(problems[0])
    if problems:  # All at once: the user mends them in one go.
      raise errors.CtlError(
          f'The training pipeline has {len(problems)} problems. ' + ' '.join(
              f'({number}) {problem.removesuffix(_NOTHING_WRITTEN).strip()}'
              for number, problem in enumerate(problems, 1)) +
          f' {_NOTHING_WRITTEN}')

  def save(self, step: int) -> None:
    """Writes this pipeline's position at `step`; drops the oldest.

    Raises:
      CtlError: when the position cannot be saved (then no checkpoint of
        this step is written; the earlier ones stay).
    """
    if not self.enabled:
      return
    try:
      self._checkpoint.write(self._prefix(step))
    except tf.errors.FailedPreconditionError as error:
      raise _unsavable(error, before_training=False) from error
    steps = sorted(files.step_of(name.rsplit('.', 1)[0]) for name in
                   storage.listdir(self._directory)
                   if name.startswith('ckpt-') and name.endswith('.index'))
    for old in steps[:-self._max_to_keep]:
      for path in storage.glob(self._prefix(old) + '.*'):
        storage.remove(path)

  def restore(self, step: int) -> None:
    """Restores this pipeline's position at `step`.

    Raises:
      CtlError: when it is missing or does not fit the pipeline.
    """
    if not self.enabled:
      return
    prefix = self._prefix(step)
    if not storage.exists(prefix + '.index'):
      raise errors.CtlError(
          f'The data position of step {step} is missing ({prefix}): the '
          'checkpoint cannot resume the data exactly. Train in a new '
          '--workdir, or restore the file.')
    checkpoint = os.path.join(os.path.dirname(self._root), f'ckpt-{step}')
    if contents.written_by_0_1_0(checkpoint):
      raise errors.ConfigError(
          f'Checkpoint {checkpoint} was written by ctl 0.1.0, and ctl '
          f'{ctl.__version__} cannot resume the position of a task\'s tf.data '
          'pipeline that it saved (CHANGELOG.md, 0.2.0). Nothing was '
          'written. Finish the run with ctl 0.1.0, or train in a new '
          '--workdir starting from these weights with --config.init_from='
          f'{os.path.dirname(self._root)}')
    try:
      self._checkpoint.read(prefix).assert_consumed()
    except Exception as error:  # pylint: disable=broad-except
      raise errors.CtlError(
          f'The data position {prefix} does not fit this task\'s input '
          f'pipeline: {errors.summary(error)}. Resume with the pipeline that wrote '
          'it, or train in a new --workdir.') from error


def _pipeline_dir(pipeline: int, num_pipelines: int) -> str:
  return f'pipeline-{pipeline}-of-{num_pipelines}'


# The stateful ops that run Python in a pipeline: Dataset.from_generator and
# tf.numpy_function (PyFunc), tf.py_function (EagerPyFunc).
_PYTHON_OPS = ('PyFunc', 'EagerPyFunc')


_NOTHING_WRITTEN = 'Nothing was written.'


def _stateful_problems(dataset: tf.data.Dataset) -> list[str]:
  """A problem for each stateful op that keeps the position from being
  saved: the one TensorFlow names, then the others the pipeline's
  functions hold (TensorFlow stops at its first)."""
  try:
    tf_internals.check_dataset_serializable(dataset)
  except tf.errors.FailedPreconditionError as error:
    named = _reason(error)
    others = [f'{op} is stateful' for op in tf_internals.stateful_ops(dataset)
              if f'{op} is stateful' != named]
    return [_unsavable_op(reason, _NOTHING_WRITTEN)
            for reason in [named, *others]]
  return []


def _unsavable(error: tf.errors.FailedPreconditionError, *,
               before_training: bool) -> errors.CtlError:
  """The error for a pipeline whose position cannot be saved."""
  kept = (_NOTHING_WRITTEN if before_training else
          'Nothing was saved at this step; earlier checkpoints are kept.')
  return errors.CtlError(_unsavable_op(_reason(error), kept))


def _reason(error: tf.errors.FailedPreconditionError) -> str:
  """TensorFlow's reason, e.g. 'RandomUniform is stateful'."""
  reason = error.message.strip().splitlines()[0]
  reason = reason.split('}}')[-1].split('[Op:')[0].strip()
  return reason.removeprefix('Failed to serialize the input pipeline '
                             'graph: ').rstrip('.')


def _unsavable_op(reason: str, kept: str) -> str:
  """Why a stateful op keeps the position from being saved, what to do
  instead, and what was kept."""
  if reason.split(' is stateful')[0] in _PYTHON_OPS:
    cause = ('Python code in the tf.data pipeline: Dataset.from_generator, '
             'tf.py_function or tf.numpy_function, whose place in the data '
             'TensorFlow cannot save')
    advice = ('hand ctl the data as NumPy arrays in ctl.InMemory(arrays) '
              '(what a generator yields, gathered once), or build the '
              'pipeline from TensorFlow ops alone (Dataset.from_tensor_slices, '
              'TFRecordDataset, ctl.TFRecordSource)')
  else:
    cause = ('a stateful op in the tf.data pipeline, before or after a '
             'shuffle, such as tf.random.uniform or a Keras random layer')
    advice = ('draw random numbers with stateless ops seeded by (seed, '
              'epoch, example), e.g. ctl.data.augment.seeds and '
              'tf.random.stateless_uniform')
  return (f'The training pipeline\'s position cannot be saved: {reason} '
          f'({cause}). ctl must save it to resume exactly: {advice}. {kept}')


def _not_resumable(reseeding_op: str, shuffle_op: str) -> str:
  """The error for a reshuffling op below another shuffle."""
  reseeding = ('Dataset.random' if reseeding_op.startswith('Random')
               else 'a shuffle that reshuffles each pass')
  return (f'The training pipeline has {reseeding} ({reseeding_op}) below '
          f'another shuffle ({shuffle_op}): TensorFlow cannot restore its '
          'seeds from a position saved once the outer shuffle holds the rest '
          'of a pass, so a resumed run would read another order. Give the '
          'inner one reshuffle_each_iteration=False (the outer shuffle still '
          'mixes each pass), shuffle once, or read TFRecord files with '
          'ctl.TFRecordSource (its own order, resumable on any number of '
          'workers). tf.data.experimental.make_csv_dataset(shuffle=True) '
          'builds such a pipeline (files shuffled, then rows): pass '
          'shuffle=False and num_epochs=1 (ctl repeats it) and shuffle its '
          'rows once after it, .unbatch().shuffle(n, seed=...).batch(b), or '
          'read the CSV into arrays for ctl.InMemory. Nothing was written.')
