"""obliq's metrics and significance against independent references on generated runs (issue 53 §1).

Metrics (:mod:`obliq.eval.metrics`) against trec_eval itself (pytrec_eval, called directly, and its file
parsers for ``obliq metrics``) and against the measures written out here from their definitions.
obliq's documented tie rule is trec_eval's (score descending, then document id descending, by code
point: docs/decisions.md "Ties and the cut"), so both references apply it as they are; its query policy
(a query without a relevant document is excluded, a judged query without a result scores 0: trec_eval
``-c``) is applied to the references' output. Generated: tied scores, graded qrels, retrieved documents
absent from the qrels, relevant documents never retrieved, shallow and deep runs, empty runs, queries
without a relevant document, run queries without judgements, ids that sort differently as numbers.

Significance (:mod:`obliq.eval.significance`) against scipy where scipy computes the same thing
(``permutation_test`` for the sign-flip test, ``bootstrap`` for the intervals) and against exact
counts written from the definitions (the sign-flip null by subset sums, Wilcoxon's and Mann–Whitney's
null distributions by enumeration, their normal approximations with tie corrections).
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from obliq.commands.compare import compare_files
from obliq.commands.metrics import score_files
from obliq.eval.metrics import evaluate_run
from obliq.eval.significance import (
    bootstrap_gap,
    bootstrap_mean,
    compare,
    mann_whitney_test,
    sign_flip_test,
    wilcoxon_test,
)

MEASURES = ["NDCG@1", "NDCG@3", "NDCG@10", "nDCG", "Recall@1", "Recall@5", "Recall@100", "P@5", "RR", "RR@3", "AP"]
TREC = {  # pytrec_eval's name of each measure
    "NDCG@1": "ndcg_cut_1",
    "NDCG@3": "ndcg_cut_3",
    "NDCG@10": "ndcg_cut_10",
    "nDCG": "ndcg",
    "Recall@1": "recall_1",
    "Recall@5": "recall_5",
    "Recall@100": "recall_100",
    "P@5": "P_5",
    "RR": "recip_rank",
    "AP": "map",
}
IDS = ["d1", "d2", "d10", "d9", "10", "9", "D1", "a", "ab", "b", "doc-ä", "doc-z", "x_1", "x-1"]
SCORES = [3.0, 2.0, 1.0, 0.5, 0.5, 0.25, 0.0, -1.0]  # few values: ties


def generated(seed: int):
    """Seeded qrels and a run: ``(qrels, run)`` (query → doc → grade / score; grade −1: judged junk,
    non-relevant, no gain)."""
    rng = random.Random(seed)
    pool = IDS + [f"u{rng.randint(0, 40)}" for _ in range(60)]
    qrels, run = {}, {}
    for q in range(rng.randint(1, 12)):
        qid = f"q{q}"
        kind = rng.random()
        if kind > 0.1:  # else: a run query without judgements
            judged = rng.sample(pool, rng.randint(1, 8))
            grades = [-1, 0, 0, 1, 1, 2, 3] if kind > 0.25 else [0, -1]  # some: nothing relevant
            qrels[qid] = {d: rng.choice(grades) for d in judged}
        depth = rng.choice([0, 1, 2, 3, 5, 10, 30, 70])
        if rng.random() < 0.1:
            continue  # a judged query the run lacks
        docs = rng.sample(pool, min(depth, len(set(pool)) - 1)) if depth else []
        continuous = rng.random() < 0.3
        run[qid] = {d: (rng.uniform(-5, 5) if continuous else rng.choice(SCORES)) for d in dict.fromkeys(docs)}
    return qrels, run


def reference(qrels: dict, ranking: dict) -> dict[str, float]:
    """Each measure of one query from its definition (trec_eval's conventions): documents ranked by
    score, descending, then by id, descending; grade ≥ 1 relevant; gain = grade, discount log2(rank + 1),
    ideal DCG from every judged document."""
    order = sorted(ranking, key=lambda d: (ranking[d], d), reverse=True)
    grade = [qrels.get(d, 0) for d in order]
    n_rel = sum(g >= 1 for g in qrels.values())
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)

    def dcg(gains, k):
        return sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]) if g > 0)

    first = next((i + 1 for i, g in enumerate(grade) if g >= 1), None)
    hits = np.cumsum([g >= 1 for g in grade])
    out = {f"NDCG@{k}": dcg(grade, k) / dcg(ideal, k) for k in (1, 3, 10)}
    out["nDCG"] = dcg(grade, len(grade)) / dcg(ideal, len(ideal))
    out.update({f"Recall@{k}": sum(g >= 1 for g in grade[:k]) / n_rel for k in (1, 5, 100)})
    out["P@5"] = sum(g >= 1 for g in grade[:5]) / 5
    out["RR"] = 1 / first if first else 0.0
    out["RR@3"] = 1 / first if first and first <= 3 else 0.0
    out["AP"] = sum(hits[i] / (i + 1) for i, g in enumerate(grade) if g >= 1) / n_rel
    return out


def test_generated_runs_match_trec_eval_and_the_definitions():
    import pytrec_eval

    evaluator_measures = {"ndcg_cut.1,3,10", "ndcg", "recall.1,5,100", "P.5", "recip_rank", "map"}
    checked = excluded = 0
    for seed in range(150):
        qrels, run = generated(seed)
        ev = evaluate_run(qrels, run, MEASURES)
        relevant = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
        assert sorted(ev.per_query) == sorted(relevant), seed
        assert (ev.n_queries, ev.n_excluded) == (len(relevant), len(qrels) - len(relevant))
        # trec_eval on the queries obliq scores (pytrec_eval-terrier 0.5.11 can hang in ndcg, from its second
        # evaluator on, when a query's only judgements are negative; such a query is excluded anyway)
        trec = pytrec_eval.RelevanceEvaluator({q: qrels[q] for q in relevant}, evaluator_measures).evaluate(run)
        for q in relevant:
            want = reference(qrels[q], run.get(q, {}))
            for name in MEASURES:
                te = trec[q][TREC[name]] if q in trec and name in TREC else None
                got = ev.per_query[q][name]
                if not run.get(q):
                    assert got == 0.0, (seed, q, name)  # trec_eval -c
                    continue
                assert got == pytest.approx(want[name], abs=1e-9), (seed, q, name, run[q], qrels[q])
                if te is not None:
                    assert got == pytest.approx(te, abs=1e-9), (seed, q, name)
            checked += 1
        excluded += ev.n_excluded
        for name in MEASURES:
            want = np.mean([ev.per_query[q][name] for q in relevant]) if relevant else math.nan
            assert ev.aggregate[name] == pytest.approx(want, nan_ok=True)
    assert checked > 400 and excluded > 20  # the classes are reached


def test_obliq_metrics_files_match_trec_eval_reading_the_same_files(tmp_path):
    """``obliq metrics`` (score_files) on TREC files written in shuffled line order with meaningless rank
    columns, against pytrec_eval's own file parsers and evaluator."""
    import pytrec_eval

    measures = ["NDCG@10", "NDCG@3", "Recall@5", "Recall@100", "P@5", "RR", "AP"]
    checked = 0
    for seed in range(40):
        qrels, run = generated(1000 + seed)
        if not any(g > 0 for j in qrels.values() for g in j.values()) or not {q for q in run if run[q]} & qrels.keys():
            continue  # nothing to score: obliq refuses such a pair of files (tests/test_eval_metrics.py)
        rng = random.Random(seed)
        lines = [f"{q} Q0 {d} {rng.randint(1, 9)} {s!r} sys\n" for q, docs in run.items() for d, s in docs.items()]
        rng.shuffle(lines)
        (tmp_path / "run.trec").write_text("".join(lines))
        (tmp_path / "qrels.txt").write_text("".join(f"{q} 0 {d} {g}\n" for q, j in qrels.items() for d, g in j.items()))
        got = score_files(tmp_path / "qrels.txt", tmp_path / "run.trec", ",".join(measures), True, True)
        with open(tmp_path / "qrels.txt") as f:
            ref_qrels = pytrec_eval.parse_qrel(f)
        with open(tmp_path / "run.trec") as f:
            ref_run = pytrec_eval.parse_run(f)
        relevant = [q for q in ref_qrels if any(g > 0 for g in ref_qrels[q].values())]
        asked = {"ndcg_cut.3,10", "recall.5,100", "P.5", "recip_rank", "map"}
        trec = pytrec_eval.RelevanceEvaluator({q: ref_qrels[q] for q in relevant}, asked).evaluate(ref_run)
        assert sorted(got["per_query"]) == sorted(relevant)
        for q in relevant:
            for name in measures:
                want = trec[q][TREC[name]] if q in trec else 0.0
                assert got["per_query"][q][name] == pytest.approx(want, abs=1e-9), (seed, q, name)
            checked += q in trec
    assert checked > 100


# --- significance ---------------------------------------------------------------------------------


def _flip_p_exact(d) -> float:
    """Two-sided sign-flip p from the definition, in exact rational arithmetic: the share of the 2^n
    sign patterns whose |sum| reaches the observed |sum| (zeros flip to themselves)."""
    x = [Fraction(v) for v in d]
    observed = abs(sum(x))
    hits = sum(
        abs(sum(s * v for s, v in zip(signs, x))) >= observed for signs in itertools.product((1, -1), repeat=len(x))
    )
    return hits / 2 ** len(x)


def _flip_p_by_counts(k: list[int]) -> float:
    """The same for integer differences, counted by subset sums (fast for many units): a pattern's sum
    is T − 2·(sum of the flipped positive-signed values)."""
    total, counts = sum(k), {0: 1}
    for v in k:
        nxt = dict(counts)
        for s, c in counts.items():
            nxt[s + v] = nxt.get(s + v, 0) + c
        counts = nxt
    return sum(c for s, c in counts.items() if abs(total - 2 * s) >= abs(total)) / 2 ** len(k)


def _values(rng: random.Random, n: int) -> np.ndarray:
    """Per-query differences as obliq meets them: many zeros, many repeated values (NDCG of a few ranks,
    1/rank), some continuous."""
    pool = [0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 1 / 3, -1 / 3, 0.6309297535714575, -0.6309297535714575, 0.25, 0.1]
    return np.array([rng.choice(pool) if rng.random() < 0.8 else rng.uniform(-1, 1) for _ in range(n)])


def test_sign_flip_exact_p_matches_scipy_and_exact_arithmetic():
    rng = random.Random(3)
    for case in range(120):
        d = _values(rng, rng.randint(1, 11))
        got = sign_flip_test(d)
        want = _flip_p_exact(d)
        assert got.p_value == pytest.approx(want, abs=1e-12), (case, d.tolist())
        assert got.n_nonzero == int(np.count_nonzero(d))
        if np.count_nonzero(d) and len(d) > 1:  # scipy needs two values
            ref = stats.permutation_test(
                (d,), np.sum, permutation_type="samples", n_resamples=np.inf, alternative="two-sided", vectorized=True
            )
            assert got.p_value == pytest.approx(min(1.0, ref.pvalue), abs=1e-12), (case, d.tolist())
            assert got.method == "exact"
        elif not np.count_nonzero(d):
            assert (got.p_value, got.method) == (1.0, "untestable")


def test_sign_flip_clusters_flip_together():
    rng = random.Random(4)
    for case in range(40):
        n = rng.randint(2, 24)
        d = _values(rng, n)
        labels = [f"c{rng.randint(0, 9)}" for _ in range(n)]
        sums: dict[str, Fraction] = {}
        for v, c in zip(d, labels):
            sums[c] = sums.get(c, Fraction(0)) + Fraction(v)
        want = _flip_p_exact(list(sums.values()))  # exact sums of the float values
        got = sign_flip_test(d, clusters=labels)
        assert got.n_units == len(sums) and got.p_value == pytest.approx(want, abs=1e-12), (case, d.tolist(), labels)


def test_sign_flip_monte_carlo_is_within_its_error_of_the_exact_p():
    """Above the exact limit (20 non-zero units) the p is Monte Carlo: (1 + count) / (1 + B), within a
    binomial error of the exact share, counted here by subset sums over integer differences."""
    rng = random.Random(5)
    resamples = 20_000
    for case in range(12):
        k = [rng.choice([1, -1, 2, -2, 3, 5, -4]) + (case % 3) for _ in range(rng.randint(21, 40))]
        k = [v for v in k if v] + [1] * 21  # at least 21 non-zero units
        k = k[: rng.randint(21, len(k))]
        want = _flip_p_by_counts(k)
        got = sign_flip_test(np.array(k, dtype=float) / 8, resamples=resamples, seed=case)
        assert got.method == "monte-carlo" and got.patterns == resamples
        spread = 5 * math.sqrt(want * (1 - want) / resamples) + 2 / resamples
        assert abs(got.p_value - want) <= spread, (case, k, got.p_value, want)


def test_bootstrap_intervals_match_scipy_resampling_the_values():
    """The percentile intervals obliq draws over indices (cluster sums / sizes) equal scipy's bootstrap of
    the values themselves (the same seed and batches draw the same resamples): one group, clusters
    (paired samples of sums and sizes) and two independent groups."""
    rng = random.Random(6)
    for case in range(15):
        n = rng.randint(2, 60)
        d = _values(rng, n)
        seed, resamples = case, rng.choice([200, 999, 5000])
        batch = max(1, 4_000_000 // n)
        got = bootstrap_mean(d, resamples=resamples, seed=seed)
        ref = stats.bootstrap(
            (d,), np.mean, n_resamples=resamples, method="percentile", batch=batch, rng=np.random.default_rng(seed)
        )
        assert got[0] == pytest.approx(d.mean())
        assert got[1:] == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), abs=1e-12), case

        labels = [rng.randint(0, max(1, n // 3)) for _ in range(n)]
        keys = list(dict.fromkeys(labels))
        sums = np.array([sum(v for v, c in zip(d, labels) if c == k) for k in keys])
        sizes = np.array([labels.count(k) for k in keys], dtype=float)
        got = bootstrap_mean(d, clusters=labels, resamples=resamples, seed=seed)
        if len(keys) < 2:
            assert math.isnan(got[1]) and math.isnan(got[2])
            continue
        ref = stats.bootstrap(
            (sums, sizes),
            lambda s, z, axis=-1: s.sum(axis=axis) / z.sum(axis=axis),
            paired=True,
            n_resamples=resamples,
            method="percentile",
            batch=max(1, 4_000_000 // len(keys)),
            rng=np.random.default_rng(seed),
        )
        assert got[1:] == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), abs=1e-12), case

        other = _values(rng, rng.randint(2, 40)) + 0.2
        got = bootstrap_gap(d, other, resamples=resamples, seed=seed)
        ref = stats.bootstrap(
            (d, other),
            lambda a, b, axis=-1: b.mean(axis=axis) - a.mean(axis=axis),
            n_resamples=resamples,
            method="percentile",
            batch=max(1, 4_000_000 // (n + len(other))),
            rng=np.random.default_rng(seed),
        )
        assert got[0] == pytest.approx(other.mean() - d.mean())
        assert got[1:] == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), abs=1e-12), case


def _wilcoxon_reference(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p from the definition (zeros dropped, Wilcoxon 1945): the exact null
    of W+ (every sign pattern of the average ranks) for at most 13 non-zero differences, or when they are
    untied; else the normal approximation with the tie correction (no continuity correction)."""
    x = d[d != 0]
    n = len(x)
    ranks = stats.rankdata(np.abs(x))
    w = float(ranks[x > 0].sum())
    tied = len(np.unique(np.abs(x))) < n
    if n <= 13 or (not tied and n <= 50):
        doubled = [int(round(2 * r)) for r in ranks]  # average ranks are halves: count in whole numbers
        counts = {0: 1}
        for r in doubled:
            nxt = dict(counts)
            for s, c in counts.items():
                nxt[s + r] = nxt.get(s + r, 0) + c
            counts = nxt
        total = 2**n
        low = sum(c for s, c in counts.items() if s <= round(2 * w)) / total
        high = sum(c for s, c in counts.items() if s >= round(2 * w)) / total
        return min(1.0, 2 * min(low, high))
    _, t = np.unique(np.abs(x), return_counts=True)
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24 - (t**3 - t).sum() / 48)
    z = (w - n * (n + 1) / 4) / sd
    return 2 * stats.norm.sf(abs(z))


def test_wilcoxon_matches_the_definition_zeros_dropped():
    """The documented test: zero differences dropped (``zero_method="wilcox"``), exact for up to 50
    untied non-zero differences — however many zeros were dropped."""
    rng = random.Random(8)
    for case in range(60):
        n = rng.randint(2, 60)
        if case % 2:
            d = np.array([rng.uniform(-1, 1) for _ in range(n)])  # untied
            d[: rng.randint(0, n // 2)] = 0.0  # with zeros
        else:
            d = _values(rng, n)
        if not np.count_nonzero(d):
            assert wilcoxon_test(d)["p_value"] == 1.0
            continue
        got = wilcoxon_test(d)
        assert got["n_nonzero"] == int(np.count_nonzero(d))
        assert got["p_value"] == pytest.approx(_wilcoxon_reference(d), rel=1e-6, abs=1e-9), (case, d.tolist())


def _mann_whitney_reference(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``(U of b, two-sided p)`` from the definition: U = rank sum of b − n_b(n_b + 1)/2 over the pooled
    average ranks; the exact null (every split of the pooled ranks) when a group has at most 8 values and
    nothing is tied, else the normal approximation with tie and continuity corrections."""
    pooled = np.concatenate([a, b])
    ranks = stats.rankdata(pooled)
    na, nb = len(a), len(b)
    u = float(ranks[na:].sum() - nb * (nb + 1) / 2)
    tied = len(np.unique(pooled)) < len(pooled)
    if len(np.unique(pooled)) == 1:
        return u, 1.0  # every value tied: U sits at its mean
    if min(na, nb) <= 8 and not tied:
        us = [sum(c) - nb * (nb + 1) / 2 for c in itertools.combinations(range(1, na + nb + 1), nb)]
        low = sum(x <= u for x in us) / len(us)
        high = sum(x >= u for x in us) / len(us)
        return u, min(1.0, 2 * min(low, high))
    _, t = np.unique(pooled, return_counts=True)
    n = na + nb
    sd = math.sqrt(na * nb / 12 * ((n + 1) - (t**3 - t).sum() / (n * (n - 1))))
    z = (abs(u - na * nb / 2) - 0.5) / sd
    return u, min(1.0, 2 * stats.norm.sf(z))


def test_mann_whitney_matches_the_definition():
    rng = random.Random(9)
    for case in range(40):
        na, nb = rng.randint(1, 14), rng.randint(1, 14)
        if case % 2:
            a, b = (
                np.array([rng.uniform(0, 1) for _ in range(na)]),
                np.array([rng.uniform(0.2, 1.2) for _ in range(nb)]),
            )
        else:
            a, b = np.abs(_values(rng, na)), np.abs(_values(rng, nb))
        if case % 10 == 4:
            a, b = np.full(na, 0.5), np.full(nb, 0.5)
        u, p = _mann_whitney_reference(a, b)
        got = mann_whitney_test(a, b)
        assert got["statistic"] == pytest.approx(u), case
        assert got["p_value"] == pytest.approx(p, rel=1e-6, abs=1e-9), (case, a.tolist(), b.tolist())


def test_compare_files_on_generated_runs_matches_trec_eval_and_the_exact_test(tmp_path):
    """``obliq compare`` end to end: per-query NDCG@10 of two generated runs by pytrec_eval, the mean
    difference, its p by the exact sign-flip count, its interval by scipy, helped / hurt / tied by hand."""
    import pytrec_eval

    for seed in range(8):
        rng = random.Random(seed)
        qrels = {f"q{i}": {f"d{j}": rng.choice([0, 1, 2]) for j in rng.sample(range(30), 5)} for i in range(14)}
        qrels = {q: j for q, j in qrels.items() if any(j.values())}
        runs = []
        for name in ("a", "b"):
            run = {q: {f"d{j}": float(rng.choice([1, 2, 3, 4])) for j in rng.sample(range(30), 12)} for q in qrels}
            runs.append(run)
            lines = [f"{q} Q0 {d} 1 {s} {name}\n" for q, docs in run.items() for d, s in docs.items()]
            (tmp_path / f"{name}.trec").write_text("".join(lines))
        (tmp_path / "q.txt").write_text("".join(f"{q} 0 {d} {g}\n" for q, j in qrels.items() for d, g in j.items()))
        got = compare_files(
            tmp_path / "a.trec", tmp_path / "b.trec", tmp_path / "q.txt", "NDCG@10", resamples=999, seed=seed
        )
        per = [pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(r) for r in runs]
        qids = sorted(qrels)
        a = np.array([per[0][q]["ndcg_cut_10"] for q in qids])
        b = np.array([per[1][q]["ndcg_cut_10"] for q in qids])
        d = b - a
        assert got["diff"] == pytest.approx(d.mean(), abs=1e-12)
        assert got["p_value"] == pytest.approx(_flip_p_exact(d[np.abs(d) > 0]) if np.any(d) else 1.0, abs=1e-12)
        ref = stats.bootstrap(
            (d,),
            np.mean,
            n_resamples=999,
            method="percentile",
            batch=4_000_000 // len(d),
            rng=np.random.default_rng(seed),
        )
        assert (got["ci_low"], got["ci_high"]) == pytest.approx(
            (ref.confidence_interval.low, ref.confidence_interval.high), abs=1e-12
        )
        assert (got["helped"], got["hurt"], got["tied"]) == (
            int((d > 0.001).sum()),
            int((d < -0.001).sum()),
            int((np.abs(d) <= 0.001).sum()),
        )
        assert got["zero_both"] == int(((a == 0) & (b == 0)).sum())
        direct = compare(dict(zip(qids, a)), dict(zip(qids, b)), "NDCG@10", resamples=999, seed=seed)
        assert direct.p_value == got["p_value"]
