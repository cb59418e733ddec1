"""The config every run starts from, and how a run loads it.

`configs/*.py` start from `base_config()` and change a few fields. One
ConfigDict flows down: each builder takes the section it needs.
"""

import contextlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags
import ml_collections

from ctl import config_checks
from ctl import errors

# The checks live in ctl/config_checks.py; callers' names for them.
validate = config_checks.validate
check_utf8 = config_checks.check_utf8
BEST_MODES = config_checks.BEST_MODES


def base_config() -> ml_collections.ConfigDict:
  """The framework's fields, for every task; each documented where it is set."""
  config = ml_collections.ConfigDict()
  # The task: 'classification' (built in, with classification_config()),
  # or your own ctl.Task subclass as 'package.module:ClassName', importable
  # from the current directory or installed (see ctl/task.py).
  config.task = ''
  # Seeds model initialisation and the order of training examples.
  config.seed = 0
  # Deterministic ops (tf.config.experimental.enable_op_determinism): a run
  # stopped and resumed any number of times ends with the same weights, bit
  # for bit, as an uninterrupted one. Some ops get slower; a few GPU ops
  # have no deterministic kernel and then fail.
  config.deterministic = False
  # Warm start: a checkpoint (path prefix, or a workdir) whose model weights
  # (the task's Keras models, by attribute name) initialise a new run. Only
  # used while the workdir has no checkpoint of its own; the optimizer and
  # step start afresh.
  config.init_from = ''
  # What of it to take: attribute paths from the task, each a Keras model
  # ('backbone') or a part of one ('model.backbone'), restored whole (the
  # rest keeps its fresh initialisation: a new head); () takes every model.
  config.init_select = ()

  # Examples per training step across all replicas and workers.
  config.batch_size = 64
  # Gradient accumulation: each replica's batch is split into this many
  # micro-batches, run one after another (the memory of one micro-batch),
  # and their gradients are summed into one update: one optimizer step per
  # training step, the gradients all-reduced once. batch_size stays the
  # examples per update; it must divide by replicas x accumulate_steps.
  # Built-in tasks use it; a task's own step calls ctx.accumulate.
  config.accumulate_steps = 1
  # Examples per evaluation step across all replicas; 0 means batch_size.
  config.eval_batch_size = 0
  config.num_epochs = 20
  # Steps per epoch; 0 means one pass over the training split.
  config.steps_per_epoch = 0
  # Stop after this many steps; 0 means num_epochs * steps_per_epoch.
  config.total_steps = 0
  # Steps run inside one tf.function call; loops also end at every interval.
  config.steps_per_loop = 100
  # What XLA compiles: 'off'; 'step': each training step, optimizer update
  # included (one replica only); 'loop': the steps_per_loop steps of a loop
  # as one program (one replica, in-memory data); 'auto': for the built-in
  # tasks on one CPU replica, 'loop', or 'step' for models with
  # convolutions; 'off' for your own task's steps, with several replicas,
  # and on GPUs (ctl/training/steps.py). A step XLA cannot compile fails
  # at its first step: set 'off'.
  config.jit_compile = 'auto'
  # Python control flow on tensors in the task's train_step, eval_step and
  # loop_logs (`if ctx.step < N:`, `for`, `while`) becomes graph control
  # flow (AutoGraph), as in a tf.function. False traces them as written:
  # a little faster to start, with Python control flow on tensors an error.
  config.autograph = True

  # Periodic work; 0 turns an interval off. Each epoch end also logs, writes
  # summaries and evaluates. A checkpoint is also saved at the end of
  # training and when SIGTERM stops it.
  config.intervals = ml_collections.ConfigDict()
  config.intervals.log_steps = 100
  config.intervals.summary_steps = 100
  config.intervals.eval_steps = 0
  config.intervals.checkpoint_steps = 0
  config.intervals.checkpoint_epochs = 0  # 1: at the end of every epoch.
  # Save when this many seconds passed since the last save (checked after
  # each loop of steps_per_loop steps). A SIGKILL loses at most one interval
  # of work; a save costs training about 2 ms plus a background write.
  config.intervals.checkpoint_secs = 600.0
  config.intervals.keep_checkpoints = 3
  # Write checkpoint files on a background thread (the chief's): training
  # waits only while the variables are copied. Crash safety is the same.
  config.intervals.async_checkpoint = True

  # Evaluation beyond the loop's: the best checkpoint, and the side-car
  # evaluator (--mode=evaluate_continuously, or TF_CONFIG's evaluator task).
  config.evaluation = ml_collections.ConfigDict()
  # The eval metric that picks the best checkpoint, kept in workdir/best/:
  # a name as logged ('accuracy'), or 'set/name' for a task with several
  # eval sets; '' keeps none.
  config.evaluation.best_metric = ''
  config.evaluation.best_mode = 'max'  # 'max' or 'min': which value is best.
  # The side-car stops after this many seconds without a new checkpoint
  # (it stops by itself once it evaluated training's final one); 0 waits
  # forever.
  config.evaluation.timeout_seconds = 3600.0

  # Stop training cleanly (a checkpoint, the final evaluation and export,
  # exit 0, the reason in results.json) once an eval metric has not
  # improved by more than min_delta for `patience` evaluations in a row
  # (ctl.EarlyStopping). '' metric: never.
  config.early_stopping = ml_collections.ConfigDict()
  config.early_stopping.metric = ''  # As best_metric: 'accuracy', 'set/x'.
  config.early_stopping.mode = 'max'  # 'max' or 'min': which way is better.
  config.early_stopping.patience = 5
  config.early_stopping.min_delta = 0.0

  # Roll back a training loss that is not finite or spikes: the weights of
  # the latest checkpoint come back and the data since is skipped, at most
  # max_rollbacks times (then exit 1, as with 0: no rollback). A spike is
  # a loop's mean loss above `factor` times its mean over the last
  # `window` loops (0: only non-finite losses). ctl.Rollback.
  config.rollback = ml_collections.ConfigDict()
  config.rollback.max_rollbacks = 0
  config.rollback.factor = 0.0
  config.rollback.window = 20

  # Every logged value (training's and evaluation's) appended to
  # workdir/metrics.csv as step,name,value rows (metric_writers/csv_file.py).
  config.log_csv = False

  # Log the run to an MLflow tracking server (ctl[mlflow]): config, values,
  # export; one MLflow run per workdir, continued on resume
  # (ctl/metric_writers/mlflow_run.py). '' tracking_uri: off.
  config.mlflow = ml_collections.ConfigDict()
  config.mlflow.tracking_uri = ''  # e.g. 'http://localhost:5000'
  config.mlflow.experiment = 'ctl'
  config.mlflow.run_name = ''  # '': the workdir's name.
  config.mlflow.parent_run_id = ''  # ctl.sweep sets it for its trials.
  config.mlflow.end_wait_seconds = 60  # For the last values, at the end.

  # Set by ctl.sweep for a trial of a search (ctl.hyper.Search): the
  # trial's chief reports the eval metric to the study after each
  # evaluation, and stops early as early stopping does (exit 0, 'pruned at
  # step N' in results.json) when the study's pruner says so
  # (ctl/sweep/pruning.py). '' storage: not a trial of a search.
  config.search = ml_collections.ConfigDict()
  config.search.storage = ''  # The study's journal file or database URL.
  config.search.study = ''  # The study's name in it.
  config.search.trial = -1  # The trial's number in the study.
  config.search.metric = ''  # The eval result reported: 'accuracy', 'set/x'.

  # A SavedModel (serving signature on raw inputs) and .keras files of the
  # best checkpoint, else the latest, in workdir/export/ (ctl/serving/).
  config.export = ml_collections.ConfigDict()
  # Export when training finishes (also: --mode=export at any time).
  config.export.at_end = True

  # A TensorBoard profiler trace of num_steps steps from start_step (the
  # chief's, in workdir/train); 0 steps: none.
  config.profile = ml_collections.ConfigDict()
  config.profile.start_step = 0
  config.profile.num_steps = 0

  # Seeing into a multi-worker job (README, "Diagnosing a multi-worker
  # job"). The chief names a worker whose work per step (CPU time, time kept
  # from running) or input wait per step exceeds straggler_factor times the
  # others' in both halves of its last straggler_seconds, as compute- or
  # input-bound, and again when it recovers. 0 straggler_factor: no check.
  config.diagnostics = ml_collections.ConfigDict()
  config.diagnostics.straggler_factor = 1.5
  config.diagnostics.straggler_seconds = 4.0

  config.distribution = ml_collections.ConfigDict()
  # 'parameter_server': asynchronous training on the cluster's "ps" tasks
  # (README). 'auto' picks it when the cluster has "ps" tasks, multi_worker
  # for another cluster, mirrored with several GPUs, one_device with one
  # GPU, otherwise 'default' (TensorFlow's default strategy, no overhead).
  config.distribution.strategy = 'auto'
  # Where the cluster comes from: 'tf_config' reads the TF_CONFIG variable
  # (ctl.launch and Kubeflow's TFJob set it); 'slurm' the variables srun
  # sets for each task of a step; 'auto' TF_CONFIG when it is set, else
  # Slurm's when srun started the process, else none (one process).
  config.distribution.cluster_resolver = 'auto'
  # Under Slurm: with no ports reserved for the step (SLURM_STEP_RESV_PORTS),
  # the task of local index i on a node listens on slurm_port_base + i (8888
  # up, as TF's SlurmClusterResolver); the last slurm_num_ps tasks are servers.
  config.distribution.slurm_port_base = 8888
  config.distribution.slurm_num_ps = 0
  # Cross-worker all-reduce: 'AUTO', 'RING' or 'NCCL'.
  config.distribution.collective = 'AUTO'
  # Seconds a worker may go without progress (a step, an evaluation batch,
  # an action) while it trains before the job fails (exit code 43): a dead
  # or hung worker never blocks the others (ctl/cluster/watchdog.py; 0
  # waits forever). Making the data does not count. Must exceed the longest
  # checkpoint save or restore, action, and the first step (its tracing).
  # TensorFlow's heartbeat is twice it (ctl/cluster/coordination.py).
  config.distribution.timeout_seconds = 600.0
  # Seconds a worker waits at start-up for every task of the cluster to
  # join, then exits 43 naming the tasks that did not arrive (a scheduler
  # or ctl.launch restarts it; 0 waits forever); TensorFlow's own
  # registration of the tasks gets what is left of it.
  config.distribution.startup_timeout_seconds = 300.0
  # All-reduce in 'float32', or 'bfloat16' / 'float16': half the bytes sent.
  config.distribution.all_reduce_dtype = 'float32'
  # All-reduce gradients in packs of about this many bytes (0: TF decides).
  config.distribution.bytes_per_pack = 0
  # Parameter servers: split variables over this many bytes by rows over the
  # servers, a shard each at most (README, "Sharded tables"); 0: none.
  config.distribution.min_shard_bytes = 0
  return config


