"""The teacher-guided false-negative mask: in-batch candidates a guide model scores above the row's positive,
less a margin, are likely false negatives and left out of the contrastive loss (sentence-transformers'
``GISTEmbedLoss``, Solatorio 2024, its ``absolute`` margin strategy). Here the guide is the frozen teacher."""

from __future__ import annotations

import math

import torch

from obliq.losses.term import Term
from obliq.losses.view import StepView, positive_mask, teacher_vectors_problem


def guided_mask(teacher: torch.Tensor, positives: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """(B, M) bool: the candidates the guide scores above the row's lowest-scored positive, less ``margin``.

    Args:
        teacher: (B, M) the guide's cosine of each query with each document; NaN where it has none (never
            masked).
        positives: (B, M) bool, each row's positives (never masked), or (B,) the index of each row's one.
        margin: how far below a positive's score a candidate is still masked (>= 0).
    """
    positives = positive_mask(positives.to(teacher.device), teacher.shape[1])
    lowest = teacher.masked_fill(~positives, float("inf")).min(1).values  # NaN where a positive has none
    out = teacher > (lowest - margin)[:, None]  # a NaN on either side compares False
    return out & ~positives


class GuidedMask(Term):
    """The guided mask (:func:`guided_mask`) of the step's view, which the contrastive loss leaves out; it
    adds no value to the objective. Over every rank's rows when the loss gathers them.

    Args:
        margin: how far below the positive's score a candidate is still masked (a finite number >= 0).

    Raises:
        ValueError: a bad margin.
    """

    name = "guided"

    @classmethod
    def data_problem(cls, data: dict) -> str | None:
        return teacher_vectors_problem(data)

    def __init__(self, margin: float = 0.0):
        super().__init__(weight=0.0)
        if not (isinstance(margin, (int, float)) and margin >= 0 and math.isfinite(margin)):
            raise ValueError(f"GuidedMask margin must be a finite number >= 0, got {margin}")
        self.margin = float(margin)

    def mask(self, view: StepView) -> torch.Tensor:
        return guided_mask(view.teacher_cosines("GuidedMask"), view.positives, self.margin)

    def settings(self) -> dict:
        return {"margin": self.margin}

    def citation(self) -> dict:
        return {**super().citation(), "references": ["Solatorio 2024 (GISTEmbed)"]}
