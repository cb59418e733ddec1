"""The digits classifier, appending its loss to a file every 22 steps."""
import os

import ctl
from ctl.builtin_tasks import classification


def get_config():
  """python -m ctl.main --config=loss_file.py --workdir=/tmp/ctl/loss_file"""
  config = ctl.classification_config()
  config.task = 'loss_file:DigitsWithLossFile'
  config.data.name = 'digits'
  config.num_epochs = 3
  config.intervals.log_steps = 22
  return config


class LossFile(ctl.Action):
  when = ctl.When(steps=22)

  def run(self, event):  # On the chief, after the log line of its step.
    with open(os.path.join(event.workdir, 'loss.txt'), 'a') as file:
      file.write(f"{event.step} {event.train_logs['loss']:.4f}\n")


class DigitsWithLossFile(classification.Classification):

  def actions(self):
    return [LossFile()]
