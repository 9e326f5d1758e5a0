"""Masked mean pooling followed by L2 normalisation (the model card: "mean over tokens, then L2 normalise")."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states of real tokens, then L2 normalisation, computed in float32.

    Only positions where ``attention_mask`` is 1 count, whichever side the padding is on, and
    whatever the model wrote at pad positions (../shared/cases/C01). The mask must be the
    tokenizer's own attention mask, never ``input_ids != pad_id`` (C02: pad = eos would drop the
    genuine end-of-sequence token).

    Args:
        hidden: (n, L, h) last hidden states, any float dtype.
        attention_mask: (n, L) 1 for real tokens, 0 for padding.

    Returns:
        (n, h) float32 unit vectors.

    Raises:
        ValueError: a row has no real token (its mean is undefined).
    """
    mask = attention_mask.to(torch.float32).unsqueeze(-1)
    counts = mask.sum(dim=1)
    if bool((counts == 0).any()):
        raise ValueError("mean_pool: a sequence has no real token (all-zero attention mask)")
    summed = (hidden.to(torch.float32) * mask).sum(dim=1)
    return F.normalize(summed / counts, p=2, dim=-1)
