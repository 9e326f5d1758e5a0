"""Exact MaxSim over document windows (issue 55 §1, search (b)) against a brute-force float64 reference:
every window of every document scored, the max per document, ordered by score then id (trec_eval's order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from obliq.search.exact import ExactIndex
from obliq.search.maxsim import maxsim_search


def _brute_force(queries, windows, window_doc, k, doc_ids):
    """Cosine of every (query, window) in float64 over the float32 unit vectors, max per document, rounded
    to float32 once, ordered by (-score, -id rank); the top min(k, n_docs)."""

    def unit(x):
        x = np.asarray(x, dtype=np.float64)
        return (x / np.sqrt((x * x).sum(1, keepdims=True))).astype(np.float32).astype(np.float64)

    cos = (unit(queries)[:, None, :] * unit(windows)[None, :, :]).sum(-1)  # (n_q, W)
    n_docs = len(doc_ids)
    best = np.full((len(queries), n_docs), -np.inf)
    for w, d in enumerate(window_doc):
        best[:, d] = np.maximum(best[:, d], cos[:, w])
    best = best.astype(np.float32)
    rank = np.argsort(np.argsort(doc_ids, kind="stable"))  # each id's place in id order
    order = np.array([np.lexsort((-rank, -row)) for row in best])[:, : min(k, n_docs)]
    return np.take_along_axis(best, order, 1), order


@st.composite
def corpora(draw):
    """Small integer vectors from a small pool, so windows repeat within and across documents (ties);
    1–30 documents of 1–5 windows each, windows shuffled; k up to n_docs + 3."""
    d = draw(st.integers(2, 4))
    entry = st.integers(-2, 2)
    vector = st.lists(entry, min_size=d, max_size=d).filter(any)
    pool = draw(st.lists(vector, min_size=1, max_size=6))
    counts = draw(st.lists(st.integers(1, 5), min_size=1, max_size=30))
    window_doc = np.repeat(np.arange(len(counts)), counts)
    windows = np.array([pool[draw(st.integers(0, len(pool) - 1))] for _ in window_doc], dtype=np.float32)
    shuffle = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(len(window_doc))
    queries = np.array(draw(st.lists(vector, min_size=1, max_size=4)), dtype=np.float32)
    k = draw(st.integers(1, len(counts) + 3))
    ids = draw(st.one_of(st.none(), st.permutations([f"d{i:02d}" for i in range(len(counts))])))
    return queries, windows[shuffle], window_doc[shuffle], k, ids


@settings(max_examples=300, deadline=None)
@given(corpora())
def test_maxsim_equals_brute_force(case):
    queries, windows, window_doc, k, ids = case
    scores, indices = maxsim_search(queries, windows, window_doc, k, doc_ids=ids)
    expected_scores, expected = _brute_force(
        queries, windows, window_doc, k, ids or [f"{i:03d}" for i in range(window_doc.max() + 1)]
    )
    assert scores.dtype == np.float32 and indices.dtype == np.int64
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_array_equal(scores, expected_scores)


def test_deepens_past_a_document_with_many_windows():
    """Document 0 has 200 windows all above every other document's: the first window depth holds only
    document 0, so the search must go deeper to find the others (a search stopping at the first depth fails)."""
    rng = np.random.default_rng(0)
    q = np.array([[1.0, 0.0, 0.0]])
    close = np.array([1.0, 0.05, 0.0]) + 0.01 * rng.standard_normal((200, 3))
    far = np.array([0.5, 1.0, 0.0]) + 0.3 * rng.standard_normal((100, 3))
    windows = np.concatenate([close, far])
    window_doc = np.concatenate([np.zeros(200, dtype=np.int64), np.arange(1, 101)])
    shuffle = rng.permutation(len(windows))
    ids = [f"d{i:03d}" for i in range(101)]
    for k in (1, 3, 10, 101):
        scores, indices = maxsim_search(q, windows[shuffle], window_doc[shuffle], k, doc_ids=ids)
        expected_scores, expected = _brute_force(q, windows, window_doc, k, ids)
        np.testing.assert_array_equal(indices, expected)
        np.testing.assert_array_equal(scores, expected_scores)


def test_one_window_per_document_is_exact_search():
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((40, 8))
    docs[7] = docs[3]  # a tie, broken by id
    q = torch.tensor(rng.standard_normal((5, 8)), dtype=torch.bfloat16)
    ids = [f"x{int(i)}" for i in rng.permutation(40)]
    order = rng.permutation(40)  # windows in another order than the documents
    built = ExactIndex(docs[order])  # an index built once serves many calls
    for k in (1, 10, 40, 45):
        got = maxsim_search(q, docs[order] if k % 2 else built, order, k, doc_ids=ids)
        want = ExactIndex(docs, ids=ids).search(q, k)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
    assert got[1].shape == (5, 40)


@pytest.mark.parametrize(
    ("window_doc", "ids", "message"),
    [
        ([0, 0, 2, 2], None, "no window"),  # document 1 has none
        ([0, 1, 1, 1], ["a", "b", "c"], "no window"),  # the last document has none
        ([0, -1, 1, 1], None, "0 … 1"),
        ([0, 1, 1], None, "expected shape"),
        ([[0, 1], [1, 0]], None, "expected shape"),
        ([0.0, 1.0, 1.0, 0.0], None, "integer"),
        ([0, 1, 5, 1], ["a", "b"], "0 … 1"),
    ],
)
def test_bad_window_doc_refused(window_doc, ids, message):
    windows = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match=f"window_doc: .*{message}"):
        maxsim_search(windows[:1], windows, window_doc, 2, doc_ids=ids)


def test_bad_k_and_queries_refused():
    windows = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="k must be at least 1"):
        maxsim_search(windows, windows, [0, 1, 2], 0)
    with pytest.raises(ValueError, match="dimension"):
        maxsim_search(np.ones((1, 4)), windows, [0, 1, 2], 1)
