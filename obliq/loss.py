"""InfoNCE over in-batch positives and hard negatives, with duplicate-document masking and
cross-device negatives.

The objective is the contrastive log-likelihood of the OBLIQ-IR paper (Eq. 1, §3.3), i.e.
sentence-transformers' MultipleNegativesRankingLoss with scale 1/τ = 50 (the model card).
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


class InfoNCELoss(nn.Module):
    """InfoNCE with in-batch and hard negatives, gathered across devices.

    Args:
        temperature: τ (default 0.02, the model card's scale 50).
        gather_across_devices: use every rank's documents as negatives (and every rank's
            queries, so that all ranks compute the same global loss).

    Call it with the local shard: ``loss(queries (B,h), docs (M,h), positive_index (B,),
    doc_keys (M,K) | None)``; ``positive_index`` indexes the local ``docs``.
    """

    def __init__(self, temperature: float = 0.02, gather_across_devices: bool = True):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature
        self.gather_across_devices = gather_across_devices

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
        return info_nce(queries, docs, positive_index, doc_keys, self.temperature)

    def citation(self) -> dict:
        """What a model card needs to describe the trained objective: its name, settings and references
        (as sentence-transformers' losses describe themselves)."""
        return {
            "loss": "InfoNCE over in-batch positives and hard negatives (GradCache)",
            "temperature": self.temperature,
            "scale": 1.0 / self.temperature,
            "gather_across_devices": self.gather_across_devices,
            "references": ["van den Oord et al. 2018 (InfoNCE)", "Gao et al. 2021 (GradCache)"],
        }
