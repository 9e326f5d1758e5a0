"""Candidate sets (``Task.candidates``, mteb's ``top_ranked``): each query ranked over its own candidates
only (see :mod:`obliq.search.retrieval`'s notes), by exact scores, in trec_eval's order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from obliq.search.exact import ranked
from obliq.tasks import Task


def candidate_rows(task: Task) -> list[np.ndarray] | None:
    """Each query's candidate set as row indices into ``task.doc_ids`` (in ``task.query_ids`` order; a
    query without candidates gets none), or None when the task ranks over the whole corpus."""
    if task.candidates is None:
        return None
    row = {d: i for i, d in enumerate(task.doc_ids)}
    return [np.array([row[d] for d in task.candidates.get(q, ())], dtype=np.int64) for q in task.query_ids]


def best_candidates(scores: np.ndarray, rows: np.ndarray, k: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of one query's scored candidates, in trec_eval's order
    (:func:`obliq.search.exact.ranked`), cut after the order is decided.

    Args:
        scores: (n,) scores of the candidates.
        rows: (n,) their row indices into the task's documents.
        k: how many to keep.
        keys: :func:`obliq.search.exact.tie_keys` of the task's document ids: equal scores are ordered by
            document id, descending, so which tied candidates pass the cut never depends on file order.

    Returns:
        ``(scores, rows)`` of at most ``k`` candidates.
    """
    scores, rows = ranked(scores, rows, keys)
    return scores[:k], rows[:k]


def candidate_scores(queries: np.ndarray, docs: np.ndarray, rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Exact inner products of each query with its candidates.

    Args:
        queries: (n_queries, d) float32 unit vectors; docs: (n_docs, d) float32 unit vectors.
        rows: per query, its candidates' row indices into ``docs``.

    Returns:
        Per query, (len(rows[i]),) float32 scores. Blocks of queries whose candidates are most of the
        corpus (OBLIQ-Bench: all but 1–3 documents) take one matrix product against the corpus and
        pick their candidates from it (at d = 3072, 10k documents: ~0.6 ms a query against ~37 ms
        for gathering each query's candidate rows); sparse candidate sets gather their rows alone.
    """
    n = len(docs)
    step = max(1, (1 << 24) // max(n, 1))  # a block's score matrix stays under 64 MB
    out: list[np.ndarray] = []
    for start in range(0, len(rows), step):
        block = rows[start : start + step]
        if sum(len(r) for r in block) * 8 >= len(block) * n:
            full = queries[start : start + len(block)] @ docs.T
            out += [full[j, r] for j, r in enumerate(block)]
        else:
            out += [docs[r] @ queries[start + j] for j, r in enumerate(block)]
    return out
