"""Runs an N-worker job on this machine and restarts it until it finishes.

    python -m ctl.launch --num_workers=2 -- --config=configs/digits.py --workdir=/tmp/ctl/job

starts N `python -m ctl.main` workers, each with a TF_CONFIG naming free
localhost ports, and prints their output line by line as `[worker i] ...`.
When the job stops because it was preempted (exit code 42), a worker failed
(43) or a worker was killed by a signal, every worker is stopped and all are
started again; they resume from the latest checkpoint. A failure a restart
cannot fix (exit code 1 or 2) ends the launch with that code.

SIGTERM or Ctrl-C to the launcher is passed on to the workers as SIGTERM:
they save a checkpoint at the step they reached and the launcher exits with
42 without restarting; a second Ctrl-C kills them at once and the launcher
exits with 130, as `ctl.main` does (the latest whole checkpoint is the one
to resume from).

With --num_ps=K the job is a parameter-server job: a chief (the
coordinator), N workers and K servers, printed as `[chief]`, `[worker i]`,
`[ps i]`. Its exit code is the chief's: a worker that dies does not stop
it (the chief runs its steps on the others) and, while the chief runs, is
started again on its own address (a signal, 42 or 43; up to --max_restarts
times a worker in an attempt), where TensorFlow's coordinator takes it back
by itself; when the chief stops, the others are told to stop too
(SIGTERM), unless it finished.

Exit codes: 0 when training finished; 130 after a second Ctrl-C; otherwise
the code that stopped the last attempt (42 preempted, 43 a worker failed, 1
or 2 from ctl.main).

The launcher itself only uses 127.0.0.1. TensorFlow's gRPC servers (one per
worker) listen on all interfaces whatever TF_CONFIG says (TF 2.21 hard-codes
`[::]:<port>`): on a machine reachable from an untrusted network, firewall
the ports.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

from ctl import errors
from ctl.runtime import tf_process
from ctl.runtime import subprocesses

_NUM_WORKERS = flags.DEFINE_integer('num_workers', 2, 'Workers to start.',
                                    lower_bound=1)
_NUM_PS = flags.DEFINE_integer(
    'num_ps', 0, 'Parameter servers to start: with any, the job is a chief '
    "(the coordinator), --num_workers workers and these servers "
    "(distribution.strategy='parameter_server').", lower_bound=0)
_MAX_RESTARTS = flags.DEFINE_integer(
    'max_restarts', 3, 'Restarts after a preemption or a worker failure; '
    'in a parameter-server job also restarts of each worker that stops '
    'while the chief runs, per attempt.', lower_bound=0)
_STOP_GRACE_SECS = flags.DEFINE_float(
    'stop_grace_secs', 30.0,
    'Once a worker has stopped, seconds the others get to stop by '
    'themselves before they are killed.')

# Exit codes after which a restart resumes the job.
_RESTARTABLE = (errors.EXIT_PREEMPTED, errors.EXIT_PEER_FAILED)


def main(argv: list[str]) -> None:
  worker_args = argv[1:]
  if not worker_args:
    raise app.UsageError('Pass ctl.main flags after --, e.g. '
                         '-- --config=configs/digits.py --workdir=/tmp/x')
  console = _Console()
  with _Interrupts() as interrupts:
    attempt = 0
    while not interrupts.count:
      attempt += 1
      codes = _Job(_NUM_WORKERS.value, worker_args, attempt, console,
                   interrupts, num_ps=_NUM_PS.value).run()
      # A parameter-server job is its chief's: workers may come and go.
      code = codes[0] if _NUM_PS.value else job_exit_code(codes)
      if code == 0:
        console.say(f'attempt {attempt}: training finished')
        sys.exit(0)
      if interrupts.count:
        console.say(f'stopped on request; workers exited with {codes}')
        if interrupts.stopped_at_once:
          # The code says so, as ctl.main's does, not the workers' deaths.
          console.say('Ctrl-C twice: stopped at once, without saving. Run '
                      'the same command again to resume from the latest '
                      'checkpoint.')
          sys.exit(tf_process.EXIT_INTERRUPTED)
        sys.exit(code)
      restartable = code in _RESTARTABLE
      if not restartable or attempt > _MAX_RESTARTS.value:
        why = 'a restart cannot fix it' if not restartable else (
            f'no restarts left (--max_restarts={_MAX_RESTARTS.value})')
        console.say(f'attempt {attempt}: workers exited with {codes}; '
                    f'giving up: {why}')
        sys.exit(code)
      console.say(f'attempt {attempt}: workers exited with {codes}; '
                  f'restarting ({attempt} of {_MAX_RESTARTS.value})')
    sys.exit(errors.EXIT_PREEMPTED)  # Asked to stop between attempts.


def job_exit_code(codes: list[int]) -> int:
  """One code for the job from its workers' exit codes.

  0 if all finished; else a code a restart cannot fix (1, 2...) if any
  worker gave one; else 43 if any worker failed or died by a signal; else 42
  (every stopped worker was preempted).
  """
  failures = [code for code in codes if code != 0]
  if not failures:
    return 0
  for code in failures:
    if code > 0 and code not in _RESTARTABLE:
      return code
  if all(code == errors.EXIT_PREEMPTED for code in failures):
    return errors.EXIT_PREEMPTED
  return errors.EXIT_PEER_FAILED


def tf_configs(num_workers: int) -> list[str]:
  """TF_CONFIG for each worker, on free localhost ports."""
  workers = [f'localhost:{port}' for port in _free_ports(num_workers)]
  return [
      json.dumps({'cluster': {'worker': workers},
                  'task': {'type': 'worker', 'index': index}})
      for index in range(num_workers)
  ]


def ps_tf_configs(num_workers: int, num_ps: int) -> list[tuple[str, str]]:
  """(name, TF_CONFIG) of a parameter-server job's tasks, on free localhost
  ports: the chief first, then the workers, then the servers."""
  ports = iter(_free_ports(1 + num_workers + num_ps))
  cluster = {job: [f'localhost:{next(ports)}' for _ in range(count)]
             for job, count in (('chief', 1), ('worker', num_workers),
                                ('ps', num_ps))}
  return [(f'{job} {index}' if job != 'chief' else 'chief',
           json.dumps({'cluster': cluster,
                       'task': {'type': job, 'index': index}}))
          for job, addresses in cluster.items()
          for index in range(len(addresses))]


def _free_ports(count: int) -> list[int]:
  """Ports free on 127.0.0.1 now; held together so that they differ."""
  sockets = []
  try:
    for _ in range(count):
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sock.bind(('127.0.0.1', 0))
      sockets.append(sock)
    return [sock.getsockname()[1] for sock in sockets]
  finally:
    for sock in sockets:
      sock.close()


class _Console:
  """Prints whole lines from several threads."""

  def __init__(self):
    self._lock = threading.Lock()

  def print(self, line: str) -> None:
    with self._lock:
      sys.stdout.write(line if line.endswith('\n') else line + '\n')
      sys.stdout.flush()

  def say(self, message: str) -> None:
    self.print(f'[launch] {message}')


class _Interrupts:
  """Turns SIGTERM and SIGINT to the launcher into requests to its workers."""

  def __init__(self):
    self.count = 0
    self.stopped_at_once = False  # By a second Ctrl-C.
    self._job = None
    self._previous = {}

  def __enter__(self) -> '_Interrupts':
    for signum in (signal.SIGTERM, signal.SIGINT):
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def watch(self, job: '_Job | None') -> None:
    """Sends later requests to job's workers (None: to nobody)."""
    self._job = job

  def _handle(self, signum, frame) -> None:
    del frame
    self.count += 1
    if self._job is not None:
      # SIGTERM lets workers save first; a second Ctrl-C stops them now.
      second_interrupt = signum == signal.SIGINT and self.count > 1
      self.stopped_at_once |= second_interrupt
      self._job.signal_all(signal.SIGKILL if second_interrupt else
                           signal.SIGTERM)


