"""A TPE search with a median pruner over the digits default's learning rate and width.

python -m ctl.sweep --sweep=experiments/digits_search.py --workdir=/tmp/sweeps/digits_search --parallel=2
"""

from ctl import hyper


def get_sweep() -> hyper.Sweep:
  return hyper.Sweep(
      config='../configs/digits.py',
      search=hyper.Search(
          space={'optimizer.learning_rate': hyper.log_uniform(1e-5, 3e-2),
                 'model.width': hyper.choice([32, 64, 128])},
          fixed={'num_epochs': 3, 'intervals.eval_steps': 11},
          num_trials=12, sampler='tpe', pruner='median',
          pruner_options={'n_startup_trials': 3}, seed=0),
      metric='eval.accuracy', mode='max')
