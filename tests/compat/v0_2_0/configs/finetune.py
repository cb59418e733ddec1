"""Fine-tuning a pretrained backbone under a new head: experiments/finetune.py."""

import ml_collections

from ctl import config as config_lib


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """python -m ctl.main --config=configs/finetune.py --workdir=/tmp/ctl/finetune --config.init_from=/tmp/ctl/pretrain

  Args:
    variant: '' to fine-tune on the 10 digits (set config.init_from to the
      pretraining workdir); 'pretrain' to train the backbone on the digits
      0-4 (--config=configs/finetune.py:pretrain); 'smoke' for one epoch.
  """
  config = config_lib.base_config()
  config.task = 'experiments.finetune:FineTune'
  config.data = ml_collections.ConfigDict()
  config.data.eval_fraction = 0.2
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.learning_rate = 1e-2
  config.finetune = ml_collections.ConfigDict()
  config.finetune.freeze_steps = 0  # Steps with the backbone frozen.
  config.finetune.backbone_lr_factor = 1.0
  config.batch_size = 64
  config.num_epochs = 5
  config.jit_compile = 'off'
  config.export.at_end = False
  if variant not in ('', 'smoke', 'pretrain'):
    raise ValueError(
        f"Unknown variant {variant!r}: use '', 'smoke' or 'pretrain'.")
  if variant == 'smoke':
    config.num_epochs = 1
  if variant == 'pretrain':
    config.num_classes = 5
    return config
  config.num_classes = 10
  config.init_select = ('backbone',)
  config.finetune.freeze_steps = 50
  config.finetune.backbone_lr_factor = 0.1
  return config
