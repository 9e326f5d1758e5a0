"""Distillation of a teacher's stored scores of each row's own candidates (its first positive, then its hard
negatives): the listwise KL divergence of the student's softmax from the teacher's (sentence-transformers'
``DistillKLDivLoss``, Tevatron's distillation), or MarginMSE (Hofstätter et al. 2020: the student's
positive − negative margins regress on the teacher's). Rows need ``meta.teacher_scores`` and negatives
(``obliq distill pairs --teacher_scores --negatives``)."""

from __future__ import annotations

import math

import torch

from obliq.losses.term import Term, need_temperature
from obliq.losses.view import StepView, positive_mask

TEACHER_TEMPERATURE = 0.05
"""The default τ of the teacher's softmax (kl)."""


def teacher_distillation(
    queries: torch.Tensor,
    docs: torch.Tensor,
    positive_index: torch.Tensor,
    doc_row: torch.Tensor,
    teacher_scores: torch.Tensor,
    kind: str,
    temperature: float,
    teacher_temperature: float,
    positives: torch.Tensor | None = None,
    similarity=None,
) -> torch.Tensor:
    """The mean over the rows with scores of each row's teacher term (module notes).

    Args:
        queries: (B, h) unit query vectors; docs: (M, h) unit document vectors.
        positive_index: (B,) each row's first positive, the one its first score is of.
        doc_row: (M,) the row each document came with.
        teacher_scores: (B, 1 + k) the teacher's scores of each row's first positive and its negatives, NaN
            where absent; rows without a positive and at least one negative score are left out.
        kind: ``kl`` or ``margin-mse``.
        temperature: τ of the student's softmax (kl); teacher_temperature: τ of the teacher's (kl).
        positives: (B, M) bool, each row's positives: a row's other positives are not its negatives here
            (None: each row's one positive, ``positive_index``).
        similarity: ``(queries, docs) -> (B, M)`` the student's scores (:meth:`StepView.similarity`: MaxSim over
            document windows); None: the cosines ``queries @ docs.T``.

    Returns:
        Scalar float32: the mean over the rows with scores (0, keeping the graph, when none has).

    Raises:
        ValueError: an unknown ``kind``, or a non-positive temperature.
    """
    if kind not in ("kl", "margin-mse"):
        raise ValueError(f"teacher loss must be 'kl' or 'margin-mse', got {kind!r}")
    if temperature <= 0 or teacher_temperature <= 0:
        raise ValueError("temperatures must be positive")
    if positives is None:
        positives = positive_mask(positive_index, len(doc_row))
    is_positive = positives.any(0)
    student = (similarity or (lambda q, d: q @ d.T))(queries.double(), docs.double())  # (B, M)
    terms = []
    for i in range(len(positive_index)):
        own = (doc_row == i) & ~is_positive.to(doc_row.device)
        cols = [int(positive_index[i]), *torch.nonzero(own).flatten().tolist()]
        t = teacher_scores[i, : len(cols)].double()
        if len(cols) < 2 or torch.isnan(t).any():
            continue
        s = student[i, cols]  # (1 + k,) the student's cosines
        if kind == "kl":
            # from log-probabilities: a teacher probability that underflows to 0 (scores 0–100 at a small
            # teacher temperature) adds 0, as 0 · log 0 = 0 says, not 0 · −inf = NaN
            log_p = torch.log_softmax(t / teacher_temperature, 0)
            p = log_p.exp()
            gap = torch.where(p > 0, log_p - torch.log_softmax(s / temperature, 0), torch.zeros_like(log_p))
            terms.append((p * gap).sum())
        else:
            terms.append((((s[0] - s[1:]) - (t[0] - t[1:])) ** 2).mean())
    if not terms:
        return queries.sum() * 0.0  # keeps the graph: a step without scores contributes nothing
    return torch.stack(terms).mean().float()


class TeacherScores(Term):
    """The teacher-score term (:func:`teacher_distillation`), over the step's scored rows.

    Args:
        kind: ``kl`` or ``margin-mse``.
        weight: its weight in the objective.
        teacher_temperature: τ of the teacher's softmax (kl); the student's is the main loss's.

    Raises:
        ValueError: an unknown kind, a bad weight or temperature.
    """

    name = "teacher"

    def __init__(self, kind: str = "kl", weight: float = 1.0, teacher_temperature: float = TEACHER_TEMPERATURE):
        super().__init__(weight)
        if kind not in ("kl", "margin-mse"):
            raise ValueError(f"TeacherScores kind must be kl or margin-mse, got {kind!r}")
        if not (teacher_temperature > 0 and math.isfinite(teacher_temperature)):
            raise ValueError(
                f"TeacherScores teacher_temperature must be a finite number > 0, got {teacher_temperature}"
            )
        self.kind, self.teacher_temperature = kind, float(teacher_temperature)

    def forward(self, queries, docs, view: StepView, temperature: float) -> torch.Tensor:
        if view.teacher_scores is None:
            raise ValueError("TeacherScores needs the batch key teacher_scores (rows' meta.teacher_scores)")
        temperature = (
            need_temperature(self, temperature) if self.kind == "kl" else temperature or 1.0
        )  # margin-mse: no τ
        return teacher_distillation(
            queries, docs, view.positive_index, view.doc_row, view.teacher_scores, self.kind, temperature,
            self.teacher_temperature, view.positives, view.similarity,
        )  # fmt: skip

    @classmethod
    def data_problem(cls, data: dict) -> str | None:
        if data.get("max_negatives", 4) == 0:  # TrainingDataModule's default keeps 4
            return (
                "scores each row's positive against its hard negatives, and data.max_negatives is 0: every row "
                "would add 0; keep the rows' negatives (data.max_negatives > 0)"
            )
        return None

    def rows_problem(self, rows) -> str | None:
        """None when a row of the sample has usable ``meta.teacher_scores`` (one number for its positive and one
        per negative); else the reason: every step would add 0 (issue 53 §3)."""
        rows = list(rows)

        def scored(row) -> bool:
            scores = (row.meta or {}).get("teacher_scores")
            return bool(row.negatives) and isinstance(scores, list) and len(scores) == 1 + len(row.negatives)

        if any(scored(row) for row in rows):
            return None
        return (
            f"scores rows by their meta.teacher_scores, and none of the {len(rows)} rows read (the first of every "
            "file) has them (one number for the positive and one per negative): the term would add 0 at every "
            "step; write them with obliq distill pairs --teacher_scores --negatives, or drop the term"
        )

    def settings(self) -> dict:
        return {"kind": self.kind, "weight": self.weight, "teacher_temperature": self.teacher_temperature}

    def citation(self) -> dict:
        source = "Hofstätter et al. 2020 (MarginMSE)" if self.kind == "margin-mse" else "listwise KL (Tevatron)"
        return {**super().citation(), "references": [source]}
