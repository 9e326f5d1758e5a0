"""What a term of the training objective is: a part beside the main loss, named, weighted, and saying what
in the data settings or rows leaves it nothing to compute (so that a config asking for it without the data that
feeds it is refused before a run starts: :func:`check_terms`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from obliq.losses.view import StepView


class Term(nn.Module):
    """A part of the step's objective beside the main loss (:class:`obliq.losses.loss.Loss`).

    A subclass sets ``name`` (logged as ``train/<name>``), overrides :meth:`forward` (a value added to the
    objective, times ``weight``) or :meth:`mask` (candidates the contrastive loss leaves out), or both, and says
    what it needs of the data (:meth:`data_problem`, :meth:`rows_problem`). Each is computed over the step's
    :class:`~obliq.losses.view.StepView`: every rank's rows when the loss gathers them, so a term is the
    same on one process and on several.

    Args:
        weight: its weight in the objective (a finite number >= 0).

    Raises:
        ValueError: a weight that is negative, NaN or infinite.
    """

    name = "term"

    def __init__(self, weight: float = 1.0):
        super().__init__()
        if not (isinstance(weight, (int, float)) and weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"{type(self).__name__} weight must be a finite number >= 0, got {weight}")
        self.weight = float(weight)

    def forward(self, queries: torch.Tensor, docs: torch.Tensor, view: StepView, temperature: float):
        """The term's value over the view's rows (queries (B, h), docs (M, h), unit vectors); ``temperature``
        is the main loss's τ (:attr:`obliq.losses.loss.Loss.temperature`; None when it has none). None: the term
        adds nothing (a mask term)."""
        return None

    def mask(self, view: StepView) -> torch.Tensor | None:
        """(B, M) bool, the candidates the contrastive loss leaves out for this term, or None."""
        return None

    @classmethod
    def data_problem(cls, data: dict) -> str | None:
        """What in the ``data`` settings leaves this term nothing to compute, said as the refusal's reason; None."""
        return None

    def rows_problem(self, rows) -> str | None:
        """What in the training rows (a sample: the first rows of every file) leaves this term nothing to compute,
        said as the refusal's reason; None (the default: any rows)."""
        return None

    def settings(self) -> dict:
        """Its arguments, as a config gives them."""
        return {"weight": self.weight}

    def citation(self) -> dict:
        """Its name, settings and source, for the checkpoint and the model card."""
        return {"term": self.name, **self.settings()}


def check_terms(terms, data: dict | None, where: str = "model.terms") -> None:
    """Refuse terms whose data settings leave them nothing to compute (:meth:`Term.data_problem`: e.g. a term of
    the teacher's vectors without the data setting that adds them to a batch).

    Args:
        terms: the term classes or instances, in config order.
        data: the ``data`` config section (its settings by name), or None.

    Raises:
        ValueError: ``model.terms[i] (Class) <the term's reason>``.
    """
    data = data or {}
    for i, term in enumerate(terms):
        name = term.__name__ if isinstance(term, type) else type(term).__name__
        problem = term.data_problem(data) if hasattr(term, "data_problem") else None
        if problem:
            raise ValueError(f"{where}[{i}] ({name}) {problem}")


def need_temperature(term: Term, temperature: float | None) -> float:
    """The main loss's τ, which ``term`` compares the student's scores at.

    Raises:
        ValueError: the loss has none (:attr:`obliq.losses.loss.Loss.temperature` is None).
    """
    if temperature is None:
        raise ValueError(
            f"{type(term).__name__} compares the student's scores at the loss's τ, and model.loss has none"
        )
    return temperature
