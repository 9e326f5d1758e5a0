"""Per-query candidate sets (top_ranked/<split>.jsonl): reading and validation, and every retriever
ranking a query over its candidates only — checked against hand computations, pytrec_eval, mteb's own
scorer and sentence-transformers' embeddings with numpy float64."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval
from support import make_task

from obliq.commands.evaluate import evaluate
from obliq.commands.task import split_task
from obliq.eval.metrics import evaluate_run
from obliq.search.retrieval import make_retriever
from obliq.search.runs import read_run
from obliq.search.settings import RetrievalSettings
from obliq.tasks import load_query_split, load_task, subset_queries

DOCS = {
    "a": "the cat sat on the warm mat",
    "b": "a cat and a dog",
    "c": "stock markets fell sharply",
    "d": "the dog sat",
    "z": "the cat sat on the mat again",
}


def write_candidates(folder: Path, rows, split: str = "test") -> Path:
    path = folder / "top_ranked" / f"{split}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def small_task(root: Path, candidates=None) -> Path:
    make_task(
        root,
        [{"_id": d, "text": t} for d, t in DOCS.items()],
        [{"_id": "q1", "text": "cat sat"}, {"_id": "q2", "text": "dog"}],
        [("q1", "a", 1), ("q1", "z", 1), ("q2", "d", 1), ("q2", "c", 0)],
    )
    if candidates is not None:
        write_candidates(root, [{"query-id": q, "corpus-ids": c} for q, c in candidates.items()])
    return root


def test_candidates_are_read_repeats_dropped_and_missing_queries_counted(tmp_path, caplog):
    folder = small_task(tmp_path / "t")
    write_candidates(folder, [{"query-id": "q1", "corpus-ids": ["a", "b", "a"]}])
    task = load_task(folder)
    assert task.candidates == {"q1": ["a", "b"]}
    assert task.report["candidates"] == {
        "file": "test.jsonl",
        "queries": 1,
        "queries_without_candidates": 1,
        "repeated_candidates": 1,
        "min": 0,
        "mean": 1.0,
        "max": 2,
    }
    assert "1 queries have no candidate set" in caplog.text
    assert load_task(small_task(tmp_path / "plain")).candidates is None


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"query-id": "q9", "corpus-ids": ["a"]}], r"test.jsonl:1: field 'query-id': 'q9' is not a query"),
        (
            [{"query-id": "q1", "corpus-ids": ["a"]}, {"query-id": "q2", "corpus-ids": ["nope"]}],
            r"test.jsonl:2: field 'corpus-ids': 'nope' is not a document",
        ),
        (
            [{"query-id": "q1", "corpus-ids": ["a"]}, "", {"query-id": "q1", "corpus-ids": ["b"]}],
            r"test.jsonl:3: field 'query-id': 'q1' already has candidates \(line 1\)",
        ),
        (["{not json"], r"test.jsonl:1: invalid JSON"),
        ([{"query-id": "q1", "corpus-ids": "a"}], r"test.jsonl:1: field 'corpus-ids' must be a list"),
        ([{"corpus-ids": ["a"]}], r"test.jsonl:1: field 'query-id' must be a string"),
    ],
)
def test_bad_candidate_files_name_file_line_and_field(tmp_path, rows, message):
    folder = small_task(tmp_path / "t")
    write_candidates(folder, rows)
    with pytest.raises(ValueError, match=message):
        load_task(folder)


def test_hand_case_judged_document_outside_the_candidates_counts_in_the_ideal_dcg(tmp_path):
    """mteb's treatment (the colleague's note §3/§4): q1's judged z is not among its candidates; it
    cannot be retrieved but still counts: NDCG@10 = 1 / (1 + 1/log2 3) = 0.61315, Recall@3 = 0.5. A run
    file's lines outside the candidates are dropped (z ranked first there would give 1.0)."""
    folder = small_task(tmp_path / "t", {"q1": ["a", "b"], "q2": ["b", "c", "d"]})
    run = tmp_path / "run.trec"
    run.write_text(
        "q1 Q0 z 1 2.0 x\nq1 Q0 a 2 0.9 x\nq1 Q0 b 3 0.5 x\n"
        "q2 Q0 d 1 0.7 x\nq2 Q0 a 2 0.6 x\nq2 Q0 c 3 0.1 x\nq2 Q0 b 4 0.05 x\n"
    )
    (summary,) = evaluate(str(run), [str(folder)], tmp_path / "out", measures=["NDCG@10", "Recall@3"])
    rows = {
        json.loads(line)["query_id"]: json.loads(line)
        for line in (tmp_path / "out" / "t" / "per_query.jsonl").read_text().splitlines()
    }
    hand = 1 / (1 + 1 / math.log2(3))
    assert rows["q1"]["NDCG@10"] == pytest.approx(hand, abs=1e-12) and rows["q1"]["Recall@3"] == 0.5
    assert rows["q2"]["NDCG@10"] == 1.0
    written = read_run(tmp_path / "out" / "t" / "run.trec")
    assert set(written["q1"]) == {"a", "b"} and set(written["q2"]) == {"b", "c", "d"}
    assert summary["ranking"]["over"] == "candidates" and summary["ranking"]["max"] == 3
    assert "ranked over its candidate set only" in (tmp_path / "out" / "results.md").read_text()


