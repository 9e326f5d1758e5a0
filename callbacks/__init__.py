"""Lightning callbacks and loggers for obliq training runs."""

from obliq.callbacks.checkpoints import CheckpointOnSigterm, StepCheckpoints
from obliq.callbacks.evaluation import RetrievalEvaluation
from obliq.callbacks.logging import LoggedConfig, WandbLogger

__all__ = ["CheckpointOnSigterm", "StepCheckpoints", "LoggedConfig", "RetrievalEvaluation", "WandbLogger"]
