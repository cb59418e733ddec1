"""A seeded random search over the digits default's optimizer and width.

python -m ctl.sweep --sweep=experiments/digits_random.py --workdir=/tmp/sweeps/digits_random --parallel=2
"""

from ctl import hyper


def get_sweep() -> hyper.Sweep:
  return hyper.Sweep(
      config='../configs/digits.py',
      trials=hyper.random(num_trials=8, seed=0, distributions={
          'optimizer.learning_rate': hyper.log_uniform(1e-4, 3e-2),
          'optimizer.name': hyper.choice(['adam', 'rmsprop']),
          'model.width': hyper.choice([32, 64, 128, 256]),
      }),
      metric='eval.accuracy', mode='max')
