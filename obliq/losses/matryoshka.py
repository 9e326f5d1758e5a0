"""A loss at nested embedding dimensions (Matryoshka representation learning)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def check_dims(dims: list[int] | None, weights: list[float] | None) -> None:
    """Refuse Matryoshka settings that are not a list of distinct positive integers with positive weights.

    Raises:
        ValueError: naming ``matryoshka_dims`` or ``matryoshka_weights`` and the value.
    """
    if dims is not None:
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
            raise ValueError(f"matryoshka_dims: positive integers, got {dims!r}")
        if len(set(dims)) != len(dims):
            raise ValueError(f"matryoshka_dims: a dimension given twice in {dims!r}")
    if weights is not None:
        if dims is None or len(weights) != len(dims):
            raise ValueError("matryoshka_weights: one weight per matryoshka_dims entry")
        if any(isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf for w in weights):
            raise ValueError(f"matryoshka_weights: finite positive numbers, got {weights!r}")


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
        raise ValueError(f"matryoshka_weights: {len(weights)} weights for {len(dims)} dimensions")
    width = queries.shape[-1]
    total = 0.0
    for dim, weight in zip(dims, weights):
        if not 1 <= dim <= width:
            raise ValueError(f"matryoshka_dims: {dim} is outside 1 … {width} (the embedding size)")
        q, d = (F.normalize(x[:, :dim].double(), dim=-1) for x in (queries, docs))
        value = loss_fn(q, d).double()
        if parts is not None:
            parts.append(value.detach().float())
        total = total + weight * value
    return total.float()
