"""Retrieval metrics with trec_eval's conventions, TREC run files, and the `obliq metrics` command.

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

Runs are TREC files (:func:`read_run`) or mteb's saved predictions (:func:`read_mteb_predictions`);
:func:`read_ranking` reads either.

Duplicates (C08): a run listing the same document twice for a query keeps its first occurrence in
ranking order (its highest score); repeated qrels rows are read once (:func:`read_qrels`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from obliq.files import open_text
from obliq.tasks import Qrels, check_id, read_qrels

log = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]
"""query id → document id → score (higher is better)."""

DEFAULT_MEASURES = ("NDCG@10", "NDCG@50", "Recall@10", "Recall@50", "Recall@100", "Recall@1000")
"""The OBLIQ-Bench panel (the OBLIQ-IR paper §4) plus Recall@1000 (§6.1)."""

RECALL_CURVE_K = (10, 20, 50, 100, 200, 500, 1000)
"""Cut-offs of the Recall@k curve (the paper's Table 6 spans k = 10…1000)."""


def parse_measures(names: str | Iterable[str]) -> dict[str, object]:
    """Map measure names to ir_measures measures, keeping the caller's spelling as the key.

    ``NDCG@k`` and ``Recall@k`` are accepted (as are ir_measures' own names: ``nDCG@10``, ``R@100``,
    ``RR``, ``P@5``, ``AP``…). A comma-separated string is split.

    Raises:
        ValueError: an unknown measure name, or one trec_eval does not compute.
    """
    import ir_measures

    if isinstance(names, str):
        names = [n for n in (s.strip() for s in names.split(",")) if n]
    out = {}
    for name in names:
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


def check_depth(measures: str | Iterable[str], top_k: int, n_docs: int, what: str = "retrieval.top_k") -> None:
    """Refuse a measure that cuts deeper than the ranking it is computed on.

    A ranking of ``top_k`` documents measures a cut-off ``k`` only when ``top_k ≥ min(k, n_docs)``:
    Recall@1000 of a top-100 run is not Recall@1000 (relevant documents at ranks 101…1000 would
    count as missing), unless the corpus has at most 100 documents and the ranking is complete.

    Raises:
        ValueError: the first such measure, naming it, the depth and how to fix it.
    """
    for name, measure in parse_measures(measures).items():
        k = cutoff(measure)
        if k is not None and top_k < min(k, n_docs):
            raise ValueError(
                f"measure {name} cuts at {k} but the ranking holds {what}={top_k} of {n_docs} documents: "
                f"raise {what} to {min(k, n_docs)} or leave {name} out"
            )


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


def run_from_search(query_ids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray, indices: np.ndarray) -> Run:
    """Turn search output (rows aligned with ``query_ids``; ``indices`` into ``doc_ids``) into a run.

    ``scores`` and ``indices`` may be (n_queries, k) arrays or lists of 1-D arrays of any length.
    """
    return {
        q: {doc_ids[int(i)]: float(s) for s, i in zip(row_s, row_i)}
        for q, row_s, row_i in zip(query_ids, scores, indices)
    }


def read_run(path: str | Path) -> Run:
    """Read a TREC run file (``qid Q0 docid rank score tag``, whitespace separated).

    A document listed twice for a query keeps its first occurrence in ranking order, i.e. its
    highest score (C08); the number of duplicates is logged.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line without 6 columns or with a score that is not a number (file and line named).
    """
    path = Path(path)
    run: Run = {}
    duplicates = 0
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            cols = line.split()
            if len(cols) != 6:
                raise ValueError(f"{path}:{lineno}: expected 6 columns (qid Q0 docid rank score tag), got {len(cols)}")
            qid, _, did, _, score, _ = cols
            try:
                s = float(score)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: field 'score' must be a number, got {score!r}") from None
            if math.isnan(s):
                raise ValueError(f"{path}:{lineno}: field 'score' is NaN")
            docs = run.setdefault(qid, {})
            if did in docs:
                duplicates += 1
                docs[did] = max(docs[did], s)
            else:
                docs[did] = s
    if duplicates:
        log.warning("%s: %d repeated (query, doc) lines; each document keeps its best-ranked line", path, duplicates)
    return run


def read_mteb_predictions(
    path: str | Path, task: str | None = None, subset: str | None = None, split: str | None = None
) -> Run:
    """Read mteb's saved predictions as a run.

    ``mteb.evaluate(model, tasks, prediction_folder=F)`` (or ``mteb run … --prediction-folder F``)
    writes ``F/<task>_predictions.json``: ``{"mteb_model_meta": {...}, "<subset>": {"<split>": {query
    id: {doc id: score}}}}``, each query's top 1000 (candidates, for a candidate-set task).

    Args:
        path: the predictions file, or the prediction folder.
        task: in a folder holding several tasks' files, the task (``<task>_predictions.json``).
        subset / split: which of the file's subsets and splits (default: the only one).

    Raises:
        FileNotFoundError: no such file, or a folder without the task's file.
        ValueError: not JSON of that layout; several tasks, subsets or splits and none chosen; a score
            that is not a finite number (the file and the query named).
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*_predictions.json"))
        if task is not None:
            files = [f for f in files if f.name == f"{task}_predictions.json"]
        if len(files) != 1:
            names = [f.name.removesuffix("_predictions.json") for f in sorted(path.glob("*_predictions.json"))]
            if not names or task is not None:
                raise FileNotFoundError(f"{path}: no {task or '<task>'}_predictions.json (mteb's prediction folder)")
            raise ValueError(f"{path}: predictions of several tasks {names}: name one with --task")
        path = files[0]
    if not path.is_file():
        raise FileNotFoundError(f"mteb predictions not found: {path}")
    try:
        data = json.loads(open_text(path).read())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected mteb's predictions object ({{subset: {{split: {{query: {{doc: score}}}}}}}})"
        )

    def pick(what, given, options, where):
        if given is None and len(options) == 1:
            return options[0]
        if given in options:
            return given
        raise ValueError(f"{path}: {where} holds the {what}s {options}: choose one with --{what} (got {given!r})")

    subsets = [k for k, v in data.items() if k != "mteb_model_meta" and isinstance(v, dict)]
    sub = pick("subset", subset, subsets, "the file")
    splits = [k for k, v in data[sub].items() if isinstance(v, dict)]
    chosen = data[sub][pick("split", split, splits, f"subset {sub!r}")]
    run: Run = {}
    for qid, docs in chosen.items():
        if not isinstance(docs, dict):
            raise ValueError(f"{path}: query {qid!r}: expected {{doc id: score}}, got {type(docs).__name__}")
        for did, score in docs.items():
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                raise ValueError(f"{path}: query {qid!r}, document {did!r}: score {score!r} is not a finite number")
        run[str(qid)] = {str(d): float(v) for d, v in docs.items()}
    return run


def read_ranking(path: str | Path, task: str | None = None, subset: str | None = None, split: str | None = None) -> Run:
    """A run from a TREC run file (:func:`read_run`) or from mteb's saved predictions (a
    ``*_predictions.json`` file or a prediction folder: :func:`read_mteb_predictions`)."""
    path = Path(path)
    if path.is_dir() or path.name.endswith(".json"):
        return read_mteb_predictions(path, task, subset, split)
    return read_run(path)


def top_k(docs: dict[str, float], k: int) -> list[str]:
    """The ``k`` best document ids of one query's run, in trec_eval's order (score descending, then
    document id descending); ``k`` at least the run's length gives the whole ranking."""
    return [d for d, _ in sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)[:k]]


