"""Retrieval for the audit and the per-query values it tests, through obliq.eval's pieces.

A model is whatever ``evaluate.py`` accepts: ``bm25`` (:func:`obliq.eval.evaluate.retrieve_bm25`),
or an alias, folder, adapter or hub id (:func:`obliq.eval.encoders.load_encoder` +
:func:`obliq.eval.evaluate.retrieve_dense`, with the same corpus-embedding cache as ``evaluate``).
A TREC run file (``*.trec``, e.g. produced on a GPU machine) is read as it is.

Per-query values come from :func:`obliq.eval.metrics.evaluate_run` (trec_eval through ir_measures:
``RR@10`` is 1/rank of the first relevant document within the top 10, else 0) and from
:func:`obliq.audit.lean.lean_at_k`.
"""

from __future__ import annotations

import gc
import logging
import math
from pathlib import Path
from typing import Sequence

from obliq.audit.inputs import GOLD
from obliq.audit.lean import lean_at_k
from obliq.eval.bm25 import B, K1
from obliq.eval.encoders import EncoderKind, fingerprint, load_encoder
from obliq.eval.evaluate import corpus_cache_file, retrieve_bm25, retrieve_dense
from obliq.eval.metrics import Run, evaluate_run, parse_measures, read_run
from obliq.eval.tasks import Task

log = logging.getLogger(__name__)


def is_run_file(model: str) -> bool:
    """True when ``model`` names an existing ``.trec`` file."""
    return model.endswith(".trec") and Path(model).is_file()


def model_run(
    model: str,
    task: Task,
    top_k: int = 1000,
    encoder: EncoderKind = "auto",
    batch_size: int = 32,
    query_max_length: int = 256,
    passage_max_length: int = 1024,
    cache: bool = True,
    cache_dir: Path | None = None,
    bm25_k1: float = K1,
    bm25_b: float = B,
    bm25_stemmer: str | None = "english",
    trust_remote_code: bool = False,
) -> Run:
    """Retrieve the task's queries with one model (arguments as in :func:`obliq.eval.evaluate.evaluate`).

    Returns:
        query id → document id → score, ``top_k`` documents per query (a run file: as written).

    Raises:
        as :func:`obliq.eval.encoders.load_encoder` and :func:`obliq.eval.metrics.read_run`.
    """
    if model.lower() == "bm25":
        return retrieve_bm25(task, top_k, bm25_k1, bm25_b, bm25_stemmer, latency_queries=0).run
    if is_run_file(model):
        run = read_run(model)
        missing = [q for q in task.query_ids if q not in run]
        if missing:
            log.warning("%s: %d audited queries have no results (they score 0; e.g. %s)", model, len(missing), missing[0])
        return run
    from obliq.models import cache_dir as obliq_cache

    enc = load_encoder(model, encoder, query_max_length, passage_max_length, trust_remote_code)
    file = None
    if cache:
        key = f"{fingerprint(model)}|{type(enc).__name__}|{encoder}|{passage_max_length}"  # as evaluate()
        file = corpus_cache_file(Path(cache_dir) if cache_dir is not None else obliq_cache() / "embeddings", key, task)
    run = retrieve_dense(enc, task, top_k, batch_size, file, latency_queries=0).run
    del enc
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
