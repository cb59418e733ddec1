"""What runs around training: strategy, cluster, checkpoints, preemption, summaries, the workdir, the process."""
