"""ctl's TensorBoard writer: TensorBoard's formats, on disk at each write."""

import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.scalar import summary_v2 as scalar_summary

from ctl import metric_writers
from ctl.metric_writers import tensorboard


def test_scalars_are_what_tensorboard_itself_writes():
  for value in (0.5, -1e-9, 3.25e7, float('nan'), np.float32(2.5), 7):
    ours = [tensorboard._scalar_value('loss', float(value))]  # pylint: disable=protected-access
    theirs = scalar_summary.scalar_pb('loss', float(value)).value
    assert [v.SerializeToString() for v in ours] == [
        v.SerializeToString() for v in theirs]


def test_each_write_is_on_disk_before_close_and_tensorboard_reads_it(
    tmp_path):
  writer = tensorboard.TensorBoardWriter(str(tmp_path))
  metric_writers.write_results(writer, 10, {'loss': 0.25,
                                            'skipped': np.zeros(3)})
  metric_writers.write_results(writer, 20, {
      'loss': 0.125,
      'digit': metric_writers.Image(np.zeros((4, 4, 3), np.uint8)),
      'weights': metric_writers.Histogram(np.arange(10.0))})
  # Not closed: a process killed now has written both.
  events = event_accumulator.EventAccumulator(
      str(tmp_path), size_guidance={event_accumulator.TENSORS: 0})
  events.Reload()
  assert sorted(events.Tags()['tensors']) == ['digit', 'loss', 'weights']
  assert [(e.step, float(np.asarray(e.tensor_proto.float_val)[0]))
          for e in events.Tensors('loss')] == [(10, 0.25), (20, 0.125)]
  writer.close()
  second = tensorboard.TensorBoardWriter(str(tmp_path))
  second.close()
  assert len(list(tmp_path.glob('events.out.tfevents.*'))) == 2
