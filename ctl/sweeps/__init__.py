"""Sweeps: trials loaded and checked, their results reported (the command is ctl/sweep.py)."""
