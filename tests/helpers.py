"""Helpers the tests share: run ctl as a real process, read what it wrote."""

import collections
import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import portpicker

REPO = pathlib.Path(__file__).resolve().parents[1]
DIGITS = str(REPO / 'configs' / 'digits.py')


# Variables set in this process for itself only (tests/gcs.py's proxy,
# which gRPC between workers would also take): a child gets them only
# when a test passes them.
IN_PROCESS_ONLY = set()


def env_with(**variables) -> dict[str, str]:
  """This process's environment plus variables; tests/ importable."""
  env = {name: value for name, value in os.environ.items()
         if name not in IN_PROCESS_ONLY}
  env['PYTHONPATH'] = os.pathsep.join(
      filter(None, [str(REPO / 'tests'), env.get('PYTHONPATH')]))
  env.update(variables)
  return env


def ctl_command(*args: str) -> list[str]:
  return [sys.executable, '-m', 'ctl.main', *args]


def run_ctl(*args: str, env=None, timeout=600) -> subprocess.CompletedProcess:
  """Runs `python -m ctl.main args` to the end; returns its output and code."""
  return subprocess.run(ctl_command(*args), cwd=REPO, env=env or env_with(),
                        capture_output=True, text=True, timeout=timeout)


def cluster_envs(num_workers: int, **variables) -> list[dict[str, str]]:
  """One environment per worker, each with its TF_CONFIG on free ports."""
  workers = [f'localhost:{portpicker.pick_unused_port()}'
             for _ in range(num_workers)]
  return [
      env_with(TF_CONFIG=json.dumps({
          'cluster': {'worker': workers},
          'task': {'type': 'worker', 'index': index},
      }), **variables) for index in range(num_workers)
  ]


@contextlib.contextmanager
def refusing_port():
  """Yields a localhost port that refuses connections while the block runs.

  A port merely picked as unused can be taken by another test's server
  before it is dialled; this one is held, bound but not listening, so every
  connection to it is refused.
  """
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
    held.bind(('127.0.0.1', 0))
    yield held.getsockname()[1]


def run_workers(args, envs, logdir: pathlib.Path, timeout=600) -> list[int]:
  """Runs one ctl.main per environment at once; returns their exit codes."""
  processes = []
  for index, env in enumerate(envs):
    log = open(logdir / f'worker{index}.log', 'w')
    processes.append((subprocess.Popen(ctl_command(*args), cwd=REPO, env=env,
                                       stdout=log, stderr=subprocess.STDOUT),
                      log))
  codes = []
  try:
    for process, _ in processes:
      codes.append(process.wait(timeout=timeout))
  finally:
    for process, log in processes:
      if process.poll() is None:
        process.kill()
      log.close()
  return codes


