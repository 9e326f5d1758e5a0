"""Statistics of the identity-signal audit: confidence intervals and tests, from scipy.

The identity-signals paper (§2.3, §3.3, its Tables 7–8 and 11–13, "appendix H") reports, for paired
query variants, the mean per-pair difference with a 95% (cluster-)bootstrap interval, a two-sided
paired Wilcoxon test and a sign-flip permutation test (B = 50,000, p floor 1/(B + 1)); for unpaired
groups, the difference of group means with a two-group percentile bootstrap and a two-sided
Mann–Whitney U test. The exact choices here (docs/audit.md has the full list):

- Intervals: ``scipy.stats.bootstrap`` with ``method="percentile"`` (as the paper's code; BCa is
  undefined when every value is equal, e.g. a gap of exactly 0). The cluster bootstrap (Field &
  Welsh, 2007) resamples *clusters* with replacement and takes the mean over all observations of
  the drawn clusters; scipy draws the cluster indices and the statistic here turns them into that
  mean (Σ drawn cluster sums / Σ drawn cluster sizes). With one observation per cluster it is the
  ordinary bootstrap of the mean, draw for draw.
- Paired test: ``scipy.stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided",
  method="auto")`` on the per-pair differences: zero differences are dropped (Wilcoxon 1945, the
  paper's code); with no non-zero difference the p-value is 1.
- Sign-flip permutation test: H0 says each unit's difference is symmetric about 0, so the signs of
  the unit sums are flipped at random (numpy, seeded); the statistic is the mean difference,
  two-sided, p = (1 + #{|T*| ≥ |T|}) / (B + 1) (Phipson & Smyth, 2010), so p ≥ 1/(B + 1), the floor
  reported with it. The unit is the cluster: with clusters given every pair of a cluster flips
  together (valid when pairs within a cluster are dependent); without, the unit is the pair, which
  is the paper's test. Checked against ``scipy.stats.permutation_test(permutation_type="samples")``
  in the tests.
- Unpaired test: ``scipy.stats.mannwhitneyu(comparison, reference, alternative="two-sided",
  method="auto", use_continuity=True)`` (ties → normal approximation with tie correction).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
PERMUTATIONS = 50_000
"""The paper's B for the sign-flip test (p floor 2·10⁻⁵)."""

_MAX_CELLS = 4_000_000  # entries of one resampling matrix (bounds memory at ~32 MB)


def _values(x, what: str) -> np.ndarray:
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
    return np.bincount(codes, weights=values, minlength=len(index)), np.bincount(codes, minlength=len(index)).astype(float)


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
    values = _values(values, "bootstrap_mean")
    sums, sizes = cluster_sums(values, clusters)
    mean = float(values.mean())
    if len(sums) < 2:
        return mean, float("nan"), float("nan")

    def statistic(i, axis=-1):
        return sums[i].sum(axis=axis) / sizes[i].sum(axis=axis)

    res = stats.bootstrap((np.arange(len(sums)),), statistic, n_resamples=resamples, method="percentile",
                          vectorized=True, batch=_batch(len(sums)), confidence_level=confidence,
                          rng=np.random.default_rng(seed))
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
    a, b = _values(reference, "reference group"), _values(comparison, "comparison group")
    sa, na = cluster_sums(a, clusters_reference)
    sb, nb = cluster_sums(b, clusters_comparison)
    gap = float(b.mean() - a.mean())
    if len(sa) < 2 or len(sb) < 2:
        return gap, float("nan"), float("nan")

    def statistic(ia, ib, axis=-1):
        return sb[ib].sum(axis=axis) / nb[ib].sum(axis=axis) - sa[ia].sum(axis=axis) / na[ia].sum(axis=axis)

    res = stats.bootstrap((np.arange(len(sa)), np.arange(len(sb))), statistic, n_resamples=resamples,
                          method="percentile", vectorized=True, batch=_batch(len(sa) + len(sb)),
                          confidence_level=confidence, rng=np.random.default_rng(seed))
    return gap, float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class SignFlip:
    """Result of :func:`sign_flip_test`."""

    p_value: float
    """Two-sided, (1 + count) / (B + 1)."""
    p_floor: float
    """1 / (B + 1): the smallest p-value B resamples can give."""
    resamples: int
    seed: int
    n_units: int
    """Units whose signs are flipped: clusters (pairs when no clusters are given)."""


def sign_flip_test(differences, clusters=None, resamples: int = PERMUTATIONS, seed: int = 0) -> SignFlip:
    """Two-sided sign-flip permutation test of mean(differences) = 0 (the paper's appendix H).

    Each resample multiplies every unit's sum of differences by an independent random sign (±1 with
    probability ½); the statistic is their total (the mean difference times n, an equivalent
    statistic). A resample counts as extreme when |T*| ≥ |T| − 1e-10·Σ|unit sums| (the tolerance
    absorbs summation-order rounding, as scipy's permutation_test does).

    Args:
        differences: (n,) per-pair differences, comparison − reference.
        clusters: (n,) cluster labels; pairs of one cluster flip together. None: each pair alone.
        resamples: B, random sign vectors (not an exact enumeration, even for tiny n).
        seed: numpy seed.

    Returns:
        :class:`SignFlip` (p-value, floor 1/(B + 1), B, seed, units).

    Raises:
        ValueError: empty or non-finite differences, or fewer than 1 resample.
    """
    d = _values(differences, "sign_flip_test")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    sums, _ = cluster_sums(d, clusters)
    observed = abs(sums.sum())
    tolerance = 1e-10 * np.abs(sums).sum()
    rng = np.random.default_rng(seed)
    extreme, step = 0, _batch(len(sums))
    for start in range(0, resamples, step):
        n = min(step, resamples - start)
        signs = rng.integers(0, 2, size=(n, len(sums)), dtype=np.int8).astype(np.float64) * 2 - 1
        extreme += int(np.count_nonzero(np.abs(signs @ sums) >= observed - tolerance))
    return SignFlip((1 + extreme) / (1 + resamples), 1 / (1 + resamples), resamples, seed, len(sums))


