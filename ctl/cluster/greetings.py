"""The start-up barrier's protocol: one-line greetings between tasks.

A probe greets a peer's address with `ctl-start-up <cluster fingerprint>
<task name>`, and the peer's `Listener` answers with its own; a task that
leaves during the wait sends `ctl-start-up-leaving <cluster fingerprint>
<task>` (and the peer whose host name did not resolve, if that is why).
ctl/cluster/rendezvous.py decides, from what the greetings found, when the
cluster has formed. Pure Python: nothing here imports TensorFlow.
"""

import enum
import socket
import threading

from ctl import errors
from ctl.cluster.tf_config import Cluster

# accept() wakes up this often to see whether the listener should stop.
_ACCEPT_SECONDS = 0.2
_GREETING = 'ctl-start-up'
_LEAVING = 'ctl-start-up-leaving'
# The longest a leaving task spends telling one peer.
_LEAVING_SECONDS = 0.5
# The longest a probe waits to connect and then to be answered; a listener
# waits as long for a greeting.
_CONNECT_SECONDS = 1.0
_ANSWER_SECONDS = 2.0


class Heard(enum.Enum):
  """What a probe of a peer's address found."""

  NOTHING = 'nothing accepts connections there'
  UNRESOLVED = 'its host name does not resolve'
  SOMETHING_ELSE = ('something accepts connections there, but it is not a '
                    'ctl task (another program holds the port?)')
  # No bytes at all within _ANSWER_SECONDS, or the connection dropped: a
  # process stopped (SIGSTOP), too busy to answer, or killed meanwhile.
  # Not another program (TensorFlow's server sends its HTTP/2 settings at
  # once): a peer that answered before is still its own self.
  SILENT = ('something accepts connections there but does not answer (a '
            'stopped or overloaded process?)')
  OTHER_CLUSTER = ('a ctl task of another cluster answers there (started '
                   'with a different TF_CONFIG?)')
  PEER = 'arrived'


def tell_leaving(cluster: Cluster, heard: dict, unresolved: str = '') -> None:
  """Tells every peer that listens that this task is leaving, and which
  peer's name did not resolve if that is why (best effort: one not
  listening yet is not waited for)."""
  for peer, (found, _) in heard.items():
    if found is Heard.UNRESOLVED:
      continue
    host, _, port = cluster.address_of(peer).rpartition(':')
    try:
      with socket.create_connection((host.strip('[]'), int(port)),
                                    timeout=_LEAVING_SECONDS) as connection:
        connection.sendall(
            f'{_LEAVING} {cluster.fingerprint} {cluster.task_name} '
            f'{unresolved}'.rstrip().encode() + b'\n')
    except OSError:
      pass


def _greeting(cluster: Cluster) -> bytes:
  """The line that names this task and its cluster to a peer."""
  return f'{_GREETING} {cluster.fingerprint} {cluster.task_name}\n'.encode()


def probe(cluster: Cluster, peer: str) -> tuple[Heard, str]:
  """Greets peer at its address; returns what answered, and a detail."""
  host, _, port = cluster.address_of(peer).rpartition(':')
  try:
    connection = socket.create_connection((host.strip('[]'), int(port)),
                                          timeout=_CONNECT_SECONDS)
  except socket.gaierror as error:
    # Whatever the resolver's reason: "no such name" and "temporary
    # failure" (EAI_AGAIN: no DNS server reachable, as in a network
    # namespace) alike; rendezvous.py allows a minute for either to pass.
    return Heard.UNRESOLVED, error.strerror or str(error)
  except OSError as error:
    return Heard.NOTHING, error.strerror or str(error) or type(error).__name__
  with connection:
    connection.settimeout(_ANSWER_SECONDS)
    try:
      connection.sendall(_greeting(cluster))
    except OSError:
      return Heard.SILENT, ''
    answer = _receive_line(connection)
  if not answer:
    return Heard.SILENT, ''
  fields = _first_line(answer).split()
  if fields == [_GREETING, cluster.fingerprint, peer]:
    return Heard.PEER, ''
  if fields[:1] == [_GREETING]:
    return Heard.OTHER_CLUSTER, ''
  return Heard.SOMETHING_ELSE, ''


def _receive_line(connection: socket.socket, limit: int = 200) -> bytes:
  """What connection sends up to its first newline, `limit` bytes or its
  end, whichever comes first; what came before a timeout or a reset."""
  data = b''
  try:
    while b'\n' not in data and len(data) < limit:
      chunk = connection.recv(limit)
      if not chunk:
        break
      data += chunk
  except OSError:
    pass
  return data


def _first_line(data: bytes) -> str:
  """The first whole line of data ('' without one)."""
  line, newline, _ = data.partition(b'\n')
  return line.decode('ascii', errors='replace') if newline else ''


class Listener:
  """This task's address while it waits: answers its peers' greetings.

  Serves on a thread of its own, so that answering never waits on this
  task's own probes (two tasks probing each other at once would otherwise
  each wait for the other's answer).
  """

  def __init__(self, cluster: Cluster):
    self._cluster = cluster
    self._heard_from = set()
    self._left = {}
    self._lock = threading.Lock()
    self._stopping = threading.Event()
    port = int(cluster.address.rpartition(':')[2])
    try:
      # All interfaces, as TensorFlow's server listens (it binds [::]:port
      # whatever the host), so that every address a peer may use works.
      if socket.has_dualstack_ipv6():
        self._socket = socket.create_server(
            ('', port), family=socket.AF_INET6, dualstack_ipv6=True)
      else:
        self._socket = socket.create_server(('', port))
    except OSError as error:
      raise errors.CtlError(
          f'This task ({cluster.task_name}) cannot listen at its address '
          f'{cluster.address} ({error.strerror or error}): another program '
          f'(an earlier run of this task?) holds port {port}. Stop it, or '
          'give the task a free port in TF_CONFIG.') from error
    # accept() wakes up this often to see whether it should stop.
    self._socket.settimeout(_ACCEPT_SECONDS)
    self._thread = threading.Thread(target=self._serve, daemon=True,
                                    name='ctl-start-up-listener')

  def __enter__(self) -> 'Listener':
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stopping.set()
    self._thread.join()
    self._socket.close()

  def heard_from(self) -> set[str]:
    """The peers whose greeting this task has answered."""
    with self._lock:
      return set(self._heard_from)

  def left(self) -> dict[str, str]:
    """The peers that said they are leaving, each with the peer whose name
    did not resolve if that is why ('' otherwise)."""
    with self._lock:
      return dict(self._left)

  def _serve(self) -> None:
    """Answers greetings, one connection at a time, until stopped."""
    while not self._stopping.is_set():
      try:
        connection, _ = self._socket.accept()
      except TimeoutError:
        continue
      except OSError:
        return
      with connection:
        self._answer(connection)

  def _answer(self, connection: socket.socket) -> None:
    """Answers one greeting; remembers the peer only once it is answered."""
    try:
      connection.settimeout(_ANSWER_SECONDS)
      fields = _first_line(_receive_line(connection)).split()
      if fields[:1] == [_LEAVING]:
        if (len(fields) in (3, 4) and
            fields[1] == self._cluster.fingerprint and
            fields[2] in self._cluster.peers):
          with self._lock:
            self._left[fields[2]] = (fields[3:] or [''])[0]
        return
      connection.sendall(_greeting(self._cluster))
    except OSError:
      return
    if (len(fields) == 3 and fields[:2] == [_GREETING,
                                             self._cluster.fingerprint]
        and fields[2] in self._cluster.peers):
      with self._lock:
        self._heard_from.add(fields[2])
