"""The statistics path (obliq.eval.significance, as the audit assembles it) on tiny inputs computed by
hand, and against scipy's own implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from obliq.audit.stats import groups_summary, paired_summary
from obliq.eval.significance import (
    bootstrap_gap,
    bootstrap_mean,
    cluster_sums,
    mann_whitney_test,
    sign_flip_test,
    wilcoxon_test,
)


def mc_tolerance(p: float, resamples: int) -> float:
    """5 standard errors of a Monte Carlo p-value (plus the +1 correction)."""
    return 5 * math.sqrt(max(p * (1 - p), 1e-4) / resamples) + 2 / resamples


# --- paired: a gap of exactly 0 ----------------------------------------------------------------


@pytest.mark.parametrize("delta", [np.zeros(12), np.array([1.0, -1.0, 2.0, -2.0, 0.5, -0.5])])
def test_paired_zero_gap_gives_p_one_and_a_ci_containing_zero(delta):
    reference = np.linspace(0.1, 0.9, len(delta))
    out = paired_summary(reference, reference + delta, resamples=2000, permutations=5000)
    assert out["delta"] == pytest.approx(0.0, abs=1e-15)
    assert out["ci"][0] <= 0.0 <= out["ci"][1]
    assert out["wilcoxon"]["p_value"] == 1.0  # W+ = W- (or nothing to rank)
    assert out["sign_flip"]["p_value"] == 1.0  # every sign pattern is at least as extreme as 0
    assert out["mean_comparison"] - out["mean_reference"] == pytest.approx(out["delta"])


def test_all_zero_differences():
    assert wilcoxon_test(np.zeros(5)) == {
        "statistic": 0.0,
        "p_value": 1.0,
        "n_nonzero": 0,
        "zero_method": "wilcox",
        "alternative": "two-sided",
    }
    assert bootstrap_mean(np.zeros(5), resamples=500)[1:] == (0.0, 0.0)


# --- paired: a constant shift ------------------------------------------------------------------


def test_paired_constant_shift_gives_that_shift():
    reference = np.array([0.0, 0.1, 0.5, 1.0, 0.25, 0.2, 0.0, 1 / 3])
    out = paired_summary(reference, reference + 0.25, resamples=2000, permutations=50_000, seed=3)
    assert out["delta"] == pytest.approx(0.25)
    assert out["ci"] == pytest.approx([0.25, 0.25])  # every resample of a constant is that constant
    # Wilcoxon, 8 positive differences, exact null: P(W- = 0) = 2^-8 on each side.
    assert out["wilcoxon"]["p_value"] == pytest.approx(2 / 2**8)
    assert out["wilcoxon"]["n_nonzero"] == 8
    # Sign flip: 8 units, all 256 sign patterns enumerated; only all-plus and all-minus reach |T| = 8 · 0.25.
    assert out["sign_flip"]["p_value"] == 2 / 256 and out["sign_flip"]["method"] == "exact"
    assert out["sign_flip"]["p_floor"] == 2 / 256


def test_sign_flip_three_values_by_hand():
    # T = ±1 ±2 ±3: the 8 sign vectors give 6, 4, 2, 0, 0, -2, -4, -6; P(|T| ≥ 6) = 2/8, exactly.
    res = sign_flip_test([1.0, 2.0, 3.0], resamples=40_000, seed=1)
    assert res.p_value == 0.25 and res.method == "exact" and res.patterns == 8
    assert res.n_units == res.n_nonzero == 3


def test_sign_flip_monte_carlo_above_the_exact_limit_has_a_floor_and_a_seed():
    d = np.full(40, 0.1)  # exact p = 2^-39, far below the Monte Carlo floor
    a, b = sign_flip_test(d, resamples=999, seed=7), sign_flip_test(d, resamples=999, seed=7)
    assert a.p_value == b.p_value == a.p_floor == 1 / 1000 and a.method == "monte-carlo"
    assert "Monte Carlo sign-flip test, 999 random sign patterns, n = 40" in a.text()
    with pytest.raises(ValueError, match="resamples"):
        sign_flip_test(d, resamples=0)


# --- sign flip against scipy.stats.permutation_test -------------------------------------------


def scipy_paired_permutation(x, y, resamples, seed):
    return stats.permutation_test(
        (x, y),
        lambda a, b, axis: np.mean(a - b, axis=axis),
        vectorized=True,
        permutation_type="samples",
        n_resamples=resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    ).pvalue


@pytest.mark.parametrize("n, shift", [(10, 0.4), (10, 0.0), (14, 0.3), (30, 0.35), (30, 0.8)])
def test_sign_flip_matches_scipy_permutation_test(n, shift):
    rng = np.random.default_rng(n)
    y = rng.uniform(0, 1, n)
    x = y + shift + rng.normal(0, 1, n)
    ours = sign_flip_test(x - y, resamples=20_000, seed=0)
    if n <= 20:  # both enumerate all 2^n sign patterns: the same exact p
        expected = scipy_paired_permutation(x, y, np.inf, 0)
        assert ours.method == "exact" and ours.p_value == pytest.approx(expected, rel=1e-9)
    else:
        expected = scipy_paired_permutation(x, y, 20_000, 0)
        assert ours.p_value == pytest.approx(expected, abs=mc_tolerance(expected, 20_000) * 1.5)


def test_cluster_sign_flip_equals_pair_flip_on_cluster_sums():
    rng = np.random.default_rng(5)
    sums = rng.normal(0.3, 1, 12)
    d = np.repeat(sums / 3, 3)  # 12 clusters of 3 equal pairs
    clusters = np.repeat(np.arange(12), 3)
    ours = sign_flip_test(d, clusters, resamples=20_000, seed=0).p_value
    expected = scipy_paired_permutation(sums, np.zeros(12), np.inf, 0)  # exact: all 2^12 patterns
    assert ours == pytest.approx(expected, rel=1e-9)
    assert sign_flip_test(d, clusters, resamples=10).n_units == 12


# --- bootstrap -------------------------------------------------------------------------------


def test_bootstrap_singletons_is_scipy_bootstrap_draw_for_draw():
    x = np.random.default_rng(0).exponential(1, 57)
    mean, low, high = bootstrap_mean(x, resamples=3000, seed=11)
    ref = stats.bootstrap((x,), np.mean, n_resamples=3000, method="percentile", rng=np.random.default_rng(11))
    assert mean == pytest.approx(x.mean())
    assert (low, high) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), rel=1e-12)
    # explicit singleton labels give the same interval
    assert bootstrap_mean(x, clusters=[f"c{i}" for i in range(57)], resamples=3000, seed=11) == pytest.approx(
        (mean, low, high)
    )


def test_cluster_bootstrap_of_identical_copies_is_bootstrap_of_cluster_values():
    values = np.array([0.0, 0.2, 0.9, 0.4, 1.0, 0.1, 0.3])
    x = np.repeat(values, 4)  # 7 clusters of 4 identical observations
    clusters = np.repeat(list("abcdefg"), 4)
    ours = bootstrap_mean(x, clusters, resamples=4000, seed=2)
    ref = stats.bootstrap((values,), np.mean, n_resamples=4000, method="percentile", rng=np.random.default_rng(2))
    assert ours[1:] == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), rel=1e-12)
    # and it is wider than the naive bootstrap that treats the 28 copies as independent
    naive = bootstrap_mean(x, resamples=4000, seed=2)
    assert ours[2] - ours[1] > 1.5 * (naive[2] - naive[1])


def test_cluster_bootstrap_pools_observations_of_drawn_clusters():
    # two clusters: {0} and {1, 1, 1}. Draws: (a, a) → 0, (a, b) and (b, a) → 3/4, (b, b) → 1;
    # a 95% percentile interval over many draws is [0, 1].
    mean, low, high = bootstrap_mean([0.0, 1.0, 1.0, 1.0], ["a", "b", "b", "b"], resamples=4000, seed=0)
    assert (mean, low, high) == (0.75, 0.0, 1.0)
    sums, sizes = cluster_sums([0.0, 1.0, 1.0, 1.0], ["a", "b", "b", "b"])
    assert sums.tolist() == [0.0, 3.0] and sizes.tolist() == [1.0, 3.0]


def test_bootstrap_needs_two_clusters():
    mean, low, high = bootstrap_mean([0.5, 0.5], ["a", "a"])
    assert mean == 0.5 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_mean([0.5, math.nan])
    with pytest.raises(ValueError, match="cluster labels"):
        bootstrap_mean([0.5, 0.1], ["a"])


# --- unpaired groups -------------------------------------------------------------------------


def test_groups_zero_gap():
    a = np.array([0.0, 0.5, 1.0, 0.2, 0.1])
    out = groups_summary(a, a.copy(), resamples=3000)
    assert out["gap"] == 0.0
    assert out["ci"][0] <= 0.0 <= out["ci"][1]
    assert out["mann_whitney"]["p_value"] == 1.0


def test_groups_constant_shift_and_exact_mann_whitney():
    a = np.array([1.0, 2.0, 3.0])
    out = groups_summary(a, a + 3.0, resamples=3000)
    assert out["gap"] == pytest.approx(3.0)
    assert out["ci"][0] <= 3.0 <= out["ci"][1]
    # every comparison value beats every reference value: U = 3·3 = 9; of the C(6,3) = 20 equally
    # likely splits only the two most extreme reach it, so the exact two-sided p = 2/20.
    assert out["mann_whitney"]["statistic"] == 9.0
    assert out["mann_whitney"]["p_value"] == pytest.approx(0.1)
    assert mann_whitney_test(a + 3.0, a)["statistic"] == 0.0  # direction: comparison's U


def test_gap_bootstrap_resamples_groups_independently():
    rng = np.random.default_rng(4)
    a, b = rng.uniform(0, 1, 40), rng.uniform(0.2, 1.2, 55)
    gap, low, high = bootstrap_gap(a, b, resamples=3000, seed=9)
    ref = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(y, axis=axis) - np.mean(x, axis=axis),
        n_resamples=3000,
        method="percentile",
        rng=np.random.default_rng(9),
    )
    assert gap == pytest.approx(b.mean() - a.mean())
    assert (low, high) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), rel=1e-12)


def test_paired_inputs_must_align():
    with pytest.raises(ValueError, match="aligned"):
        paired_summary([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="no values"):
        wilcoxon_test([])
