"""A trained run, outside training: export for serving, load in Python."""
