"""Retrieval metrics with trec_eval's conventions (``obliq metrics``: :mod:`obliq.commands.metrics`).

Scores come from trec_eval itself, through ir_measures' pytrec_eval provider (Van Gysel & de Rijke,
2018; MacAvaney et al., 2022) — never a hand-written metric. That fixes the conventions:

- NDCG@k: gain = the qrels grade (linear), discount log2(rank + 1), ideal DCG from *all* judged
  documents with grade > 0 (retrieved or not), cut at k; a document absent from the qrels is
  non-relevant (C09).
- Recall@k: relevant documents (grade ≥ 1) in the top k over all relevant documents in the qrels.
- Ranking: by score, descending; equal scores are ordered by document id, descending (trec_eval's
  tie order). The rank column of a run file is ignored, as trec_eval ignores it.

Policy for queries, stated once here and applied everywhere:

- a query with no relevant document (no grade > 0) is **excluded** from every mean and counted as
  ``n_excluded`` — its NDCG and recall are undefined;
- a query with relevant documents but no retrieved document scores 0 on every measure (trec_eval
  ``-c``), so a run cannot raise its mean by skipping hard queries;
- run queries absent from the qrels are ignored.

Candidate sets (mteb's ``top_ranked``): a query ranked over its candidates only is scored against
*all* its judgements — a relevant document outside its candidates cannot be retrieved yet counts in
its ideal DCG and its recall denominator, exactly as mteb scores it (pytrec_eval on the unfiltered
qrels; checked against mteb's ``calculate_retrieval_scores``). mteb keeps a query whose judgements are
all 0 in its means (score 0) where obliq excludes it; OBLIQ-Bench has no such query.

Runs are TREC files or mteb's saved predictions, read by :func:`obliq.search.runs.read_ranking`.

Duplicates (C08): a run listing the same document twice for a query keeps its first occurrence in
ranking order (its highest score); repeated qrels rows are read once (:func:`read_qrels`).

Cut-offs and depth, one rule for every command (refuse rather than guess):

- a cut-off is a rank, a whole number ≥ 1 (trec_eval's ``ndcg_cut.k``): ``NDCG@0``, ``NDCG@2.5`` or
  ``Recall@-1`` is refused when the measure is parsed (:func:`parse_measures`), before any file is read
  or any document retrieved (trec_eval would abort the process once the run is scored);
- a measure cut at k is computed on a ranking only when the ranking reaches ``min(k, corpus size)``
  (:func:`check_depth`). ``obliq evaluate`` knows both (``retrieval.top_k`` or a run file's depth, and
  the task's corpus); ``obliq metrics`` and ``obliq compare`` know only the run, so a cut-off deeper
  than the run is refused unless ``--whole_ranking true`` says the run is each query's whole ranking
  (:func:`check_run_depth`): trec_eval then scores it as given.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from obliq.search.runs import Run
from obliq.tasks import Qrels

DEFAULT_MEASURES = ("NDCG@10", "NDCG@50", "Recall@10", "Recall@50", "Recall@100", "Recall@1000")
"""The OBLIQ-Bench panel (the OBLIQ-IR paper §4) plus Recall@1000 (§6.1)."""

RECALL_CURVE_K = (10, 20, 50, 100, 200, 500, 1000)
"""Cut-offs of the Recall@k curve (the paper's Table 6 spans k = 10…1000)."""


def parse_measures(names: str | Iterable[str]) -> dict[str, object]:
    """Map measure names to ir_measures measures, keeping the caller's spelling as the key.

    ``NDCG@k`` and ``Recall@k`` are accepted (as are ir_measures' own names: ``nDCG@10``, ``R@100``,
    ``RR``, ``P@5``, ``AP``…). A comma-separated string is split. A cut-off ``k`` is a rank, a whole
    number ≥ 1 written in decimal digits (trec_eval's ``-m ndcg_cut.k``, ``P.k``): ``NDCG@0``,
    ``NDCG@2.5`` and ``Recall@-1`` are refused here, where trec_eval itself would abort the process
    only once the run is scored (pytrec_eval asserts on a cut-off below 1, after all retrieval work).

    Raises:
        ValueError: an unknown measure name, a cut-off that is not a rank, or a measure trec_eval does
            not compute; the message names the measure.
    """
    import ir_measures

    if isinstance(names, str):
        names = [n for n in (s.strip() for s in names.split(",")) if n]
    out = {}
    for name in names:
        _check_cutoff(name)
        try:
            out[name] = ir_measures.parse_measure(name)
        except (ValueError, NameError, SyntaxError, TypeError) as e:
            raise ValueError(f"unknown measure {name!r} ({e}); try NDCG@10, Recall@100, RR, P@10") from None
        if not ir_measures.pytrec_eval.supports(_trec_eval_measure(out[name])):
            raise ValueError(
                f"measure {name!r} is not computed by trec_eval (pytrec_eval); "
                "try NDCG@10, Recall@100, RR, RR@10, P@10, AP"
            )
        if list(out.values()).count(out[name]) > 1:  # NDCG@10 and nDCG@10: keep the first spelling
            del out[name]
    if not out:
        raise ValueError("no measure given")
    return out


def cutoff(measure) -> int | None:
    """The rank cut-off of a parsed measure (``NDCG@10`` → 10), or None for a whole-ranking measure."""
    value = measure.params.get("cutoff") if hasattr(measure, "params") else None
    return int(value) if value is not None else None


MAX_CUTOFF = 2**31 - 1
"""The deepest cut-off accepted (beyond a 64-bit integer, pytrec_eval names the measure by another cut)."""


def _check_cutoff(name: str) -> None:
    """Refuse ``name`` when it has a cut-off (``…@k``) that is not a whole number in 1 … :data:`MAX_CUTOFF`
    written in decimal digits, no leading zero (ir_measures reads ``@010`` as an octal literal and refuses it)."""
    head, at, cut = str(name).rpartition("@")
    if at and not (re.fullmatch(r"[1-9][0-9]*", cut.strip()) and 1 <= int(cut) <= MAX_CUTOFF):
        raise ValueError(
            f"measure {name!r}: the cut-off {cut.strip()!r} is not a rank (a whole number of documents from 1 to "
            f"{MAX_CUTOFF:,}, as trec_eval cuts a ranking); try {head.strip() or 'NDCG'}@10"
        )


def check_depth(
    measures: str | Iterable[str],
    depth: int,
    n_docs: int | None,
    what: str = "retrieval.top_k",
    fix: str | None = None,
) -> None:
    """Refuse a measure that cuts deeper than the ranking it is computed on: the one depth rule of
    ``obliq evaluate``, ``obliq metrics``, ``obliq compare``, the audit and the training callback.

    A ranking ``depth`` documents deep measures a cut-off ``k`` only when ``depth ≥ min(k, n_docs)``:
    Recall@1000 of a top-100 run is not Recall@1000 (relevant documents at ranks 101…1000 would
    count as missing), unless the corpus has at most 100 documents and the ranking is complete. Where
    the corpus is unknown (``n_docs`` None: a run file scored alone), every cut-off needs ``depth ≥ k``;
    a caller told that the run is each query's whole ranking (``--whole_ranking true``) skips the check.

    Args:
        measures: names, see :func:`parse_measures`.
        depth: documents ranked per query (for a run, its deepest query's).
        n_docs: documents each query is ranked over (the corpus, or the largest candidate set); None: unknown.
        what: the setting or file that set the depth, as the message names it.
        fix: what the message suggests (default: raise ``what``).

    Raises:
        ValueError: the first such measure, naming it, the depth and how to fix it.
    """
    for name, measure in parse_measures(measures).items():
        k = cutoff(measure)
        need = k if k is None or n_docs is None else min(k, n_docs)
        if k is not None and depth < need:
            held = f"{what}={depth}" + (" documents per query" if n_docs is None else f" of {n_docs} documents")
            raise ValueError(
                f"measure {name} cuts at {k} but the ranking holds {held}: "
                f"{fix or f'raise {what} to {need}'} or leave {name} out"
            )


def check_run_depth(measures: str | Iterable[str], run: Run, path: object, whole_ranking: bool = False) -> int:
    """The depth of ``run`` (its deepest query's ranking), once :func:`check_depth` allows ``measures``
    on it: the corpus is unknown, so a cut-off deeper than the run is refused unless ``whole_ranking``
    says the run is each query's whole ranking (every document its system returns, or its whole corpus).

    Raises:
        ValueError: a measure cuts deeper than the run (named, with the file).
    """
    depth = max((len(docs) for docs in run.values()), default=0)
    if not whole_ranking:
        check_depth(
            measures,
            depth,
            None,
            f"the depth of {path}",
            f"rank deeper, pass --whole_ranking true if {path} holds each query's whole ranking (every document "
            "its system returns, or the whole corpus),",
        )
    return depth


def _rr_cutoff(measure) -> int | None:
    return int(measure["cutoff"]) if measure.NAME == "RR" and measure.params.get("cutoff") is not None else None


def _trec_eval_measure(measure):
    """What trec_eval computes for ``measure``: ``RR@k`` → ``RR`` (trec_eval's ``recip_rank`` has no
    cut-off, and ir_measures' pytrec_eval provider would return the uncut value for ``RR@k``)."""
    import ir_measures

    return ir_measures.parse_measure("RR") if _rr_cutoff(measure) is not None else measure


@dataclass
class Evaluation:
    """The result of :func:`evaluate_run`."""

    per_query: dict[str, dict[str, float]]
    """evaluated query id → measure name → value (queries with relevant docs only)."""
    aggregate: dict[str, float]
    """measure name → mean over the evaluated queries (NaN when none)."""
    n_queries: int
    """Queries evaluated: those with at least one relevant document."""
    n_excluded: int
    """Queries without a relevant document, left out of the means."""


def evaluate_run(
    qrels: Qrels,
    run: Run,
    measures: str | Iterable[str] = DEFAULT_MEASURES,
    query_ids: Iterable[str] | None = None,
) -> Evaluation:
    """Score a run against qrels with trec_eval (via ir_measures / pytrec_eval).

    Args:
        qrels: query id → doc id → integer grade.
        run: query id → doc id → score.
        measures: names, see :func:`parse_measures`.
        query_ids: the query set; default the qrels' queries. A listed query without relevant
            documents counts in ``n_excluded``.

    Returns:
        Per-query values and means, following the policy in the module docstring.

    Raises:
        ValueError: an unknown measure.
    """
    import ir_measures

    parsed = parse_measures(measures)
    query_ids = list(dict.fromkeys(query_ids)) if query_ids is not None else list(qrels)
    judged = {q: {d: int(g) for d, g in qrels[q].items()} for q in query_ids if q in qrels}
    evaluated = [q for q in query_ids if any(g > 0 for g in judged.get(q, {}).values())]
    per_query = {q: {name: 0.0 for name in parsed} for q in evaluated}
    asked = {name: _trec_eval_measure(m) for name, m in parsed.items()}
    sub_qrels = {q: judged[q] for q in evaluated}
    sub_run = {q: {d: float(s) for d, s in run[q].items()} for q in evaluated if run.get(q)}
    if sub_run:
        values: dict[str, dict] = {q: {} for q in evaluated}
        for metric in ir_measures.pytrec_eval.iter_calc(list(set(asked.values())), sub_qrels, sub_run):
            values[metric.query_id][metric.measure] = float(metric.value)
        for q, got in values.items():
            for name, measure in parsed.items():
                value = got.get(asked[name], 0.0)
                k = _rr_cutoff(measure)
                # RR@k: 1/rank of the first relevant document when that rank is ≤ k, else 0.
                per_query[q][name] = value if k is None or value * k >= 1 - 1e-9 else 0.0
    aggregate = {
        name: float(np.mean([v[name] for v in per_query.values()])) if per_query else math.nan for name in parsed
    }
    return Evaluation(per_query, aggregate, len(evaluated), len(query_ids) - len(evaluated))


def check_run(run: Run, qrels: Qrels, run_path: object, qrels_path: object) -> Run:
    """``run`` when it can be scored against ``qrels``.

    Raises:
        ValueError: the run is empty, or none of its queries is in the qrels (the run of another task);
            the message names both files.
    """
    if not run:
        raise ValueError(f"{run_path}: the run is empty (no 'qid Q0 docid rank score tag' line)")
    if not qrels.keys() & run.keys():
        raise ValueError(
            f"{run_path}: none of its {len(run)} queries is in {qrels_path} (e.g. {next(iter(run))!r} "
            f"vs {next(iter(qrels))!r}): is this the run of another task?"
        )
    return run
