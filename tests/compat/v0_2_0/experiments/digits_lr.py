"""Learning rate and batch size of the digits default: a 4x2 grid, 8 trials.

python -m ctl.sweep --sweep=experiments/digits_lr.py --workdir=/tmp/sweeps/digits_lr --parallel=2
"""

from ctl import hyper


def get_sweep() -> hyper.Sweep:
  return hyper.Sweep(
      config='../configs/digits.py',
      trials=hyper.product(
          hyper.sweep('optimizer.learning_rate', [3e-4, 1e-3, 3e-3, 1e-2]),
          hyper.sweep('batch_size', [32, 64])),
      metric='eval.accuracy', mode='max')
