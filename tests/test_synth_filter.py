"""The filter stage (issue 23) on real split tasks: BM25 ranks against obliq's BM25 search over the corpus,
dense ranks against sentence-transformers' own MiniLM embeddings, thresholds against numpy on the real
development queries' ranks (read from the files the split wrote), the decisions against those values,
and the thresholds' independence from the test side."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from obliq.commands.task import split_task
from obliq.search.bm25 import BM25
from obliq.synth.audit import entity_tokens, leaks
from obliq.synth.filter import FilterConfig, dense_threshold, filter_candidates, lexical_threshold
from obliq.tasks import load_task, read_qrels
from obliq.text import normalise_text


def _math_cut(tasks_dir: Path, out: Path, n_queries: int = 50, n_docs: int = 50) -> Path:
    """math-theoremqa cut small, in its own file order: its first ``n_queries`` queries with their judgements,
    and its first ``n_docs`` problems with those queries' relevant ones (158 of 620)."""
    src = tasks_dir / "math-theoremqa"
    qrels = read_qrels(src / "qrels" / "test.tsv")
    queries = (src / "queries.jsonl").read_text().splitlines()[:n_queries]
    ids = [json.loads(line)["_id"] for line in queries]
    wanted = {d for q in ids for d in qrels[q]}
    corpus = (src / "corpus.jsonl").read_text().splitlines()
    docs = [line for i, line in enumerate(corpus) if i < n_docs or json.loads(line)["_id"] in wanted]
    (out / "qrels").mkdir(parents=True)
    (out / "corpus.jsonl").write_text("\n".join(docs) + "\n")
    (out / "queries.jsonl").write_text("\n".join(queries) + "\n")
    judged = [f"{q}\t{d}\t{g}" for q in ids for d, g in qrels[q].items()]
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(judged) + "\n")
    (out / "task.json").write_text((src / "task.json").read_text())
    return out


@pytest.fixture(scope="module")
def split(tasks_dir, tmp_path_factory):
    """writing-news and a cut of math-theoremqa (its name kept; the dense check encodes its corpus twice), split."""
    root = tmp_path_factory.mktemp("split")
    split_task(_math_cut(tasks_dir, root / "math-cut"), root / "math-theoremqa", 0.5, 0)
    split_task(tasks_dir / "writing-news", root / "writing-news", 0.5, 0)
    return root


def _dev_pairs(folder: Path, doc_ids: list[str]) -> tuple[list[str], list[list[int]]]:
    """The development side's (query, gold documents), from queries-dev.jsonl and qrels/dev.tsv."""
    texts = {o["_id"]: o["text"] for o in map(json.loads, (folder / "queries-dev.jsonl").read_text().splitlines())}
    index = {d: i for i, d in enumerate(doc_ids)}
    gold: dict[str, list[int]] = {}
    with (folder / "qrels" / "dev.tsv").open() as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if int(row["score"]) > 0 and row["corpus-id"] in index:
                gold.setdefault(row["query-id"], []).append(index[row["corpus-id"]])
    queries = [q for q in texts if q in gold]
    return [texts[q] for q in queries], [gold[q] for q in queries]


def _search_rank(bm25: BM25, query: str, j: int, n: int) -> int | None:
    """The rank of document j in BM25's own full ranking: 1 + the documents it scores strictly higher."""
    [(scores, indices)] = bm25.search([query], n)
    hit = np.flatnonzero(np.asarray(indices) == j)
    if not len(hit):
        return None
    return 1 + int((np.asarray(scores) > scores[hit[0]]).sum())


def _row(task, doc: int, query: str, sample: int = 0) -> dict:
    return {
        "id": f"synth:{task.name}:{task.doc_ids[doc]}:{sample}",
        "task": task.name,
        "source": "synthetic",
        "query": query,
        "positive": {"id": task.doc_ids[doc], "text": task.doc_texts[doc]},
        "negatives": [],
        "meta": {"sample": sample},
    }


def test_thresholds_against_numpy_by_hand_and_at_the_edges():
    rng = np.random.default_rng(0)
    for _ in range(200):
        ranks = rng.integers(1, 60, size=int(rng.integers(1, 80)))
        q = float(rng.choice([0.0, 0.01, 0.05, 0.1, 0.3, 0.5, 0.95, 1.0]))
        if q < 1:  # the largest rank (up to the largest reached) that at most q of the ranks reach
            expect = max(r for r in range(int(ranks.max()) + 1) if np.mean(ranks <= r) <= q + 1e-12)
            assert lexical_threshold(ranks, q) == expect
        if q > 0:  # the smallest rank that at least q of the ranks reach
            assert dense_threshold(ranks, q) == min(
                int(r) for r in np.unique(ranks) if np.mean(ranks <= r) >= q - 1e-12
            )
    assert lexical_threshold([1, 1, 2, 5, 9], 0.2) == 0  # 2 of 5 at rank 1: more than 20 %
    assert lexical_threshold([1, 3, 5, 9, 9], 0.2) == 2  # rank 1 reached by 1 of 5; rank 3 would make 2
    assert lexical_threshold([1, 3, 5, 9, 9], 0.4) == 4
    assert dense_threshold([1, 3, 5, 9, 9], 0.95) == 9 and dense_threshold([1, 3, 5, 9, 9], 0.6) == 5
    with pytest.raises(ValueError, match="no development pair"):
        lexical_threshold([], 0.05)
    with pytest.raises(ValueError, match="test side"):
        FilterConfig(split="test")


