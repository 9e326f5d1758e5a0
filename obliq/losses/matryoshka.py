"""A loss at nested embedding dimensions (Matryoshka representation learning): :class:`Matryoshka` wraps any
loss, as sentence-transformers' ``MatryoshkaLoss(model, base_loss)`` does."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from obliq.losses.loss import Loss
from obliq.losses.settings import spec
from obliq.losses.view import StepView


def check_dims(dims: list[int] | None, weights: list[float] | None) -> None:
    """Refuse Matryoshka settings that are not a list of distinct positive integers with positive weights.

    Raises:
        ValueError: naming :class:`Matryoshka`'s ``dims`` or ``weights`` and the value.
            ``weights``) and the value.
    """
    if dims is not None:
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
            raise ValueError(f"Matryoshka dims: positive integers, got {dims!r}")
        if len(set(dims)) != len(dims):
            raise ValueError(f"Matryoshka dims: a dimension given twice in {dims!r}")
    if weights is not None:
        if dims is None or len(weights) != len(dims):
            raise ValueError("Matryoshka weights: one weight per dims entry")
        if any(isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf for w in weights):
            raise ValueError(f"Matryoshka weights: finite positive numbers, got {weights!r}")


def matryoshka(loss_fn, queries: torch.Tensor, docs: torch.Tensor, dims, weights=None, parts=None) -> torch.Tensor:
    """A loss at nested dimensions: Σ_i w_i · loss_fn(q[:, :d_i] / ‖·‖, docs[:, :d_i] / ‖·‖).

    Matryoshka representation learning (Kusupati et al., 2022), as sentence-transformers'
    ``MatryoshkaLoss`` takes it: at every dimension (the full one too) the embeddings are truncated,
    then re-normalised (in float64), and the inner loss sees unit vectors. It is a function of the
    full embedding matrices, so GradCache (which back-propagates the loss's gradient with respect to
    the embeddings) and cross-device gathering (done before) need nothing more.

    Args:
        loss_fn: ``(q (B, d), docs (M, d)) -> scalar``.
        queries: (B, h) and docs: (M, h) embeddings.
        dims: the dimensions, each in 1 … h.
        weights: one per dimension (default 1 each).
        parts: None, or a list to which each dimension's loss (unweighted, detached) is appended.

    Returns:
        The weighted sum, float32.

    Raises:
        ValueError: a dimension outside 1 … h, or weights of another length.
    """
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if len(weights) != len(dims):
        raise ValueError(f"Matryoshka weights: {len(weights)} weights for {len(dims)} dimensions")
    width = queries.shape[-1]
    total = 0.0
    for dim, weight in zip(dims, weights):
        if not 1 <= dim <= width:
            raise ValueError(f"Matryoshka dims: {dim} is outside 1 … {width} (the embedding size)")
        q, d = (F.normalize(x[:, :dim].double(), dim=-1) for x in (queries, docs))
        value = loss_fn(q, d).double()
        if parts is not None:
            parts.append(value.detach().float())
        total = total + weight * value
    return total.float()


class Matryoshka(Loss):
    """``loss`` taken at each of ``dims`` (the embeddings truncated and re-normalised) and summed with
    ``weights`` (:func:`matryoshka`); each dimension's value is logged as ``<loss's name>_dim<d>``.

    Args:
        loss: the loss at each dimension (any :class:`~obliq.losses.loss.Loss`).
        dims: the embedding dimensions, distinct positive integers; include the full size.
        weights: one weight per dimension (default 1 each).

    Raises:
        ValueError: bad dimensions or weights (:func:`check_dims`).
    """

    def __init__(self, loss: Loss, dims: list[int], weights: list[float] | None = None):
        super().__init__()
        check_dims(dims, weights)
        self.loss = loss
        self.dims = list(dims)
        self.weights = list(weights) if weights else None

    @property
    def name(self) -> str:
        return self.loss.name

    @property
    def temperature(self) -> float | None:
        return self.loss.temperature

    @property
    def gathers(self) -> bool:
        return self.loss.gathers

    def logged(self) -> list[str]:
        return [*self.loss.logged(), *(f"{self.name}_dim{d}" for d in self.dims)]

    def forward(self, queries: torch.Tensor, docs: torch.Tensor, view: StepView, parts: dict | None = None):
        each: list[torch.Tensor] = []
        value = matryoshka(lambda q, d: self.loss(q, d, view), queries, docs, self.dims, self.weights, each)
        if parts is not None:
            parts.update({f"{self.name}_dim{d}": p for d, p in zip(self.dims, each)})
        return value

    def negatives_left(self, view: StepView) -> torch.Tensor:
        return self.loss.negatives_left(view)

    def settings(self) -> dict:
        return {"loss": spec(self.loss), "dims": self.dims, "weights": self.weights}

    def citation(self) -> dict:
        inner = self.loss.citation()
        return {
            **inner,
            "class": f"Matryoshka({inner.get('class', type(self.loss).__name__)})",
            "matryoshka_dims": self.dims,
            "matryoshka_weights": self.weights or [1.0] * len(self.dims),
            "references": [*(inner.get("references") or []), "Kusupati et al. 2022 (Matryoshka)"],
        }
