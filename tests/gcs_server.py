"""A Google Cloud Storage JSON API on localhost, for TensorFlow's own client.

    python tests/gcs_server.py store --port=S
    python tests/gcs_server.py front --port=P --store_port=S --certificates=C

TensorFlow's GCS filesystem always talks to https://www.googleapis.com and
https://storage.googleapis.com (it has no endpoint setting). Two processes
serve both, offline: the store, `gcp-storage-emulator` from the package
registry (its objects in memory), on 127.0.0.1:S; and in front of it a
TLS-terminating CONNECT proxy on 127.0.0.1:P, with certificates for both
names signed by a throwaway CA (C/ca.pem, made here with openssl). A
process reaches them with `https_proxy=http://127.0.0.1:P` and
`CURL_CA_BUNDLE=C/ca.pem` (`tests/gcs.py` sets them up). Stopping and
restarting the front is the store going away for a while, its objects
kept. Each prints "ready" once it accepts connections, and serves until
SIGTERM.

Two fixes to the emulator for what TensorFlow 2.21 asks of it (see
../shared/TF_NOTES.md): a zero-byte media upload (TensorFlow's directory
markers) crashed it, and TensorFlow asks for a bucket's storageLayout
before renaming a directory, which it did not serve.
"""

import argparse
import http.client
import os
import pathlib
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading

from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.handlers import objects as emulator_objects

BUCKET = 'ctl-test'
NAMES = ('www.googleapis.com', 'storage.googleapis.com')


def certificates(directory: pathlib.Path) -> tuple[str, str]:
  """A throwaway CA (ca.pem) and a server certificate for NAMES signed by
  it; returns (server.pem, server.key). Made once per directory."""
  directory.mkdir(parents=True, exist_ok=True)
  cert, key = directory / 'server.pem', directory / 'server.key'
  if cert.exists():
    return str(cert), str(key)

  def openssl(*args):
    subprocess.run(['openssl', *args], cwd=directory, check=True,
                   capture_output=True)

  openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
          '-subj', '/CN=ctl test CA', '-keyout', 'ca.key', '-out', 'ca.pem')
  openssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', f'/CN={NAMES[0]}',
          '-keyout', 'server.key', '-out', 'server.csr')
  (directory / 'names.ext').write_text(
      'subjectAltName=' + ','.join(f'DNS:{name}' for name in NAMES) + '\n')
  openssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey',
          'ca.key', '-CAcreateserial', '-days', '2', '-extfile', 'names.ext',
          '-out', 'server.pem.tmp')
  os.replace(directory / 'server.pem.tmp', cert)
  return str(cert), str(key)


def fix_emulator() -> None:
  """The two fixes named in the module's docstring."""
  media_upload = emulator_objects._media_upload  # pylint: disable=protected-access

  def media_upload_of_nothing_too(request, response, storage):
    if request.data is None:
      request._data = b''  # pylint: disable=protected-access
    return media_upload(request, response, storage)

  emulator_objects._media_upload = media_upload_of_nothing_too  # pylint: disable=protected-access

  def storage_layout(request, response, storage):
    del storage
    response.json({'kind': 'storage#storageLayout',
                   'bucket': request.params['bucket_name'],
                   'hierarchicalNamespace': {'enabled': False}})

  # Its responses leave in several writes: without this, each waits for
  # the client's delayed ACK (40 ms).
  emulator_server.RequestHandler.disable_nagle_algorithm = True
  emulator_server.HANDLERS = (
      (r'^/storage/v1/b/(?P<bucket_name>[-.\w]+)/storageLayout$',
       {emulator_server.GET: storage_layout}),
      *emulator_server.HANDLERS)


class Proxy(socketserver.ThreadingTCPServer):
  """Answers CONNECT, terminates TLS, and forwards each request to the
  emulator as plain HTTP (resumable-upload Locations made https again)."""

  daemon_threads = True
  allow_reuse_address = True

  def __init__(self, port: int, upstream_port: int, cert: str, key: str):
    self.upstream_port = upstream_port
    self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    self.tls.load_cert_chain(cert, key)
    super().__init__(('127.0.0.1', port), ProxyHandler)


