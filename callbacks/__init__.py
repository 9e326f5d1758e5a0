"""Lightning callbacks and loggers for obliq training runs."""

from callbacks.checkpoints import DoseCheckpoints
from callbacks.evaluation import RetrievalEvaluation
from callbacks.logging import LoggedConfig, WandbLogger

__all__ = ["DoseCheckpoints", "LoggedConfig", "RetrievalEvaluation", "WandbLogger"]