def test_bm25_and_dense_ranks_thresholds_and_decisions_on_math(split, minilm_path, tmp_path):
    from sentence_transformers import SentenceTransformer

    from obliq.search.settings import RetrievalSettings

    folder = split / "math-theoremqa"
    task = load_task(folder)
    n = len(task.doc_ids)
    picks = [0, 1, 2, 3, 4, 5]
    queries = {
        0: [
            "How many ways to divide a set into non-empty ordered subsets?",
            "counting partitions of objects",
            "ordered blocks of a finite collection, counted",
        ],
        1: ["what is the value of an integral of sin(3t) sin(t/pi)/t^2", "a definite integral over the real line"],
        2: ["routing tables with poisoned reverse on a graph of link costs", task.doc_texts[7]],  # another problem
        3: ["counting partitions of objects", "an electric circuit question"],  # a duplicate of an earlier query
        4: [task.doc_texts[4], "a physics question on rotation"],
        5: ["Ohm's law for a resistor network"],
    }
    rows = [_row(task, d, q, s) for d in picks for s, q in enumerate(queries[d])]
    dev_q, dev_src = _dev_pairs(folder, task.doc_ids)
    rows.append(_row(task, 6, dev_q[0], 0))  # a development query's text: a duplicate
    config = FilterConfig(lexical_quantile=0.3, dense_quantile=0.9)  # 0.3: 27 % of the cut's real pairs at rank 1
    retrieval = RetrievalSettings(cache_dir=tmp_path / "cache")
    candidates, report = filter_candidates(rows, task, config, "minilm", retrieval)

    # BM25: obliq's BM25 search over the task's corpus
    bm25 = BM25(task.doc_texts)
    for c in candidates:
        assert c.bm25_rank == _search_rank(bm25, c.row["query"], c.source, n)
    real_bm25 = [r or n + 1 for q, src in zip(dev_q, dev_src) for r in (_search_rank(bm25, q, j, n) for j in src)]
    t = report["thresholds"]["bm25_max_rank_dropped"]
    assert report["thresholds"]["real_pairs"] == len(real_bm25) and report["thresholds"]["real_queries"] == len(dev_q)
    ranks = np.array(real_bm25)
    assert np.mean(ranks <= t) <= 0.3 and np.mean(ranks <= t + 1) > 0.3  # the largest such rank
    assert report["thresholds"]["real_bm25_rank1"] == pytest.approx(np.mean(ranks == 1))

    # dense: sentence-transformers' own MiniLM embeddings, cosine over the whole corpus
    st = SentenceTransformer(minilm_path, device="cpu")
    docs = st.encode(task.doc_texts, normalize_embeddings=True, batch_size=64).astype(np.float64)

    scores: dict[str, np.ndarray] = {}  # each query encoded once, on its own

    def bounds(query: str, j: int) -> tuple[int, int]:  # the rank, allowing float32 near-ties
        if query not in scores:
            scores[query] = docs @ st.encode([query], normalize_embeddings=True)[0].astype(np.float64)
        s = scores[query]
        return 1 + int((s > s[j] + 1e-5).sum()), 1 + int((s > s[j] - 1e-5).sum())

    for c in candidates:
        lo, hi = bounds(c.row["query"], c.source)
        assert lo <= c.dense_rank <= hi, c.row["query"]
    real_dense = [bounds(q, j) for q, src in zip(dev_q, dev_src) for j in src]
    k = report["thresholds"]["dense_top_k"]
    lo_ranks, hi_ranks = np.array([a for a, _ in real_dense]), np.array([b for _, b in real_dense])
    assert np.mean(lo_ranks <= k) >= 0.9 and np.mean(hi_ranks <= k - 1) < 0.9  # the smallest such rank

    # the decisions follow from those values
    seen = {normalise_text(q) for q in dev_q}
    for c in candidates:
        key = normalise_text(c.row["query"])
        if key in seen:
            assert c.decision == "duplicate"
        elif c.bm25_rank is not None and c.bm25_rank <= t:
            assert c.decision == "too_lexical"
        elif c.dense_rank > k:
            assert c.decision == "unanswerable"
        else:
            assert c.decision in ("kept", "not_best", "entity_leak")
        seen.add(key)
    assert [c.decision for c in candidates if c.source == 3][0] == "duplicate"
    assert {c.decision for c in candidates} == {"too_lexical", "unanswerable", "duplicate", "kept", "not_best"}
    assert candidates[-1].decision == "duplicate"  # the development query
    for d in picks:  # best-of-n: the kept one minimises log(dense rank) - log(BM25 rank)
        alive = [c for c in candidates if c.source == d and c.decision in ("kept", "not_best")]
        if alive:
            best = min(
                alive,
                key=lambda c: (bool(c.leaked), math.log(c.dense_rank) - math.log(c.bm25_rank or n + 1), c.sample),
            )
            assert [c for c in alive if c.decision == "kept"] in ([best], [])
    counted = report["dropped"]
    assert sum(counted.values()) + report["kept"] == len(rows) == report["candidates"]
    assert report["kept"] == sum(c.decision == "kept" for c in candidates) and report["kept"] >= 1
    names = [a["name"] for a in report["audit"]]
    assert names == ["generated", "kept", "real dev"] and report["audit"][2]["queries"] == len(dev_q)


