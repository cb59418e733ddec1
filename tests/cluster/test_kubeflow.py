"""Kubernetes: the TFJob manifest a user copies, its command run as Kubeflow runs it.

Kubeflow's training operator gives each pod of a TFJob a TF_CONFIG naming
every pod of the training replicas, by service name, and which one the pod
is; it recreates a pod that exits with a retryable code. This machine has
no Kubernetes: the tests read experiments/deploy/tfjob.yaml (and
tfjob_ps.yaml, a parameter-server job) and run each replica's container
command (command + args) as a process, with the
TF_CONFIG the operator would set, on localhost ports instead of the pods'
port 2222.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import portpicker
import pytest
import yaml

from ctl.cluster import tf_config as cluster_lib
import helpers

MANIFEST = helpers.REPO / 'experiments' / 'deploy' / 'tfjob.yaml'
# Chief, Worker and PS replicas: a parameter-server job.
PS_MANIFEST = helpers.REPO / 'experiments' / 'deploy' / 'tfjob_ps.yaml'
# The operator's exit codes that restart a pod (training-operator v1:
# 128 to 255); 1 to 127 fail the job.
RETRYABLE = range(128, 256)


def _documents(manifest=MANIFEST) -> dict:
  """The manifest's documents, by kind."""
  return {document['kind']: document
          for document in yaml.safe_load_all(manifest.read_text())}


def _replicas(manifest=MANIFEST) -> dict:
  """The TFJob's replica specs, by type ('Chief', 'Worker', 'PS')."""
  return _documents(manifest)['TFJob']['spec']['tfReplicaSpecs']


def _container(replica_type: str, manifest=MANIFEST) -> dict:
  [container] = _replicas(manifest)[replica_type]['template']['spec'][
      'containers']
  return container


def _tf_configs(addresses: dict) -> dict:
  """{(type, index): TF_CONFIG} as the operator sets them for each pod.

  addresses: {job: [host:port, ...]}, the operator's service names here
  replaced by localhost ports.
  """
  return {(job, index): json.dumps({
      'cluster': addresses, 'task': {'type': job, 'index': index},
      'environment': 'cloud'})
          for job, tasks in addresses.items() for index in range(len(tasks))}


def test_the_manifest_restarts_pods_on_what_a_restart_resumes():
  documents = _documents()
  replicas = _replicas()
  assert documents['TFJob']['apiVersion'] == 'kubeflow.org/v1'
  # A chief distinct from the workers: it alone writes the workdir.
  assert replicas['Chief']['replicas'] == 1 and replicas['Worker']['replicas']
  claim = documents['PersistentVolumeClaim']
  assert claim['spec']['accessModes'] == ['ReadWriteMany']
  for replica_type, spec in replicas.items():
    assert spec['restartPolicy'] == 'ExitCode'
    container = _container(replica_type)
    assert container['name'] == 'tensorflow'  # Whose exit code counts.
    assert {'name': 'tfjob-port', 'containerPort': 2222} in container['ports']
    [mount] = container['volumeMounts']
    [volume] = spec['template']['spec']['volumes']
    assert volume['persistentVolumeClaim']['claimName'] == (
        claim['metadata']['name'])
    assert f'--workdir={mount["mountPath"]}/' in ' '.join(container['args'])
    assert container['command'] == _container('Chief')['command']


