"""The process group as obliq's layers see it: this rank and the world size, and a gather that keeps
the local shard's gradient (the loss's cross-device negatives, the evaluation's shared encoding)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) outside one: always in a process that
    has not imported torch, where there can be none (so BM25 and the store never import torch for it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every rank along dim 0, keeping the gradient of the local shard.

    Ranks may hold different numbers of rows. Remote shards are constants: every rank then
    computes the same global loss and back-propagates only into its own embeddings, so the sum
    of the ranks' gradients is the full-batch gradient (see :attr:`obliq.model.module.RetrieverModule.backward_scale`).

    Args:
        x: (n_local, ...) tensor.

    Returns:
        (Σ n_rank, ...) tensor, rank order; the local rows are ``x`` itself.
    """
    import torch
    import torch.distributed as dist

    rank, size = world()
    if size == 1:
        return x
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(size)]
    dist.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device))
    sizes = [int(s) for s in sizes]
    width = max(sizes)
    padded = torch.zeros((width, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x.detach()
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded)
    parts = [p[:n] for p, n in zip(parts, sizes)]
    parts[rank] = x
    return torch.cat(parts)
