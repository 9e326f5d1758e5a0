"""Paired comparisons: the sign-flip p (exact for a handful of queries, C20), the paired bootstrap
interval and helped/hurt/tied counts (the OBLIQ-IR paper §5, Table 7), against scipy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from support import cli_fails

from obliq.cli import main as obliq_main
from obliq.commands.compare import compare_files
from obliq.eval.significance import compare, sign_flip_test


def test_identical_runs_give_zero_difference_and_p_one():
    a = np.random.default_rng(0).uniform(size=200)
    c = compare(dict(enumerate(a)), dict(enumerate(a.copy())))
    assert (c.diff, c.ci_low, c.ci_high, c.p_value, c.p_method) == (0.0, 0.0, 0.0, 1.0, "untestable")
    assert c.p_text() == "p = 1 (cannot be tested: no non-zero difference, n = 0)"


def test_constant_shift_gives_the_shift_and_an_honest_p():
    """300 queries all 0.1 better: the interval has no spread (degenerate, said so) and the sign-flip
    p is the Monte Carlo floor — the smallest value the test can show, stated as such."""
    a = np.random.default_rng(1).uniform(0, 0.5, size=300)
    c = compare(dict(enumerate(a)), dict(enumerate(a + 0.1)), resamples=2000, permutations=1999)
    assert c.diff == pytest.approx(0.1) and c.ci_low == pytest.approx(0.1) and c.ci_high == pytest.approx(0.1)
    assert c.ci_degenerate and "degenerate" in c.text()
    assert c.p_value == 1 / 2000 and c.p_method == "monte-carlo" and c.n_nonzero == 300


def test_interval_and_p_value_agree_with_independent_references():
    rng = np.random.default_rng(2)
    a = rng.uniform(size=400)
    b = np.clip(a + rng.normal(0.03, 0.2, size=400), 0, 1)
    c = compare(dict(enumerate(a)), dict(enumerate(b)), resamples=10_000, permutations=20_000, seed=3)
    assert c.diff == pytest.approx(float(np.mean(b - a)))
    ref = stats.bootstrap((b - a,), np.mean, n_resamples=10_000, method="percentile", random_state=4)
    assert c.ci_low == pytest.approx(ref.confidence_interval.low, abs=0.004)
    assert c.ci_high == pytest.approx(ref.confidence_interval.high, abs=0.004)
    assert c.p_value == pytest.approx(stats.ttest_rel(b, a).pvalue, abs=0.02)  # large n: sign-flip ≈ t-test
    again = compare(dict(enumerate(a)), dict(enumerate(b)), resamples=10_000, permutations=20_000, seed=3)
    assert again == c  # seeded


# --- C20: significance from a handful of queries ----------------------------------------------


def _c20_files(tmp_path, n):
    """qrels q1..qn each judge d1 relevant; run A ranks d2 then d1, run B ranks d1 then d2."""
    (tmp_path / "q.tsv").write_text("".join(f"q{i}\t0\td1\t1\n" for i in range(1, n + 1)))
    for name, order in (("a", ("d2", "d1")), ("b", ("d1", "d2"))):
        (tmp_path / f"{name}.trec").write_text(
            "".join(f"q{i} Q0 {d} {r} {3 - r} {name}\n" for i in range(1, n + 1) for r, d in enumerate(order, 1))
        )
    return [str(tmp_path / f) for f in ("a.trec", "b.trec")], str(tmp_path / "q.tsv")


@pytest.mark.parametrize("n, expected", [(1, 1.0), (3, 0.25), (5, 0.0625)])
def test_c20_a_handful_of_queries_gives_the_exact_sign_flip_p(tmp_path, capsys, n, expected):
    runs, qrels = _c20_files(tmp_path, n)
    obliq_main(["compare", *runs, "--qrels", qrels, "--whole_ranking"])  # C20's runs rank two documents
    out = json.loads(capsys.readouterr().out)
    assert out["mean_a"] == pytest.approx(0.630930, abs=1e-6) and out["mean_b"] == 1.0
    assert out["diff"] == pytest.approx(0.369070, abs=1e-6)
    assert out["p_value"] == expected and out["p_method"] == "exact" and out["n_nonzero"] == n
    assert f"exact sign-flip test, {2**n} sign patterns, n = {n}" in out["p_text"]
    assert out["ci_degenerate"] is True  # every difference equal: the interval shows no spread
    # the independent references: scipy's exact permutation test (n ≥ 2; at n = 1 the two sign
    # patterns are both as extreme, p = 1 by hand), and Wilcoxon at n = 3
    d = np.full(n, 0.369070)
    if n > 1:
        ref = stats.permutation_test(
            (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
        ).pvalue
        assert out["p_value"] == pytest.approx(ref)
    if n == 3:
        assert stats.wilcoxon(d, alternative="two-sided", method="exact").pvalue == pytest.approx(expected)


def test_c20_a_zero_difference_carries_no_sign():
    res = sign_flip_test([0.2, 0.1, 0.3, 0.05, 0.0])
    assert (res.p_value, res.method, res.n_nonzero, res.patterns) == (0.125, "exact", 4, 16)
    ref = stats.permutation_test(
        (np.array([0.2, 0.1, 0.3, 0.05, 0.0]),),
        np.mean,
        permutation_type="samples",
        n_resamples=np.inf,
        alternative="two-sided",
    ).pvalue
    assert res.p_value == pytest.approx(ref)  # zeros double every count alike: the same p


def test_the_exact_limit_is_where_enumeration_stops_and_both_sides_agree():
    """20 non-zero differences are enumerated (2^20 patterns); 21 go to Monte Carlo, whose p then
    agrees with the exact value within its error."""
    rng = np.random.default_rng(5)
    d20 = rng.normal(0.1, 1.0, 20)
    exact = sign_flip_test(d20)
    assert exact.method == "exact" and exact.patterns == 2**20
    mc = sign_flip_test(d20, exact_max=19, resamples=50_000)
    assert mc.method == "monte-carlo" and abs(mc.p_value - exact.p_value) < 5 * np.sqrt(0.25 / 50_000) + 1e-4


def test_helped_hurt_tied_zero_counts_by_hand():
    a = {"q1": 0.5, "q2": 0.5, "q3": 0.0, "q4": 0.2, "q5": 0.3}
    b = {"q1": 0.6, "q2": 0.4, "q3": 0.0, "q4": 0.2005, "q5": 0.3}
    c = compare(a, b, resamples=500)
    assert (c.helped, c.hurt, c.tied, c.zero_both) == (1, 1, 3, 1)
    assert c.n_queries == 5 and c.diff == pytest.approx(0.0001)
    with pytest.raises(ValueError, match="different queries"):
        compare(a, {"q1": 0.1})
    with pytest.raises(ValueError, match="no query"):
        compare({}, {})


def test_obliq_compare_command(tmp_path, capsys):
    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td3\t1\nq4\td9\t0\n")
    (tmp_path / "a.trec").write_text("q1 Q0 d1 1 2 a\nq2 Q0 x 1 2 a\nq2 Q0 d2 2 1 a\n")  # q3 missing: 0
    (tmp_path / "b.trec").write_text("q1 Q0 d1 1 2 b\nq2 Q0 d2 1 2 b\nq3 Q0 d3 1 1 b\n")
    obliq_main(
        [
            "compare",
            str(tmp_path / "a.trec"),
            str(tmp_path / "b.trec"),
            "--qrels",
            str(tmp_path / "q.tsv"),
            "--resamples",
            "1000",
            "--missing",
            "zero",  # q3, missing from a.trec, scores 0 (trec_eval -c)
            "--whole_ranking",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert out["missing_from_a"] == ["q3"] and out["missing_from_b"] == [] and out["queries_compared"] == 3
    a_q2 = 1 / np.log2(3)
    assert out["n_queries"] == 3  # q4 has no relevant document
    assert out["mean_a"] == pytest.approx((1 + a_q2 + 0) / 3) and out["mean_b"] == pytest.approx(1.0)
    assert out["diff"] == pytest.approx((0 + (1 - a_q2) + 1) / 3)
    assert (out["helped"], out["hurt"], out["tied"], out["zero_both"]) == (2, 0, 1, 0)
    assert out["measure"] == "NDCG@10" and out["resamples"] == 1000


def test_compare_reads_obliq_output_folders(tmp_path, capsys):
    """Issue 53 §3: `obliq compare` on two `obliq evaluate --output` folders reads their runs (``<task>/run.trec``)
    as it reads the files, and names the tasks when a folder holds several and none is chosen."""
    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    runs = {"a": "q1 Q0 d1 1 2 a\nq2 Q0 x 1 2 a\nq2 Q0 d2 2 1 a\n", "b": "q1 Q0 d1 1 2 b\nq2 Q0 d2 1 2 b\n"}
    for name, text in runs.items():
        (tmp_path / f"{name}.trec").write_text(text)
        (tmp_path / name / "task-x").mkdir(parents=True)
        (tmp_path / name / "task-x" / "run.trec").write_text(text)
    common = ["--qrels", str(tmp_path / "q.tsv"), "--resamples", "500", "--whole_ranking"]
    results = []
    for a, b in (("a.trec", "b.trec"), ("a", "b")):
        obliq_main(["compare", str(tmp_path / a), str(tmp_path / b), *common])
        results.append(json.loads(capsys.readouterr().out))
    assert results[0] == results[1] and results[0]["diff"] > 0
    (tmp_path / "a" / "task-y").mkdir()
    (tmp_path / "a" / "task-y" / "run.trec").write_text(runs["a"])
    cli_fails(["compare", str(tmp_path / "a"), str(tmp_path / "b"), *common], capsys, "several tasks", "task-x")
    obliq_main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), *common, "--task", "task-x"])
    assert json.loads(capsys.readouterr().out) == results[0]
    for task in ("task-z", "task-y"):  # a task a folder does not hold is named, never replaced by its only one
        argv = ["compare", str(tmp_path / "a"), str(tmp_path / "b"), *common, "--task", task]
        cli_fails(argv, capsys, "without task", repr(task), "task-x")


def test_compare_refuses_runs_that_miss_judged_queries_unless_told_what_to_do(tmp_path, capsys):
    """Issue 24: a run that misses most queries is not "significantly worse"; the comparison says which
    queries it compares."""

    runs, qrels = _c20_files(tmp_path, 12)
    full = tmp_path / runs[0]
    lines = full.read_text().splitlines()
    kept = [line for line in lines if line.split()[0] in {line.split()[0] for line in lines[:2]}]
    sparse = tmp_path / "sparse.trec"
    sparse.write_text("\n".join(kept) + "\n")
    with pytest.raises(ValueError, match=r"has no result for \d+ of the 12 judged queries"):
        compare_files(full, sparse, tmp_path / qrels, whole_ranking=True)
    dropped = compare_files(full, sparse, tmp_path / qrels, missing="drop", whole_ranking=True)
    held = {line.split()[0] for line in kept}
    assert dropped["queries_compared"] == dropped["n_queries"] == len(held) < 12
    assert len(dropped["missing_from_b"]) == 12 - len(held)
    with pytest.raises(SystemExit):
        obliq_main(["compare", str(full), str(sparse), "--qrels", str(tmp_path / qrels), "--whole_ranking"])
    assert "--missing zero" in capsys.readouterr().err


def test_compare_refuses_an_empty_run_or_one_of_another_task(tmp_path):
    """An empty baseline scores 0 everywhere and would make any run look a significant win."""
    runs, qrels = _c20_files(tmp_path, 3)
    (tmp_path / "empty.trec").write_text("")
    (tmp_path / "other.trec").write_text("x1 Q0 d1 1 1.0 t\n")
    for bad, message in (("empty.trec", "the run is empty"), ("other.trec", "none of its 1 queries is in")):
        with pytest.raises(SystemExit) as stop:  # one line on stderr, exit 2
            obliq_main(["compare", str(tmp_path / bad), runs[1], "--qrels", qrels])
        assert stop.value.code == 2
        with pytest.raises(ValueError, match=message):
            compare_files(runs[0], tmp_path / bad, qrels)
