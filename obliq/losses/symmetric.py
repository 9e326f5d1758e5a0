"""The symmetric contrastive loss: the mean of a loss of the InfoNCE family and its reverse (each positive against
every query of the batch, its row's query the target), as sentence-transformers'
``MultipleNegativesSymmetricRankingLoss`` — for passage↔passage pairs, where either side can be the query."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from obliq.losses.infonce import InfoNCE, Scored
from obliq.losses.loss import Loss
from obliq.losses.masks import negatives_left
from obliq.losses.settings import spec
from obliq.losses.view import StepView


def reverse_rows(s: Scored) -> torch.Tensor:
    """Scalar float64: the reverse direction's loss, each positive against all queries (the in-batch false
    negatives of that direction masked), a row's term the mean over its positives, averaged over the rows."""
    rows, cols = s.positives.nonzero(as_tuple=True)  # each positive with its row
    back = s.scores[:, cols].T  # (P, B): each positive against every query
    if s.reverse is not None:
        back = back.masked_fill(s.reverse[cols], float("-inf"))
    each = F.cross_entropy(back, rows, reduction="none")  # (P,)
    per_row = torch.zeros(len(s.queries), dtype=each.dtype, device=each.device).index_add(0, rows, each)
    return (per_row / s.positives.sum(1)).mean()


class Symmetric(Loss):
    """The mean of ``loss`` (its rows' form: InfoNCE, MIL-NCE or SupCon) and its reverse direction
    (:func:`reverse_rows`), at its τ, over its rows (gathered or not).

    Args:
        loss: the loss of the queries → documents direction (an :class:`~obliq.losses.infonce.InfoNCE`, or one of
            its forms for several positives).

    Raises:
        TypeError: a loss that is not of the InfoNCE family.
    """

    def __init__(self, loss: InfoNCE):
        super().__init__()
        if not isinstance(loss, InfoNCE):
            raise TypeError(f"Symmetric wraps InfoNCE or one of its forms, got {type(loss).__name__}")
        self.loss = loss

    @property
    def name(self) -> str:
        return self.loss.name

    @property
    def temperature(self) -> float:
        return self.loss.temperature

    @property
    def gathers(self) -> bool:
        return self.loss.gathers

    def forward(self, queries: torch.Tensor, docs: torch.Tensor, view: StepView, parts: dict | None = None):
        s = self.loss.scored(queries, docs, view)
        return ((self.loss.rows(s).mean() + reverse_rows(s)) / 2).float()

    def negatives_left(self, view: StepView) -> torch.Tensor:
        """Each row's negatives in both directions: the documents its query meets beside its positives, and the
        queries its positives meet beside its own."""
        self.loss.takes(view.positives)
        return negatives_left(view.positives, view.doc_keys, view.query_keys, view.mask, True, view.cut)

    def settings(self) -> dict:
        return {"loss": spec(self.loss)}

    def citation(self) -> dict:
        inner = self.loss.citation()
        return {
            **inner,
            "class": f"Symmetric({inner['class']})",
            "loss": f"symmetric {inner['loss']} (the mean of both directions)",
            "references": [*inner["references"], "sentence-transformers MultipleNegativesSymmetricRankingLoss"],
        }
