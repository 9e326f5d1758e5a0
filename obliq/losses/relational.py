"""In-batch relational distillation: for each query, the KL divergence of the student's softmax over the
step's documents from the frozen teacher's (NeMo's ``InfoNCEDistillLoss``; Jasper's relative-similarity loss
compares the same in-batch matrices). It needs no stored scores of a row's own candidates, so kNN rows (no
mined negatives) get a teacher term: the teacher's view of every in-batch pair."""

from __future__ import annotations

import math

import torch

from obliq.losses.masks import false_negative_masks
from obliq.losses.term import Term, need_temperature
from obliq.losses.view import StepView, teacher_vectors_problem


def relational_distillation(
    queries: torch.Tensor,
    docs: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor | None,
    temperature: float,
    teacher_temperature: float | None,
    similarity=None,
) -> torch.Tensor:
    """The mean over queries of KL(teacher's softmax ‖ student's softmax) over the documents (module notes).

    Args:
        queries: (B, h) unit query vectors; docs: (M, h) unit document vectors.
        teacher: (B, M) the teacher's cosines (:meth:`StepView.teacher_cosines`); NaN entries are left out
            of both distributions.
        mask: (B, M) bool, entries left out of both (the in-batch false negatives by identity).
        temperature: τ of the student's softmax.
        teacher_temperature: τ of the teacher's; None: set from the teacher's score spread, per step, so
            its logits are as spread as the student's: ``τ · std(teacher) / std(student)`` over the
            entries used (the student's scores detached).
        similarity: ``(queries, docs) -> (B, M)`` the student's scores (:meth:`StepView.similarity`: MaxSim over
            document windows); None: the cosines ``queries @ docs.T``.

    Returns:
        Scalar float32: the mean over rows with at least two usable entries (0 when none has, or when the
        teacher's scores do not vary).

    Raises:
        ValueError: a non-positive temperature.
    """
    if temperature <= 0 or (teacher_temperature is not None and teacher_temperature <= 0):
        raise ValueError("temperatures must be positive")
    s = (similarity or (lambda q, d: q @ d.T))(queries.double(), docs.double())  # (B, M) the student's cosines
    t = teacher.to(s.device).double()
    usable = torch.isfinite(t) if mask is None else torch.isfinite(t) & ~mask
    rows = usable.sum(1) >= 2
    zero = queries.sum() * 0.0  # keeps the graph
    if not rows.any():
        return zero
    s, t, usable = s[rows], t[rows], usable[rows]
    if teacher_temperature is None:
        spread_t, spread_s = t[usable].std(), s.detach()[usable].std()
        if not (spread_t > 0 and spread_s > 0):
            return zero
        teacher_temperature = float(temperature * spread_t / spread_s)
    inf = float("-inf")
    log_p = torch.log_softmax(torch.where(usable, t / teacher_temperature, inf), 1)
    log_q = torch.log_softmax(torch.where(usable, s / temperature, inf), 1)
    p = log_p.exp()
    gap = torch.where(p > 0, log_p - log_q, torch.zeros_like(log_p))
    return (p * gap).sum(1).mean().float()


class Relational(Term):
    """The relational term (:func:`relational_distillation`) over the step's view: every rank's queries
    against every rank's documents when the loss gathers them, the in-batch false negatives left out.

    Args:
        weight: its weight in the objective.
        teacher_temperature: τ of the teacher's softmax; None sets it from the teacher's score spread.

    Raises:
        ValueError: a bad weight or temperature.
    """

    name = "relational"

    @classmethod
    def data_problem(cls, data: dict) -> str | None:
        return teacher_vectors_problem(data)

    def __init__(self, weight: float = 1.0, teacher_temperature: float | None = None):
        super().__init__(weight)
        if teacher_temperature is not None and not (teacher_temperature > 0 and math.isfinite(teacher_temperature)):
            raise ValueError(
                f"Relational teacher_temperature must be null or a finite number > 0, got {teacher_temperature}"
            )
        self.teacher_temperature = teacher_temperature

    def forward(self, queries, docs, view: StepView, temperature: float) -> torch.Tensor:
        forward, _ = false_negative_masks(view.positives, view.doc_keys, view.query_keys, view.cut)
        teacher = view.teacher_cosines("Relational")
        tau = need_temperature(self, temperature)
        return relational_distillation(queries, docs, teacher, forward, tau, self.teacher_temperature, view.similarity)

    def settings(self) -> dict:
        return {"weight": self.weight, "teacher_temperature": self.teacher_temperature}

    def citation(self) -> dict:
        return {**super().citation(), "references": ["NeMo InfoNCEDistillLoss (relational KL)"]}
