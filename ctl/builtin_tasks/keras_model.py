"""Keras users' models, with their own train_step and test_step, under ctl.

`config.task = 'keras_model'` is the classification task (data by
`data.name`), except that `model.name` names a function returning a
*compiled* Keras model, and each step is the model's own `train_step` /
`test_step`, overridden or not, run on every replica as `Model.fit` runs
it. Its metrics (`model.metrics`: the loss and the compiled metrics) are
read and reset at every report and before every evaluation.
"""


from ctl import errors
from ctl import task as task_lib
from ctl.builtin_tasks import classification


class KerasModelTask(classification.Classification):
  """Runs a compiled Keras model's train_step and test_step."""

  auto_xla = False  # The model's steps are the user's: XLA is opt-in.

  def build(self) -> None:
    data = self._data()
    self.model = classification.build_model(self.config.model, data.input_shape,
                                    data.num_classes)
    if not self.model.compiled or self.model.optimizer is None:
      raise errors.ConfigError(
          f'config.task=\'keras_model\' needs model.name='
          f'{self.config.model.name!r} to return a compiled model: call '
          'model.compile(optimizer=..., loss=..., metrics=[...]) in it.')
    self.optimizer = self.model.optimizer
    self.optimizer.build(self.model.trainable_variables)
    # The loss tracker and compiled metrics, shared by both phases as in
    # Model.fit; ctl resets them before each evaluation.
    self.train_metrics = self.model.metrics
    self.eval_metrics = self.model.metrics

  def train_step(self, batch, ctx: task_lib.StepContext) -> dict:
    del ctx
    self.model.train_step(batch)
    return {}  # The metrics say it all.

  def eval_step(self, batch, ctx: task_lib.StepContext) -> dict:
    del ctx
    self.model.test_step(batch)
    return {}
