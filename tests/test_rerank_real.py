"""One real rerank: SmolLM2-135M-Instruct (CPU) reorders the BM25 top-20 of the first math-theoremqa query
with TourRank and with the task-aware listwise prompt, through `obliq rerank run` (slow: ~25 s; every new
token reads the whole model, so the cost is the calls' replies: one query, not two; the scripted tests in
test_rerank.py check several queries and their per-query costs)."""

from __future__ import annotations

import json

import pytest
import yaml

from obliq.commands.rerank import run as rerank_run
from obliq.llm.backends import BackendConfig
from obliq.rerank.config import load_policy
from obliq.rerank.tourrank import tourrank_calls
from obliq.search.retrieval import retrieve_bm25
from obliq.search.runs import read_run, top_k, write_run
from obliq.search.settings import RetrievalSettings
from obliq.tasks import load_task


@pytest.mark.slow
def test_smollm2_reranks_a_real_top20(tmp_path, tasks_dir, smollm2_path, monkeypatch):
    # the model is loaded once, by the first run; the second run's reranker is handed the same backend (each
    # run's cost is counted as the difference of the backend's counters over its own calls)
    build, built = BackendConfig.build, []
    monkeypatch.setattr(
        BackendConfig, "build", lambda self: built[0] if built else built.append(build(self)) or built[0]
    )
    task = load_task(tasks_dir / "math-theoremqa")
    dense = retrieve_bm25(task, RetrievalSettings(top_k=100)).run
    write_run(tmp_path / "bm25.trec", dense, tag="bm25")
    policy = tmp_path / "cpu.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "depth": 20,
                "backend": {"model": smollm2_path, "device": "cpu", "threads": 1, "batch_size": 4},
                "tourrank": {"tournaments": 1},
                "max_query_words": 30,
                "max_doc_words": 10,
                "tokens_per_id": 4,
            }
        )
    )
    calls = {"tourrank": tourrank_calls(20, load_policy(policy).tourrank), "listwise": 1}
    assert calls["tourrank"] == 3  # 20 -> 10 -> 5 -> 2, one group each
    for method in ("tourrank", "listwise"):
        out = tmp_path / f"{method}.trec"
        report = rerank_run(task.path, tmp_path / "bm25.trec", out, policy=policy, method=method, queries=1)
        cost = report["cost"]
        assert report["n_queries"] == cost["queries"] == 1 and cost["calls"] == calls[method]
        assert cost["prompt_tokens"] > 60 * cost["calls"] and cost["new_tokens"] > 0 and cost["seconds"] > 0
        assert 0 <= cost["failed_calls"] <= cost["calls"] and cost["per_query"]["calls"] == calls[method]
        assert set(report["metrics"]) == {"dense", method}
        assert json.loads(out.with_name(out.name + ".report.json").read_text())["cost"] == cost
        reranked = read_run(out)
        assert list(reranked) == task.query_ids[:1]  # of the run's 179 queries
        for q, docs in reranked.items():
            order, before = top_k(docs, len(docs)), top_k(dense[q], len(dense[q]))
            assert len(set(order)) == len(order) == len(before)  # a permutation, nothing lost
            assert set(order[:20]) == set(before[:20]) and order[20:] == before[20:]
    assert len(built) == 1
