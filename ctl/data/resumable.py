"""A task's tf.data.Dataset as ctl reads it: endlessly, with a saved
position that resumes every later pass exactly.

A shuffle that reshuffles each pass (TF's default) draws each pass's seeds
from a generator its dataset shares between iterators, and an iterator
checkpoint holds the generator's count only in that shuffle's own state.
An op that has read its input to the end (a `prefetch` holding a pass's
last batches) leaves its input's state out of the checkpoint, so a
position saved near a pass's end restored that pass but drew the next
pass's seeds from whatever count the restoring process had left: another
order (TF 2.21: `range(64).shuffle(64, seed=1).batch(8).prefetch(2)
.repeat()` saved two batches before a pass's end read another next pass in
17 of 20 restores; BUILD.md, "Exact resume of a reshuffled pipeline").

So ctl reads `choose_from_datasets([dataset.repeat(), dataset])`, always
choosing the first: the second input, an iterator of the same dataset that
is never read, is saved with every position and holds the generator's
count (an unread iterator keeps its shuffle's state); the directed
interleave saves and restores it after the first, under the lock its reads
take, so a prefetch reading across a pass's end in the background cannot
slip a draw in between (an unread iterator saved beside a plain repeat()
iterator could: 7 to 11 of 48 restores wrong, against 0 of 192 here;
tests/data/test_resumable.py). A step reads as from `repeat()`. A
reshuffling shuffle below another shuffle cannot be helped so (the inner
one starts lazily): it is refused before training
(`tf_internals.reseeding_below_shuffle`).
"""

import tensorflow as tf


def resumable(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` repeated if finite, its reshuffle seeds in every saved
  position (see above)."""
  repeated = (dataset if dataset.cardinality() == tf.data.INFINITE_CARDINALITY
              else dataset.repeat())
  always_first = tf.data.Dataset.from_tensors(
      tf.constant(0, tf.int64)).repeat()
  return tf.data.Dataset.choose_from_datasets(
      [repeated, dataset], always_first, stop_on_empty_dataset=True)
