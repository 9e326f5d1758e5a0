"""The audit end to end on the real health-dialect task (BM25, MiniLM), checked against independent
references: the data README's BM25 figures, ranks read back from the written run files, scipy on
those hand-computed values, and sentence-transformers' own encode with a numpy search.

No threshold on the audit's findings themselves (the issue): the tests check that the numbers are
computed right, not what they are.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from obliq.commands.audit import audit
from obliq.search.runs import read_run
from obliq.search.settings import RetrievalSettings
from obliq.tasks import read_qrels

# NDCG@10 per query set, data README / task.json (reference BM25: k1 0.9, b 0.4, unstemmed \w+ tokens).
README_NDCG10 = {"aal": 0.2254, "wme": 0.3093, "wme-translated": 0.2593}


def gold(task: Path) -> dict[str, str]:
    out = {}
    for split in ("test", "translated"):
        for q, docs in read_qrels(task / "qrels" / f"{split}.tsv").items():
            (doc,) = [d for d, g in docs.items() if g > 0]  # one relevant answer per question
            out[q] = doc
    return out


def rr_at_10_from_run(run_file: Path, relevant: dict[str, str]) -> dict[str, float]:
    """RR@10 by hand: the rank of the gold answer in the written run (trec_eval order)."""
    out = {}
    for q, docs in read_run(run_file).items():
        ranked = [d for d, _ in sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)]
        rank = ranked.index(relevant[q]) + 1 if relevant[q] in ranked else math.inf
        out[q] = 1 / rank if rank <= 10 else 0.0
    return out


def rows(report: dict, kind: str) -> dict:
    return {(r["model"], r["metric"]): r for r in report[kind][0]["rows"]}


@pytest.fixture(scope="module")
def bm25_audit(tmp_path_factory, tasks_dir):
    out = tmp_path_factory.mktemp("audit-bm25")
    audit(
        tasks_dir / "health-dialect",
        out,
        models=["bm25"],
        paired=[("aal", "wme-translated")],
        groups=[("aal", "wme")],
        measures=["RR@10", "NDCG@10", "Recall@100"],
        retrieval=RetrievalSettings(bm25_stemmer=None, top_k=100),
        resamples=2000,
        permutations=5000,
    )
    return out, json.loads((out / "audit.json").read_text())


@pytest.mark.slow
def test_bm25_group_means_match_the_data_readme(bm25_audit):
    _, report = bm25_audit
    assert report["n_queries"] == 647 + 659 + 647 and report["n_docs"] == 1309
    assert report["query_sets"] == ["queries.jsonl:test", "queries-translated.jsonl:translated"]
    paired, groups = rows(report, "paired")["bm25", "NDCG@10"], rows(report, "groups")["bm25", "NDCG@10"]
    assert paired["n_pairs"] == 647 and paired["dropped"] == {"no_reference": 0, "no_comparison": 0, "undefined": 0}
    assert paired["mean_reference"] == pytest.approx(README_NDCG10["aal"], abs=5e-5)
    assert paired["mean_comparison"] == pytest.approx(README_NDCG10["wme-translated"], abs=5e-5)
    assert (groups["n_reference"], groups["n_comparison"]) == (647, 659)
    assert groups["mean_reference"] == pytest.approx(README_NDCG10["aal"], abs=5e-5)
    assert groups["mean_comparison"] == pytest.approx(README_NDCG10["wme"], abs=5e-5)


@pytest.mark.slow
def test_bm25_rr_and_tests_match_hand_computation(bm25_audit, tasks_dir):
    out, report = bm25_audit
    task = tasks_dir / "health-dialect"
    rr = rr_at_10_from_run(out / "bm25" / "run.trec", gold(task))
    aal = sorted(q for q in rr if q.startswith("aal_"))
    wme = [rr[q] for q in rr if q.startswith("wme_")]
    delta = np.array([rr["trans_" + q[4:]] - rr[q] for q in aal])
    paired, groups = rows(report, "paired")["bm25", "RR@10"], rows(report, "groups")["bm25", "RR@10"]
    assert paired["delta"] == pytest.approx(delta.mean(), abs=1e-12)
    assert paired["ci"][0] < paired["delta"] < paired["ci"][1]
    assert paired["wilcoxon"]["p_value"] == pytest.approx(stats.wilcoxon(delta, zero_method="wilcox").pvalue, rel=1e-9)
    assert paired["wilcoxon"]["n_nonzero"] == int(np.count_nonzero(delta))
    assert groups["gap"] == pytest.approx(np.mean(wme) - np.mean([rr[q] for q in aal]), abs=1e-12)
    mwu = stats.mannwhitneyu(wme, [rr[q] for q in aal], alternative="two-sided")
    assert groups["mann_whitney"]["p_value"] == pytest.approx(mwu.pvalue, rel=1e-9)
    # per_query.jsonl carries the same values and the attributes
    per_query = {r["query_id"]: r for r in map(json.loads, (out / "bm25" / "per_query.jsonl").read_text().splitlines())}
    assert all(per_query[q]["RR@10"] == pytest.approx(v) for q, v in rr.items())
    assert per_query["trans_0"]["dialect"] == "wme-translated" and per_query["trans_0"]["pair_id"] == "aal_0"
    assert "| bm25 | RR@10 | 647 |" in (out / "audit.md").read_text()


def task_cut(task: Path, out: Path, queries: set[str], n_docs: int) -> Path:
    """The task folder with only ``queries`` (both query files) and their judgements, and of the corpus
    their gold answers and the first ``n_docs`` others, in file order."""
    wanted = {d for q, d in gold(task).items() if q in queries}
    (out / "qrels").mkdir(parents=True)
    corpus = (task / "corpus.jsonl").read_text().splitlines()
    docs = [ln for i, ln in enumerate(corpus) if i < n_docs or json.loads(ln)["_id"] in wanted]
    (out / "corpus.jsonl").write_text("\n".join(docs) + "\n")
    kept = {json.loads(ln)["_id"] for ln in docs}
    lines = (task / "attributes.tsv").read_text().splitlines()
    lines = lines[:1] + [ln for ln in lines[1:] if ln.split("\t")[0] in kept]
    (out / "attributes.tsv").write_text("\n".join(lines) + "\n")
    for name, split in (("queries.jsonl", "test"), ("queries-translated.jsonl", "translated")):
        lines = (task / name).read_text().splitlines()
        (out / name).write_text("\n".join(ln for ln in lines if json.loads(ln)["_id"] in queries) + "\n")
        lines = (task / "qrels" / f"{split}.tsv").read_text().splitlines()
        rows = lines[:1] + [ln for ln in lines[1:] if ln.split("\t")[0] in queries]
        (out / "qrels" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (out / "task.json").write_text((task / "task.json").read_text())
    return out


@pytest.mark.slow
def test_bm25_and_minilm_side_by_side(tmp_path, tasks_dir, minilm_path):
    """A subset of pairs (40 AAL/translation pairs, 40 WME questions) over their answers and 100 other
    documents, and MiniLM cut at 32 passage and 64 query tokens, to stay fast on a loaded CPU."""
    from sentence_transformers import SentenceTransformer

    full = tasks_dir / "health-dialect"
    lines = (full / "query_attributes.tsv").read_text().splitlines()
    keep = {ln.split("\t")[0] for ln in lines[1:] if ln.startswith("aal_")}
    keep = set(sorted(keep)[::10][:40])
    subset = (
        [lines[0]]
        + [ln for ln in lines[1:] if ln.split("\t")[2] in keep]
        + [ln for ln in lines[1:] if ln.startswith("wme_")][:40]
    )
    attributes = tmp_path / "query_attributes.tsv"
    attributes.write_text("\n".join(subset) + "\n")
    task = task_cut(full, tmp_path / "health-dialect", {ln.split("\t")[0] for ln in subset[1:]}, 100)
    out = tmp_path / "out"
    result = audit(
        task,
        out,
        query_attributes=attributes,
        models=["bm25", minilm_path],
        paired=[("aal", "wme-translated")],
        groups=[("aal", "wme")],
        measures=["RR@10", "Recall@10"],
        retrieval=RetrievalSettings(
            query_max_length=64, passage_max_length=32, cache_dir=tmp_path / "cache", top_k=100
        ),
        resamples=1000,
        permutations=2000,
    )
    report = json.loads((out / "audit.json").read_text())
    minilm = Path(minilm_path).parent.name + "-model"
    assert [m["name"] for m in report["models"]] == ["bm25", minilm] and report["n_queries"] == 120
    assert len(result["headline"]) == 4  # 2 contrasts × 2 models, RR@10
    for kind in ("paired", "groups"):
        for (model, metric), row in rows(report, kind).items():
            diff = row["delta"] if kind == "paired" else row["gap"]
            assert row["ci"][0] <= diff <= row["ci"][1], (kind, model, metric)
            assert 0 <= row["mean_reference"] <= 1 and 0 <= row["mean_comparison"] <= 1
    assert rows(report, "paired")[minilm, "RR@10"]["n_pairs"] == 40

    # MiniLM's RR@10 against sentence-transformers' own encode and a numpy search
    st = SentenceTransformer(minilm_path, device="cpu")
    st.max_seq_length = 32
    (cache,) = (tmp_path / "cache").glob("*/shard-0-of-1.npy")  # the store evaluate wrote (docs/formats.md)
    corpus = np.load(cache)
    doc_ids = [json.loads(line)["_id"] for line in (task / "corpus.jsonl").read_text().splitlines()]
    texts = [json.loads(line)["text"] for line in (task / "corpus.jsonl").read_text().splitlines()[:8]]
    np.testing.assert_allclose(st.encode(texts, normalize_embeddings=True), corpus[:8], atol=1e-5)
    st.max_seq_length = 64
    queries = {}
    for name in ("queries.jsonl", "queries-translated.jsonl"):
        for line in (task / name).read_text().splitlines():
            q = json.loads(line)
            queries[q["_id"]] = q["text"]
    audited = [ln.split("\t")[0] for ln in subset[1:]]
    scores = st.encode([queries[q] for q in audited], normalize_embeddings=True) @ corpus.T
    relevant = gold(task)
    per_query = {r["query_id"]: r for r in map(json.loads, (out / minilm / "per_query.jsonl").read_text().splitlines())}
    mismatched = []
    for q, row in zip(audited, scores):
        rank = int(np.sum(row > row[doc_ids.index(relevant[q])])) + 1
        expected = 1 / rank if rank <= 10 else 0.0
        if per_query[q]["RR@10"] != pytest.approx(expected):
            mismatched.append(q)
    assert not mismatched
