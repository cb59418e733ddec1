"""A warm process: runs `python -m ctl.main` commands one after another.

Starting a ctl process costs 10-20 s of Python and TensorFlow imports
before the first step; a caller with many short runs (a sweep's trials,
the compatibility suite's projects) starts this once instead:

    python -m ctl.warm [--cpu_devices=N]

It reads one JSON object a line on stdin, each one run:

    {"argv": ["--config=configs/digits.py:smoke", "--workdir=/tmp/w"],
     "cwd": "/path/to/project", "env": {"NAME": "value"}, "log": "/tmp/w.log"}

`argv` is what follows `python -m ctl.main`; `cwd` (default: the warm
process's own), `env` (variables set for this run over the process's own
environment; null unsets one) and `cpu_devices` (default 1) are optional;
`log` is the file that gets the run's stdout and stderr (file descriptors
1 and 2, so TensorFlow's C++ lines too), written anew, or appended to
with `"append": true` (a sweep trial's log.txt keeps its earlier runs'
lines). It answers one line
each, in order, on stdout:

    {"exit_code": 0}            the code `python -m ctl.main` would exit with
    {"refused": "reason"}       not run: it needs a process of its own

Each run starts from the state a fresh process has (ctl/runtime/fresh_state.py)
and equals a fresh process's run, weights included. Refused, so that the
caller runs them in a fresh process instead: a run in a cluster (TF_CONFIG,
srun, `distribution.strategy=multi_worker`: TensorFlow's collective runtime
lasts as long as its process), and one asking another number of CPU
devices than the process was started with (they are fixed when TensorFlow
starts). It exits 0 at the end of stdin. A run that kills its process (a
segfault, a second Ctrl-C) ends it: the caller sees stdout close.
"""

import contextlib
import json
import os
import sys
import traceback
from typing import Any, Iterator

from absl import flags
from absl import logging

from ctl import errors
from ctl import main as ctl_main
from ctl.cluster import slurm
from ctl.runtime import fresh_state
from ctl.runtime import tf_process

# Its own flags: ctl.main's (--config required) are each run's.
_FLAGS = flags.FlagValues()
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', 1, 'Logical CPU devices to split the CPU into before '
    'TensorFlow starts (a stand-in for that many GPUs); every run shares them.',
    flag_values=_FLAGS)

def run_request(request: dict[str, Any], cpu_devices: int) -> dict[str, Any]:
  """Runs one request (the module docstring's JSON object); returns its
  answer."""
  with _output_to(request['log'], bool(request.get('append'))), \
      fresh_state.restored_after():
    if request.get('cwd'):
      os.chdir(request['cwd'])
    sys.path[0] = os.getcwd()  # Where `python -m` imports from.
    for name, value in (request.get('env') or {}).items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = str(value)
    refusal = _refusal(request, cpu_devices)
    if refusal:
      return {'refused': refusal}
    try:
      code = ctl_main.run_in_process(['ctl.main', *request['argv']],
                                     check=_cluster_refusal)
    except ctl_main.RunRefused as refused:
      return {'refused': str(refused)}
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()  # A bug of ctl: the log says where.
      code = 1
  return {'exit_code': code}


def _refusal(request: dict[str, Any], cpu_devices: int) -> str | None:
  """Why the process cannot run the request as a fresh one would; None when
  it can."""
  wanted = int(request.get('cpu_devices', 1))
  if wanted != cpu_devices:
    return (f'it asks for {wanted} CPU device(s) and this warm process has '
            f'{cpu_devices}: devices are set once, before TensorFlow starts. '
            'Run it in a fresh process.')
  return None


def _cluster_refusal(config) -> str | None:
  """Why a run of this config needs a process of its own; None otherwise."""
  in_cluster = ('TF_CONFIG' in os.environ or
                slurm.started_by_srun(os.environ) or
                config.distribution.strategy == 'multi_worker')
  if in_cluster:
    return ('it is a multi-worker run: TensorFlow\'s collective runtime lasts '
            'as long as its process. Run it in a fresh process.')
  return None


@contextlib.contextmanager
def _output_to(log_path: str, append: bool = False) -> Iterator[None]:
  """Within it, file descriptors 1 and 2 write to the file at log_path
  (a new one, unless append)."""
  os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
  sys.stdout.flush()
  sys.stderr.flush()
  saved = os.dup(1), os.dup(2)
  with open(log_path, 'ab' if append else 'wb') as log:
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
      yield
    finally:
      logging.flush()
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      for descriptor in saved:
        os.close(descriptor)


def _split_cpu(num_devices: int) -> None:
  """Splits the CPU into logical devices, before TensorFlow starts."""
  if num_devices == 1:
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  [cpu] = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


def serve(requests, answers, cpu_devices: int) -> None:
  """Answers each request line of `requests` with a line on `answers`."""
  for line in requests:
    if line.strip():
      try:
        request = json.loads(line)
        request['argv'], request['log']  # pylint: disable=pointless-statement
      except (ValueError, TypeError, KeyError) as error:
        answer = {'refused': f'Not a request ({error!r}): {line.strip()}'}
      else:
        answer = run_request(request, cpu_devices)
      answers.write(json.dumps(answer) + '\n')
      answers.flush()


def main() -> None:
  """Takes stdin and stdout for the protocol; the runs get neither."""
  try:
    _FLAGS(sys.argv)
  except flags.Error as error:
    print(f'ctl: error: {error}', file=sys.stderr)
    sys.exit(errors.EXIT_USAGE)
  cpu_devices = _CPU_DEVICES.value
  logging.use_absl_handler()  # As absl's app.run does for ctl.main.
  requests = os.fdopen(os.dup(0), 'r')
  answers = os.fdopen(os.dup(1), 'w')
  with open(os.devnull, 'rb') as devnull:
    os.dup2(devnull.fileno(), 0)
  os.dup2(2, 1)  # A stray print between runs must not reach the answers.
  with tf_process.quiet_start_up():
    _split_cpu(cpu_devices)
  tf_process.import_tensorflow()
  serve(requests, answers, cpu_devices)


if __name__ == '__main__':
  main()
