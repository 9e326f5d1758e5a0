"""lean@k: the mean lean label of the documents a query retrieves (the identity-signals paper §2.2).

A query's lean@k is the mean lean (e.g. −1 left, 0 centre, +1 right) over the documents of its top k
that carry a lean label. The paper's "gold-filtered" variant (its Figure 2, Tables 6–8) keeps only
the top-k documents judged relevant to the query (``qrels`` grade ≥ 1): ``relevant_only``.
A query with no such document has no lean@k (NaN) and drops out of the means and tests.

Ranking order is trec_eval's, as in :mod:`obliq.eval.metrics`: score descending, then document id
descending.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from obliq.search.runs import Run, top_k
from obliq.tasks import Qrels


def lean_at_k(
    run: Run,
    lean: dict[str, float],
    k: int = 10,
    query_ids: Iterable[str] | None = None,
    qrels: Qrels | None = None,
) -> dict[str, float]:
    """lean@k of every query.

    Args:
        run: query id → document id → score.
        lean: document id → lean (a finite number); documents without one are skipped.
        k: the cut-off (the paper: 10; its k-sweep 5…100).
        query_ids: the queries (default: the run's); a query missing from the run gets NaN.
        qrels: when given, only top-k documents with a grade ≥ 1 for the query count (the paper's
            gold filter).

    Returns:
        query id → lean@k (same unit as the labels), NaN where no top-k document counts.

    Raises:
        ValueError: k < 1.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    out = {}
    for q in run if query_ids is None else query_ids:
        docs = top_k(run.get(q, {}), k)
        if qrels is not None:
            judged = qrels.get(q, {})
            docs = [d for d in docs if judged.get(d, 0) >= 1]
        labels = [lean[d] for d in docs if d in lean]
        out[q] = sum(labels) / len(labels) if labels else math.nan
    return out
