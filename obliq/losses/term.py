"""What a term of the training objective is: a part beside the contrastive loss, named, weighted, and
declaring the batch keys it reads (so that a config asking for it without the data that feeds it is refused
before a run starts: :func:`check_terms`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from obliq.losses.view import StepView

TEACHER_VECTORS = ("teacher_query_vectors", "teacher_doc_vectors")
PROVIDED_BY = {key: "teacher_vectors" for key in TEACHER_VECTORS}
"""The batch keys a batch holds only when a data setting asks for them, and that setting (``data.<name>``)."""
WRITTEN_BY = {"teacher_vectors": "obliq distill graph --vectors_out writes them"}


class Term(nn.Module):
    """A part of the step's objective beside the contrastive loss (:class:`obliq.losses.infonce.InfoNCE`).

    A subclass sets ``name`` (logged as ``train/<name>``) and ``needs`` (the batch keys it reads beyond the
    contrastive loss's), and overrides :meth:`forward` (a value added to the objective, times ``weight``)
    or :meth:`mask` (candidates the contrastive loss leaves out), or both. Each is computed over the step's
    :class:`~obliq.losses.view.StepView`: every rank's rows when the loss gathers them, so a term is the
    same on one process and on several.

    Args:
        weight: its weight in the objective (a finite number >= 0).

    Raises:
        ValueError: a weight that is negative, NaN or infinite.
    """

    name = "term"
    needs: tuple[str, ...] = ()

    def __init__(self, weight: float = 1.0):
        super().__init__()
        if not (isinstance(weight, (int, float)) and weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"{type(self).__name__} weight must be a finite number >= 0, got {weight}")
        self.weight = float(weight)

    def forward(self, queries: torch.Tensor, docs: torch.Tensor, view: StepView, temperature: float):
        """The term's value over the view's rows (queries (B, h), docs (M, h), unit vectors); ``temperature``
        is the contrastive loss's τ. None: the term adds nothing (a mask term)."""
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
    """Refuse terms whose batch keys the data will not provide (``model.terms[i] (Class) needs batch key K: set
    <setting>``), or whose data settings leave them nothing to compute (:meth:`Term.data_problem`).

    Args:
        terms: the term classes or instances, in config order.
        data: the ``data`` config section (its settings by name), or None.

    Raises:
        ValueError: naming the term, the key and the data setting that provides it.
    """
    data = data or {}
    for i, term in enumerate(terms):
        name = term.__name__ if isinstance(term, type) else type(term).__name__
        problem = term.data_problem(data) if hasattr(term, "data_problem") else None
        if problem:
            raise ValueError(f"{where}[{i}] ({name}) {problem}")
        for key in getattr(term, "needs", ()):
            setting = PROVIDED_BY.get(key)
            if setting is not None and not data.get(setting):
                raise ValueError(
                    f"{where}[{i}] ({name}) needs the batch key {key}: set data.{setting} ({WRITTEN_BY[setting]})"
                )
