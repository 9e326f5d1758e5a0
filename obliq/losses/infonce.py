"""InfoNCE over in-batch positives and hard negatives: the OBLIQ-IR paper's contrastive objective (Eq. 1,
§3.3), i.e. sentence-transformers' ``MultipleNegativesRankingLoss`` with scale 1/τ = 50 (the model card),
for rows with one positive or several (:mod:`obliq.losses.multipositive`), with the in-batch false
negatives masked by key (:mod:`obliq.losses.masks`) and, with ``symmetric``, the mean of that loss and its
reverse (each positive against every query of the batch), as sentence-transformers'
``MultipleNegativesSymmetricRankingLoss`` — for passage↔passage pairs, where either side can be the query.
With ``matryoshka_dims`` the loss is taken at several nested dimensions and summed
(:mod:`obliq.losses.matryoshka`). A row whose every candidate is masked adds 0 (C05's right value).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from obliq.distributed import world
from obliq.losses.masks import false_negative_masks
from obliq.losses.matryoshka import check_dims, matryoshka
from obliq.losses.multipositive import FORMS, multi_positive_losses
from obliq.losses.view import StepView, positive_mask

TEMPERATURE = 0.02
"""The default τ of the contrastive loss: the model card's scale 50. Terms that need the student's τ read the
loss's own (:attr:`InfoNCE.temperature`), never a default of their own."""
MIN_TEMPERATURE = 1e-4
"""The least τ the loss takes (scale 10,000; the card's is 0.02): a row's loss reaches 2 / τ, and its gradient
1 / τ, in float32 (GradCache's cached gradients, the logged loss); far below, every loss is infinite."""


