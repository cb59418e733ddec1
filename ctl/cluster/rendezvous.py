"""ctl's start-up barrier: every task waits for its peers before TensorFlow does.

TensorFlow waits for every task inside the MultiWorkerMirroredStrategy
constructor, in C++ code that holds Python's GIL, and takes SIGTERM with
a handler of its own that only sets a flag: nothing written in Python,
not even another thread, runs until it returns. Its deadline
(distribution.py sets it from distribution.startup_timeout_seconds)
fails a peer that never registers, but SIGTERM cannot end that wait. So
ctl waits first, in Python, where a deadline and SIGTERM can be acted
on, and enters TensorFlow's wait only once every peer has arrived, when
it lasts about as long as the peers take to enter theirs too.

While it waits, each task listens at its own address and answers a
one-line greeting naming its cluster and itself; it probes each peer's
address the same way. A task goes on once it has heard every peer *and*
every peer has heard it: after that nothing needs its listener, which it
closes so that TensorFlow's server can take the port. Waiting for the
second half is what makes this safe: a task that went on after hearing
the others, but unheard by one of them, would leave that one probing a
TensorFlow server that does not answer the greeting. The greeting also
tells a peer that has not started from another program on its port, or a
ctl task of another cluster (a stale run), which a mere TCP connect would
take for an arrived peer.

A peer that stops during the wait must not leave the others waiting out
the timeout: one that leaves (SIGTERM, an error) tells every peer
listening, and one killed outright is noticed when its address, which
answered, stops accepting connections. Every peer is probed until the
wait ends, whatever it answered before: one that goes silent for a while
(stopped, overloaded) and is killed later is noticed too. A peer done
waiting is told from a slow one by what its port answers: TensorFlow's
server sends bytes that are not a greeting at once, a stopped process
none. A peer's host name that does not resolve for `_UNRESOLVED_SECONDS`,
whatever the resolver's reason (no such name, or a resolver that fails),
is a wrong cluster, not a late peer.

Pure Python: nothing here imports TensorFlow.
"""

import math
import time
from typing import Callable

from absl import logging

from ctl import errors
from ctl.cluster import greetings
from ctl.cluster.tf_config import Cluster

# How long a peer's host name may fail to resolve before the cluster is
# taken for wrong (exit 2): Kubernetes creates a pod's DNS name when the
# pod starts, which can lag the other pods by some seconds; a name that
# still does not resolve after a minute is a typo or a wrong node list.
_UNRESOLVED_SECONDS = 60.0
# Probes refused in a row, of a peer that had answered and has not heard
# this task, before it counts as gone (one refusal could be the moment a
# peer that is done closes its listener).
_GONE_AFTER_REFUSALS = 2
# As many for a peer that heard this task: it may be done, its port between
# its listener and TensorFlow's server.
_DONE_GONE_AFTER_REFUSALS = 15
# Seconds between rounds of probes.
_ROUND_SECONDS = 0.2
# While waiting, the missing peers are logged this often.
_REPORT_SECONDS = 30.0


def wait_for_peers(cluster: Cluster, timeout_seconds: float,
                   should_stop: Callable[[], bool],
                   unresolved_seconds: float = _UNRESOLVED_SECONDS) -> bool:
  """Returns once every peer has started and has heard from this task.

  See the module docstring for how. The listener at this task's address is
  closed when this returns or raises, so TensorFlow's server can take it.

  Args:
    cluster: the cluster; its `peers` are waited for.
    timeout_seconds: how long to wait; 0 waits for ever.
    should_stop: called between probes; when it returns True, the wait
      ends (the peers are told this task leaves) and False is returned.
    unresolved_seconds: how long a peer's host name may not resolve.

  Returns:
    True once the peers are there; False if should_stop() said so first.

  Raises:
    PeerFailure: the peers were not all there within timeout_seconds (the
      message names the ones missing and what was found at their
      addresses), or one left or was killed meanwhile (named).
    ConfigError: a peer's host name did not resolve for unresolved_seconds.
    CtlError: this task cannot listen at its own address.
  """
  peers = cluster.peers
  if not peers:
    return True
  started = time.monotonic()
  next_report = started + _REPORT_SECONDS
  heard, refusals, silent, unresolved_since = _nothing_found_yet(peers)
  with greetings.Listener(cluster) as listener:
    try:
      while True:
        if not _probe_all(cluster, should_stop, heard, refusals, silent,
                          unresolved_since):
          greetings.tell_leaving(cluster, heard)
          return False
        heard_from = listener.heard_from()
        _check_peers(cluster, listener.left(), refusals, heard_from,
                     unresolved_since, unresolved_seconds,
                     lambda gone: _missing(cluster, heard, heard_from, silent,
                                           besides=gone))
        if _all_there(peers, heard, heard_from):
          return True
        next_report = _wait_a_round(
            cluster, timeout_seconds, started, next_report,
            _missing(cluster, heard, heard_from, silent))
    except _Unresolved as error:
      # The peers are told which name does not resolve, so that they exit 2
      # too rather than 43 (a task gone), which slurm.sbatch requeues.
      greetings.tell_leaving(cluster, heard, error.peer)
      raise
    except BaseException:
      # Leaving (a failure, Ctrl-C): the peers need not wait for this task.
      greetings.tell_leaving(cluster, heard)
      raise


