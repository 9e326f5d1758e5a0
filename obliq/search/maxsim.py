"""Exact MaxSim search over document windows (issue 55 §1, search (b)).

A long document is encoded as several token windows, one vector each; the score of a (query, document)
pair is the best cosine over the document's windows — MaxSim, as ColBERT scores a query's tokens against
a document's token set (Khattab & Zaharia, 2020) and Tevatron PR #229 scores a document's chunk set
(chunked MaxSim). The windows are searched with :class:`obliq.search.exact.ExactIndex` (float64-rescored,
tie-safe), reduced to documents, and searched deeper until no document left out could still reach the
``k``-th document's score, so the result equals brute force over every window of every document.
"""

from __future__ import annotations

import numpy as np

from obliq.search.exact import ExactIndex, ranked, tie_keys
from obliq.windows import check_window_doc


def _best_per_doc(scores: np.ndarray, windows: np.ndarray, window_doc: np.ndarray, keys: np.ndarray):
    """Each row's windows (best first) reduced to documents: a document's score is its first (best)
    window's. Returns ``(scores, docs)`` in trec_eval's order (:func:`ranked`), ``-1`` / ``-inf`` padding
    after the distinct documents, and the number of distinct documents of each row."""
    docs = window_doc[windows]
    order = np.argsort(docs, axis=1, kind="stable")  # stable: within a document, its best window first
    docs, scores = np.take_along_axis(docs, order, 1), np.take_along_axis(scores, order, 1)
    first = np.ones(docs.shape, dtype=bool)
    first[:, 1:] = docs[:, 1:] != docs[:, :-1]
    out_scores, out_docs = ranked(np.where(first, scores, -np.inf), np.where(first, docs, -1), keys)
    return out_scores, out_docs, first.sum(1)


def maxsim_search(queries, windows, window_doc, k: int, doc_ids=None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best documents of each query by MaxSim over the documents' windows, exactly.

    The score of (query, document) is the maximum over the document's windows of the cosine (MaxSim:
    ColBERT, Khattab & Zaharia, 2020, over token sets; Tevatron PR #229 over chunk sets). The windows are
    searched with :class:`~obliq.search.exact.ExactIndex` at a window depth (first ``min(W, 2·k·W/n_docs
    + 16)``), reduced to documents (the best window found of each), and each query is searched again
    twice as deep until at least ``k`` distinct documents are found and the deepest window returned
    scores strictly below the ``k``-th document's score (no document left out can reach or tie it), or
    every window was returned. Documents are ordered by :func:`~obliq.search.exact.ranked` with
    :func:`~obliq.search.exact.tie_keys` (score descending, then document id descending: trec_eval's
    order), so the top ``k`` is a prefix of any deeper top ``k``.

    Args:
        queries: (n_queries, d) vectors, any float dtype, numpy or torch (unit-normalised in float32 as
            :meth:`ExactIndex.search <obliq.search.exact.ExactIndex.search>` does).
        windows: (W, d) vectors of every document's windows, any float dtype (made unit float32:
            :meth:`Corpus.from_array <obliq.search.exact.Corpus.from_array>`), or a
            :class:`~obliq.search.exact.Corpus` of them (e.g. a store's, truncated by its ``dim``), or an
            :class:`~obliq.search.exact.ExactIndex` over them (built once for many calls, e.g. one query at
            a time).
        window_doc: (W,) integer document row of each window, in ``0 … n_docs - 1``; every document has
            at least one window; one document's windows need not be contiguous.
        k: documents wanted; more than ``n_docs`` returns all ``n_docs``.
        doc_ids: the documents' ids, one per document row, which break ties; None: the row stands for
            the id (and ``n_docs`` is ``max(window_doc) + 1``).

    Returns:
        ``(scores, indices)``: (n_queries, min(k, n_docs)) float32 — each document's best window's
        cosine, computed in float64 and rounded to float32 once — and int64 document rows.

    Raises:
        ValueError: ``k`` < 1; ``window_doc`` of another length than the windows, not integers, out of
            range, or leaving a document with no window; ``doc_ids`` of another length than
            ``n_docs``; bad vectors (see :func:`~obliq.search.exact.unit_float32`, a dimension mismatch).
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    index = windows if isinstance(windows, ExactIndex) else ExactIndex(windows)
    n_windows = index.n_docs
    window_doc, n_docs = check_window_doc(window_doc, n_windows, None if doc_ids is None else len(doc_ids))
    keys = tie_keys(doc_ids, n_docs)
    if hasattr(queries, "detach"):  # a torch tensor: as unit_float32 reads it, so rows can be taken
        queries = queries.detach().float().cpu().numpy()
    queries = np.asarray(queries)
    index.corpus.prepare(queries)  # refuse bad queries before any search
    k = min(k, n_docs)
    scores = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    pending = np.arange(len(queries))
    depth = min(n_windows, 2 * k * -(-n_windows // n_docs) + 16)
    while len(pending):
        window_scores, found = index.search(queries[pending], depth)
        doc_scores, docs, distinct = _best_per_doc(window_scores, found, window_doc, keys)
        # complete: k documents found, and no window left out (all score ≤ the deepest) reaches the k-th
        done = (depth == n_windows) | ((distinct >= k) & (window_scores[:, -1] < doc_scores[:, k - 1]))
        scores[pending[done]], indices[pending[done]] = doc_scores[done, :k], docs[done, :k]
        pending, depth = pending[~done], min(n_windows, 2 * depth)
    return scores, indices