def classification_config() -> ml_collections.ConfigDict:
  """base_config() and the built-in classification task's fields."""
  config = base_config()
  config.task = 'classification'
  config.data = ml_collections.ConfigDict()
  # 'digits', 'mnist', or 'package.module:function' (see ctl/data/datasets.py).
  config.data.name = 'digits'
  # A data file; '' means the dataset's default location.
  config.data.path = ''
  # Share of examples held out for evaluation, for datasets without a split.
  config.data.eval_fraction = 0.2

  config.model = ml_collections.ConfigDict()
  # 'cnn', 'mlp', or 'package.module:function' (builtin_tasks/classification.py).
  config.model.name = 'cnn'
  config.model.filters = 32  # cnn: filters of the 3x3 convolution.
  config.model.width = 128  # Units of each hidden dense layer.
  config.model.depth = 1  # mlp: number of hidden dense layers.
  config.model.dropout = 0.0  # Dropout rate before the output layer.
  config.model.l2 = 1e-5  # L2 regularisation of every kernel.
  # Keras dtype policy: 'float32', 'mixed_float16' (with loss scaling) or
  # 'mixed_bfloat16'. Mixed precision pays on GPUs and TPUs, not on CPUs.
  config.model.dtype_policy = 'float32'

  # Per-example loss: 'sparse_categorical_crossentropy' (on logits) or
  # 'package.module:function' returning per-example losses.
  config.loss = 'sparse_categorical_crossentropy'
  # Metrics for training and evaluation, besides the loss.
  config.metrics = ('accuracy',)
  config.evaluation.best_metric = 'accuracy'

  config.optimizer = ml_collections.ConfigDict()
  # 'adam', 'adamw', 'sgd', 'rmsprop', or 'package.module:function'.
  config.optimizer.name = 'adam'
  config.optimizer.learning_rate = 1e-3  # Peak learning rate.
  config.optimizer.schedule = 'constant'  # 'constant', 'cosine' or 'linear'.
  config.optimizer.warmup_steps = 0  # Linear warm-up from 0 to the peak.
  # Where 'cosine' and 'linear' end, as a fraction of the peak.
  config.optimizer.end_learning_rate_factor = 0.0
  config.optimizer.momentum = 0.0  # sgd and rmsprop only.
  config.optimizer.weight_decay = 0.0  # Decoupled weight decay; 0 is off.
  # Keep a moving average of the weights with this momentum (Keras's
  # use_ema; 0 is off): evaluation, export and ctl.load use the average,
  # training goes on with the trained weights.
  config.optimizer.ema_momentum = 0.0
  return config


