"""What runs around training: strategy, cluster, checkpoints, preemption, the workdir, the process."""
