"""Benchmarks of ctl against a hand-written loop, Keras fit and the
tutorial code: `python -m benchmarks.bench` from the repository root (not
installed with ctl)."""
