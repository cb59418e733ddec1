"""Input data: in-memory arrays, tf.data pipelines, and the built-in datasets."""