class _Job:
  """One attempt: N workers started together, watched until all have exited."""

  def __init__(self, num_workers: int, worker_args: list[str], attempt: int,
               console: _Console, interrupts: _Interrupts, num_ps: int = 0):
    self._num_workers = num_workers
    self._num_ps = num_ps
    self._worker_args = worker_args
    self._attempt = attempt
    self._console = console
    self._interrupts = interrupts
    self._tasks = []  # (name, TF_CONFIG) of each task.
    self._processes = []  # The latest process of each task.
    self._readers = []
    self._restarts = {}  # Of a parameter-server job's workers, by task.
    self._left = set()  # Workers not started again.

  def run(self) -> list[int]:
    """Starts the workers; returns their exit codes (-N: killed by signal N;
    a parameter-server job's chief first)."""
    self._tasks = (ps_tf_configs(self._num_workers, self._num_ps)
                   if self._num_ps else
                   [(f'worker {index}', tf_config) for index, tf_config
                    in enumerate(tf_configs(self._num_workers))])
    self._processes = [self._start(tf_config)
                       for _, tf_config in self._tasks]
    # Started after every fork, so that no thread runs while one happens
    # (a worker started again is the exception: _restart_lost_workers).
    for (name, _), process in zip(self._tasks, self._processes):
      self._relay(process.stdout, f'[{name}] ')
    self._console.say(f'attempt {self._attempt}: started workers with pids '
                      f'{[process.pid for process in self._processes]}')
    self._interrupts.watch(self)
    try:
      codes = self._wait()
    finally:
      self._interrupts.watch(None)
      self.signal_all(signal.SIGKILL)
      for reader in self._readers:
        reader.join()
    return codes

  def signal_all(self, signum: int) -> None:
    for process in self._processes:
      if process.poll() is None:
        process.send_signal(signum)

  def _start(self, tf_config: str) -> subprocess.Popen:
    """Starts one task of the job: ctl.main with its TF_CONFIG."""
    env = dict(os.environ, TF_CONFIG=tf_config, PYTHONUNBUFFERED='1')
    return subprocesses.start(
        [sys.executable, '-m', 'ctl.main', *self._worker_args], env=env,
        stdout=subprocess.PIPE)

  def _relay(self, stream, prefix: str) -> None:
    """Prints a worker's output lines with a prefix, from a thread."""

    def relay():
      for line in stream:
        self._console.print(prefix + line)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    self._readers.append(reader)

  def _restart_lost_workers(self, codes: list[int | None]) -> None:
    """Starts again, with the same TF_CONFIG, each worker of a
    parameter-server job that stopped on a signal, 42 or 43 while the chief
    runs (TensorFlow's coordinator reconnects it by itself), up to
    --max_restarts times a worker; not once the launcher is asked to stop."""
    for index, code in enumerate(codes):
      name, tf_config = self._tasks[index]
      if (code in (None, 0) or not name.startswith('worker ') or
          index in self._left or self._interrupts.count):
        continue  # Running, done, the chief or a server, or stopping.
      count = self._restarts.get(index, 0) + 1
      said = f'attempt {self._attempt}: {name} exited with {code}'
      if code > 0 and code not in _RESTARTABLE:
        why = 'a restart cannot fix it'
      elif count > _MAX_RESTARTS.value:
        why = f'no restarts left (--max_restarts={_MAX_RESTARTS.value})'
      else:
        # The relays' threads run as it forks: the child's work before exec
        # (subprocesses.start: a prctl) takes no lock of theirs.
        self._restarts[index] = count
        self._processes[index] = process = self._start(tf_config)
        self._console.say(f'{said}; started again ({count} of '
                          f'{_MAX_RESTARTS.value}) with pid {process.pid}')
        self._relay(process.stdout, f'[{name}] ')
        continue
      self._left.add(index)
      self._console.say(f'{said}; not started again: {why}')

  def _wait(self) -> list[int]:
    """Waits for every worker; kills the rest some time after one fails
    (in a parameter-server job, after the chief ended: the others are told
    to stop at once unless it finished, when they leave by themselves;
    while it runs, a worker lost is started again)."""
    first_failure = None
    killed = False
    while True:
      codes = [process.poll() for process in self._processes]
      if all(code is not None for code in codes):
        return codes
      if self._num_ps:
        if codes[0] is None:
          self._restart_lost_workers(codes)
        elif first_failure is None:
          first_failure = time.monotonic()
          if codes[0]:
            self.signal_all(signal.SIGTERM)
      elif first_failure is None and any(code for code in codes):
        first_failure = time.monotonic()
      # Once: the killed take a moment to be gone, and this loop goes on.
      if (first_failure is not None and not killed and
          time.monotonic() - first_failure > _STOP_GRACE_SECS.value):
        killed = True
        self._console.say(f'attempt {self._attempt}: killing workers that '
                          f'did not stop within {_STOP_GRACE_SECS.value} s')
        self.signal_all(signal.SIGKILL)
      time.sleep(0.1)


if __name__ == '__main__':
  app.run(main)
