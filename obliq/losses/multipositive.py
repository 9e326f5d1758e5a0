"""InfoNCE for rows with several positives, in its two standard forms, each a loss of its own (issue 47 §2).

A kNN anchor has k neighbours, a query of OBLIQ's tasks 9–22 relevant documents; one row may carry them
all. Both forms equal :class:`~obliq.losses.infonce.InfoNCE` (sentence-transformers'
``MultipleNegativesRankingLoss``) when a row has one:

- :class:`MILNCE`: the negative log of the summed probability of the row's positives, ``−log Σ_p e^{s_p} /
  Σ_c e^{s_c}`` over the candidates ``c`` (its positives and its unmasked negatives) — Miech et al. 2020,
  "End-to-End Learning of Visual Representations from Uncurated Instructional Videos" (MIL-NCE), Eq. 1.
- :class:`SupCon`: the mean over the row's positives of each one's log-likelihood against the negatives alone,
  the other positives masked out of the denominator, ``−(1/|P|) Σ_p log e^{s_p} / (e^{s_p} + Σ_n e^{s_n})``
  — Khosla et al. 2020, "Supervised Contrastive Learning" (the per-positive form; here with the other
  positives left out of each denominator, so a positive is never another positive's negative).

A row's positives are never each other's negatives under either form; a row with no negative adds 0.
"""

from __future__ import annotations

import torch

from obliq.losses.infonce import InfoNCE, Scored


def mil_nce_rows(scores: torch.Tensor, positives: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """(B,) each row's MIL-NCE (module notes).

    Args:
        scores: (B, M) logits (q·d / τ), float64.
        positives: (B, M) bool, each row's positives (at least one a row).
        candidates: (B, M) bool, what each row's softmax may see: its positives and its negatives (the
            in-batch false negatives already left out).
    """
    inf = float("-inf")
    summed = torch.logsumexp(scores.masked_fill(~positives, inf), 1)
    return torch.logsumexp(scores.masked_fill(~candidates, inf), 1) - summed


def supcon_rows(scores: torch.Tensor, positives: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """(B,) each row's SupCon loss (module notes); arguments as :func:`mil_nce_rows` takes them."""
    inf = float("-inf")
    negatives = candidates & ~positives
    has = negatives.any(1)
    # a row without a negative: a finite dummy row, so its (unused) gradient is 0, never 0 · NaN
    safe = torch.where(has[:, None], scores.masked_fill(~negatives, inf), torch.zeros_like(scores))
    negative = torch.where(has, torch.logsumexp(safe, 1), torch.full_like(has, inf, dtype=scores.dtype))
    each = (torch.logaddexp(scores, negative[:, None]) - scores).masked_fill(~positives, 0.0)  # −log p per positive
    return each.sum(1) / positives.sum(1)


class MILNCE(InfoNCE):
    """InfoNCE over rows with one positive or several, the MIL-NCE form (:func:`mil_nce_rows`); settings as
    :class:`~obliq.losses.infonce.InfoNCE`'s."""

    what = "MIL-NCE (InfoNCE with several positives a row: their summed probability)"
    references = ("Miech et al. 2020 (MIL-NCE)",)

    def rows(self, s: Scored) -> torch.Tensor:
        return mil_nce_rows(s.scores, s.positives, s.candidates)

    def takes(self, positives: torch.Tensor) -> None:
        """Any number of positives a row."""


class SupCon(InfoNCE):
    """InfoNCE over rows with one positive or several, the supervised-contrastive form (:func:`supcon_rows`);
    settings as :class:`~obliq.losses.infonce.InfoNCE`'s."""

    what = "SupCon (InfoNCE with several positives a row: each against the negatives alone)"
    references = ("Khosla et al. 2020 (SupCon)",)

    def rows(self, s: Scored) -> torch.Tensor:
        return supcon_rows(s.scores, s.positives, s.candidates)

    def takes(self, positives: torch.Tensor) -> None:
        """Any number of positives a row."""
