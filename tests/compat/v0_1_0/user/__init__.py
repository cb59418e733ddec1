"""Projects a user wrote against ctl 0.1.0's API (tests/compat/README.md)."""