def read_scalars(logdir: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} from every TensorBoard event file in logdir."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  scalars = collections.defaultdict(list)
  for path in sorted(logdir.glob('events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        scalars[value.tag].append(
            (event.step, float(tf.make_ndarray(value.tensor))))
  return dict(scalars)


def read_events(logdir: pathlib.Path) -> dict[str, list[tuple[int, object]]]:
  """{tag: [(step, summary value), ...]} of every kind (images, histograms)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  events = collections.defaultdict(list)
  for path in sorted(logdir.glob('events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        events[value.tag].append((event.step, value))
  return dict(events)


def checkpoint_tensors(checkpoint_path) -> dict:
  """{name: value} of every tensor in a checkpoint."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(str(checkpoint_path))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


def model_tensors(checkpoint_path) -> dict:
  """{name: value} of the task's model weights in a ctl checkpoint.

  A checkpoint names each variable once, by its shortest path: trainable
  weights appear as the optimizer's, the others as the model's.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(str(checkpoint_path))
  return {
      name: reader.get_tensor(name)
      for name in reader.get_variable_to_shape_map()
      if name.startswith(('task/model/', 'task/optimizer/_trainable_variables/'))
  }


def latest_checkpoint_step(workdir: pathlib.Path) -> int:
  """The step of the newest complete checkpoint; 0 before the first one.

  Read from the `checkpoint` state file, which is written after a
  checkpoint's files are complete: a `ckpt-N.index` alone may belong to a
  save still in progress.
  """
  state_file = workdir / 'checkpoints' / 'checkpoint'
  if not state_file.exists():
    return 0
  text = state_file.read_text()
  return int(re.search(r'model_checkpoint_path: "ckpt-(\d+)"', text).group(1))


def wait_for_checkpoint(workdir: pathlib.Path, process, timeout=120) -> None:
  """Waits until workdir has a complete checkpoint, while process runs."""
  deadline = time.monotonic() + timeout
  while not latest_checkpoint_step(workdir):
    assert process.poll() is None, 'exited before its first checkpoint'
    assert time.monotonic() < deadline, f'no checkpoint within {timeout} s'
    time.sleep(0.05)


def wait_for_glob(directory: pathlib.Path, pattern: str, process,
                  timeout=300) -> None:
  """Waits until something in directory matches pattern, while process
  runs (polled often: such paths can be short-lived)."""
  deadline = time.monotonic() + timeout
  while not list(directory.glob(pattern)):
    assert process.poll() is None, f'exited before {directory}/{pattern}'
    assert time.monotonic() < deadline, f'no {pattern} within {timeout} s'
    time.sleep(0.005)


def wait_for_line(path: pathlib.Path, pattern: str, process,
                  timeout: float = 300) -> None:
  """Waits until the file has a line matching pattern, while process (a
  Popen, or a Watched) runs."""
  popen = getattr(process, 'process', process)
  deadline = time.monotonic() + timeout
  while not (path.exists() and re.search(pattern, path.read_text(),
                                         re.MULTILINE)):
    assert popen.poll() is None, (
        f'exited before {pattern!r}: '
        f'{getattr(process, "output", "")[-3000:]}')
    assert time.monotonic() < deadline, f'no {pattern!r} within {timeout} s'
    time.sleep(0.05)


def assert_sweep_refused(run, message: str, workdir: pathlib.Path) -> None:
  """The sweep exited 2 with one `ctl.sweep: error:` message containing
  message, nothing else printed, nothing written (no workdir)."""
  from ctl import errors  # pylint: disable=g-import-not-at-top
  assert run.wait() == errors.EXIT_USAGE, run.output[-3000:]
  # No traceback, and none of TensorFlow's start-up lines (run with
  # TF_CPP_MIN_LOG_LEVEL=3, which does not hide them).
  first, *rest = run.output.splitlines()
  assert first.startswith('ctl.sweep: error: '), run.output[-3000:]
  assert all(line.startswith('  ') for line in rest), run.output[-3000:]
  assert message in run.output, run.output[-3000:]
  assert not workdir.exists()


def assert_same_model(checkpoint, reference, atol: float) -> int:
  """Asserts two ctl checkpoints' model weights agree to within atol.

  Returns how many weight tensors were compared.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  got, expected = model_tensors(checkpoint), model_tensors(reference)
  assert got.keys() == expected.keys() and expected
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, atol=atol, err_msg=name)
  return len(expected)


def read_results(workdir: pathlib.Path) -> dict:
  return json.loads((workdir / 'results.json').read_text())


def file_stamps(directory: pathlib.Path) -> dict[str, tuple[int, int]]:
  """{relative path: (size, mtime_ns)} of every file below directory."""
  return {
      str(path.relative_to(directory)): (path.stat().st_size,
                                         path.stat().st_mtime_ns)
      for path in directory.rglob('*') if path.is_file()
  }


def digits(num_epochs=2, **fields):
  """configs/digits.py, shorter; fields are dotted keys -> values:
  digits(1, **{'model.width': 16})."""
  return override(load_config('digits'), num_epochs=num_epochs, **fields)


def override(config, **fields):
  """Sets each dotted key of fields in config; returns config."""
  for key, value in fields.items():
    section, _, field = key.rpartition('.')
    (config[section] if section else config)[field] = value
  return config


def load_config(name: str, *args):
  """Returns configs/<name>.py's get_config(*args)."""
  return load_config_file(REPO / 'configs' / f'{name}.py', *args)


