"""InfoNCE over in-batch positives and hard negatives, with duplicate-document masking and
cross-device negatives.

The objective is the contrastive log-likelihood of the OBLIQ-IR paper (Eq. 1, §3.3), i.e.
sentence-transformers' MultipleNegativesRankingLoss with scale 1/τ = 50 (the model card). With
``matryoshka_dims`` it is taken at several nested dimensions and summed (:func:`matryoshka`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from obliq.distributed import gather, world


def info_nce(
    queries: torch.Tensor,
    docs: torch.Tensor,
    positive_index: torch.Tensor,
    doc_keys: torch.Tensor | None = None,
    temperature: float = 0.02,
) -> torch.Tensor:
    """Mean cross-entropy of each query against all documents, its own positive the target.

    A document that is a copy of query i's positive (same key in any column of ``doc_keys``:
    the same id, or the same normalised text) is masked out of query i's negatives (C05, C06);
    the positive itself stays the target.

    Args:
        queries: (B, h) unit query vectors.
        docs: (M, h) unit document vectors (positives and hard negatives of the whole batch).
        positive_index: (B,) index into ``docs`` of each query's positive.
        doc_keys: (M,) or (M, K) int64 identity keys of the documents (e.g. an id hash and a
            text hash); None masks nothing.
        temperature: τ; scores are q·d / τ (0.02 → scale 50).

    Returns:
        Scalar float32 loss (computed in float64).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    # float64: the (B, M) matrix is small, and float32 rounds a near-zero loss at scale 50 away
    # (log(1 + e^-16) = 1.1254e-7 comes out as 1.19e-7, C06).
    scores = queries.double() @ docs.double().T / temperature  # (B, M)
    if doc_keys is not None:
        keys = doc_keys if doc_keys.dim() == 2 else doc_keys[:, None]
        same = (keys[positive_index][:, None, :] == keys[None, :, :]).any(-1)  # (B, M)
        same[torch.arange(len(positive_index), device=same.device), positive_index] = False
        scores = scores.masked_fill(same, float("-inf"))
    return F.cross_entropy(scores, positive_index).float()


def matryoshka(loss_fn, queries: torch.Tensor, docs: torch.Tensor, dims, weights=None) -> torch.Tensor:
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
        total = total + weight * loss_fn(q, d).double()
    return total.float()


class InfoNCELoss(nn.Module):
    """InfoNCE with in-batch and hard negatives, gathered across devices.

    Args:
        temperature: τ (default 0.02, the model card's scale 50).
        gather_across_devices: use every rank's documents as negatives (and every rank's
            queries, so that all ranks compute the same global loss).
        matryoshka_dims: None, or take the loss at each of these embedding dimensions (truncated and
            re-normalised) and sum them (:func:`matryoshka`); include the full size to train it too.
        matryoshka_weights: one weight per dimension (default 1 each).

    Call it with the local shard: ``loss(queries (B,h), docs (M,h), positive_index (B,),
    doc_keys (M,K) | None)``; ``positive_index`` indexes the local ``docs``.
    """

    def __init__(
        self,
        temperature: float = 0.02,
        gather_across_devices: bool = True,
        matryoshka_dims: list[int] | None = None,
        matryoshka_weights: list[float] | None = None,
    ):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature
        self.gather_across_devices = gather_across_devices
        if matryoshka_dims is not None:
            if not matryoshka_dims or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in matryoshka_dims
            ):
                raise ValueError(f"matryoshka_dims: positive integers, got {matryoshka_dims!r}")
            if len(set(matryoshka_dims)) != len(matryoshka_dims):
                raise ValueError(f"matryoshka_dims: a dimension given twice in {matryoshka_dims!r}")
        if matryoshka_weights is not None:
            if matryoshka_dims is None or len(matryoshka_weights) != len(matryoshka_dims):
                raise ValueError("matryoshka_weights: one weight per matryoshka_dims entry")
            if any(not w > 0 for w in matryoshka_weights):
                raise ValueError(f"matryoshka_weights: positive numbers, got {matryoshka_weights!r}")
        self.matryoshka_dims = list(matryoshka_dims) if matryoshka_dims else None
        self.matryoshka_weights = list(matryoshka_weights) if matryoshka_weights else None

    @property
    def backward_scale(self) -> float:
        """Factor for the backward pass: DDP/FSDP average the ranks' gradients, and each rank's
        gradient already is its share of the global loss's, so the average is scaled back up."""
        return float(world()[1]) if self.gather_across_devices else 1.0

    def forward(self, queries, docs, positive_index, doc_keys=None) -> torch.Tensor:
        if self.gather_across_devices and world()[1] > 1:
            counts = gather(torch.tensor([docs.shape[0]], device=docs.device))  # (world,)
            positive_index = gather(positive_index + counts[: world()[0]].sum())
            queries, docs = gather(queries), gather(docs)
            doc_keys = gather(doc_keys) if doc_keys is not None else None
        if self.matryoshka_dims:
            nce = lambda q, d: info_nce(q, d, positive_index, doc_keys, self.temperature)  # noqa: E731
            return matryoshka(nce, queries, docs, self.matryoshka_dims, self.matryoshka_weights)
        return info_nce(queries, docs, positive_index, doc_keys, self.temperature)

    def citation(self) -> dict:
        """What a model card needs to describe the trained objective: its name, settings and references
        (as sentence-transformers' losses describe themselves)."""
        out = {
            "loss": "InfoNCE over in-batch positives and hard negatives (GradCache)",
            "temperature": self.temperature,
            "scale": 1.0 / self.temperature,
            "gather_across_devices": self.gather_across_devices,
            "references": ["van den Oord et al. 2018 (InfoNCE)", "Gao et al. 2021 (GradCache)"],
        }
        if self.matryoshka_dims:
            out["matryoshka_dims"] = self.matryoshka_dims
            out["matryoshka_weights"] = self.matryoshka_weights or [1.0] * len(self.matryoshka_dims)
            out["references"].append("Kusupati et al. 2022 (Matryoshka)")
        return out
