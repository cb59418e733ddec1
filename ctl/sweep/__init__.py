"""Sweeps: `python -m ctl.sweep` (__main__.py) runs a sweep's trials, checked and named by trials.py, and reports their results (report.py)."""