class ProxyHandler(socketserver.StreamRequestHandler):

  def handle(self):
    line = self.rfile.readline().decode('latin-1')
    while self.rfile.readline() not in (b'\r\n', b'\n', b''):
      pass
    if not line.startswith('CONNECT '):
      self.wfile.write(b'HTTP/1.1 405 Only CONNECT\r\n\r\n')
      return
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    self.wfile.write(b'HTTP/1.1 200 Connection established\r\n\r\n')
    self.wfile.flush()
    with self.server.tls.wrap_socket(self.connection,
                                     server_side=True) as tls:
      reader, writer = tls.makefile('rb'), tls.makefile('wb')
      while self._forward_one(reader, writer):
        pass

  def _forward_one(self, reader, writer) -> bool:
    """Forwards one request; False once the client closed."""
    request_line = reader.readline().decode('latin-1')
    if not request_line.strip():
      return False
    method, target, _ = request_line.split(' ', 2)
    headers = []
    while True:
      header = reader.readline().decode('latin-1')
      if header in ('\r\n', '\n', ''):
        break
      name, _, value = header.partition(':')
      headers.append((name.strip(), value.strip()))
    names = {name.lower(): value for name, value in headers}
    if names.get('expect', '').lower() == '100-continue':
      # Else libcurl waits a second before it sends the body.
      writer.write(b'HTTP/1.1 100 Continue\r\n\r\n')
      writer.flush()
    if names.get('transfer-encoding', '').lower() == 'chunked':
      body = _read_chunked(reader)
    else:
      body = reader.read(int(names.get('content-length', 0)))
    headers = [(name, value) for name, value in headers
               if name.lower() not in ('content-length', 'transfer-encoding',
                                       'expect')]
    headers.append(('Content-Length', str(len(body))))
    upstream = http.client.HTTPConnection('127.0.0.1',
                                          self.server.upstream_port,
                                          timeout=60)
    try:
      upstream.putrequest(method, target, skip_host=True,
                          skip_accept_encoding=True)
      for name, value in headers:
        if name.lower() not in ('connection', 'proxy-connection'):
          upstream.putheader(name, value)
      upstream.endheaders(body)
      response = upstream.getresponse()
      content = response.read()
    finally:
      upstream.close()
    writer.write(f'HTTP/1.1 {response.status} {response.reason}\r\n'.encode())
    for name, value in response.getheaders():
      if name.lower() in ('content-length', 'connection',
                          'transfer-encoding'):
        continue
      if name.lower() == 'location':
        value = value.replace('http://', 'https://', 1)
      writer.write(f'{name}: {value}\r\n'.encode('latin-1'))
    writer.write(f'Content-Length: {len(content)}\r\n\r\n'.encode())
    writer.write(content)
    writer.flush()
    return True


def serve_store(port: int) -> None:
  fix_emulator()
  emulator = emulator_server.create_server('127.0.0.1', port, in_memory=True,
                                           default_bucket=BUCKET)
  stopped = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stopped.set())
  emulator.start()
  print('ready', flush=True)
  stopped.wait()
  emulator.stop()


def serve_front(port: int, store_port: int, certificate_dir: str) -> None:
  cert, key = certificates(pathlib.Path(certificate_dir))
  proxy = Proxy(port, store_port, cert, key)
  signal.signal(signal.SIGTERM, lambda *_: threading.Thread(
      target=proxy.shutdown).start())
  print('ready', flush=True)
  try:
    proxy.serve_forever()
  finally:
    proxy.server_close()


def _read_chunked(reader) -> bytes:
  body = b''
  while True:
    size = int(reader.readline().split(b';')[0].strip() or b'0', 16)
    if not size:
      while reader.readline() not in (b'\r\n', b'\n', b''):
        pass  # Trailers.
      return body
    body += reader.read(size)
    reader.readline()


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('role', choices=('store', 'front'))
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--store_port', type=int)
  parser.add_argument('--certificates')
  args = parser.parse_args()
  if args.role == 'store':
    serve_store(args.port)
  else:
    serve_front(args.port, args.store_port, args.certificates)
  sys.exit(0)


if __name__ == '__main__':
  main()