def test_metrics_with_candidates_match_mteb_and_pytrec_eval(tmp_path):
    """obliq's per-query values against mteb's calculate_retrieval_scores (what mteb reports) and
    pytrec_eval on the unfiltered qrels, for a BM25 run over candidates with graded, zero and
    excluded judgements."""
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores

    folder = small_task(tmp_path / "t", {"q1": ["a", "b", "c", "d"], "q2": ["a", "b", "c"]})
    task = load_task(folder)
    run = make_retriever("bm25")(task).run
    qrels = task.qrels["test"]
    ours = evaluate_run(qrels, run, ["NDCG@10", "Recall@100"]).per_query
    k_values = [1, 3, 5, 10, 20, 100, 1000]
    theirs = calculate_retrieval_scores(run, qrels, k_values).all_scores
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    for q in ("q1", "q2"):
        assert ours[q]["NDCG@10"] == pytest.approx(theirs[q]["ndcg_cut_10"], abs=1e-12)
        assert ours[q]["Recall@100"] == pytest.approx(theirs[q]["recall_100"], abs=1e-12)
        assert ours[q]["NDCG@10"] == pytest.approx(ref[q]["ndcg_cut_10"], abs=1e-12)
    assert ours["q2"]["NDCG@10"] == 0.0 and ours["q2"]["Recall@100"] == 0.0  # its relevant d is not a candidate


def test_bm25_ranks_candidates_with_full_corpus_statistics_and_breaks_cut_ties_by_id(tmp_path):
    from obliq.search.bm25 import BM25

    docs = {"d1": "red apple", "d2": "red apple", "d3": "red apple", "d4": "green pear", "d5": "red red apple"}
    make_task(tmp_path / "t", [{"_id": d, "text": t} for d, t in docs.items()], ["red"], [])
    folder = tmp_path / "t"
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "red apple"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text("q\td1\t1\n")
    write_candidates(folder, [{"query-id": "q", "corpus-ids": ["d1", "d3", "d2", "d4"]}])
    task = load_task(folder)
    run = make_retriever("bm25", RetrievalSettings(top_k=2))(task).run["q"]
    # d1, d2, d3 tie; trec_eval orders ties by id descending, so the cut at 2 keeps d3 and d2; d5 is
    # not a candidate and d4 shares no term.
    assert list(run) == ["d3", "d2"]
    full = BM25(list(docs.values())).scores(BM25(list(docs.values())).tokenize(["red apple"])[0])
    assert run["d3"] == pytest.approx(float(full[2]), abs=1e-6)  # scored over the whole corpus's index


@pytest.mark.slow
def test_dense_scores_candidates_exactly(tmp_path, minilm_path):
    """MiniLM over candidates: every score is the float64 cosine of sentence-transformers' own
    embeddings, and only candidates are ranked."""
    from sentence_transformers import SentenceTransformer

    folder = small_task(tmp_path / "t", {"q1": ["b", "c", "d", "z"], "q2": ["a", "c"]})
    task = load_task(folder)
    run = make_retriever(minilm_path, RetrievalSettings(cache=False))(task).run
    st = SentenceTransformer(minilm_path, device="cpu")
    d = st.encode(list(DOCS.values()), convert_to_numpy=True).astype(np.float64)
    q = st.encode(["cat sat", "dog"], convert_to_numpy=True).astype(np.float64)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ids = list(DOCS)
    for i, qid in enumerate(("q1", "q2")):
        assert set(run[qid]) == set(task.candidates[qid])
        for doc, score in run[qid].items():
            assert score == pytest.approx(float(q[i] @ d[ids.index(doc)]), abs=1e-5)


def test_subsets_splits_and_query_sets_keep_their_candidates(tmp_path):
    folder = small_task(tmp_path / "t", {"q1": ["a", "b"], "q2": ["c", "d"]})
    task = load_task(folder)
    assert subset_queries(task, ["q2"], "sub").candidates == {"q2": ["c", "d"]}
    split_task(folder, tmp_path / "split", dev_fraction=0.5, seed=0)
    test_side, dev_side = load_task(tmp_path / "split"), load_query_split(tmp_path / "split")
    assert set(test_side.candidates) == set(test_side.query_ids)
    assert set(dev_side.candidates) == set(dev_side.query_ids)
    assert {**test_side.candidates, **dev_side.candidates} == task.candidates