def write_run(path: str | Path, run: Run, tag: str = "obliq") -> None:
    """Write a run in TREC format, ranked as trec_eval ranks it (score desc, then doc id desc).

    Scores are written with ``repr`` so that reading the file back gives the same floats, hence
    the same ranking and metrics (:func:`read_run`).

    Raises:
        ValueError: a query or document id that a TREC run cannot hold (empty, or with whitespace, C25).
    """
    tag = "_".join(str(tag).split()) or "obliq"
    for qid, docs in run.items():
        for value in (qid, *docs):
            check_id(value, f"{path}: query {qid!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for qid, docs in run.items():
            for rank, did in enumerate(top_k(docs, len(docs)), 1):
                score = docs[did]
                f.write(f"{qid} Q0 {did} {rank} {float(score)!r} {tag}\n")


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


def score_files(
    qrels: Path,
    run: Path,
    measures: str = ",".join(DEFAULT_MEASURES),
    per_query: bool = False,
) -> dict:
    """Score a TREC run file against qrels with trec_eval's conventions (the `obliq metrics` command).

    Args:
        qrels: relevance judgements, BEIR TSV (``query-id corpus-id score``, header optional) or
            TREC qrels (``qid 0 docid grade``).
        run: a TREC run file (``qid Q0 docid rank score tag``), or mteb's saved predictions of one
            task (:func:`read_mteb_predictions`).
        measures: comma-separated measure names, e.g. ``NDCG@10,Recall@100``.
        per_query: also return each query's values.

    Returns:
        ``{"metrics": {name: mean}, "n_queries": …, "n_excluded": …, "run_depth": …,
        "deeper_than_run": […], "run_queries_not_in_qrels": …, "qrels_queries_not_in_run": …}`` (+
        ``"per_query"``). Queries of the qrels that the run lacks score 0 (trec_eval ``-c``); run
        queries without judgements are ignored and counted. ``deeper_than_run`` flags the measures
        whose cut-off exceeds the run's deepest ranking (``run_depth``): they are not measured at the
        depth they name unless the corpus is that small.

    Raises:
        ValueError: the qrels hold no judgement; the run has no line, or none of its queries is in
            the qrels (a wrong pair of files).
    """
    judged = read_qrels(qrels)
    ranked = check_run(read_ranking(run), judged, run, qrels)
    ev = evaluate_run(judged, ranked, measures)
    depth = max(len(docs) for docs in ranked.values())
    deeper = {name: cutoff(m) for name, m in parse_measures(measures).items() if (cutoff(m) or 0) > depth}
    out: dict = {
        "metrics": ev.aggregate,
        "n_queries": ev.n_queries,
        "n_excluded": ev.n_excluded,
        "run_depth": depth,
        "deeper_than_run": sorted(deeper),
        "run_queries_not_in_qrels": len(ranked.keys() - judged.keys()),
        "qrels_queries_not_in_run": len(judged.keys() - ranked.keys()),
    }
    if deeper:
        log.warning(
            "%s holds at most %d documents per query: %s cut deeper and are not measured at their depth "
            "(unless the corpus has at most %d documents)",
            run,
            depth,
            ", ".join(sorted(deeper)),
            depth,
        )
    for key in ("run_queries_not_in_qrels", "qrels_queries_not_in_run"):
        if out[key]:
            log.warning("%s: %d %s", run, out[key], key.replace("_", " "))
    if per_query:
        out["per_query"] = ev.per_query
    return out
