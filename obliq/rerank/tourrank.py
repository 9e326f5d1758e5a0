"""TourRank: rerank the top-N by tournaments of group selections (Chen et al. 2024, "TourRank:
Utilizing Large Language Models for Documents Ranking with a Tournament-Inspired Strategy"; the
OBLIQ-IR paper, §3.4 and Table 5, where it reorders the dense top-100 with Y = 5).

One **tournament** runs in stages. With ``n_0`` candidates and stages ``n_1 > n_2 > …`` (how many
advance out of each stage; the paper's 100 → 50 → 20 → 10 → 5 → 2 is depth 100 with stages
``[50, 20, 10, 5, 2]``), stage ``s`` splits its ``n_s`` candidates into ``G_s = ⌈n_s / g⌉`` groups of
at most ``g`` (``group_size``), and each group's share of the ``n_{s+1}`` places (proportional to its
size, largest remainders first) is chosen by one language-model call. Every candidate that advances
out of a stage earns one point.

**Grouping** follows TourRank's seeding: candidates are dealt to groups in snake order of their
dense rank (1 → group 1, …, G → group G, G+1 → group G, …), so each group mixes strong and weak
seeds. Tournament 0 uses this grouping and shows each group in dense order; tournament ``t > 0``
shuffles each pot of ``G`` consecutive seeds before dealing, and the order within each group, with
a random generator seeded by ``(seed, t, stage)``. **Y** tournaments (``tournaments``) run side by
side (a stage's groups of all tournaments go to the backend as one batch); a candidate's points are
summed over them, and the final order is by points, ties by dense rank.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from obliq.llm.prompts import Messages
from obliq.rerank.config import TourRankConfig
from obliq.rerank.judge import Judge


def stage_sizes(n: int, stages: list[int]) -> list[int]:
    """``[n_0, n_1, …]``: the candidates entering each stage, then the final survivors."""
    return [n] + [s for s in stages if s < n]


def quotas(n_out: int, sizes: list[int]) -> list[int]:
    """Places per group: ``n_out`` split in proportion to group sizes, largest remainders first
    (ties to the earlier group); each quota is at most its group's size."""
    n_in = sum(sizes)
    exact = [n_out * m / n_in for m in sizes]
    out = [math.floor(x) for x in exact]
    for j in sorted(range(len(sizes)), key=lambda j: (out[j] - exact[j], j))[: n_out - sum(out)]:
        out[j] += 1
    return out


def deal(seeded: list[int], n_groups: int, rng: random.Random | None = None) -> list[list[int]]:
    """Deal candidates (best seed first) to ``n_groups`` groups in snake order; with ``rng``, each
    pot of ``n_groups`` consecutive seeds is shuffled first and so is each group's order."""
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    for p in range(0, len(seeded), n_groups):
        pot = seeded[p : p + n_groups]
        if rng is not None:
            rng.shuffle(pot)
        targets = range(n_groups) if (p // n_groups) % 2 == 0 else reversed(range(n_groups))
        for g, item in zip(targets, pot):
            groups[g].append(item)
    if rng is not None:
        for group in groups:
            rng.shuffle(group)
    return groups


def tourrank_calls(n: int, cfg: TourRankConfig) -> int:
    """Language-model calls TourRank makes on ``n`` candidates (failed calls included).

    A group whose quota is all of it or none of it needs no call, so

        calls(n) = Y · Σ_s #{groups j of stage s : 0 < k_{s,j} < m_{s,j}}

    (``m``: group size, ``k``: its quota; group sizes differ by at most one). In the usual case,
    where every group both keeps and drops a candidate, this is

        calls(n) = Y · Σ_{s=0}^{S-1} ⌈n_s / g⌉,

    over the stages ``n_0 = n > n_1 > … > n_S`` of :func:`stage_sizes`. Examples (g = 20, Y = 5):
    the top-100 with stages 50, 20, 10, 5, 2 takes 5 · (5 + 3 + 1 + 1 + 1) = 55 calls; the
    top-20 takes 5 · (1 + 1 + 1) = 15. (The OBLIQ-IR paper's Table 8 reports 65 calls for Y = 5,
    13 per tournament, without stating its grouping.) No stage is smaller than ``n ≤ 1`` (nor than
    ``n`` equal to the last stage), so such a list takes 0 calls and keeps its order.
    """
    per_tournament = 0
    sizes = stage_sizes(n, cfg.stages)
    for n_in, n_out in zip(sizes, sizes[1:]):
        g = math.ceil(n_in / cfg.group_size)
        groups = [n_in // g + (j < n_in % g) for j in range(g)]
        per_tournament += sum(0 < k < m for k, m in zip(quotas(n_out, groups), groups))
    return cfg.tournaments * per_tournament


def tourrank(
    n: int, judge: Judge, prompt_for: Callable[[list[int], int], Messages], cfg: TourRankConfig, seed: int
) -> list[int]:
    """Rerank ``n`` candidates (positions ``0…n-1`` in dense order) by TourRank.

    Args:
        n: number of candidates.
        judge: asks the model and counts (:class:`obliq.rerank.judge.Judge`).
        prompt_for: ``(positions shown, k) -> chat`` for one group.
        cfg: stages, group size, tournaments.
        seed: seeds the groupings of tournaments ``t > 0`` and the generation.

    Returns:
        A permutation of ``0…n-1``: by points summed over the tournaments, ties in dense order.
        Makes exactly :func:`tourrank_calls` calls.
    """
    sizes = stage_sizes(n, cfg.stages)
    points = [0] * n
    alive = [list(range(n)) for _ in range(cfg.tournaments)]
    for s, n_out in enumerate(sizes[1:]):
        winners: list[list[int]] = [[] for _ in alive]
        jobs: list[tuple[int, list[int], int]] = []
        for t, seeded in enumerate(alive):
            rng = random.Random(f"{seed}:{t}:{s}") if t else None
            groups = deal(seeded, math.ceil(len(seeded) / cfg.group_size), rng)
            for group, k in zip(groups, quotas(n_out, [len(g) for g in groups])):
                if k == len(group):
                    winners[t] += group
                elif k:
                    jobs.append((t, group, k))
        picks = judge.select(
            [prompt_for(g, k) for _, g, k in jobs], [len(g) for _, g, _ in jobs], [k for _, _, k in jobs], seed + s
        )
        for (t, group, _), pick in zip(jobs, picks):
            winners[t] += [group[i] for i in pick]
        for t, won in enumerate(winners):
            alive[t] = sorted(won)
            for i in won:
                points[i] += 1
    return sorted(range(n), key=lambda i: (-points[i], i))
