"""BM25: Lucene scoring by hand (C17), empty documents, the data README's reference figures, and text in
another Unicode form (C50: NFKC + case folding, one tokenizer for evaluation, mining and the audit)."""

from __future__ import annotations

import math
import unicodedata

import numpy as np
import pytest
from support import make_task

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


def test_windows_asked_of_bm25_are_said_to_be_unused_and_change_nothing(tmp_path, caplog):
    """BM25 reads each text whole; ``retrieval.windows`` (an encoder setting, shared by one retrieval config) is
    said to be unused, and the run is BM25's own."""
    from obliq.search.retrieval import make_retriever

    corpus = [{"_id": f"d{i}", "text": ("filler " * 300) + ("apple" if i % 2 else "pear")} for i in range(4)]
    task = load_task(make_task(tmp_path / "t", corpus, [{"_id": "q", "text": "apple"}], [("q", "d1", 1)]))
    plain = make_retriever("bm25", RetrievalSettings())(task).run
    assert "retrieval.windows" not in caplog.text
    windowed = make_retriever("bm25", RetrievalSettings(windows={"size": 64, "stride": 32}))(task).run
    assert "BM25 reads each text whole: retrieval.windows" in caplog.text
    assert windowed == plain and list(plain["q"]) == ["d3", "d1"]


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


# C50: the same words in another Unicode form (NFD accents, a ligature). Corpus built so that the
# case's scores hold: analysed lengths 11, 9, 7, 8, 8, 7 (avgdl 50/6 = 8.3333), every query term in
# one document once (df 1, N 6), two terms a query; d4-d6 share no word (nor a pre-fix token) with a query.
C50_DOCS = {
    "d1": unicodedata.normalize("NFD", "The café crème served at the little corner shop each morning"),
    "d2": "A \ufb01nancial \ufb01rm opened its new office in London",  # U+FB01 "ﬁ"
    "d3": unicodedata.normalize("NFC", "A naïve résumé lists every summer job"),
    "d4": "Fresh bread and butter are sold every day",
    "d5": "The river flooded the valley after heavy rain",
    "d6": "Students wrote essays about ancient Roman history",
}
C50_QUERIES = {
    "q1": unicodedata.normalize("NFC", "café crème"),
    "q2": "financial firm",
    "q3": unicodedata.normalize("NFD", "naïve résumé"),
}
C50_SCORES = {("q1", "d1"): 1.528826, ("q2", "d2"): 1.597309, ("q3", "d3"): 1.672216}


def test_c50_unicode_forms_match_through_obliq_evaluate(tmp_path):
    import pytrec_eval

    from obliq.commands.evaluate import evaluate
    from obliq.search.runs import read_run

    assert unicodedata.normalize("NFC", C50_DOCS["d1"]) != C50_DOCS["d1"] != C50_QUERIES["q1"]  # forms differ
    task = make_task(
        tmp_path / "c50",
        [{"_id": d, "text": t} for d, t in C50_DOCS.items()],
        [{"_id": q, "text": t} for q, t in C50_QUERIES.items()],
        [(q, d, 1) for q, d in C50_SCORES],
    )
    (summary,) = evaluate("bm25", [str(task)], tmp_path / "out", measures=["NDCG@10", "Recall@10"], latency_queries=0)
    assert summary["metrics"] == {"NDCG@10": pytest.approx(1.0, abs=1e-6), "Recall@10": pytest.approx(1.0, abs=1e-6)}
    run = read_run(tmp_path / "out" / "c50" / "run.trec")
    assert {q: list(docs) for q, docs in run.items()} == {q: [d] for q, d in C50_SCORES}  # nothing else shares a term
    lengths, avgdl = {"d1": 11, "d2": 9, "d3": 7}, 50 / 6
    for (q, d), expected in C50_SCORES.items():
        assert 2 * lucene(1, 1, 6, lengths[d], avgdl, 0.9, 0.4) == pytest.approx(expected, abs=1e-6)
        assert run[q][d] == pytest.approx(expected, abs=1e-6), (q, d)
    qrels = {q: {d: 1} for q, d in C50_SCORES}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10"}).evaluate(run)
    assert all(ref[q]["ndcg_cut_10"] == 1.0 and ref[q]["recall_10"] == 1.0 for q in qrels)


def test_c50_one_tokenizer_for_evaluation_mining_and_the_audit(monkeypatch):
    import obliq.text
    from obliq.negatives.mine import Bm25sBackend
    from obliq.synth.audit import jaccard, leaked, source_rank
    from obliq.text import fold, words

    assert fold("\ufb01nancial") == "financial" and fold(unicodedata.normalize("NFD", "Crème")) == "crème"
    assert fold("STRASSE") == fold("Straße") and fold("\u01f0") == "\u01f0"  # folding's "j" + U+030C recomposed
    texts, queries = list(C50_DOCS.values()), list(C50_QUERIES.values())
    for stemmer in ("english", None):  # stemming runs on the folded words
        tokens = BM25([], stemmer=stemmer).tokenize(queries)
        assert tokens == [
            ["café", "crème"],
            ["financi" if stemmer else "financial", "firm"],
            ["naïv" if stemmer else "naïve", "résumé"],
        ]
    assert BM25([], stemmer=None).tokenize(texts) == [words(t) for t in texts]
    folded = []
    monkeypatch.setattr(obliq.text, "fold", lambda t: folded.append(t) or fold(t))  # every path goes through it
    mined = Bm25sBackend(texts, ids=list(C50_DOCS)).score(queries, [0, 1, 2])
    assert mined == pytest.approx(list(C50_SCORES.values()), abs=1e-6) and folded == texts + queries
    folded.clear()
    audit_index = BM25(texts)
    assert [source_rank(audit_index, q, j) for j, q in enumerate(queries)] == [1, 1, 1]
    assert jaccard(queries[0], texts[0]) == pytest.approx(2 / 10)  # {café, crème} of d1's 10 distinct words
    assert jaccard(queries[1], "\ufb01nancial FIRM") == 1.0 and folded[-2:] == [queries[1], "\ufb01nancial FIRM"]
    nfd = unicodedata.normalize("NFD", "We met at the Café Müller.")
    assert leaked(unicodedata.normalize("NFC", "Visit Café Müller"), nfd) == {"Café", "Müller"}  # case kept
