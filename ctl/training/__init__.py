"""The training core: the run, the loop and its actions, the step runner, evaluation, the training state."""
