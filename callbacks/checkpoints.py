"""Step checkpoints: save (and evaluate) a run at chosen optimizer steps.

A learning curve within one run: the model after 10, 20, … steps (of the same rows). Not the paper's
dose (§5, Figure 2 right: kNN rows per epoch), which changes the training data: ``obliq dose-sweep``
trains a recipe once per dose (:mod:`obliq.dose`).
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from obliq.callbacks.evaluation import RetrievalEvaluation


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