def _run_container(replica_type: str, bin_dir, log, *extra_args, env,
                   manifest=MANIFEST):
  """Starts the replica's container command as a process, with bin_dir
  first on the PATH and its output to the file log; returns it."""
  container = _container(replica_type, manifest)
  env = {**env, 'PATH': os.pathsep.join([str(bin_dir), env['PATH']])}
  return subprocess.Popen(
      [*container['command'], *container['args'], *extra_args],
      cwd=helpers.REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


# Stands in for ctl: records that it started, then exits with $EXIT_CODE,
# or with 42 on SIGTERM (as ctl does once it saved), or kills itself.
STANDIN_CTL = '''#!/bin/sh
trap 'exit 42' TERM
echo started > "$STARTED"
if [ "$EXIT_CODE" = wait ]; then
  while :; do sleep 0.05; done
elif [ "$EXIT_CODE" = kill ]; then
  kill -KILL $$
fi
exit "$EXIT_CODE"
'''


@pytest.mark.parametrize('ctl_exit, pod_exit', [
    ('0', 0),
    ('42', 138),  # Preempted after a checkpoint: restart the pod.
    ('43', 138),  # A peer failed: restart.
    ('1', 1),  # A restart would fail the same way: fail the job.
    ('2', 2),
    ('kill', 137),  # SIGKILL, out of memory: the operator retries it too.
    ('wait', 138),  # SIGTERM to the pod reaches ctl, which saves: 42.
])
def test_the_container_command_maps_ctl_exit_codes_for_the_operator(
    tmp_path, ctl_exit, pod_exit):
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  python = bin_dir / 'python'
  python.write_text(STANDIN_CTL)
  python.chmod(python.stat().st_mode | stat.S_IXUSR)
  started = tmp_path / 'started'
  pod = _run_container('Worker', bin_dir, subprocess.DEVNULL,
                       env=helpers.env_with(EXIT_CODE=ctl_exit,
                                            STARTED=str(started)))
  try:
    if ctl_exit == 'wait':
      deadline = time.monotonic() + 30
      while not started.exists():
        assert time.monotonic() < deadline and pod.poll() is None
        time.sleep(0.02)
      pod.send_signal(signal.SIGTERM)  # What Kubernetes sends the pod.
    assert pod.wait(timeout=30) == pod_exit
  finally:
    if pod.poll() is None:
      pod.kill()
  assert (pod_exit in RETRYABLE) == (ctl_exit in ('42', '43', 'kill',
                                                 'wait'))


def test_kubeflow_tf_configs_with_a_chief_worker_and_evaluator_are_read():
  addresses = {'chief': ['ctl-digits-chief-0.default.svc:2222'],
               'worker': [f'ctl-digits-worker-{index}.default.svc:2222'
                          for index in range(2)],
               'evaluator': ['ctl-digits-evaluator-0.default.svc:2222']}
  clusters = {key: cluster_lib.from_tf_config(text)
              for key, text in _tf_configs(addresses).items()}
  assert [key for key, cluster in clusters.items() if cluster.is_chief] == [
      ('chief', 0)]
  worker = clusters[('worker', 0)]
  assert worker.training_tasks == ('chief:0', 'worker:0', 'worker:1')
  assert worker.describe() == (
      'worker:0 at ctl-digits-worker-0.default.svc:2222; peers: chief:0 at '
      'ctl-digits-chief-0.default.svc:2222, worker:1 at '
      'ctl-digits-worker-1.default.svc:2222')
  assert clusters[('evaluator', 0)].has_evaluator
  assert len({cluster.fingerprint for cluster in clusters.values()}) == 1


def test_the_parameter_server_manifest_restarts_what_a_restart_resumes():
  documents = _documents(PS_MANIFEST)
  replicas = _replicas(PS_MANIFEST)
  assert documents['TFJob']['apiVersion'] == 'kubeflow.org/v1'
  assert set(replicas) == {'Chief', 'Worker', 'PS'}
  assert replicas['Chief']['replicas'] == 1  # The coordinator.
  assert replicas['Worker']['replicas'] >= 1 and replicas['PS']['replicas']
  # Workers and servers of a job that ended are deleted, not left serving.
  assert documents['TFJob']['spec']['runPolicy']['cleanPodPolicy'] == (
      'Running')
  claim = documents['PersistentVolumeClaim']
  assert claim['spec']['accessModes'] == ['ReadWriteMany']
  for replica_type, spec in replicas.items():
    # Recreated on 128 to 255, uncounted by backoffLimit: workers come and
    # go any number of times; 1 and 2 fail the job.
    assert spec['restartPolicy'] == 'ExitCode'
    container = _container(replica_type, PS_MANIFEST)
    assert container['name'] == 'tensorflow'
    # tfjob.yaml's command, whose exit codes the test above maps.
    assert container['command'] == _container('Chief')['command']
    assert container['args'] == _container('Chief', PS_MANIFEST)['args']
    assert {'name': 'tfjob-port', 'containerPort': 2222} in container['ports']
    [mount] = container['volumeMounts']
    [volume] = spec['template']['spec']['volumes']
    assert volume['persistentVolumeClaim']['claimName'] == (
        claim['metadata']['name'])
    assert f'--workdir={mount["mountPath"]}/' in ' '.join(container['args'])


@pytest.mark.parametrize('evaluator', [False, True])
def test_the_operators_tf_configs_of_the_ps_manifest_are_a_ps_job(evaluator):
  from ctl.cluster import ps_cluster  # pylint: disable=g-import-not-at-top
  addresses = {
      kind.lower(): [f'ctl-digits-ps-{kind.lower()}-{index}.default.svc:2222'
                     for index in range(spec['replicas'])]
      for kind, spec in _replicas(PS_MANIFEST).items()}
  if evaluator:  # The template's Evaluator, uncommented.
    addresses['evaluator'] = ['ctl-digits-ps-evaluator-0.default.svc:2222']
  clusters = {key: cluster_lib.from_tf_config(text)
              for key, text in _tf_configs(addresses).items()}
  for cluster in clusters.values():
    assert ps_cluster.has_ps(cluster, 'auto')  # strategy 'auto' chooses it.
    ps_cluster.check_cluster(cluster)  # A cluster it can run.
  assert [key for key, cluster in clusters.items() if cluster.is_chief] == [
      ('chief', 0)]
  assert [key for key, cluster in clusters.items()
          if ps_cluster.is_server(cluster.task_type)] == [
              ('worker', 0), ('worker', 1), ('ps', 0)]
  assert clusters[('chief', 0)].has_evaluator is evaluator
  assert len({cluster.fingerprint for cluster in clusters.values()}) == 1


@pytest.mark.slow
def test_the_ps_pods_serve_on_while_the_chiefs_pod_is_recreated(tmp_path):
  """The PS manifest's pods, chief, worker and server: SIGTERM to the
  chief's pod (138: the operator recreates it), and the new chief
  resumes from its checkpoint on the same worker and server, which served
  on meanwhile and leave when it marks the job done."""
  workdir = tmp_path / 'workdir'
  overrides = ('--config.num_epochs=4', '--config.intervals.log_steps=11',
               f'--workdir={workdir}')
  addresses = {job: [f'localhost:{portpicker.pick_unused_port()}']
               for job in ('chief', 'worker', 'ps')}
  tf_configs = _tf_configs(addresses)
  replica_types = {'chief': 'Chief', 'worker': 'Worker', 'ps': 'PS'}

  def start_pod(job, attempt):
    with open(tmp_path / f'{job}{attempt}.log', 'w') as log:
      return _run_container(
          replica_types[job], os.path.dirname(sys.executable), log,
          *overrides, env=helpers.env_with(TF_CONFIG=tf_configs[(job, 0)]),
          manifest=PS_MANIFEST)

  pods = {job: start_pod(job, 1) for job in addresses}
  try:
    helpers.wait_for_checkpoint(workdir, pods['chief'], timeout=300)
    pods['chief'].send_signal(signal.SIGTERM)  # The sh wrapper's pid.
    assert pods['chief'].wait(timeout=120) == 138, (
        tmp_path / 'chief1.log').read_text()[-3000:]
    stopped = helpers.latest_checkpoint_step(workdir)
    assert pods['worker'].poll() is None and pods['ps'].poll() is None
    pods['chief'] = start_pod('chief', 2)  # As the operator recreates it.
    codes = {job: pod.wait(timeout=300) for job, pod in pods.items()}
  finally:
    for pod in pods.values():
      if pod.poll() is None:
        pod.kill()
  outputs = {name: (tmp_path / f'{name}.log').read_text()
             for name in ('chief1', 'chief2', 'worker1', 'ps1')}
  assert codes == {'chief': 0, 'worker': 0, 'ps': 0}, (
      outputs['chief2'][-3000:])
  assert 'Stopped by SIGTERM after step' in outputs['chief1']
  assert f'Training from step {stopped} to 176' in outputs['chief2']
  assert helpers.read_results(workdir)['step'] == 176
  for output in (outputs['worker1'], outputs['ps1']):
    assert output.count('Serving as ') == 1  # One process throughout.
    assert 'The chief marked the job done' in output


@pytest.mark.slow
def test_a_chief_and_a_worker_preempted_and_recreated_train_one_model(
    tmp_path):
  """The manifest's pods, chief:0 and worker:0: SIGTERM to the chief's pod,
  both exit for a restart, are started again, and end with the model of
  one process trained on the same batches (the chief reads input pipeline
  0, the worker 1)."""
  workdir, scratch = tmp_path / 'workdir', tmp_path / 'scratch'
  scratch.mkdir()
  # The manifest's config, shortened; the pods' workdir here.
  overrides = ('--config.num_epochs=2', '--config.deterministic=True',
               '--config.intervals.checkpoint_steps=8', f'--workdir={workdir}')
  bin_dir = os.path.dirname(sys.executable)  # The image's `python`.

  pods = {}

  def start_pods(attempt):
    addresses = {job: [f'localhost:{portpicker.pick_unused_port()}']
                 for job in ('chief', 'worker')}
    for (job, _), text in _tf_configs(addresses).items():
      with open(tmp_path / f'{job}{attempt}.log', 'w') as log:
        pods[job] = _run_container(
            job.capitalize(), bin_dir, log, *overrides,
            env=helpers.env_with(TF_CONFIG=text, TMPDIR=str(scratch)))

  def wait_for_pods(attempt):
    codes = {job: pod.wait(timeout=300) for job, pod in pods.items()}
    outputs = {job: (tmp_path / f'{job}{attempt}.log').read_text()
               for job in pods}
    return codes, outputs

  try:
    start_pods(1)
    helpers.wait_for_checkpoint(workdir, pods['chief'])
    pods['chief'].send_signal(signal.SIGTERM)  # The sh wrapper's pid.
    codes, outputs = wait_for_pods(1)
    assert codes == {'chief': 138, 'worker': 138}, outputs['chief'][-3000:]
    for output in outputs.values():
      assert 'Stopped by SIGTERM after step' in output
    stopped = helpers.latest_checkpoint_step(workdir)
    assert 0 < stopped < 88

    start_pods(2)  # As the operator recreates them.
    codes, outputs = wait_for_pods(2)
  finally:
    for pod in pods.values():
      if pod.poll() is None:
        pod.kill()
  assert codes == {'chief': 0, 'worker': 0}, outputs['worker'][-3000:]
  assert f'Training from step {stopped} to 88' in outputs['chief']
  assert 'Task chief:0 of 2 worker(s), 2 replica(s) in sync, chief: True' in (
      outputs['chief'])
  assert 'Task worker:0 of 2 worker(s), 2 replica(s) in sync, chief: False' in (
      outputs['worker'])
  assert 'Took part in saving checkpoint' in outputs['worker']
  fingerprints = helpers.fingerprint(outputs['chief'] + outputs['worker'])
  assert len(fingerprints) == 2 and len(set(fingerprints)) == 1
  # Only the chief wrote the workdir; the worker's scratch saves are gone.
  assert not list(workdir.rglob('workertemp*'))
  assert not list(scratch.iterdir())

  # The batches of one process: the chief read pipeline 0, the worker 1.
  single = tmp_path / 'single'
  run = helpers.run_ctl(
      *_container('Chief')['args'], *overrides[:-1], f'--workdir={single}')
  assert run.returncode == 0, run.stderr[-3000:]
  assert helpers.assert_same_model(workdir / 'checkpoints' / 'ckpt-88',
                                   single / 'checkpoints' / 'ckpt-88',
                                   atol=1e-5) == 6
