"""evaluate.py end to end on real tasks: BM25 (against the data README) and MiniLM (against
sentence-transformers' own encode, brute-force numpy search and pytrec_eval on the written files)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval

from obliq.cli import main as obliq_main
from obliq.search.runs import read_run
from obliq.tasks import load_task, read_qrels

REPO = Path(__file__).resolve().parents[1]
README_BM25_NDCG10 = {"math-theoremqa": 0.5431, "writing-news": 0.1289}  # ../shared/data/README.md


def pytrec_means(qrels_file: Path, run_file: Path) -> dict[str, float]:
    """NDCG@10 and Recall@100 straight from pytrec_eval on the files (queries with relevant docs)."""
    qrels = {q: d for q, d in read_qrels(qrels_file).items() if any(g > 0 for g in d.values())}
    out = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(read_run(run_file))
    assert set(out) == set(qrels)  # every query retrieved something
    return {
        "NDCG@10": np.mean([v["ndcg_cut_10"] for v in out.values()]),
        "Recall@100": np.mean([v["recall_100"] for v in out.values()]),
    }


def check_outputs(out: Path, task_dir: Path, n_queries: int) -> dict:
    name = task_dir.name
    summary = json.loads((out / name / "summary.json").read_text())
    assert summary["task"] == name and summary["n_queries"] == n_queries and summary["n_excluded"] == 0
    assert set(summary["metrics"]) == {"NDCG@10", "NDCG@50", "Recall@10", "Recall@50", "Recall@100", "Recall@1000"}
    ref = pytrec_means(task_dir / "qrels" / "test.tsv", out / name / "run.trec")
    assert summary["metrics"]["NDCG@10"] == pytest.approx(ref["NDCG@10"], abs=1e-9)
    assert summary["metrics"]["Recall@100"] == pytest.approx(ref["Recall@100"], abs=1e-9)
    rows = [json.loads(line) for line in (out / name / "per_query.jsonl").read_text().splitlines()]
    assert len(rows) == n_queries and all(r["qrels"] == "gold" for r in rows)
    assert np.mean([r["NDCG@10"] for r in rows]) == pytest.approx(summary["metrics"]["NDCG@10"])
    curve = list(summary["recall_curve"].values())
    assert curve == sorted(curve) and summary["recall_curve"]["100"] == summary["metrics"]["Recall@100"]
    for stage in ("query_encoding", "search"):
        lat = summary["latency_ms"][stage]
        assert lat["n"] == 3 and 0 < lat["p50"] <= lat["p95"]
    assert set(summary["timing_s"]) == {"encode_corpus", "encode_queries", "search", "metrics"}
    return summary


def test_bm25_end_to_end_matches_readme(tmp_path, tasks_dir, capsys, monkeypatch):
    """evaluate.py run as a script (``__main__``, its own argv, another working folder) in this process: the
    start-up of another interpreter is not what is checked here."""
    tasks = [tasks_dir / name for name in README_BM25_NDCG10]
    out = tmp_path / "bm25"
    cmd = [
        str(REPO / "evaluate.py"),
        "--model",
        "bm25",
        "--tasks",
        *map(str, tasks),
        "--output",
        str(out),
        "--latency_queries",
        "3",
    ]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", cmd)
    runpy.run_path(cmd[0], run_name="__main__")
    capsys.readouterr()  # the command's printed report
    for task_dir in tasks:
        summary = check_outputs(out, task_dir, len(load_task(task_dir).query_ids))
        # stemmed tokens (Snowball English) versus the README's unstemmed reference: within 0.02
        assert summary["metrics"]["NDCG@10"] == pytest.approx(README_BM25_NDCG10[task_dir.name], abs=0.02)
        # `obliq metrics` scores the written run to the same numbers
        obliq_main(
            [
                "metrics",
                "--qrels",
                str(task_dir / "qrels" / "test.tsv"),
                "--run",
                str(out / task_dir.name / "run.trec"),
                "--whole_ranking",  # top_k 1000 holds each task's whole corpus
            ]
        )
        assert json.loads(capsys.readouterr().out)["metrics"] == pytest.approx(summary["metrics"])
    table = (out / "results.md").read_text()
    for task_dir in tasks:
        ndcg = json.loads((out / task_dir.name / "summary.json").read_text())["metrics"]["NDCG@10"]
        assert f"| {task_dir.name} | analogue | gold |" in table and f"{ndcg:.4f}" in table
    assert (out / "recall_at_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "config.json").read_text())["model"] == "bm25"


QUERY_LEN, PASSAGE_LEN = 64, 128  # shorter than the defaults (256 / 1024) to keep the CPU test quick


@pytest.fixture(scope="module")
def minilm_eval(tmp_path_factory, tasks_dir):
    """Slices of the two real tasks (names kept): math-theoremqa's first 20 queries, writing-news's first 5,
    their relevant documents and some others; what is checked (the store, the encodings, the run, the metrics
    against pytrec_eval) holds on any corpus, and the whole tasks took ~50 s to encode on one CPU thread."""
    from support import task_slice

    out = tmp_path_factory.mktemp("minilm")
    tasks = [
        task_slice(tasks_dir, "math-theoremqa", out / "tasks" / "math-theoremqa", 20, 40),
        task_slice(tasks_dir, "writing-news", out / "tasks" / "writing-news", 5, 20),
    ]
    argv = [
        "--model",
        "minilm",
        "--tasks",
        *map(str, tasks),
        "--output",
        str(out / "run1"),
        "--retrieval.cache_dir",
        str(out / "cache"),
        "--latency_queries",
        "3",
        "--retrieval.query_max_length",
        str(QUERY_LEN),
        "--retrieval.passage_max_length",
        str(PASSAGE_LEN),
    ]
    obliq_main(["evaluate", *argv])
    return out, tasks, argv


@pytest.mark.slow
def test_minilm_end_to_end(minilm_eval, minilm_path):
    from sentence_transformers import SentenceTransformer

    out, tasks, _ = minilm_eval
    st = SentenceTransformer(minilm_path, device="cpu")
    for task_dir in tasks:
        task = load_task(task_dir)
        summary = check_outputs(out / "run1", task_dir, len(task.query_ids))
        assert summary["corpus_cache"] == "miss"
        [cache] = (out / "cache").glob(f"{task.name}-*/shard-0-of-1.npy")  # a one-shard store (obliq.search.store)
        docs = np.load(cache)
        assert docs.shape == (len(task.doc_ids), 384)
        # passages are encoded the sentence-transformers way (no "passage: " prefix), cut at PASSAGE_LEN
        st.max_seq_length = PASSAGE_LEN
        own = st.encode(task.doc_texts[:4], normalize_embeddings=True)
        np.testing.assert_allclose(docs[:4], own, atol=1e-5)
        prefixed = st.encode(["passage: " + t for t in task.doc_texts[:4]], normalize_embeddings=True)
        assert np.abs(docs[:4] - prefixed).max() > 1e-2
        # the run is the brute-force cosine top-k of sentence-transformers' query vectors
        st.max_seq_length = QUERY_LEN
        queries = st.encode(task.query_texts[:3], normalize_embeddings=True)
        sims = queries @ docs.T
        run = read_run(out / "run1" / task.name / "run.trec")
        for qid, row in zip(task.query_ids[:3], sims):
            top = np.argsort(-row)[:10]
            ranked = sorted(run[qid].items(), key=lambda x: -x[1])[:10]
            assert [d for d, _ in ranked] == [task.doc_ids[i] for i in top]
            np.testing.assert_allclose([s for _, s in ranked], row[top], atol=1e-5)


@pytest.mark.slow
def test_minilm_corpus_cache_is_reused(minilm_eval):
    out, tasks, argv = minilm_eval
    first = json.loads((out / "run1" / "math-theoremqa" / "summary.json").read_text())
    argv = [a if a != str(out / "run1") else str(out / "run2") for a in argv]
    argv[argv.index("--tasks") + 1 : argv.index("--output")] = [str(tasks[0])]
    [second] = obliq_main(["evaluate", *argv])
    assert second["corpus_cache"] == "hit"
    assert second["metrics"] == pytest.approx(first["metrics"], abs=1e-6)
    assert second["timing_s"]["encode_corpus"] < first["timing_s"]["encode_corpus"] / 5


def test_pooled_qrels_and_queries_without_relevant_docs(tmp_path):
    from support import make_task

    from obliq.eval.results import evaluate_tasks
    from obliq.search.retrieval import retrieve_bm25
    from obliq.search.settings import RetrievalSettings

    corpus = [{"_id": f"d{i}", "text": t} for i, t in enumerate(["red apple pie", "green apple", "blue sky", ""])]
    queries = [{"_id": "q1", "text": "apple"}, {"_id": "q2", "text": "sky"}, {"_id": "q3", "text": "zebra"}]
    gold = [("q1", "d0", 1), ("q2", "d2", 0), ("q3", "d3", 1)]  # q2: judged, nothing relevant; q3: no hit
    pooled = [("q1", "d1", 1), ("q2", "d2", 2)]
    task = load_task(make_task(tmp_path / "toy", corpus, queries, gold, pooled=pooled))
    [summary] = evaluate_tasks(
        lambda t: retrieve_bm25(t, RetrievalSettings()), [task], tmp_path / "out", "bm25", ["NDCG@10", "Recall@10"]
    )
    # gold: q1 finds d0 at rank 2 (the shorter "green apple" ranks first), q3 retrieves nothing → 0; q2 excluded
    assert (summary["n_queries"], summary["n_excluded"]) == (2, 1)
    assert summary["metrics"]["NDCG@10"] == pytest.approx((1 / np.log2(3) + 0) / 2)
    assert summary["pooled"] == {"metrics": {"NDCG@10": 1.0, "Recall@10": 1.0}, "n_queries": 2, "n_excluded": 1}
    rows = [json.loads(line) for line in (tmp_path / "out" / "toy" / "per_query.jsonl").read_text().splitlines()]
    assert [(r["query_id"], r["qrels"]) for r in rows] == [
        ("q1", "gold"),
        ("q3", "gold"),
        ("q1", "pooled"),
        ("q2", "pooled"),
    ]
    assert "| toy |  | pooled | 2 | 1 | 1.0000 | 1.0000 |" in (tmp_path / "out" / "results.md").read_text()
    assert "d3" not in (tmp_path / "out" / "toy" / "run.trec").read_text()  # the empty doc is never retrieved


def test_lightning_checkpoint_is_refused_with_the_export_command(tmp_path):
    from obliq.search.encoders import load_encoder

    (tmp_path / "last.ckpt").write_bytes(b"")
    with pytest.raises(ValueError, match="BiEncoder.save_pretrained"):
        load_encoder(str(tmp_path / "last.ckpt"))


@pytest.mark.slow
def test_obliq_adapter_folder_loads_as_biencoder(tmp_path):
    import torch

    from obliq.model import BiEncoder, LoraSettings
    from obliq.search.encoders import load_encoder

    torch.manual_seed(0)
    trained = BiEncoder("minilm", lora=LoraSettings(r=4, alpha=8), query_max_length=32, passage_max_length=64)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # a "trained" adapter, different from the base model
    trained.save_pretrained(tmp_path / "adapter")
    texts = ["How many primes are below 20?", "A ball is thrown upward at 10 m/s."]
    loaded = load_encoder(str(tmp_path / "adapter"))
    assert isinstance(loaded, BiEncoder) and loaded.is_peft
    lora = {n: p for n, p in loaded.named_parameters() if "lora_B" in n}
    assert lora and all(p.abs().max() > 0 for p in lora.values())  # the saved adapter, not a fresh one
    torch.testing.assert_close(
        loaded.encode(texts, kind="passage"), trained.encode(texts, kind="passage"), atol=1e-5, rtol=0
    )


def test_config_file_and_task_list_forms(tmp_path):
    from support import make_task

    from obliq.cli import _expand

    corpus = [{"_id": "d1", "text": "apple pie"}, {"_id": "d2", "text": "blue sky"}]
    for name in ("t1", "t2"):
        make_task(tmp_path / "tasks" / name, corpus, [{"_id": "q1", "text": "apple"}], [("q1", "d1", 1)])
    assert _expand(["evaluate", "--tasks", "a", "b", "--model", "bm25"]) == [
        "evaluate",
        "--tasks",
        '["a", "b"]',
        "--model",
        "bm25",
    ]
    assert _expand(["evaluate", "--tasks=a"]) == ["evaluate", '--tasks=["a"]']
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"model: bm25\ntasks: [{tmp_path / 'tasks'}]\noutput: {tmp_path / 'out'}\n"
        "measures: [NDCG@10]\nlatency_queries: 0\nretrieval: {bm25_k1: 1.2}\n"
    )
    summaries = obliq_main(["evaluate", "--config", str(config)])
    assert [s["task"] for s in summaries] == ["t1", "t2"]  # a folder of task folders expands
    assert summaries[0]["metrics"] == {"NDCG@10": 1.0}
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["retrieval"]["bm25_k1"] == 1.2 and saved["measures"] == ["NDCG@10"]
