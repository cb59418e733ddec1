"""Benchmarks of ctl against a hand-written loop, Keras fit and the tutorial code (not installed)."""
