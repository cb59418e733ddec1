"""Shared by every test: tests/ is importable (helpers, split_cpu,
user_modules).

Tests are laid out like the package (tests/training/ for ctl/training/, ...);
pytest imports them in importlib mode (setup.cfg), so two folders may each
have a test module of the same name.
"""

import pathlib
import sys


TESTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
