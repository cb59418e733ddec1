"""SIGTERM and Ctrl-C: the names of their old home, kept for imports.

The process and its signals are one home, ctl/runtime/tf_process.py.
"""

from ctl.runtime.tf_process import EXIT_INTERRUPTED, StopSignal  # pylint: disable=unused-import
