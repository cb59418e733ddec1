"""ctl: TensorFlow 2 custom training loops, from one CPU to preemptible clusters."""

__version__ = '0.1.0'
