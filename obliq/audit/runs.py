"""Retrieval for the audit and the per-query values it tests, through obliq.eval's pieces.

A model is whatever ``evaluate`` accepts (:func:`obliq.search.retrieval.make_retriever`): ``bm25``,
an alias, folder, adapter or hub id (with the same corpus-embedding cache as ``evaluate``), or a
TREC run file (``*.trec``, e.g. produced on a GPU machine), read as it is.

Per-query values come from :func:`obliq.eval.metrics.evaluate_run` (trec_eval through ir_measures:
``RR@10`` is 1/rank of the first relevant document within the top 10, else 0) and from
:func:`obliq.audit.lean.lean_at_k`.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Sequence

from obliq.audit.inputs import GOLD
from obliq.audit.lean import lean_at_k
from obliq.eval.metrics import evaluate_run, parse_measures
from obliq.search.retrieval import make_retriever
from obliq.search.runs import Run
from obliq.search.settings import RetrievalSettings
from obliq.tasks import Task

log = logging.getLogger(__name__)


def model_run(model: str, task: Task, retrieval: RetrievalSettings) -> Run:
    """Retrieve the task's queries with one model (:func:`obliq.search.retrieval.make_retriever`).

    Returns:
        query id → document id → score, ``retrieval.top_k`` documents per query (a run file: as written).

    Raises:
        as :func:`obliq.search.encoders.load_encoder` and :func:`obliq.search.runs.read_run`.
    """
    retrieve = make_retriever(model, retrieval)
    run = retrieve(task).run
    del retrieve  # a dense model's weights: freed before the next model loads
    gc.collect()
    return run


def query_values(
    run: Run,
    task: Task,
    measures: Sequence[str],
    lean: dict[str, float] | None = None,
    lean_k: Sequence[int] = (10,),
    lean_relevant_only: bool = False,
) -> dict[str, dict[str, float]]:
    """Per-query values of every measure and lean@k.

    Args:
        run: the model's run.
        task: the audited task (gold judgements in ``qrels["test"]``).
        measures: trec_eval measures (``RR@10``, ``Recall@100``, ``RR`` …).
        lean: document leans; None skips lean@k.
        lean_k: cut-offs of lean@k, each reported as ``lean@<k>``.
        lean_relevant_only: lean@k over relevant top-k documents only (the paper's gold filter).

    Returns:
        metric name → query id → value; NaN where undefined (a query without relevant documents for
        the measures, a query without a counted document for lean@k).
    """
    measures = list(parse_measures(measures))  # two spellings of one measure: the first kept
    ev = evaluate_run(task.qrels[GOLD], run, measures, task.query_ids)
    out = {m: {q: ev.per_query[q][m] if q in ev.per_query else math.nan for q in task.query_ids} for m in measures}
    if lean is not None:
        qrels = task.qrels[GOLD] if lean_relevant_only else None
        for k in lean_k:
            out[f"lean@{k}"] = lean_at_k(run, lean, k, task.query_ids, qrels)
    return out