def _nothing_found_yet(
    peers: tuple[str, ...]) -> tuple[dict, dict, set[str], dict]:
  """The records of what probing the peers finds, before the first probe.

  Returns:
    heard: {peer: (what answered, a detail)}; refusals: {peer: refused
    probes in a row, since it answered}; silent: of the peers that
    answered, the ones whose latest probe found silence; unresolved_since:
    {peer: (since when its name does not resolve, the resolver's reason)}.
  """
  heard = dict.fromkeys(peers, (greetings.Heard.NOTHING, 'not probed yet'))
  return heard, dict.fromkeys(peers, 0), set(), {}


def _probe_all(cluster: Cluster, should_stop: Callable[[], bool],
               heard: dict, refusals: dict, silent: set[str],
               unresolved_since: dict) -> bool:
  """Probes every peer once (_probe_again); False, before probing the next
  one, once should_stop() says so."""
  for peer in cluster.peers:
    if should_stop():
      return False
    _probe_again(cluster, peer, heard, refusals, silent, unresolved_since)
  return True


def _all_there(peers: tuple[str, ...], heard: dict,
               heard_from: set[str]) -> bool:
  """Whether every peer answered the greeting and has heard this task."""
  return (all(found is greetings.Heard.PEER for found, _ in heard.values())
          and heard_from >= set(peers))


def _wait_a_round(cluster: Cluster, timeout_seconds: float, started: float,
                  next_report: float, missing: str) -> float:
  """Sleeps until the next round of probes; the time of the next report.

  Logs the missing peers when a report is due.

  Raises:
    PeerFailure: timeout_seconds (0: for ever) have passed since started.
  """
  now = time.monotonic()
  if now >= started + (timeout_seconds or math.inf):
    raise _did_not_form(cluster, timeout_seconds, missing)
  if now >= next_report:
    logging.info('Still waiting for the cluster after %.0f s: %s.',
                 now - started, missing)
    next_report = now + _REPORT_SECONDS
  time.sleep(_ROUND_SECONDS)
  return next_report


def _did_not_form(cluster: Cluster, timeout_seconds: float,
                  missing: str) -> errors.PeerFailure:
  return errors.PeerFailure(
      'The cluster did not form within '
      f'distribution.startup_timeout_seconds={timeout_seconds:g}: '
      f'{missing}. This task ({cluster.task_name} at {cluster.address}) '
      'gives up without training; restart all workers of the job together, '
      'and check that every one of them starts with the same cluster '
      f'({cluster.source}).')


def _probe_again(cluster: Cluster, peer: str, heard: dict, refusals: dict,
                 silent: set[str], unresolved_since: dict) -> None:
  """Probes a peer and records what answered.

  A peer that answered before keeps its place: refused connections in a
  row count towards its being gone (refusals); anything that accepts the
  connection breaks the row: silence (noted in silent: the peer is alive
  but stopped or slow) or something else (TensorFlow's server: the peer is
  done)."""
  found, detail = greetings.probe(cluster, peer)
  silent.discard(peer)
  if (heard[peer][0] is greetings.Heard.PEER and
      found is not greetings.Heard.PEER):
    refusals[peer] = (refusals[peer] + 1 if found is greetings.Heard.NOTHING
                      else 0)
    if found is greetings.Heard.SILENT:
      silent.add(peer)
  else:
    heard[peer], refusals[peer] = (found, detail), 0
  if found is greetings.Heard.UNRESOLVED:
    since, _ = unresolved_since.get(peer, (time.monotonic(), ''))
    unresolved_since[peer] = since, detail
  else:
    unresolved_since.pop(peer, None)


