"""The training progress line without Lightning's "Epoch 0/-2" (a run limited by ``max_steps``)."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


class StepProgressBar(RichProgressBar):
    """Lightning's rich progress bar, described as ``epoch <e> of <max_epochs>`` or ``epoch <e> (max_steps
    <n>)``: a run limited by ``max_steps`` has ``max_epochs = -1``, which Lightning prints as "Epoch 0/-2".
    The bar itself counts the epoch's steps. Added to every ``fit`` that configures no progress bar."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        text = f"epoch {current_epoch}"
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            text += f" of {trainer.max_epochs}"
        if trainer.max_steps > 0:
            text += f" (max_steps {trainer.max_steps})"
        return text