@contextlib.contextmanager
def loading_user_file():
  """While a user's config or sweep file is imported: no __pycache__ is
  written beside it (a run writes nowhere but its workdir)."""
  before = sys.dont_write_bytecode
  sys.dont_write_bytecode = True
  try:
    yield
  finally:
    sys.dont_write_bytecode = before


def define_config_flag(flag_values: flags.FlagValues = flags.FLAGS,
                       argv: Sequence[str] | None = None):
  """Defines --config: a config file, locked, overridable by --config.key=v.

  Overrides come from argv (sys.argv by default); an old release's file
  gets the fields it lacks first (config_checks).
  """
  return config_checks.define_config_file(
      'config', 'Training config file, e.g. configs/digits.py.',
      flag_values=flag_values,
      sys_argv=list(argv) if argv is not None else None)


def override_flags(overrides: Mapping[str, Any]) -> list[str]:
  """['--config.key=value', ...], as ctl.main parses them back."""
  return [f'--config.{key}={_flag_value(value)}'
          for key, value in overrides.items()]


def _flag_value(value: Any) -> str:
  return repr(value) if isinstance(value, (tuple, list)) else str(value)


def load(config_file: str,
         overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
  """Loads a config file with overrides exactly as ctl.main's flags do.

  Raises:
    ConfigError: naming the file or key that fails, as ctl.main would.
  """
  argv = ['ctl', f'--config={config_file}', *override_flags(overrides or {})]
  flag_values = flags.FlagValues()
  config_flag = define_config_flag(flag_values, argv)
  try:
    with loading_user_file():
      flag_values(argv)
    config = config_flag.value
    config.keys()  # A config file that failed to load raises when read.
  except Exception as error:  # pylint: disable=broad-except
    raise errors.ConfigError(explain_flag_error(error, argv)) from error
  validate(config)
  return config


def explain_flag_error(error: Exception, argv: Sequence[str]) -> str:
  """A one-paragraph message for an error raised while parsing --config flags."""
  if isinstance(error, flags.Error):
    text = str(error)
    if 'Traceback (most recent call last)' in text:
      # ml_collections puts the traceback of a config file's get_config in
      # the message: its last line says what went wrong.
      flag, _, _ = text.partition(': Error whilst parsing config file')
      last = [line for line in text.splitlines() if line.strip()][-1]
      return f'Cannot load {flag.removeprefix("flag ")}: {last.strip()}'
    return text
  if isinstance(error, (AttributeError, KeyError)):
    # An override of a key the config does not have: ml_collections wraps a
    # KeyError, whose text names the last part of the key, in an
    # AttributeError.
    text = _innermost_text(error)
    overrides = [arg for arg in argv if arg.startswith('--config.')]
    key = text.split("'")[1:2]
    named = [arg for arg in overrides if key and key[0] in arg] or overrides
    return f'Unknown config key in {" ".join(named)}: {text}'
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  # A file that fails to load is explained over several lines; the last
  # says why (e.g. "[Errno 2] No such file or directory: 'configs/x.py'").
  return f'Cannot load --config: {lines[-1] if lines else type(error).__name__}'


def _innermost_text(error: BaseException) -> str:
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  return str(error.args[0]) if error.args else str(error)
