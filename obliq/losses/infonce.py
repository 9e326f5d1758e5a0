"""InfoNCE over in-batch positives and hard negatives: the OBLIQ-IR paper's contrastive objective (Eq. 1,
§3.3), i.e. sentence-transformers' ``MultipleNegativesRankingLoss`` with scale 1/τ = 50 (the model card), for
rows with one positive, with the in-batch false negatives masked by key (:mod:`obliq.losses.masks`). A row whose
every candidate is masked adds 0 (C05's right value). Its forms for rows with several positives
(:mod:`obliq.losses.multipositive`) and its reverse direction (:mod:`obliq.losses.symmetric`) are losses of their
own, built on its scores (:func:`scored`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from obliq.losses.loss import Loss
from obliq.losses.masks import false_negative_masks
from obliq.losses.view import StepView, positive_mask

TEMPERATURE = 0.02
"""The default τ of the contrastive loss: the model card's scale 50. Terms that need the student's τ read the
loss's own (:attr:`obliq.losses.Loss.temperature`), never a default of their own."""
MIN_TEMPERATURE = 1e-4
"""The least τ the loss takes (scale 10,000; the card's is 0.02): a row's loss reaches 2 / τ, and its gradient
1 / τ, in float32 (GradCache's cached gradients, the logged loss); far below, every loss is infinite."""


class Scored(NamedTuple):
    """A step's float64 scores and masks, what every form of InfoNCE reads (:func:`scored`)."""

    queries: torch.Tensor
    """(B, h) float64."""
    docs: torch.Tensor
    """(M, h) float64 (under MaxSim the W windows: :meth:`StepView.similarity`)."""
    scores: torch.Tensor
    """(B, M) q·d / τ."""
    positives: torch.Tensor
    """(B, M) bool, each row's positives."""
    candidates: torch.Tensor
    """(B, M) bool, what each row's softmax may see: its positives and its unmasked negatives."""
    reverse: torch.Tensor | None
    """(M, B) bool, the queries a positive must not meet in the reverse direction, or None (no keys)."""
    temperature: float


def scored(queries: torch.Tensor, docs: torch.Tensor, view: StepView, temperature: float) -> Scored:
    """The view's scores and masks, in float64 (the (B, M) matrix is small, and float32 rounds a near-zero
    loss at scale 50 away: log(1 + e^-16) = 1.1254e-7 comes out as 1.19e-7, C06).

    Args:
        queries: (B, h) unit query vectors; docs: (M, h) unit document vectors (the view's rows).
        view: the step's view: each row's positives, the identity keys whose in-batch false negatives are
            masked (:func:`~obliq.losses.masks.false_negative_masks`; none without ``doc_keys``), a mask term's
            mask (never a row's positive), the positives the batch's cap left out (never negatives of their rows).
        temperature: τ; scores are q·d / τ (0.02 → scale 50).

    Raises:
        ValueError: a temperature that is not positive, a malformed ``positives``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    q, d = queries.double(), docs.double()
    positives = positive_mask(view.positives.to(q.device), len(view.doc_row))
    forward, reverse = false_negative_masks(positives, view.doc_keys, view.query_keys, view.cut)
    if view.mask is not None:
        forward = view.mask & ~positives if forward is None else forward | (view.mask & ~positives)
    candidates = ~forward if forward is not None else torch.ones_like(positives)
    return Scored(q, d, view.similarity(q, d) / temperature, positives, candidates, reverse, temperature)


def one_positive_rows(s: Scored) -> torch.Tensor:
    """(B,) float64, each row's InfoNCE: ``−log e^{s_p} / Σ_c e^{s_c}`` over its candidates ``c``.

    Raises:
        ValueError: a row with several positives (:func:`check_one_positive`).
    """
    check_one_positive(s.positives)
    return torch.logsumexp(s.scores.masked_fill(~s.candidates, float("-inf")), 1) - s.scores[s.positives]


def check_one_positive(positives: torch.Tensor) -> None:
    """Refuse rows with several positives, naming the losses that take them.

    Raises:
        ValueError: ``InfoNCE takes one positive a row: row r has k …``.
    """
    counts = positives.sum(1)
    if (counts > 1).any():
        row = int((counts > 1).nonzero()[0])
        raise ValueError(
            f"InfoNCE takes one positive a row: row {row} has {int(counts[row])} (data.max_positives): use "
            "obliq.losses.MILNCE or obliq.losses.SupCon, the losses of rows with several positives"
        )


def info_nce(
    queries: torch.Tensor,
    docs: torch.Tensor,
    positives: torch.Tensor,
    doc_keys: torch.Tensor | None = None,
    temperature: float = TEMPERATURE,
    query_keys: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    cut: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Mean over rows of each query's InfoNCE against all documents, its positive the target, the in-batch false
    negatives masked (:func:`~obliq.losses.masks.false_negative_masks`): :class:`InfoNCE`'s value, as a function.

    Args:
        queries: (B, h) unit query vectors.
        docs: (M, h) unit document vectors (positives and hard negatives of the whole batch).
        positives: (B,) index into ``docs`` of each row's one positive, or (B, M) bool, each row's positives.
        doc_keys: (M,) or (M, K) int64 identity keys of the documents (an id hash and a text hash);
            None masks nothing.
        temperature: τ; scores are q·d / τ (0.02 → scale 50).
        query_keys: (B,) or (B, K) int64 keys of the queries, in the same columns as ``doc_keys``.
        mask: (B, M) bool, more in-batch candidates to leave out (a mask term's); never a row's positive.
        cut: the keys and rows of positives the batch's cap left out (:func:`~obliq.losses.masks.false_negative_masks`):
            never negatives of their rows.

    Returns:
        Scalar float32 loss (computed in float64).

    Raises:
        ValueError: a temperature that is not positive, a malformed ``positives``, a row with several.
    """
    positives = positive_mask(positives.to(queries.device), len(docs))
    cut_keys, cut_row = cut if cut is not None else (None, None)
    view = StepView(positives, positives.to(torch.uint8).argmax(1), torch.arange(len(docs)), doc_keys, query_keys,
                    mask=mask, cut_keys=cut_keys, cut_row=cut_row)  # fmt: skip
    return one_positive_rows(scored(queries, docs, view, temperature)).mean().float()


