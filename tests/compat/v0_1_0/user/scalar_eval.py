"""A user's task of ctl 0.1.0: 0.1.0's regression example whose eval_step
returns scalars only, keeping its two-argument eval_end.

    python -m ctl.main --config=configs/regression.py \
        --config.task=user.scalar_eval:ScalarEval --workdir=/tmp/ctl/scalar

0.1.0 called eval_end(name, outputs) only when eval_step returned
per-example outputs, so the inherited eval_end, which reads them, was never
called here.
"""

import ctl

from experiments import regression


class ScalarEval(regression.Regression):
  """Evaluates the loss and the MAE only: no per-example outputs."""

  def eval_step(self, batch, ctx: ctl.StepContext) -> dict:
    return {'loss': super().eval_step(batch, ctx)['loss']}
