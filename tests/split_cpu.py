"""Runs `python -m ctl.main` with this machine's CPU split into N devices.

    python tests/split_cpu.py N --config=... --workdir=...

Stands in for a machine with N GPUs: with `distribution.strategy=mirrored`,
MirroredStrategy then has N replicas in this one process.
"""

import runpy
import sys

import tensorflow as tf


def main() -> None:
  num_devices = int(sys.argv.pop(1))
  [cpu] = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  sys.argv[0] = 'ctl.main'
  runpy.run_module('ctl.main', run_name='__main__', alter_sys=True)


if __name__ == '__main__':
  main()