def check_temperature(temperature) -> float:
    """τ as a float, or refused.

    Raises:
        ValueError: a temperature that is not a finite number >= :data:`MIN_TEMPERATURE`.
    """
    number = isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
    if not (number and MIN_TEMPERATURE <= temperature and math.isfinite(temperature)):
        raise ValueError(
            f"model.loss temperature must be a finite number >= {MIN_TEMPERATURE}, got {temperature}: scores are "
            "cosines / temperature, and below it a float32 loss or gradient overflows (issue 53)"
        )
    return float(temperature)


class InfoNCE(Loss):
    """InfoNCE over the step's view (:func:`info_nce`), one positive a row, over every rank's rows by default. It
    owns the temperature: a term that needs the student's τ (the teacher's KL, the relational KL) reads it here.

    Args:
        temperature: τ (default 0.02, the model card's scale 50).
        gather_across_devices: every rank's documents are negatives (and every rank's queries, so that all
            ranks compute the same global loss: the view is gathered, :class:`~obliq.losses.view.StepView`).

    Raises:
        ValueError: a temperature that is not a finite positive number.
    """

    name = "infonce"
    what = "InfoNCE"
    """What it is, in its citation."""
    references: tuple[str, ...] = ()
    """Its references beside InfoNCE's and GradCache's."""

    def __init__(self, temperature: float = TEMPERATURE, gather_across_devices: bool = True):
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.gather_across_devices = gather_across_devices

    @property
    def gathers(self) -> bool:
        return self.gather_across_devices

    def scored(self, queries: torch.Tensor, docs: torch.Tensor, view: StepView) -> Scored:
        """The view's scores and masks at this loss's τ (:func:`scored`)."""
        return scored(queries, docs, view, self.temperature)

    def rows(self, s: Scored) -> torch.Tensor:
        """(B,) float64, each row's loss (:func:`one_positive_rows`); a form for several positives overrides it."""
        return one_positive_rows(s)

    def takes(self, positives: torch.Tensor) -> None:
        """Refuse positives it does not take: several in a row (:func:`check_one_positive`)."""
        check_one_positive(positives)

    def forward(self, queries: torch.Tensor, docs: torch.Tensor, view: StepView, parts: dict | None = None):
        """The loss over the view's rows (class notes), float32."""
        return self.rows(self.scored(queries, docs, view)).mean().float()

    def negatives_left(self, view: StepView) -> torch.Tensor:
        self.takes(view.positives)
        return super().negatives_left(view)

    def settings(self) -> dict:
        return {"temperature": self.temperature, "gather_across_devices": self.gather_across_devices}

    def citation(self) -> dict:
        """Its name, settings and references (as sentence-transformers' losses describe themselves)."""
        return {
            "class": type(self).__name__,
            "loss": f"{self.what} over in-batch positives and hard negatives (GradCache), in-batch false negatives "
            "masked",
            "temperature": self.temperature,
            "scale": 1.0 / self.temperature,
            "gather_across_devices": self.gather_across_devices,
            "references": ["van den Oord et al. 2018 (InfoNCE)", "Gao et al. 2021 (GradCache)", *self.references],
        }