def info_nce(
    queries: torch.Tensor,
    docs: torch.Tensor,
    positives: torch.Tensor,
    doc_keys: torch.Tensor | None = None,
    temperature: float = TEMPERATURE,
    query_keys: torch.Tensor | None = None,
    symmetric: bool = False,
    mask: torch.Tensor | None = None,
    form: str = "mil-nce",
    cut: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Mean over rows of each query's contrastive loss against all documents, its own positives the targets
    (``form``, :func:`~obliq.losses.multipositive.multi_positive_losses`), the in-batch false negatives
    masked (:func:`~obliq.losses.masks.false_negative_masks`); with ``symmetric``, averaged with the reverse
    loss: each positive against all queries, its row's query the target (a row's term the mean over its
    positives).

    Args:
        queries: (B, h) unit query vectors.
        docs: (M, h) unit document vectors (positives and hard negatives of the whole batch).
        positives: (B,) index into ``docs`` of each row's one positive, or (B, M) bool, each row's positives.
        doc_keys: (M,) or (M, K) int64 identity keys of the documents (an id hash and a text hash);
            None masks nothing.
        temperature: τ; scores are q·d / τ (0.02 → scale 50).
        query_keys: (B,) or (B, K) int64 keys of the queries, in the same columns as ``doc_keys``.
        symmetric: add the documents → queries direction; the loss is the mean of both directions.
        mask: (B, M) bool, more in-batch candidates to leave out (a mask term's); never a row's positive.
        form: ``mil-nce`` or ``supcon``, for rows with several positives (equal with one).
        cut: the keys and rows of positives the batch's cap left out (:func:`~obliq.losses.masks.false_negative_masks`):
            never negatives of their rows.

    Returns:
        Scalar float32 loss (computed in float64).

    Raises:
        ValueError: a temperature that is not positive, an unknown form, a malformed ``positives``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    # float64: the (B, M) matrix is small, and float32 rounds a near-zero loss at scale 50 away
    # (log(1 + e^-16) = 1.1254e-7 comes out as 1.19e-7, C06).
    q, d = queries.double(), docs.double()
    positives = positive_mask(positives.to(q.device), len(d))
    scores = q @ d.T / temperature  # (B, M)
    forward, reverse = false_negative_masks(positives, doc_keys, query_keys, cut)
    if mask is not None:
        forward = mask & ~positives if forward is None else forward | (mask & ~positives)
    candidates = ~forward if forward is not None else torch.ones_like(positives)
    loss = multi_positive_losses(scores, positives, candidates, form).mean()
    if symmetric:
        rows, cols = positives.nonzero(as_tuple=True)  # each positive with its row
        back = d[cols] @ q.T / temperature  # (P, B): each positive against every query
        if reverse is not None:
            back = back.masked_fill(reverse[cols], float("-inf"))
        each = F.cross_entropy(back, rows, reduction="none")  # (P,)
        per_row = torch.zeros(len(q), dtype=each.dtype, device=each.device).index_add(0, rows, each)
        loss = (loss + (per_row / positives.sum(1)).mean()) / 2
    return loss.float()


class InfoNCE(nn.Module):
    """The contrastive loss of a training step (:func:`info_nce`), over every rank's rows by default. It owns
    the temperature: a term that needs the student's τ (the teacher's KL, the relational KL) reads it here.

    Args:
        temperature: τ (default 0.02, the model card's scale 50).
        gather_across_devices: every rank's documents are negatives (and every rank's queries, so that all
            ranks compute the same global loss: the view is gathered, :class:`~obliq.losses.view.StepView`).
        symmetric: also the reverse direction, for passage↔passage pairs.
        multi_positive: ``mil-nce`` or ``supcon``: the loss of a row with several positives
            (:mod:`obliq.losses.multipositive`; both equal InfoNCE for a row with one).
        matryoshka_dims: None, or take the loss at each of these embedding dimensions (truncated and
            re-normalised) and sum them (:func:`~obliq.losses.matryoshka.matryoshka`); include the full size.
        matryoshka_weights: one weight per dimension (default 1 each).

    Call it with the view's rows: ``loss(queries (B, h), docs (M, h), view)`` where the embeddings are the
    view's (:meth:`StepView.embeddings`); ``parts``: a list for each Matryoshka dimension's loss.

    Raises:
        ValueError: a temperature that is not a finite positive number, an unknown form, bad Matryoshka settings.
    """

    def __init__(
        self,
        temperature: float = TEMPERATURE,
        gather_across_devices: bool = True,
        symmetric: bool = False,
        multi_positive: str = "mil-nce",
        matryoshka_dims: list[int] | None = None,
        matryoshka_weights: list[float] | None = None,
    ):
        super().__init__()
        number = isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
        if not (number and MIN_TEMPERATURE <= temperature and math.isfinite(temperature)):
            raise ValueError(
                f"model.loss temperature must be a finite number >= {MIN_TEMPERATURE}, got {temperature}: scores are "
                "cosines / temperature, and below it a float32 loss or gradient overflows (issue 53)"
            )
        if multi_positive not in FORMS:
            raise ValueError(f"model.loss multi_positive must be one of {FORMS}, got {multi_positive!r}")
        check_dims(matryoshka_dims, matryoshka_weights)
        self.temperature = float(temperature)
        self.gather_across_devices = gather_across_devices
        self.symmetric = symmetric
        self.multi_positive = multi_positive
        self.matryoshka_dims = list(matryoshka_dims) if matryoshka_dims else None
        self.matryoshka_weights = list(matryoshka_weights) if matryoshka_weights else None

    @property
    def backward_scale(self) -> float:
        """Factor for the backward pass: DDP/FSDP average the ranks' gradients, and each rank's gradient of a
        gathered objective already is its share of the global one's, so the average is scaled back up."""
        return float(world()[1]) if self.gather_across_devices else 1.0

    def forward(self, queries: torch.Tensor, docs: torch.Tensor, view: StepView, parts: list | None = None):
        """The loss over the view's rows (class notes)."""

        def nce(q, d):
            return info_nce(
                q, d, view.positives, view.doc_keys, self.temperature, view.query_keys, self.symmetric,
                view.mask, self.multi_positive, view.cut,
            )  # fmt: skip

        if self.matryoshka_dims:
            return matryoshka(nce, queries, docs, self.matryoshka_dims, self.matryoshka_weights, parts)
        return nce(queries, docs)

    def settings(self) -> dict:
        """Its arguments, as a config gives them."""
        keys = ("temperature", "gather_across_devices", "symmetric", "multi_positive", "matryoshka_dims")
        return {k: getattr(self, k) for k in keys} | {"matryoshka_weights": self.matryoshka_weights}

    def citation(self) -> dict:
        """What a model card needs to describe the trained objective: its name, settings and references
        (as sentence-transformers' losses describe themselves)."""
        out = {
            "loss": ("symmetric " if self.symmetric else "")
            + "InfoNCE over in-batch positives and hard negatives (GradCache), in-batch false negatives masked",
            "temperature": self.temperature,
            "scale": 1.0 / self.temperature,
            "gather_across_devices": self.gather_across_devices,
            "symmetric": self.symmetric,
            "multi_positive": self.multi_positive,
            "references": ["van den Oord et al. 2018 (InfoNCE)", "Gao et al. 2021 (GradCache)"],
        }
        out["references"].append(
            "Miech et al. 2020 (MIL-NCE)" if self.multi_positive == "mil-nce" else "Khosla et al. 2020"
        )
        if self.matryoshka_dims:
            out["matryoshka_dims"] = self.matryoshka_dims
            out["matryoshka_weights"] = self.matryoshka_weights or [1.0] * len(self.matryoshka_dims)
            out["references"].append("Kusupati et al. 2022 (Matryoshka)")
        return out