def test_entity_leaks_stay_within_the_real_rate_and_the_test_side_is_never_read(split, tmp_path, capsys):
    from obliq.cli import main

    folder = split / "writing-news"
    task = load_task(folder)
    dev_q, dev_src = _dev_pairs(folder, task.doc_ids)
    real_rate = np.mean([np.mean([leaks(q, task.doc_texts[j]) for j in src]) for q, src in zip(dev_q, dev_src)])
    rows = []
    for d in range(40):  # most of them name an entity of their snippet, some describe its style only
        names = sorted(entity_tokens(task.doc_texts[d]))
        q = (
            f"a plain, even account {d} in the manner of {names[0]}"
            if names and d % 8
            else f"an even account, number {d}"
        )
        rows.append(_row(task, d, q))
    file = tmp_path / "rows.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "kept.jsonl"
    args = ["synth", "filter", "--rows", str(file), "--task", str(folder), "--out", str(out)]
    settings = ["--dense_quantile", "null", "--lexical_quantile", "0"]  # the leak rule alone
    main(args + settings)
    report = json.loads((tmp_path / "kept.jsonl.report.json").read_text())["report"]
    printed = capsys.readouterr().out
    assert "kept" in printed and "real dev" in printed and "dropped:" in printed
    assert report["thresholds"]["leak_rate"] == pytest.approx(real_rate) and 0 < real_rate < 1
    assert report["thresholds"]["bm25_max_rank_dropped"] == 0 and report["dropped"]["too_lexical"] == 0
    decisions = [json.loads(x) for x in (tmp_path / "kept.jsonl.decisions.jsonl").read_text().splitlines()]
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in kept] == [d["id"] for d in decisions if d["decision"] == "kept"]
    leaking = [r for r in kept if leaks(r["query"], r["positive"]["text"])]
    generated_leaking = sum(leaks(r["query"], r["positive"]["text"]) for r in rows)
    assert generated_leaking / len(rows) > real_rate  # more than the real rate: some must go
    assert len(leaking) / len(kept) <= real_rate  # the kept rows leak no more than the real queries
    assert (len(leaking) + 1) / (len(kept) + 1) > real_rate  # and no more was dropped than needed
    assert (
        report["dropped"]["duplicate"] == 0 and report["dropped"]["entity_leak"] == generated_leaking - len(leaking) > 0
    )
    assert len(kept) - len(leaking) == len(rows) - generated_leaking  # every query without a leak stays
    assert all(r["meta"]["filter"]["dense_rank"] is None for r in kept)
    # the test side changed: the same thresholds and decisions
    other = tmp_path / "other-test-side"
    shutil.copytree(folder, other)
    lines = [json.loads(x) for x in (other / "queries.jsonl").read_text().splitlines()]
    (other / "queries.jsonl").write_text(
        "".join(json.dumps({**o, "text": "Trump said " + o["text"][::-1]}) + "\n" for o in lines)
    )
    main(args[:5] + [str(other), "--out", str(tmp_path / "again.jsonl"), *settings])
    again = json.loads((tmp_path / "again.jsonl.report.json").read_text())["report"]
    assert again["thresholds"] == report["thresholds"] and again["dropped"] == report["dropped"]
    assert (tmp_path / "again.jsonl").read_bytes() == out.read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(args + settings)
    assert exit_.value.code == 2 and "kept.jsonl already holds rows: pass --overwrite true" in capsys.readouterr().err
    # issue 32 §3: a development side that is a copy of the test side gives no thresholds (synth generate's rule)
    leaky = tmp_path / "leaky"
    shutil.copytree(folder, leaky)
    shutil.copy(leaky / "queries.jsonl", leaky / "queries-dev.jsonl")
    shutil.copy(leaky / "qrels" / "test.tsv", leaky / "qrels" / "dev.tsv")
    with pytest.raises(SystemExit) as exit_:
        main(args[:5] + [str(leaky), "--out", str(tmp_path / "leak.jsonl"), *settings])
    assert exit_.value.code == 2 and "is also a test query" in capsys.readouterr().err
