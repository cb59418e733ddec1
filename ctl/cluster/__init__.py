"""The cluster a process belongs to: its shape (TF_CONFIG, Slurm), the start-up barrier, the tf.distribute strategy and this process's role in it."""
