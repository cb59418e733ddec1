"""TFRecord files of tf.train.Example records, checked: found by a glob,
counted (which reads them through and checks their CRCs), and their
records parsed against a feature spec, so that a bad file is named."""

from collections.abc import Mapping
import os
from typing import Any

import tensorflow as tf

from ctl import errors
from ctl import storage

FeatureSpec = Mapping[str, tf.io.FixedLenFeature]


# The tf.train.Feature kind that holds each dtype's values.
_KINDS = {tf.string: 'bytes_list', tf.int64: 'int64_list',
          tf.float32: 'float_list'}


def spec_from_json(features: Mapping[str, Mapping[str, Any]]) -> dict[
    str, tf.io.FixedLenFeature]:
  """A parse spec from features.json's form: {name: {dtype, shape}}.

  Raises:
    CtlError: for a dtype that a tf.train.Example cannot hold.
  """
  spec = {}
  for name, feature in features.items():
    dtype = tf.as_dtype(feature['dtype'])
    if dtype not in _KINDS:
      raise errors.CtlError(
          f'Feature {name!r} has dtype {feature["dtype"]!r}: a '
          "tf.train.Example holds only 'string', 'int64' or 'float32'.")
    spec[name] = tf.io.FixedLenFeature(list(feature.get('shape', [])), dtype)
  return spec


def find_files(pattern: str) -> list[str]:
  """The files matching pattern, sorted (every worker sees one order).

  Raises:
    CtlError: when the directory is missing or nothing matches.
  """
  directory = os.path.dirname(pattern) or '.'
  if not storage.isdir(directory):
    raise errors.CtlError(
        f'The data directory {directory} does not exist (TFRecord files '
        f'{pattern!r}). Write the files there, e.g. with `python -m '
        f'ctl.data.write_tfrecords --output={directory}`, or correct the '
        'path.')
  files = sorted(storage.glob(pattern))
  if not files:
    raise errors.CtlError(
        f'No file matches {pattern!r}. The directory {directory} holds: '
        f'{sorted(storage.listdir(directory))[:10]}.')
  return files


def count_records(path: str) -> int:
  """How many records a file holds, each read and its CRC checked.

  Raises:
    CtlError: naming the file when it is not a whole TFRecord file.
  """
  try:
    return int(tf.data.TFRecordDataset(path).reduce(
        tf.constant(0, tf.int64), lambda count, _: count + 1))
  except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
    raise errors.CtlError(
        f'{path} is not a whole TFRecord file: {errors.op_reason(error)}. Rewrite '
        'it or remove it from the glob.') from error


def parse_records(path: str, spec: FeatureSpec) -> None:
  """Reads a file through: its CRCs, and every record parsed with spec.

  Raises:
    CtlError: naming the file, when it is not a whole TFRecord file or a
      record of it does not parse (and which record).
  """
  count = count_records(path)

  def first_gap(state, index, features):
    del features  # Parsed (a record that does not parse is dropped).
    expected, gap = state
    return index + 1, tf.where((gap < 0) & (index != expected), expected, gap)

  parsed = tf.data.TFRecordDataset(path).enumerate().map(
      lambda index, record: (index, tf.io.parse_single_example(record, spec))
  ).ignore_errors()
  end, gap = parsed.reduce(
      (tf.constant(0, tf.int64), tf.constant(-1, tf.int64)),
      lambda state, element: first_gap(state, *element))
  bad = int(gap) if int(gap) >= 0 else (int(end) if int(end) < count
                                        else None)
  if bad is None:
    return
  record = next(iter(tf.data.TFRecordDataset(path).skip(bad).take(1)))
  try:
    tf.io.parse_single_example(record, spec)
    reason = 'it does not parse'
  except tf.errors.InvalidArgumentError as error:
    reason = errors.op_reason(error)
  raise errors.CtlError(
      f'Record {bad} of {path} does not match the feature spec: '
      f'{reason.rstrip(".")}.')


def check_spec(path: str, spec: FeatureSpec) -> None:
  """Checks that the first record of a file has every feature of spec,
  of its dtype and size.

  Raises:
    CtlError: naming the first feature that does not match, and the file.
  """
  try:
    record = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
  except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
    raise errors.CtlError(
        f'{path} is not a whole TFRecord file: {errors.op_reason(error)}.') from error
  if record is None:
    return  # An empty file parses as nothing.
  try:
    example = tf.train.Example.FromString(record.numpy())
  except Exception as error:  # The protobuf's DecodeError.
    raise errors.CtlError(
        f'The records of {path} are not tf.train.Example protos: '
        f'{error}.') from error
  found = example.features.feature
  for name, feature in spec.items():
    if name not in found:
      raise errors.CtlError(
          f'Feature {name!r} of the spec is not in the records of {path}; '
          f'they have {sorted(found)}.')
    kind = found[name].WhichOneof('kind')
    expected_kind = _KINDS[feature.dtype]
    if kind != expected_kind:
      raise errors.CtlError(
          f'Feature {name!r} of {path} is a {kind} but the spec says '
          f'{feature.dtype.name} (a {expected_kind}).')
    size = len(getattr(found[name], kind).value)
    expected_size = 1
    for dimension in feature.shape:
      expected_size *= dimension
    if size != expected_size:
      raise errors.CtlError(
          f'Feature {name!r} of {path} has {size} values but the spec\'s '
          f'shape {list(feature.shape)} needs {expected_size}.')


def known_count(path: str, known: Mapping[str, Mapping[str, int]]
                 ) -> int | None:
  """The writer's record count for path, if it recorded path's size; an
  empty file's is 0 whatever was recorded (a writer that failed may have
  counted the records it meant to write)."""
  entry = known.get(os.path.basename(path))
  if entry is None or storage.size(path) != entry['bytes']:
    return None
  return int(entry['records']) if entry['bytes'] else 0
