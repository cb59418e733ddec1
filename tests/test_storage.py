"""ctl.storage on a local folder and on gs:// (TensorFlow's own GCS
client against tests/gcs_server.py), and that no other module of ctl
touches the filesystem itself."""

import re

import pytest

from ctl import storage
import helpers


@pytest.fixture(params=['local', 'gcs'])
def root(request, tmp_path) -> str:
  if request.param == 'local':
    return str(tmp_path)
  return request.getfixturevalue('gcs_server').url('storage')


def test_whole_files_are_written_read_listed_and_removed(root):
  path = storage.join(root, 'a', 'results.json')
  assert storage.read_json(path) is None
  storage.makedirs(storage.join(root, 'a'))
  storage.write_json(path, {'step': 1})
  storage.write_json(path, {'step': 2})
  assert storage.read_json(path) == {'step': 2}
  # No temporary file is left beside it.
  assert storage.listdir(storage.join(root, 'a')) == ['results.json']
  storage.append_text(storage.join(root, 'a', 'log.txt'), 'one\n')
  storage.append_text(storage.join(root, 'a', 'log.txt'), 'two\n')
  assert storage.read_text(storage.join(root, 'a', 'log.txt')) == 'one\ntwo\n'
  storage.link_or_copy(path, storage.join(root, 'a', 'copy.json'))
  storage.remove(path)
  assert storage.read_json(storage.join(root, 'a', 'copy.json')) == {'step': 2}
  assert sorted(storage.glob(storage.join(root, 'a', '*.txt'))) == [
      storage.join(root, 'a', 'log.txt')]
  storage.remove(storage.join(root, 'a'))
  assert not storage.exists(storage.join(root, 'a'))
  storage.remove(storage.join(root, 'a'))  # Gone already: nothing.


def test_a_published_folder_replaces_the_old_one_marker_last(root, tmp_path):
  final = storage.join(root, 'export')
  for version in ('1', '2'):
    staging = tmp_path / f'staging-{version}'
    (staging / 'sub').mkdir(parents=True)
    (staging / 'sub' / 'model.bin').write_text(version)
    if version == '1':
      (staging / 'only-in-1').write_text('old')
    (staging / 'saved_model.pb').write_text(version)
    (staging / 'export.json').write_text(version)
    storage.publish_folder(str(staging), final, 'export.json')
  assert storage.read_text(storage.join(final, 'export.json')) == '2'
  assert storage.read_text(storage.join(final, 'sub', 'model.bin')) == '2'
  assert sorted(storage.listdir(final)) == ['export.json', 'saved_model.pb',
                                            'sub']
  assert not storage.exists(storage.join(final, 'only-in-1'))


def test_local_and_remote_paths_are_told_apart():
  assert storage.is_local('/tmp/run') and storage.is_local('run')
  assert storage.is_local('file:///tmp/run')
  assert not storage.is_local('gs://bucket/run')


# What may touch the filesystem outside ctl/storage.py, and why.
_ALLOWED = {
    # TensorFlow's AutoGraph cache in the local temp folder, not a workdir;
    # the process's start time, from /proc.
    'ctl/runtime/tf_process.py': ('glob.glob', 'os.path.exists', 'os.remove',
                                  'os.rmdir', "open('/proc"),
    # A flock of a local workdir, and who holds it from /proc; the local
    # temp folder's leftovers of killed ctl processes: this user's folders
    # only (their owner from os.stat), never a workdir.
    'ctl/runtime/workdir.py': ('os.path.isdir', 'os.stat', "open('/proc",
                               "open(f'/proc", 'glob.glob'),
    # Whether a worker's process of this host runs, is stopped or gone, from
    # /proc (ctl.status, and a worker naming its stalled peers).
    'ctl/runtime/processes.py': ("os.path.exists('/proc", "open('/proc",
                                "open(f'/proc"),
    # A study journal: Optuna's JournalFileBackend reads and writes a local
    # file itself, under its own lock; a cut last record is mended in place
    # under that lock, with the same kind of calls.
    'ctl/runtime/studies.py': ('os.path.exists(path)', "open(path, 'rb+')",
                               "open(backup, 'ab')"),
    # A warm process's run log: its file descriptors 1 and 2 are pointed at
    # it, so it is a local file by construction; stdin is /dev/null.
    'ctl/warm.py': ('os.makedirs(os.path.dirname(os.path.abspath(log_path))',
                    "open(log_path, 'ab' if append else 'wb')",
                    "open(os.devnull, 'rb')"),
    # A warm sweep slot's resident memory, from /proc.
    'ctl/sweep/slots.py': ("open(f'/proc",),
    # A trial's output file: a process writes it, so it is local by
    # construction (copied to a remote workdir when the trial exits).
    # Read back for its last error line (Trial.error_line).
    'ctl/sweep/trials.py': ('open(self._local_log', 'os.path.exists(path)',
                            "open(path, 'rb')", 'os.path.getsize(path)'),
}
_FILE_ACCESS = re.compile(
    r'\bos\.path\.(exists|isdir|isfile|getsize|getmtime)\(|\bshutil\.\w+\('
    r'|(?<![\w.])open\(|\bos\.(makedirs|remove|rename|replace|listdir|link|'
    r'unlink|stat|scandir|mkdir|rmdir|walk)\(|\bglob\.glob\(|tf\.io\.gfile\.')


def test_no_module_but_storage_touches_the_filesystem():
  found = []
  for path in sorted((helpers.REPO / 'ctl').rglob('*.py')):
    name = str(path.relative_to(helpers.REPO))
    if name == 'ctl/storage.py':
      continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
      code = line.split('#')[0]
      match = _FILE_ACCESS.search(code)
      if match and not any(allowed in code
                           for allowed in _ALLOWED.get(name, ())):
        found.append(f'{name}:{number}: {line.strip()}')
  assert not found, ('Use ctl.storage for file access:\n' +
                     '\n'.join(found))


def test_the_file_access_check_finds_what_it_looks_for():
  for line in ("open(path)", "os.replace(a, b)", "shutil.rmtree(x)",
               "tf.io.gfile.exists(p)", "os.path.isdir(w)", "glob.glob(p)"):
    assert _FILE_ACCESS.search(line), line
  for line in ("storage.open_binary(p)", "subprocess.Popen(c)",
               "os.path.join(a, b)", "self._open()"):
    assert not _FILE_ACCESS.search(line), line
