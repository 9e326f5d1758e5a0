"""``obliq metrics``: one TREC run file scored against qrels (the metrics and their conventions:
:mod:`obliq.eval.metrics`)."""

from __future__ import annotations

import logging
from pathlib import Path

from obliq.eval.metrics import DEFAULT_MEASURES, check_run, check_run_depth, cutoff, evaluate_run, parse_measures
from obliq.search.runs import read_ranking
from obliq.tasks import read_qrels

log = logging.getLogger(__name__)


def score_files(
    qrels: Path,
    run: Path,
    measures: str = ",".join(DEFAULT_MEASURES),
    per_query: bool = False,
    whole_ranking: bool = False,
) -> dict:
    """Score a TREC run file against qrels with trec_eval's conventions.

    Args:
        qrels: relevance judgements, BEIR TSV (``query-id corpus-id score``, header optional) or
            TREC qrels (``qid 0 docid grade``).
        run: a TREC run file (``qid Q0 docid rank score tag``), or mteb's saved predictions of one
            task (:func:`obliq.search.runs.read_mteb_predictions`).
        measures: comma-separated measure names, e.g. ``NDCG@10,Recall@100``.
        per_query: also return each query's values.
        whole_ranking: the run is each query's whole ranking (every document its system returns, or
            the whole corpus): a measure that cuts deeper than the run is then scored as trec_eval scores
            the run as given, and listed in ``deeper_than_run``. Without it such a measure is refused
            (:func:`~obliq.eval.metrics.check_run_depth`, the rule ``obliq evaluate`` and ``obliq compare`` apply).

    Returns:
        ``{"metrics": {name: mean}, "n_queries": …, "n_excluded": …, "run_depth": …,
        "deeper_than_run": […], "run_queries_not_in_qrels": …, "qrels_queries_not_in_run": …}`` (+
        ``"per_query"``). Queries of the qrels that the run lacks score 0 (trec_eval ``-c``); run
        queries without judgements are ignored and counted. ``run_depth`` is the run's deepest ranking.

    Raises:
        ValueError: a bad measure name or cut-off (before any file is read); the qrels hold no judgement;
            the run has no line, or none of its queries is in the qrels (a wrong pair of files); a
            measure cuts deeper than the run without ``whole_ranking``.
    """
    parsed = parse_measures(measures)  # before any file is read
    judged = read_qrels(qrels)
    ranked = check_run(read_ranking(run), judged, run, qrels)
    depth = check_run_depth(parsed, ranked, run, whole_ranking)
    ev = evaluate_run(judged, ranked, parsed)
    out: dict = {
        "metrics": ev.aggregate,
        "n_queries": ev.n_queries,
        "n_excluded": ev.n_excluded,
        "run_depth": depth,
        "deeper_than_run": sorted(name for name, m in parsed.items() if (cutoff(m) or 0) > depth),
        "run_queries_not_in_qrels": len(ranked.keys() - judged.keys()),
        "qrels_queries_not_in_run": len(judged.keys() - ranked.keys()),
    }
    for key in ("run_queries_not_in_qrels", "qrels_queries_not_in_run"):
        if out[key]:
            log.warning("%s: %d %s", run, out[key], key.replace("_", " "))
    if per_query:
        out["per_query"] = ev.per_query
    return out
