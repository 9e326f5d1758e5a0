"""Paired comparison of two runs: bootstrap test and helped / hurt / tied counts.

The OBLIQ-IR paper §5 ("a paired bootstrap over per-query NDCG@10, 10000 resamples") and Table 7
(§6.2: queries helped, hurt, tied within 0.001, and zero in both).

The test is the paired bootstrap of Efron & Tibshirani (1993, §16.4) as used for IR by Sakai
(SIGIR 2006): resample queries with replacement, keeping each query's pair together; the 95%
interval is the percentile interval of the resampled mean differences; the two-sided p-value is
the share of resampled means, shifted to the null (mean 0), at least as far from 0 as the observed
mean, computed as (1 + count) / (1 + resamples) so that it is never 0 (Davison & Hinkley, 1997).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

TIE = 0.001
"""Per-query differences within this are ties (the paper's Table 7)."""


@dataclass
class Comparison:
    """Run B against run A over the same queries (differences are B − A)."""

    measure: str
    n_queries: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    helped: int
    """queries where B − A > tie."""
    hurt: int
    """queries where B − A < −tie."""
    tied: int
    """queries where |B − A| ≤ tie (zero_both included)."""
    zero_both: int
    """queries where both runs score 0."""
    resamples: int
    seed: int


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float, float]:
    """Paired bootstrap over per-query values (see the module docstring).

    Args:
        a, b: (n,) per-query values of the two systems, aligned by query.
        resamples: bootstrap samples.
        seed: numpy seed (same seed, same answer).
        confidence: level of the percentile interval.

    Returns:
        ``(mean difference b − a, ci_low, ci_high, two-sided p-value)``.

    Raises:
        ValueError: different lengths, no query, or fewer than 1 resample.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"expected two 1-D arrays of the same length, got {a.shape} and {b.shape}")
    if len(a) == 0:
        raise ValueError("no query to compare")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    d = b - a
    observed = float(d.mean())
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, 2_000_000 // len(d))  # bound the index matrix to ~16 MB
    for start in range(0, resamples, step):
        n = min(step, resamples - start)
        means[start : start + n] = d[rng.integers(0, len(d), size=(n, len(d)))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    extreme = int(np.sum(np.abs(means - observed) >= abs(observed)))
    return observed, float(low), float(high), (1 + extreme) / (1 + resamples)


def compare(
    per_query_a: dict[str, float],
    per_query_b: dict[str, float],
    measure: str = "NDCG@10",
    resamples: int = 10_000,
    seed: int = 0,
    tie: float = TIE,
) -> Comparison:
    """Compare two systems' per-query values (query id → value) on the same queries.

    Raises:
        ValueError: the two query sets differ, or are empty.
    """
    if set(per_query_a) != set(per_query_b):
        only = sorted(set(per_query_a) ^ set(per_query_b))
        raise ValueError(f"the runs were evaluated on different queries ({len(only)} differ, e.g. {only[0]})")
    qids = sorted(per_query_a)
    a = np.array([per_query_a[q] for q in qids], dtype=np.float64)
    b = np.array([per_query_b[q] for q in qids], dtype=np.float64)
    diff, low, high, p = paired_bootstrap(a, b, resamples, seed)
    d = b - a
    return Comparison(
        measure=measure,
        n_queries=len(qids),
        mean_a=float(a.mean()),
        mean_b=float(b.mean()),
        diff=diff,
        ci_low=low,
        ci_high=high,
        p_value=p,
        helped=int(np.sum(d > tie)),
        hurt=int(np.sum(d < -tie)),
        tied=int(np.sum(np.abs(d) <= tie)),
        zero_both=int(np.sum((a == 0) & (b == 0))),
        resamples=resamples,
        seed=seed,
    )


def compare_files(
    run_a: Path,
    run_b: Path,
    qrels: Path,
    measure: str = "NDCG@10",
    resamples: int = 10_000,
    seed: int = 0,
    tie: float = TIE,
) -> dict:
    """Paired bootstrap of run B against run A on one qrels file (the `obliq compare` command).

    Both runs are scored per query with :func:`obliq.eval.metrics.evaluate_run` (trec_eval's
    conventions; queries without relevant documents excluded, a query missing from a run scores 0).

    Args:
        run_a: the baseline TREC run file.
        run_b: the system TREC run file.
        qrels: relevance judgements (BEIR TSV or TREC qrels).
        measure: the per-query measure compared.
        resamples: bootstrap samples.
        seed: random seed.
        tie: per-query differences within this count as ties.

    Returns:
        The :class:`Comparison` as a dict (differences are B − A).
    """
    from obliq.eval.metrics import evaluate_run, read_run
    from obliq.eval.tasks import read_qrels

    judged = read_qrels(qrels)
    values = []
    for run in (run_a, run_b):
        ev = evaluate_run(judged, read_run(run), [measure])
        values.append({q: v[measure] for q, v in ev.per_query.items()})
    return asdict(compare(values[0], values[1], measure, resamples, seed, tie))
