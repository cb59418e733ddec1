"""A run's state at a glance: `python -m ctl.status WORKDIR [--watch]`.

Reads only small files of the workdir (local, without TensorFlow: it
answers at once; or gs://): each worker's status (workers/worker-<i>.json,
ctl/cluster/worker_status.py), results.json, the checkpoint state file,
best/best.json and the names of the diagnostics files; and, for a worker
of this host, whether its process still exists (ctl/runtime/processes.py).
Says whether the run is running, hung, failed, finished or stopped, by
that evidence (ctl/status/verdict.py), where it is, how fast each worker
went at the last report, and which worker lags. A damaged or foreign file
is named in a line, never a traceback (ctl/status/evidence.py).

    __main__.py   the command (--watch)
    view.py       the lines it shows
"""

from ctl.status.view import render  # pylint: disable=unused-import
