"""Tasks of the tests whose hooks raise, as a bug of a user's own would
(tests/test_hook_failures.py)."""

import user_modules


class BugInTrainStep(user_modules.NoisyRegression):

  def train_step(self, batch, ctx):
    raise RuntimeError('a bug in train_step')


class BugInEvalStep(user_modules.NoisyRegression):

  def eval_step(self, batch, ctx):
    raise RuntimeError('a bug in eval_step')


class BugInEvalEnd(user_modules.NoisyRegression):

  def eval_end(self, name, outputs, results):
    raise RuntimeError('a bug in eval_end')


class BugInServingSignature(user_modules.NoisyRegression):

  def serving_signature(self):
    raise RuntimeError('a bug in serving_signature')
