"""Task-aware listwise reranking: one prompt lists the candidates, names the task's latent attribute
and asks for a permutation (the OBLIQ-IR paper, §5 "When language-model reranking helps" and §6.3:
"rank by authorial style; ignore topic"; the sliding window is RankGPT's, Sun et al. 2023).

When the top-N does not fit one prompt, a window of ``window`` candidates slides from the bottom of
the list to the top by ``step``: each window is reordered by one call, and the best candidates of a
window are carried up into the next. The calls are sequential (each window depends on the previous).

Calls per query: ``0`` when ``N ≤ 1`` (nothing to order), ``1`` when ``1 < N ≤ window``, else
``⌈(N − window) / step⌉ + 1`` (see :func:`windows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from obliq.llm.prompts import Messages
from obliq.rerank.config import ListwiseConfig
from obliq.rerank.judge import Judge


def windows(n: int, window: int, step: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` windows over ``n`` candidates, bottom first: ``⌈(n − window)/step⌉ + 1``
    of them when ``n > window``, one when ``1 < n ≤ window``, none when ``n ≤ 1`` (nothing to order)."""
    if n <= window:
        return [(0, n)] if n > 1 else []
    starts = list(range(n - window, 0, -step)) + [0]
    assert len(starts) == math.ceil((n - window) / step) + 1
    return [(a, a + window) for a in starts]


def listwise(
    n: int, judge: Judge, prompt_for: Callable[[list[int], int | None], Messages], cfg: ListwiseConfig, seed: int
) -> list[int]:
    """Rerank ``n`` candidates (positions ``0…n-1`` in dense order) with sliding listwise windows.

    Args:
        n: number of candidates.
        judge: asks the model and counts (:class:`obliq.rerank.judge.Judge`).
        prompt_for: ``(positions shown, None) -> chat`` for one window.
        cfg: window and step.
        seed: generation seed (window ``w`` uses ``seed + w``).

    Returns:
        A permutation of ``0…n-1``; a failed window keeps its order. Makes one call per window of
        :func:`windows` (none when ``n ≤ 1``).
    """
    order = list(range(n))
    for w, (a, b) in enumerate(windows(n, cfg.window, cfg.step)):
        shown = order[a:b]
        order[a:b] = [shown[i] for i in judge.order(prompt_for(shown, None), len(shown), seed + w)]
    return order