def test_audit_joins_candidate_sets_of_query_sets(tmp_path):
    from obliq.audit.inputs import load_query_sets
    from obliq.audit.runs import model_run

    folder = small_task(tmp_path / "t", {"q1": ["a", "b"], "q2": ["b", "d"]})
    (folder / "queries-other.jsonl").write_text(json.dumps({"_id": "o1", "text": "cat dog"}) + "\n")
    (folder / "qrels" / "other.tsv").write_text("o1\ta\t1\n")
    joined = load_query_sets(folder, ["queries.jsonl", "queries-other.jsonl"])
    assert joined.candidates == {"q1": ["a", "b"], "q2": ["b", "d"], "o1": list(DOCS)}
    run = model_run("bm25", joined, RetrievalSettings())
    assert set(run["q1"]) <= {"a", "b"} and set(run["q2"]) <= {"b", "d"}


@pytest.mark.slow
def test_the_training_callback_ranks_each_query_sets_candidates(tmp_path, minilm_path):
    """The callback's evaluation (dev and test sides: top_ranked/dev.jsonl, top_ranked/test.jsonl) ranks
    every query over its candidates and says so in its summaries."""
    from types import SimpleNamespace

    import torch
    from obliq.callbacks.evaluation import RetrievalEvaluation

    from obliq.model import BiEncoder

    folder = small_task(tmp_path / "t", {"q1": ["a", "b"], "q2": ["c", "d"]})
    split_task(folder, tmp_path / "split", dev_fraction=0.5, seed=0)
    module = torch.nn.Module()
    module.encoder = BiEncoder(minilm_path, query_prefix="", passage_prefix="")
    strategy = SimpleNamespace(barrier=lambda name: None, broadcast=lambda value: value)
    for split in ("test", "dev"):
        trainer = SimpleNamespace(
            global_step=1, log_dir=str(tmp_path / split), default_root_dir=str(tmp_path), is_global_zero=True,
            loggers=[], strategy=strategy, callback_metrics={},
        )  # fmt: skip
        callback = RetrievalEvaluation(
            tasks=[str(tmp_path / "split")], split=split, retrieval=RetrievalSettings(top_k=5)
        )
        callback.setup(trainer, module, "fit")
        (summary,) = callback.evaluate(trainer, module)
        (task,) = callback.tasks
        assert summary["ranking"]["over"] == "candidates" and set(task.candidates) == set(task.query_ids)
        run = read_run(tmp_path / split / "eval" / "step-00000001" / task.name / "run.trec")
        assert all(set(docs) == set(task.candidates[q]) for q, docs in run.items())


@pytest.mark.parametrize("per_query", [3, 95], ids=["sparse-gathered", "dense-one-product"])
def test_candidate_scores_equal_float64_inner_products(per_query):
    from obliq.search.candidates import candidate_scores
    from obliq.search.exact import unit_float32

    rng = np.random.default_rng(0)
    docs, queries = unit_float32(rng.standard_normal((100, 16))), unit_float32(rng.standard_normal((7, 16)))
    rows = [rng.choice(100, per_query, replace=False) for _ in range(7)]
    got = candidate_scores(queries, docs, rows)
    for q, r, s in zip(queries, rows, got):
        np.testing.assert_allclose(s, docs[r].astype(np.float64) @ q.astype(np.float64), atol=1e-6)


def test_task_json_instruction_prompt_name_and_judgements_are_read_and_checked(tmp_path):
    folder = small_task(tmp_path / "t")
    meta = {"instruction": "Find cats.", "prompt_name": "OBLIQBenchMathRetrieval", "judgements": "pooled"}
    (folder / "task.json").write_text(json.dumps(meta))
    task = load_task(folder)
    assert (task.instruction, task.prompt_name, task.judgements) == ("Find cats.", "OBLIQBenchMathRetrieval", "pooled")
    (folder / "qrels" / "pooled.tsv").write_text("q1\ta\t1\n")
    with pytest.raises(ValueError, match="says qrels/test.tsv is pooled, yet qrels/pooled.tsv exists"):
        load_task(folder)
    (folder / "task.json").write_text(json.dumps({"judgements": "silver"}))
    with pytest.raises(ValueError, match=r"task.json: field 'judgements' must be one of \['gold', 'pooled'\]"):
        load_task(folder)
    (folder / "task.json").write_text(json.dumps({"instruction": ""}))
    with pytest.raises(ValueError, match="field 'instruction' must be a non-empty string"):
        load_task(folder)
