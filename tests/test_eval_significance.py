"""Paired bootstrap and helped/hurt/tied counts (the OBLIQ-IR paper §5, Table 7)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from obliq.cli import main as obliq_main
from obliq.eval.significance import compare, paired_bootstrap


def test_identical_runs_give_zero_difference_and_p_one():
    a = np.random.default_rng(0).uniform(size=200)
    diff, low, high, p = paired_bootstrap(a, a.copy())
    assert (diff, low, high, p) == (0.0, 0.0, 0.0, 1.0)


def test_constant_shift_gives_the_shift():
    a = np.random.default_rng(1).uniform(0, 0.5, size=300)
    diff, low, high, p = paired_bootstrap(a, a + 0.1, resamples=2000)
    assert diff == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)
    assert p == pytest.approx(1 / 2001)  # no resample as extreme under the null: the floor


def test_interval_and_p_value_agree_with_independent_references():
    rng = np.random.default_rng(2)
    a = rng.uniform(size=400)
    b = np.clip(a + rng.normal(0.03, 0.2, size=400), 0, 1)
    diff, low, high, p = paired_bootstrap(a, b, resamples=10_000, seed=3)
    assert diff == pytest.approx(float(np.mean(b - a)))
    ref = stats.bootstrap((b - a,), np.mean, n_resamples=10_000, method="percentile", random_state=4)
    assert low == pytest.approx(ref.confidence_interval.low, abs=0.004)
    assert high == pytest.approx(ref.confidence_interval.high, abs=0.004)
    assert p == pytest.approx(stats.ttest_rel(b, a).pvalue, abs=0.02)  # large n: bootstrap ≈ t-test
    assert paired_bootstrap(a, b, resamples=10_000, seed=3) == (diff, low, high, p)  # seeded


def test_helped_hurt_tied_zero_counts_by_hand():
    a = {"q1": 0.5, "q2": 0.5, "q3": 0.0, "q4": 0.2, "q5": 0.3}
    b = {"q1": 0.6, "q2": 0.4, "q3": 0.0, "q4": 0.2005, "q5": 0.3}
    c = compare(a, b, resamples=500)
    assert (c.helped, c.hurt, c.tied, c.zero_both) == (1, 1, 3, 1)
    assert c.n_queries == 5 and c.diff == pytest.approx(0.0001)
    with pytest.raises(ValueError, match="different queries"):
        compare(a, {"q1": 0.1})
    with pytest.raises(ValueError, match="no query"):
        paired_bootstrap([], [])


def test_obliq_compare_command(tmp_path, capsys):
    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td3\t1\nq4\td9\t0\n")
    (tmp_path / "a.trec").write_text("q1 Q0 d1 1 2 a\nq2 Q0 x 1 2 a\nq2 Q0 d2 2 1 a\n")  # q3 missing: 0
    (tmp_path / "b.trec").write_text("q1 Q0 d1 1 2 b\nq2 Q0 d2 1 2 b\nq3 Q0 d3 1 1 b\n")
    obliq_main(["compare", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"), "--qrels", str(tmp_path / "q.tsv"),
                "--resamples", "1000"])
    out = json.loads(capsys.readouterr().out)
    a_q2 = 1 / np.log2(3)
    assert out["n_queries"] == 3  # q4 has no relevant document
    assert out["mean_a"] == pytest.approx((1 + a_q2 + 0) / 3) and out["mean_b"] == pytest.approx(1.0)
    assert out["diff"] == pytest.approx((0 + (1 - a_q2) + 1) / 3)
    assert (out["helped"], out["hurt"], out["tied"], out["zero_both"]) == (2, 0, 1, 0)
    assert out["measure"] == "NDCG@10" and out["resamples"] == 1000
