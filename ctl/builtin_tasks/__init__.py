"""The built-in tasks (`config.task`): each found by name, and imported only
when a config names it, by ctl/task_hooks.py (`resolve`, `BUILT_IN`)."""
