"""Exact search: faiss against brute-force numpy, k beyond the corpus, C13 (non-unit and bf16 vectors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from obliq.search.exact import ExactIndex, unit_float32


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_search_equals_brute_force_numpy():
    rng = np.random.default_rng(0)
    q, docs = _unit(rng, 50, 64), _unit(rng, 500, 64)
    scores, idx = ExactIndex(docs).search(q, k=20)
    sims = q.astype(np.float64) @ docs.astype(np.float64).T
    expected = np.argsort(-sims, axis=1, kind="stable")[:, :20]
    assert scores.shape == idx.shape == (50, 20) and idx.dtype == np.int64 and scores.dtype == np.float32
    np.testing.assert_array_equal(idx, expected)  # continuous random scores: no ties
    np.testing.assert_allclose(scores, np.take_along_axis(sims, expected, axis=1), atol=1e-5)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_k_larger_than_corpus_returns_every_doc_without_padding():
    rng = np.random.default_rng(1)
    q, docs = _unit(rng, 3, 8), _unit(rng, 5, 8)
    scores, idx = ExactIndex(docs).search(q, k=1000)
    assert idx.shape == (3, 5) and (idx >= 0).all()
    assert all(sorted(row) == [0, 1, 2, 3, 4] for row in idx.tolist())
    index = ExactIndex(docs)
    assert index.search(q, 2)[1].shape == (3, 2)  # the index is reusable with any k


def test_c13_vectors_are_renormalised_before_inner_product():
    q = np.array([[1.0, 0.0]])
    docs = np.array([[10.0, 10.0], [1.0, 0.1], [0.0, 1.0]])  # a, b, c
    assert (q @ docs.T).argsort()[0, ::-1].tolist() == [0, 1, 2]  # raw inner product: a, b, c (wrong)
    scores, idx = ExactIndex(docs).search(q, k=3)
    assert idx[0].tolist() == [1, 0, 2]  # b, a, c
    np.testing.assert_allclose(scores[0], [0.995037, 0.707107, 0.0], atol=1e-6)


def test_bf16_vectors_are_renormalised_in_float32():
    rng = np.random.default_rng(2)
    x = torch.from_numpy(_unit(rng, 64, 4096)).to(torch.bfloat16)
    raw_norms = x.float().norm(dim=1)
    assert (raw_norms - 1).abs().max() > 1e-5  # bf16 storage is off unit length
    v = unit_float32(x)
    assert v.dtype == np.float32 and np.abs(np.linalg.norm(v, axis=1) - 1).max() <= 1e-6
    scores, idx = ExactIndex(x).search(x[:4], k=1)
    assert idx[:, 0].tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)


def test_bad_vectors_are_rejected_with_a_reason():
    with pytest.raises(ValueError, match="row 1 is all zeros"):
        ExactIndex(np.array([[1.0, 0.0], [0.0, 0.0]])).search(np.ones((1, 2)), k=1)
    with pytest.raises(ValueError, match="NaN"):
        ExactIndex(np.ones((2, 2))).search(np.array([[np.nan, 1.0]]), k=1)
    with pytest.raises(ValueError, match="dimension 3, docs 2"):
        ExactIndex(np.ones((2, 2))).search(np.ones((1, 3)), k=1)
    with pytest.raises(ValueError, match="2-D"):
        ExactIndex(np.ones((2, 2))).search(np.ones(2), k=1)
    with pytest.raises(ValueError, match="k must be at least 1"):
        ExactIndex(np.ones((2, 2))).search(np.ones((1, 2)), k=0)
    # the norm is taken in float64: a float32 row of length 2e20 has a direction; a float64 one of 2e200 is refused
    np.testing.assert_array_equal(unit_float32(np.full((1, 4), 1e20, dtype=np.float32)), np.full((1, 4), 0.5))
    with np.errstate(over="ignore"), pytest.raises(ValueError, match="too long"):
        unit_float32(np.full((1, 4), 1e200))
