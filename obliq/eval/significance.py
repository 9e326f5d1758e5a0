"""The one statistics path of obliq: paired comparisons of per-query values, their intervals and tests.

Used by ``obliq compare``, the quickstart, the dose sweep and the identity-signal audit. The choices:

- **p-values of a paired comparison** come from the **sign-flip (randomisation) test** (Fisher, 1935;
  Smucker, Allan & Carterette, CIKM 2007 for IR): under H0 each unit's difference is symmetric about
  0, so its sign is flipped at random; the statistic is the sum of the differences, two-sided. With at
  most :data:`EXACT_MAX_UNITS` non-zero units every one of the 2^n sign patterns is enumerated and
  the p-value is exact (the share of patterns at least as extreme, the observed one included); above
  that it is Monte Carlo over ``resamples`` random patterns, p = (1 + count) / (1 + B) (Phipson &
  Smyth, 2010), never below its floor 1 / (B + 1). A zero difference carries no sign and is left
  out. With no non-zero difference there is nothing to test: p = 1, method ``untestable``. So p is
  never smaller than the data can show: 1 at n = 1, 0.25 at n = 3 (``shared/cases/C20``).
  Units are queries, or clusters of them (every difference of a cluster flips together).
- **Intervals** are percentile bootstraps from ``scipy.stats.bootstrap`` (``method="percentile"``;
  BCa is undefined when every value is equal), over units or clusters (Field & Welsh, 2007): the
  OBLIQ-IR paper's §5 paired bootstrap of per-query NDCG@10 (10,000 resamples). An interval of zero
  width (every difference equal, or one unit) is reported as ``degenerate``, not as certainty.
- **Helped / hurt / tied** counts follow the paper's Table 7 (§6.2): ties within 0.001.
- Rank tests from scipy for the audit's tables: paired Wilcoxon signed-rank and Mann–Whitney U.

Every p-value obliq prints names its method and n (:meth:`Comparison.p_text`, :func:`p_text`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
PERMUTATIONS = 50_000
"""Monte Carlo sign patterns when the units are too many to enumerate (the identity-signals paper's B)."""
EXACT_MAX_UNITS = 20
"""Up to this many non-zero units, the sign-flip test enumerates all 2^n patterns (about a million)."""
TIE = 0.001
"""Per-query differences within this are ties (the paper's Table 7)."""
MAX_RESAMPLES = 1_000_000
"""The most bootstrap draws, or Monte Carlo sign patterns, one comparison takes (100 × the paper's
10,000): the Monte Carlo p-value's floor is then 1e-6, and the bootstrap keeps one float per draw
(8 MB) on top of its bounded batches; beyond it a typo (``--resamples 10000000000``) would run for
hours, or exhaust memory, before printing anything."""

_MAX_CELLS = 4_000_000  # entries of one resampling matrix (bounds memory at ~32 MB)


def finite_values(x, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D array, got shape {x.shape}")
    if len(x) == 0:
        raise ValueError(f"{what}: no values")
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: contains NaN or infinite values")
    return x


def cluster_sums(values, clusters=None) -> tuple[np.ndarray, np.ndarray]:
    """Sum and size of each cluster, clusters in order of first appearance.

    Args:
        values: (n,) observations.
        clusters: (n,) cluster labels (any hashable), or None for one cluster per observation.

    Returns:
        ``(sums, sizes)``, each (n_clusters,) float64.

    Raises:
        ValueError: ``clusters`` has another length than ``values``.
    """
    values = np.asarray(values, dtype=np.float64)
    if clusters is None:
        return values.copy(), np.ones(len(values))
    clusters = list(clusters)
    if len(clusters) != len(values):
        raise ValueError(f"{len(clusters)} cluster labels for {len(values)} values")
    index: dict = {}
    codes = np.array([index.setdefault(c, len(index)) for c in clusters], dtype=np.int64)
    return np.bincount(codes, weights=values, minlength=len(index)), np.bincount(codes, minlength=len(index)).astype(
        float
    )


def _batch(n_clusters: int) -> int:
    return max(1, _MAX_CELLS // max(1, n_clusters))


def bootstrap_mean(
    values,
    clusters=None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[float, float, float]:
    """Mean of ``values`` with a percentile (cluster-)bootstrap interval.

    ``scipy.stats.bootstrap`` resamples cluster indices with replacement; each draw's statistic is the
    mean over all observations of the drawn clusters (Field & Welsh, 2007; the paper's Figure 2).

    Args:
        values: (n,) observations (e.g. per-pair ΔRR@10, unitless).
        clusters: (n,) cluster labels; None = every observation its own cluster.
        resamples: bootstrap draws.
        seed: seed of numpy's generator handed to scipy (same seed, same interval).
        confidence: level of the interval.

    Returns:
        ``(mean, low, high)``; low and high are NaN when there are fewer than 2 clusters.

    Raises:
        ValueError: empty or non-finite values, or labels of another length.
    """
    values = finite_values(values, "bootstrap_mean")
    sums, sizes = cluster_sums(values, clusters)
    mean = float(values.mean())
    if len(sums) < 2:
        return mean, float("nan"), float("nan")

    def statistic(i, axis=-1):
        return sums[i].sum(axis=axis) / sizes[i].sum(axis=axis)

    res = stats.bootstrap(
        (np.arange(len(sums)),),
        statistic,
        n_resamples=resamples,
        method="percentile",
        vectorized=True,
        batch=_batch(len(sums)),
        confidence_level=confidence,
        rng=np.random.default_rng(seed),
    )
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_gap(
    reference,
    comparison,
    clusters_reference=None,
    clusters_comparison=None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[float, float, float]:
    """Difference of two independent groups' means, ``mean(comparison) − mean(reference)``, with a
    two-group percentile bootstrap that resamples each group (its clusters) independently.

    Args:
        reference / comparison: (n_a,) and (n_b,) per-query values.
        clusters_reference / clusters_comparison: cluster labels per value, or None.
        resamples, seed, confidence: as in :func:`bootstrap_mean`.

    Returns:
        ``(gap, low, high)``; low and high are NaN when a group has fewer than 2 clusters.

    Raises:
        ValueError: an empty group, non-finite values, or labels of another length.
    """
    a, b = finite_values(reference, "reference group"), finite_values(comparison, "comparison group")
    sa, na = cluster_sums(a, clusters_reference)
    sb, nb = cluster_sums(b, clusters_comparison)
    gap = float(b.mean() - a.mean())
    if len(sa) < 2 or len(sb) < 2:
        return gap, float("nan"), float("nan")

    def statistic(ia, ib, axis=-1):
        return sb[ib].sum(axis=axis) / nb[ib].sum(axis=axis) - sa[ia].sum(axis=axis) / na[ia].sum(axis=axis)

    res = stats.bootstrap(
        (np.arange(len(sa)), np.arange(len(sb))),
        statistic,
        n_resamples=resamples,
        method="percentile",
        vectorized=True,
        batch=_batch(len(sa) + len(sb)),
        confidence_level=confidence,
        rng=np.random.default_rng(seed),
    )
    return gap, float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class SignFlip:
    """Result of :func:`sign_flip_test`."""

    p_value: float
    """Two-sided p-value."""
    method: str
    """``exact`` (all 2^n sign patterns), ``monte-carlo`` (B random patterns) or ``untestable`` (no
    non-zero difference: p = 1)."""
    n_units: int
    """Units whose signs are flipped: clusters (queries or pairs when no clusters are given)."""
    n_nonzero: int
    """Units with a non-zero difference: the n of the test."""
    patterns: int
    """Sign patterns counted: 2^n_nonzero (exact) or B (Monte Carlo); 0 when untestable."""
    p_floor: float
    """The smallest p-value the test can give: 2 / 2^n (exact), 1 / (B + 1) (Monte Carlo)."""
    seed: int

    def text(self) -> str:
        """The p-value with its method and n, e.g. ``p = 0.25 (exact sign-flip test, 8 sign patterns, n = 3)``."""
        return p_text(self.p_value, self.method, self.n_nonzero, self.patterns)


def p_text(p: float, method: str, n: int, patterns: int = 0) -> str:
    """A p-value as obliq prints it: its value, method and n."""
    if method == "untestable":
        return f"p = 1 (cannot be tested: no non-zero difference, n = {n})"
    what = (
        f"exact sign-flip test, {patterns:,} sign patterns"
        if method == "exact"
        else f"Monte Carlo sign-flip test, {patterns:,} random sign patterns"
    )
    value = f"{p:.2g}" if p < 0.001 else f"{p:.4f}"
    return f"p = {value} ({what}, n = {n})"


def sign_flip_test(
    differences, clusters=None, resamples: int = PERMUTATIONS, seed: int = 0, exact_max: int = EXACT_MAX_UNITS
) -> SignFlip:
    """Two-sided paired sign-flip (randomisation) test of mean(differences) = 0 (see the module notes).

    The statistic is T = Σ units' sums of differences; a pattern counts as extreme when
    |T*| ≥ |T| − 1e-10·Σ|unit sums| (the tolerance absorbs summation-order rounding, as scipy's
    ``permutation_test`` does).

    Args:
        differences: (n,) per-query (or per-pair) differences, B − A; unitless.
        clusters: (n,) cluster labels; differences of one cluster flip together. None: each alone.
        resamples: B, random sign patterns when there are more than ``exact_max`` non-zero units.
        seed: numpy seed of the Monte Carlo patterns (an exact test does not use it).
        exact_max: the most non-zero units that are enumerated exactly.

    Returns:
        :class:`SignFlip`.

    Raises:
        ValueError: empty or non-finite differences, or fewer than 1 resample.
    """
    d = finite_values(differences, "sign_flip_test")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    sums, _ = cluster_sums(d, clusters)
    nonzero = sums[sums != 0]
    n = len(nonzero)
    if n == 0:
        return SignFlip(1.0, "untestable", len(sums), 0, 0, 1.0, seed)
    observed = abs(nonzero.sum())
    tolerance = 1e-10 * np.abs(nonzero).sum()
    extreme = 0
    if n <= exact_max:
        total = 1 << n
        bits = np.arange(n, dtype=np.int64)
        step = max(1, _MAX_CELLS // n)
        for start in range(0, total, step):
            codes = np.arange(start, min(total, start + step), dtype=np.int64)
            signs = ((codes[:, None] >> bits) & 1).astype(np.float64) * 2 - 1
            extreme += int(np.count_nonzero(np.abs(signs @ nonzero) >= observed - tolerance))
        return SignFlip(extreme / total, "exact", len(sums), n, total, 2 / total, seed)
    rng = np.random.default_rng(seed)
    for start in range(0, resamples, _batch(n)):
        size = min(_batch(n), resamples - start)
        signs = rng.integers(0, 2, size=(size, n), dtype=np.int8).astype(np.float64) * 2 - 1
        extreme += int(np.count_nonzero(np.abs(signs @ nonzero) >= observed - tolerance))
    return SignFlip((1 + extreme) / (1 + resamples), "monte-carlo", len(sums), n, resamples, 1 / (1 + resamples), seed)


def wilcoxon_test(differences) -> dict:
    """Two-sided paired Wilcoxon signed-rank test on per-pair differences (scipy.stats.wilcoxon).

    Zero differences (pairs that score the same, frequent for RR@10) are dropped before the test
    (Wilcoxon's rule, ``zero_method="wilcox"``), so the null distribution is chosen from the non-zero
    ones alone (scipy's ``method="auto"`` would otherwise leave the exact distribution for any zero):
    the exact null for ≤ 50 untied non-zero differences, every sign pattern of the average ranks for
    ≤ 13 with ties (``PermutationMethod``, deterministic at that size), else the normal approximation
    with the tie correction, no continuity correction. With no non-zero difference the test has
    nothing to rank: p = 1.

    Returns:
        ``{"statistic", "p_value", "n_nonzero", "zero_method", "alternative"}``.

    Raises:
        ValueError: empty or non-finite differences.
    """
    d = finite_values(differences, "wilcoxon_test")
    out = {"n_nonzero": int(np.count_nonzero(d)), "zero_method": "wilcox", "alternative": "two-sided"}
    if out["n_nonzero"] == 0:
        return {"statistic": 0.0, "p_value": 1.0, **out}
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.wilcoxon(d[d != 0], zero_method="wilcox", alternative="two-sided", method="auto")
    return {"statistic": float(res.statistic), "p_value": float(res.pvalue), **out}


def mann_whitney_test(reference, comparison) -> dict:
    """Two-sided Mann–Whitney U test between two independent groups (scipy.stats.mannwhitneyu).

    ``U`` is the comparison group's statistic (large when comparison values are larger);
    ``method="auto"`` (exact for small samples without ties, else the normal approximation with tie
    correction), ``use_continuity=True``.

    Returns:
        ``{"statistic", "p_value", "alternative", "method"}``.

    Raises:
        ValueError: an empty group or non-finite values.
    """
    a, b = finite_values(reference, "reference group"), finite_values(comparison, "comparison group")
    res = stats.mannwhitneyu(b, a, alternative="two-sided", method="auto", use_continuity=True)
    return {
        "statistic": float(res.statistic),
        "p_value": float(res.pvalue),
        "alternative": "two-sided",
        "method": "auto",
    }


@dataclass
class Comparison:
    """System B against system A over the same queries (differences are B − A)."""

    measure: str
    n_queries: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    """The paired percentile-bootstrap interval of the mean difference (the OBLIQ-IR paper §5)."""
    ci_degenerate: bool
    """The interval has no width (one query, or every difference equal): it shows no spread, not
    certainty."""
    p_value: float
    p_method: str
    """``exact``, ``monte-carlo`` or ``untestable`` sign-flip test (:func:`sign_flip_test`)."""
    n_nonzero: int
    """Queries with a non-zero difference: the n of the test."""
    patterns: int
    helped: int
    """queries where B − A > tie."""
    hurt: int
    """queries where B − A < −tie."""
    tied: int
    """queries where |B − A| ≤ tie (zero_both included)."""
    zero_both: int
    """queries where both systems score 0."""
    resamples: int
    """bootstrap draws of the interval."""
    confidence: float
    seed: int

    def p_text(self) -> str:
        """The p-value with its method and n (what obliq prints)."""
        return p_text(self.p_value, self.p_method, self.n_nonzero, self.patterns)

    def as_dict(self) -> dict:
        """The fields, plus ``p_text``."""
        return {**asdict(self), "p_text": self.p_text()}

    def text(self, label: str = "B − A") -> str:
        """One line for a report: the difference, its interval, the p-value with method and n, and the
        helped / hurt / tied counts."""
        ci = f"{round(self.confidence * 100)}% paired-bootstrap CI {self.ci_low:+.4f} … {self.ci_high:+.4f}"
        if self.ci_degenerate:
            ci += ", degenerate: no spread to resample"
        return (
            f"{label} {self.measure} = {self.diff:+.4f} ({ci}; {self.p_text()}); queries helped {self.helped}, "
            f"hurt {self.hurt}, tied {self.tied} (zero in both {self.zero_both}) of {self.n_queries}"
        )


def check_resamples(name: str, value) -> None:
    """Refuse ``value`` unless it is an integer in 1 … :data:`MAX_RESAMPLES` (``name`` is the setting's).

    Raises:
        ValueError: ``"<name>: …"``, naming the limit.
    """
    from obliq.errors import check_int

    check_int(name, value, 1)
    if value > MAX_RESAMPLES:
        raise ValueError(
            f"{name}: at most {MAX_RESAMPLES:,} (obliq.eval.significance.MAX_RESAMPLES; the paper's interval "
            f"takes {BOOTSTRAP_RESAMPLES:,}), got {value:,}"
        )


def compare(
    per_query_a: dict[str, float],
    per_query_b: dict[str, float],
    measure: str = "NDCG@10",
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
    tie: float = TIE,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """Compare two systems' per-query values (query id → value) on the same queries.

    Args:
        per_query_a, per_query_b: per-query values of the baseline A and the system B.
        measure: the name of the measure (recorded).
        resamples: bootstrap draws of the interval.
        permutations: Monte Carlo sign patterns when the test cannot be exact.
        seed: seed of both.
        tie: per-query differences within this count as ties.
        confidence: level of the interval.

    Raises:
        ValueError: the two query sets differ, or are empty; ``resamples`` or ``permutations`` outside
            1 … :data:`MAX_RESAMPLES`.
    """
    check_resamples("resamples", resamples)
    check_resamples("permutations", permutations)
    if set(per_query_a) != set(per_query_b):
        only = sorted(set(per_query_a) ^ set(per_query_b))
        raise ValueError(f"the runs were evaluated on different queries ({len(only)} differ, e.g. {only[0]})")
    if not per_query_a:
        raise ValueError("no query to compare")
    qids = sorted(per_query_a)
    a = np.array([per_query_a[q] for q in qids], dtype=np.float64)
    b = np.array([per_query_b[q] for q in qids], dtype=np.float64)
    d = b - a
    diff, low, high = bootstrap_mean(d, resamples=resamples, seed=seed, confidence=confidence)
    if math.isnan(low):  # one query: no resampling spread
        low = high = diff
    flip = sign_flip_test(d, resamples=permutations, seed=seed)
    return Comparison(
        measure=measure,
        n_queries=len(qids),
        mean_a=float(a.mean()),
        mean_b=float(b.mean()),
        diff=diff,
        ci_low=low,
        ci_high=high,
        ci_degenerate=bool(high - low <= 1e-12),
        p_value=flip.p_value,
        p_method=flip.method,
        n_nonzero=flip.n_nonzero,
        patterns=flip.patterns,
        helped=int(np.sum(d > tie)),
        hurt=int(np.sum(d < -tie)),
        tied=int(np.sum(np.abs(d) <= tie)),
        zero_both=int(np.sum((a == 0) & (b == 0))),
        resamples=resamples,
        confidence=confidence,
        seed=seed,
    )