def wilcoxon_test(differences) -> dict:
    """Two-sided paired Wilcoxon signed-rank test on per-pair differences (scipy.stats.wilcoxon).

    ``zero_method="wilcox"`` drops zero differences (pairs that score the same, frequent for RR@10);
    ``method="auto"``: exact null distribution for ≤ 50 non-zero differences without ties, the normal
    approximation otherwise. With no non-zero difference the test has nothing to rank: p = 1.

    Returns:
        ``{"statistic", "p_value", "n_nonzero", "zero_method", "alternative"}``.

    Raises:
        ValueError: empty or non-finite differences.
    """
    d = _values(differences, "wilcoxon_test")
    out = {"n_nonzero": int(np.count_nonzero(d)), "zero_method": "wilcox", "alternative": "two-sided"}
    if out["n_nonzero"] == 0:
        return {"statistic": 0.0, "p_value": 1.0, **out}
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided", method="auto")
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
    a, b = _values(reference, "reference group"), _values(comparison, "comparison group")
    res = stats.mannwhitneyu(b, a, alternative="two-sided", method="auto", use_continuity=True)
    return {"statistic": float(res.statistic), "p_value": float(res.pvalue), "alternative": "two-sided",
            "method": "auto"}


def paired_summary(
    reference,
    comparison,
    clusters=None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict:
    """Everything the paper reports for paired variants (its Tables 7, 11, 13), on aligned values.

    Args:
        reference: (n,) per-pair values of the reference variant (e.g. RR@10 of the AAL question).
        comparison: (n,) values of the other variant, aligned (e.g. RR@10 of its WME translation).
        clusters: (n,) cluster labels of the pairs, or None (each pair its own cluster).
        resamples: bootstrap draws; permutations: sign-flip resamples; seed; confidence.

    Returns:
        ``n_pairs``, ``n_clusters``, ``mean_reference`` / ``mean_comparison`` with their intervals,
        ``delta`` (mean of comparison − reference) with its interval, ``wilcoxon`` and ``sign_flip``.

    Raises:
        ValueError: arrays of different lengths, empty, or non-finite.
    """
    r, c = _values(reference, "reference"), _values(comparison, "comparison")
    if r.shape != c.shape:
        raise ValueError(f"reference and comparison must be aligned, got {r.shape} and {c.shape}")
    d = c - r
    kw = dict(clusters=clusters, resamples=resamples, seed=seed, confidence=confidence)
    mr, mc, md = bootstrap_mean(r, **kw), bootstrap_mean(c, **kw), bootstrap_mean(d, **kw)
    flip = sign_flip_test(d, clusters, permutations, seed)
    return {
        "n_pairs": len(d),
        "n_clusters": flip.n_units,
        "mean_reference": mr[0], "ci_reference": [mr[1], mr[2]],
        "mean_comparison": mc[0], "ci_comparison": [mc[1], mc[2]],
        "delta": md[0], "ci": [md[1], md[2]],
        "wilcoxon": wilcoxon_test(d),
        "sign_flip": asdict(flip),
    }


def groups_summary(
    reference,
    comparison,
    clusters_reference=None,
    clusters_comparison=None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict:
    """Everything the paper reports for unpaired groups (its Tables 8 and 12).

    Args:
        reference / comparison: per-query values of the two groups (e.g. RR@10 of AAL and of WME
            questions); lengths may differ.
        clusters_reference / clusters_comparison: cluster labels per query, or None.
        resamples, seed, confidence: as in :func:`bootstrap_mean`.

    Returns:
        ``n_reference``, ``n_comparison``, each group's mean with its interval, ``gap``
        (mean comparison − mean reference) with its two-group interval, ``mann_whitney``.

    Raises:
        ValueError: an empty group or non-finite values.
    """
    a, b = _values(reference, "reference group"), _values(comparison, "comparison group")
    ma = bootstrap_mean(a, clusters_reference, resamples, seed, confidence)
    mb = bootstrap_mean(b, clusters_comparison, resamples, seed, confidence)
    gap = bootstrap_gap(a, b, clusters_reference, clusters_comparison, resamples, seed, confidence)
    return {
        "n_reference": len(a), "n_comparison": len(b),
        "mean_reference": ma[0], "ci_reference": [ma[1], ma[2]],
        "mean_comparison": mb[0], "ci_comparison": [mb[1], mb[2]],
        "gap": gap[0], "ci": [gap[1], gap[2]],
        "mann_whitney": mann_whitney_test(a, b),
    }
