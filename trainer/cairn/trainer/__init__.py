"""cairn.trainer: Train state, optimizers, schedules, the training loop and checkpoints."""

__version__ = "0.1.0"