def _check_peers(cluster: Cluster, left: dict[str, str], refusals: dict,
                 heard_from: set[str], unresolved_since: dict,
                 unresolved_seconds: float,
                 missing: Callable[[str], str]) -> None:
  """Raises when a peer left or is gone, or its name does not resolve.

  missing(peer) says which other peers are missing, and why.

  Raises:
    PeerFailure: a peer said it is leaving, or it had answered and its
      address now refuses connections.
    ConfigError: a peer's host name has not resolved for
      unresolved_seconds.
  """
  for peer, unresolved in sorted(left.items()):
    # Its name for any task of the cluster, this one's included.
    if unresolved in (*cluster.peers, cluster.task_name):
      raise _unresolved(cluster, unresolved, unresolved_seconds,
                        f' ({peer} found so and stopped)')
    raise errors.PeerFailure(
        f'{peer} at {cluster.address_of(peer)} stopped while the cluster '
        f'formed{_besides(missing(peer))}. This task ({cluster.task_name}) '
        'gives up without training; restart all workers of the job together.')
  for peer, count in refusals.items():
    # One that heard this task may be done, between closing its listener
    # and TensorFlow's server taking the port: allowed a longer while.
    if count >= (_GONE_AFTER_REFUSALS if peer not in heard_from else
                 _DONE_GONE_AFTER_REFUSALS):
      raise errors.PeerFailure(
          f'{peer} at {cluster.address_of(peer)} had started and is gone '
          f'(killed?) while the cluster formed{_besides(missing(peer))}. '
          f'This task ({cluster.task_name}) gives up without training; '
          'restart all workers of the job together.')
  now = time.monotonic()
  for peer, (since, reason) in unresolved_since.items():
    if now - since >= unresolved_seconds:
      raise _unresolved(cluster, peer, unresolved_seconds, f' ({reason})')


def _besides(missing: str) -> str:
  """The other peers missing, for a message about one (or nothing)."""
  return f'; {missing}' if missing else ''


class _Unresolved(errors.ConfigError):
  """A peer's host name did not resolve (exit 2); names the peer."""

  def __init__(self, message: str, peer: str):
    super().__init__(message)
    self.peer = peer


def _unresolved(cluster: Cluster, peer: str, unresolved_seconds: float,
                how: str = '') -> _Unresolved:
  """The error for a peer whose host name has not resolved."""
  host = cluster.address_of(peer).rpartition(':')[0]
  return _Unresolved(
      f'The host name of {peer}, {host!r}, has not resolved for '
      f'{unresolved_seconds:g} s{how}: the cluster ({cluster.source}) names '
      'a host that does not exist, or this host cannot reach its name '
      'server. Correct it; nothing was trained.', peer)


def _missing(cluster: Cluster, heard: dict, heard_from: set[str],
             silent: set[str], besides: str = '') -> str:
  """Says which peers (but `besides`) are missing, and what was found at
  their addresses."""
  missing = []
  for peer, (found, detail) in heard.items():
    where = f'{peer} at {cluster.address_of(peer)}'
    if peer == besides:
      continue
    if found is greetings.Heard.NOTHING:
      missing.append(f'{where} did not arrive ({found.value}: {detail})')
    elif found is not greetings.Heard.PEER:
      missing.append(f'{where} did not arrive ({found.value})')
    elif peer in silent:
      missing.append(f'{where} started, then stopped answering '
                     f'({greetings.Heard.SILENT.value})')
    elif peer not in heard_from:
      missing.append(f'{where} started but has not reached this task at '
                     f'{cluster.address} (is that address right, and '
                     'reachable from there?)')
  if besides:
    return '; '.join(missing)
  # The wait returns before asking when nothing is missing; should a peer
  # arrive between the two, every peer is named rather than none.
  return '; '.join(missing) or 'one of ' + ', '.join(
      f'{peer} at {cluster.address_of(peer)}' for peer in heard)