def load_config_file(path: pathlib.Path, *args):
  """Returns the get_config(*args) of the config file at path."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  name = pathlib.Path(path).stem
  spec = importlib.util.spec_from_file_location(f'configs_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


def config_from_flags(*args: str):
  """The config ctl.main makes of these flags (`--config=FILE[:ARG]`, FILE
  relative to the repository, and `--config.KEY=VALUE`), for a run in this
  process."""
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  assert all(arg.startswith('--config') for arg in args), args
  [config_file] = [arg.partition('=')[2] for arg in args
                   if arg.startswith('--config=')]
  overrides = dict(arg[len('--config.'):].split('=', 1) for arg in args
                   if arg.startswith('--config.'))
  return config_lib.load(str(REPO / config_file), overrides)


# A recommendation export served in a fresh interpreter without ctl: its
# signature on the eval pairs (argv: the SavedModel, the pairs' .npz).
SERVE_RECOMMEND = """
import json, sys
import numpy as np, tensorflow as tf
pairs = np.load(sys.argv[2])
serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']
out = serve(user=tf.constant(pairs['user']), item=tf.constant(pairs['item']))
assert not any(name == 'ctl' or name.startswith('ctl.') for name in sys.modules)
print(json.dumps(out['probability'].numpy().tolist()))
"""


class Watched:
  """A process whose output (stdout and stderr) is collected as it runs."""

  started = []  # Those of tests, for conftest to kill a test's leftovers.

  def __init__(self, command: list[str], env=None, *, server: bool = False):
    """server: it outlives the test that starts it (a session's server,
    restarted by a test); else conftest kills it at the test's end."""
    self.process = subprocess.Popen(command, cwd=REPO, env=env or env_with(),
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
    if not server:
      Watched.started.append(self)
    self._lines = []
    self._changed = threading.Condition()
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.process.stdout:
      with self._changed:
        self._lines.append(line)
        self._changed.notify_all()
    with self._changed:
      self._lines.append(None)  # End of output.
      self._changed.notify_all()

  @property
  def output(self) -> str:
    with self._changed:
      return ''.join(line for line in self._lines if line is not None)

  def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
    """Waits until a line matches pattern; fails if output ends first."""
    deadline = time.monotonic() + timeout
    with self._changed:
      while True:
        for line in self._lines:
          match = line is not None and re.search(pattern, line)
          if match:
            return match
        assert self._lines[-1:] != [None], (
            f'Output ended without {pattern!r}:\n{self.output[-3000:]}')
        remaining = deadline - time.monotonic()
        assert remaining > 0, (f'No {pattern!r} within {timeout} s; the '
                               f'output so far ends:\n{self.output[-3000:]}')
        self._changed.wait(remaining)

  def wait(self, timeout: float = 600) -> int:
    """Waits for the process to exit; returns its exit code."""
    code = self.process.wait(timeout=timeout)
    self._reader.join()
    return code

  def kill(self) -> None:
    if self.process.poll() is None:
      self.process.kill()
    self.wait()


def sigterm_after(start, pattern: str, total_steps: int,
                  attempts: int = 3) -> tuple[Watched, int, int]:
  """SIGTERM to a job once a line matches pattern; the job, its exit code
  and the attempt it was.

  start(attempt) starts the job (in a workdir of that attempt's own). A job
  whose last steps take under a second can finish before the signal lands
  when this process stalls under load: only that, exit 0 with the log line
  of step total_steps, starts it again, at most `attempts` times.
  """
  for attempt in range(attempts):
    job = start(attempt)
    job.wait_for(pattern)
    job.process.send_signal(signal.SIGTERM)
    code = job.wait()
    if code or f'step {total_steps}/{total_steps} ' not in job.output:
      break
  return job, code, attempt


def fingerprint(output: str) -> list[str]:
  """The final-weights SHA-256 that each worker logged, in order."""
  return re.findall(r'Final weights sha256 (\w+)', output)


def processes_mentioning(text: str) -> list[int]:
  """Pids of live processes whose command line contains text."""
  found = []
  for entry in os.listdir('/proc'):
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as file:
        if text.encode() in file.read():
          found.append(int(entry))
    except (OSError, ValueError):
      continue
  return found


def wait_until_gone(pid: int, timeout: float = 60) -> None:
  """Waits until process pid is gone (or a zombie), at most timeout s."""
  deadline = time.monotonic() + timeout
  while True:
    try:
      with open(f'/proc/{pid}/stat', encoding='utf-8',
                errors='replace') as file:
        if file.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X'):
          return
    except FileNotFoundError:
      return
    assert time.monotonic() < deadline, f'process {pid} still runs'
    time.sleep(0.05)
