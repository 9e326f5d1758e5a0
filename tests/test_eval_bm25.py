"""BM25: Lucene scoring by hand (C17), empty documents, and the data README's reference figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from obliq.eval.metrics import evaluate_run
from obliq.search.bm25 import BM25
from obliq.search.retrieval import retrieve_bm25
from obliq.search.settings import RetrievalSettings
from obliq.tasks import load_task


def lucene(tf: int, df: int, n: int, dl: int, avgdl: float, k1: float, b: float) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_c17_lucene_scores():
    index = BM25(["foo", "dog", "baz", "quick god", "quick fox"], k1=1.5, b=0.75)
    expected = lucene(tf=1, df=2, n=5, dl=2, avgdl=1.4, k1=1.5, b=0.75)
    assert expected == pytest.approx(0.293570, abs=1e-6)
    np.testing.assert_allclose(index.scores(["quick"]), [0, 0, 0, expected, expected], atol=1e-6)
    scores, idx = index.search_tokens(["quick"], k=10)
    assert idx.tolist() == [4, 3]  # only matching docs; equal scores by id descending (trec_eval), here the row
    _, idx = BM25(["foo", "dog", "baz", "quick god", "quick fox"], k1=1.5, b=0.75, ids=list("abczy")).search_tokens(
        ["quick"], k=10
    )
    assert idx.tolist() == [3, 4]  # ids z (row 3), y (row 4)


def test_stemming_repeated_query_terms_and_defaults_by_hand():
    docs = ["The runners were running", "a runner runs", "nothing here", "run"]
    index = BM25(docs)  # k1 = 0.9, b = 0.4, Snowball English
    assert index.tokenize(["The Runners were RUNNING!"]) == [["the", "runner", "were", "run"]]
    lengths = [4, 3, 2, 1]
    avgdl = sum(lengths) / 4
    # "run" occurs in docs 0 (running), 1 (runs), 3 (run): df = 3
    run = [lucene(1, 3, 4, dl, avgdl, 0.9, 0.4) if i != 2 else 0.0 for i, dl in enumerate(lengths)]
    np.testing.assert_allclose(index.scores(["run"]), run, rtol=1e-5)
    np.testing.assert_allclose(index.scores(["run", "run"]), 2 * np.array(run), rtol=1e-5)  # counted twice
    scores, idx = index.search(["Running?"], k=2)[0]
    assert idx.tolist() == [3, 1] and scores.tolist() == pytest.approx([run[3], run[1]], rel=1e-5)


def test_c17_empty_documents():
    index = BM25(["", "apple banana", "apple"])
    assert index.n_empty == 1
    scores = index.scores(["banana"])
    assert scores[1] > 0 and scores[0] == 0 and scores[2] == 0
    assert [h[1].tolist() for h in index.search(["banana", "apple", "pear", ""], k=10)] == [[1], [2, 1], [], []]
    empty = BM25(["", "", ""])  # must not raise
    assert empty.search(["anything"], k=5)[0][1].tolist() == []
    assert empty.scores(["anything"]).tolist() == [0, 0, 0]


def test_reproduces_the_data_readme_reference_unstemmed(tasks_dir):
    # the README's BM25: k1 = 0.9, b = 0.4, lowercase \w+ tokens, no stemming, top 1000
    reference = {  # NDCG@10, Recall@100 from ../shared/data/README.md
        "writing-news": (0.1289, 0.4053),
        "math-theoremqa": (0.5431, 0.8559),
        "stance-tweets": (0.3695, 0.0703),
        "hearings-exchanges": (0.3095, 0.5056),
        "health-dialect": (0.2678, 0.6639),
    }
    for name, (ndcg, recall) in reference.items():
        task = load_task(tasks_dir / name)
        run = retrieve_bm25(task, RetrievalSettings(top_k=1000, bm25_stemmer=None)).run
        ev = evaluate_run(task.qrels["test"], run, ["NDCG@10", "Recall@100"], task.query_ids)
        assert ev.aggregate["NDCG@10"] == pytest.approx(ndcg, abs=5e-5), name
        assert ev.aggregate["Recall@100"] == pytest.approx(recall, abs=5e-5), name
