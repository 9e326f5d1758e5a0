"""``obliq compare``: two runs on one qrels file, per query (the one statistics path:
:mod:`obliq.eval.significance`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from obliq.eval.metrics import check_run, check_run_depth, evaluate_run, parse_measures
from obliq.eval.significance import BOOTSTRAP_RESAMPLES, PERMUTATIONS, TIE, check_resamples, compare
from obliq.search.runs import read_ranking
from obliq.tasks import read_qrels


def compare_files(
    run_a: Path,
    run_b: Path,
    qrels: Path,
    measure: str = "NDCG@10",
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
    tie: float = TIE,
    task: str | None = None,
    subset: str | None = None,
    split: str | None = None,
    missing: Literal["refuse", "zero", "drop"] = "refuse",
    whole_ranking: bool = False,
) -> dict:
    """Run B against run A on one qrels file: mean difference, its paired-bootstrap interval and the
    sign-flip test's p-value with its method and n (the statistics: :mod:`obliq.eval.significance`).

    Both runs are scored per query with :func:`obliq.eval.metrics.evaluate_run` (trec_eval's
    conventions; queries without relevant documents excluded). A judged query that one run holds no
    result for is refused by default: a run that misses most queries would look "significantly" worse.
    ``missing`` says what to do instead, and the result names the queries compared and those missing.
    A run is a TREC run file, an obliq output folder or mteb's saved predictions (``<task>_predictions.json``
    or the prediction folder, :func:`obliq.search.runs.read_mteb_predictions`): two models evaluated by mteb
    are compared per query, which mteb itself does not offer.

    Args:
        run_a: the baseline: a TREC run file, an ``obliq evaluate`` / ``obliq encode`` output folder (its
            ``run.trec``, or ``<task>/run.trec``), or mteb predictions (file or folder).
        run_b: the system: likewise.
        qrels: relevance judgements (BEIR TSV or TREC qrels; for an mteb task, the ``qrels/test.tsv``
            that ``obliq task from-mteb`` wrote).
        measure: the per-query measure compared.
        resamples: bootstrap draws of the interval.
        permutations: Monte Carlo sign patterns when the test cannot be exact.
        seed: random seed.
        tie: per-query differences within this count as ties.
        task: for output or mteb prediction folders holding several tasks: which (a folder without it refused).
        subset / split: for mteb predictions holding several: which (default: the only one).
        missing: judged queries a run holds nothing for: ``refuse`` (the default), ``zero`` (they score
            0, trec_eval ``-c``) or ``drop`` (compare only the queries both runs hold).
        whole_ranking: each run is each query's whole ranking (every document its system returns, or the
            whole corpus): a measure that cuts deeper than a run is then scored as trec_eval scores the run
            as given. Without it such a measure is refused, as ``obliq metrics`` and ``obliq evaluate``
            refuse it (:func:`obliq.eval.metrics.check_run_depth`).

    Returns:
        The :class:`~obliq.eval.significance.Comparison` as a dict (differences are B − A), with ``p_text``,
        ``missing``, ``whole_ranking``, ``queries_compared`` and, per run, the judged queries it has no result
        for (``missing_from_a``, ``missing_from_b``).

    Raises:
        ValueError: before any file is read: a bad measure name or cut-off
            (:func:`obliq.eval.metrics.parse_measures`), ``resamples`` or ``permutations`` outside 1 …
            :data:`~obliq.eval.significance.MAX_RESAMPLES`; then a run that is empty or holds no query of the
            qrels (a run of another task: :func:`obliq.eval.metrics.check_run`); a measure that cuts deeper
            than a run without ``whole_ranking``; judged queries a run lacks with ``missing="refuse"``.
    """
    parse_measures([measure])
    check_resamples("resamples", resamples)
    check_resamples("permutations", permutations)
    if missing not in ("refuse", "zero", "drop"):
        raise ValueError(f"missing: 'refuse', 'zero' or 'drop', got {missing!r}")
    judged = read_qrels(qrels)
    rankings = [check_run(read_ranking(run, task, subset, split), judged, run, qrels) for run in (run_a, run_b)]
    for run, ranked in zip((run_a, run_b), rankings):  # both runs read and checked before either is scored
        check_run_depth([measure], ranked, run, whole_ranking)
    values, lacking = [], []
    for ranked in rankings:
        ev = evaluate_run(judged, ranked, [measure])
        values.append({q: v[measure] for q, v in ev.per_query.items()})
        lacking.append(sorted(q for q in ev.per_query if not ranked.get(q)))
    n = len(values[0])
    if any(lacking) and missing == "refuse":
        said = "; ".join(
            f"{run} has no result for {len(lack)} of the {n} judged queries (e.g. {lack[0]!r})"
            for run, lack in zip((run_a, run_b), lacking)
            if lack
        )
        raise ValueError(
            f"{said}: pass --missing zero to score them 0 (trec_eval -c) or --missing drop to compare only the "
            "queries both runs hold"
        )
    if missing == "drop":
        keep = set(values[0]) - set(lacking[0]) - set(lacking[1])
        if not keep:
            raise ValueError(f"{run_a} and {run_b} hold no judged query in common")
        values = [{q: v for q, v in vals.items() if q in keep} for vals in values]
    out = compare(values[0], values[1], measure, resamples, permutations, seed, tie).as_dict()
    out.update(
        missing=missing,
        queries_compared=len(values[0]),
        missing_from_a=lacking[0],
        missing_from_b=lacking[1],
        whole_ranking=whole_ranking,
    )
    return out
