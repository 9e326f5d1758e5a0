"""What a main loss is: the small protocol :class:`obliq.model.RetrieverModule` asks of ``model.loss``.

Embeddings and the step's view in, a scalar out, and what the module and the model card need to know about it,
each asked here, never read as one loss's settings: whether it is computed over every rank's rows
(:attr:`Loss.gathers`), the τ at which the terms compare the student's scores (:attr:`Loss.temperature`), the
parts it logs beside its value (:meth:`Loss.logged`), how many negatives each row still scores
(:meth:`Loss.negatives_left`), its settings (:meth:`Loss.settings`) and its citation (:meth:`Loss.citation`).
A wrapper (:class:`~obliq.losses.symmetric.Symmetric`, :class:`~obliq.losses.matryoshka.Matryoshka`) is a loss
that takes another as its ``loss`` and answers from it where it adds nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from obliq.losses.masks import negatives_left
from obliq.losses.view import StepView


class Loss(nn.Module):
    """The main loss of a training step (module notes). A subclass overrides :meth:`forward` and, to be cited by
    more than its class name, :meth:`citation`; the rest has defaults for a loss over this rank's rows.


    Attributes:
        temperature: τ of its scores (q·d / τ), at which a term compares the student's (the teacher's KL, the
            relational KL); None: it has none, and a term that needs one refuses it.
    """

    temperature: float | None = None

    def __init__(self) -> None:
        if type(self) is Loss:
            raise TypeError(
                "obliq.losses.Loss is the protocol a main loss follows, not a loss: name one "
                "(obliq.losses.InfoNCE, MILNCE, SupCon, or a wrapper: Symmetric, Matryoshka)"
            )
        super().__init__()

    @property
    def name(self) -> str:
        """Logged as ``train/<name>`` (the parts of :meth:`logged` beside it); default the class's name, lower case."""
        return type(self).__name__.lower()

    def forward(
        self, queries: torch.Tensor, docs: torch.Tensor, view: StepView, parts: dict | None = None
    ) -> torch.Tensor:
        """The loss over the view's rows: ``queries`` (B, h) and ``docs`` (M, h) are the view's embeddings
        (:meth:`StepView.embeddings`); the parts :meth:`logged` names are put in ``parts`` (detached) when given.
        Returns a float32 scalar."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward")

    @property
    def gathers(self) -> bool:
        """Whether it is computed over every rank's rows (the view gathered across devices): each rank then
        computes the same global value. Default False: this rank's rows."""
        return False

    def logged(self) -> list[str]:
        """The names of the parts it logs beside its value (``train/<part>``); default none."""
        return []

    def negatives_left(self, view: StepView) -> torch.Tensor:
        """(B,) the negatives each row still scores, once the in-batch false negatives and the view's mask are
        left out (:func:`~obliq.losses.masks.negatives_left`): a row at 0 adds no gradient.

        Raises:
            ValueError: a view this loss does not take.
        """
        return negatives_left(view.positives, view.doc_keys, view.query_keys, view.mask, False, view.cut)

    def settings(self) -> dict:
        """Its arguments, as a config gives them (the base loss of a wrapper as its own config)."""
        return {}

    def citation(self) -> dict:
        """What a model card needs to describe it: its class (``Matryoshka(Symmetric(InfoNCE))`` for wrappers),
        what it is, its settings and references."""
        return {"class": type(self).__name__, "loss": type(self).__name__, **self.settings()}
