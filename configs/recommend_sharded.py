"""configs/recommend.py's run with the tables sharded over parameter
servers: experiments/recommend_sharded.py."""

import importlib.util
import os

import ml_collections


def _recommend_config(variant: str) -> ml_collections.ConfigDict:
  """configs/recommend.py's get_config(variant), loaded beside this file."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'recommend.py')
  spec = importlib.util.spec_from_file_location('configs_recommend', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/recommend_sharded.py --workdir=/tmp/ctl/recommend_sharded --config.distribution.min_shard_bytes=0

  That trains on one device, the tables whole. On parameter servers, each
  table split over 2 of them:

      python -m ctl.launch --num_workers=2 --num_ps=2 -- \\
          --config=configs/recommend_sharded.py \\
          --workdir=/tmp/ctl/recommend_sharded

  Args:
    variant: '' for the default; 'smoke' for a run of a few steps, e.g.
      --config=configs/recommend_sharded.py:smoke.
  """
  # The recommend run (data, sizes, batches, epochs, intervals; its
  # variants), with the task whose tables are plain variables.
  config = _recommend_config(variant)
  config.task = 'experiments.recommend_sharded:RecommendSharded'
  # The tables' sparse Adagrad (the MLP keeps Adam's learning_rate).
  config.optimizer.table_learning_rate = 0.05
  # Split each variable over 32 KiB over the servers: the user table
  # (5,000 x 16 floats, 320 KB; 2,000 rows in :smoke), the item table and
  # their Adagrad accumulators, each in 2 shards on 2 servers; the MLP's
  # variables (under 7 KB each) stay whole.
  config.distribution.min_shard_bytes = 32 << 10
  return config
