"""Checkpoints beyond Lightning's ``ModelCheckpoint``.

- :class:`StepCheckpoints`: save (and evaluate) a run at chosen optimizer steps. A learning curve within
  one run: the model after 10, 20, … steps (of the same rows). Not the paper's dose (§5, Figure 2 right:
  kNN rows per epoch), which changes the training data: ``obliq dose-sweep`` trains a recipe once per
  dose (:mod:`obliq.commands.dose`).
- :class:`CheckpointOnSigterm`: what a cluster's SIGTERM (sent before preemption or at the time limit)
  leaves: a checkpoint at the stop and a non-zero exit, so the scheduler requeues the job and
  ``--ckpt_path last`` resumes it. ``train.py`` always installs it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from obliq.callbacks.evaluation import RetrievalEvaluation

from obliq.runs import SIGTERM_CHECKPOINT

log = logging.getLogger(__name__)

SIGTERM_EXIT = 143
"""128 + SIGTERM: the status of a process ended by SIGTERM, which schedulers read as "not finished"."""


class CheckpointOnSigterm(Callback):
    """On SIGTERM, save ``<dirpath>/sigterm.ckpt`` and exit with status 143.

    Lightning's signal connector turns a SIGTERM into ``SIGTERMException`` at the next batch boundary
    (after that step's update and ModelCheckpoint's save; under DDP every rank is told) and then ends
    ``fit`` with exit status 0 and no checkpoint (``SIGTERMException`` is a ``SystemExit`` without a
    code). This callback saves a full checkpoint there (every rank takes part, as in any save) and
    sets the exception's code, which becomes the process's exit status. The checkpoint holds the data
    loader's position, so ``--ckpt_path last`` continues exactly. Under SLURM, Lightning's own
    ``SIGUSR1`` requeue (``#SBATCH --signal=USR1@90``) keeps working beside it.

    Args:
        dirpath: the run's folder.
        exit_code: the exit status after the save (143 = 128 + SIGTERM).
    """

    def __init__(self, dirpath: str | Path, exit_code: int = SIGTERM_EXIT):
        self.dirpath, self.exit_code = Path(dirpath), exit_code

    @property
    def ckpt_path(self) -> Path:
        return self.dirpath / SIGTERM_CHECKPOINT

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        trainer.save_checkpoint(self.ckpt_path)
        exception.code = self.exit_code
        log.warning(
            "SIGTERM at step %d: saved %s; exiting with status %d (resume with --ckpt_path last)",
            trainer.global_step,
            self.ckpt_path,
            self.exit_code,
        )


class StepCheckpoints(Callback):
    """Write ``<dirpath>/step-<n>.ckpt`` when the global step reaches each of ``steps``, and run the
    trainer's :class:`RetrievalEvaluation` callback there (when one is configured and ``evaluate``).

    Args:
        steps: global steps to save at (after that step's optimizer update).
        dirpath: folder for the checkpoints (default ``<default_root_dir>/step-checkpoints``).
        evaluate: also evaluate at those steps.

    Raises:
        ValueError: a step below 1.
    """

    def __init__(self, steps: list[int], dirpath: str | None = None, evaluate: bool = True):
        if any(s < 1 for s in steps):
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.steps, self.dirpath, self.evaluate = sorted(set(steps)), dirpath, evaluate
        self.saved: list[str] = []

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step not in self.steps or any(p.endswith(f"step-{step}.ckpt") for p in self.saved):
            return
        folder = Path(self.dirpath or Path(trainer.default_root_dir) / "step-checkpoints")
        path = folder / f"step-{step}.ckpt"
        trainer.save_checkpoint(path)
        self.saved.append(str(path))
        if self.evaluate:
            for cb in trainer.callbacks:
                if isinstance(cb, RetrievalEvaluation) and cb.last_step != step:
                    cb.evaluate(trainer, pl_module)

    def state_dict(self) -> dict:
        return {"saved": self.saved}

    def load_state_dict(self, state_dict: dict) -> None:
        self.saved = list(state_dict.get("saved", []))
