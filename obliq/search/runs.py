"""TREC run files and other rankings: the run a search makes, read and written (docs/formats.md).

A run is query id → document id → score. A TREC run file holds ``qid Q0 docid rank score tag`` lines,
ranked as trec_eval ranks them: score descending, then document id descending (the rank column is
ignored on reading, as trec_eval ignores it). A document listed twice for a query keeps its first
occurrence in ranking order (its highest score; C08). mteb's saved predictions read as a run too
(:func:`read_mteb_predictions`); :func:`read_ranking` reads either.

A run obliq writes for a task (:func:`write_run` with ``task``) carries what it was retrieved from, in a
record beside it, ``<run>.json`` (:func:`run_record`): ``run_sha256`` (the run file's bytes), ``task``,
``corpus_sha256`` (:attr:`obliq.tasks.Task.corpus_sha256`) and ``n_docs``. :func:`check_run_corpus` refuses a
run scored on a task whose corpus is not the one recorded, and any run (a foreign TREC file has no record)
that names documents the task's corpus lacks (issue 49 §3: a run of a corpus that lost documents would be
scored as the full corpus's).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from obliq.files import file_sha256, open_text, read_json_object, write_json
from obliq.tasks import Task, check_id

log = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]
"""query id → document id → score (higher is better)."""


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
    """A run from a TREC run file (:func:`read_run`), from an ``obliq evaluate`` / ``obliq encode`` output folder
    (its ``run.trec``, or ``<task>/run.trec``: the only task, or ``task``), or from mteb's saved predictions (a
    ``*_predictions.json`` file or a prediction folder: :func:`read_mteb_predictions`).

    Raises:
        ValueError: an output folder of several tasks and no ``task`` (naming them).
    """
    path = Path(path)
    if path.is_dir() and not any(path.glob("*_predictions.json")):  # an obliq output folder, not mteb's
        runs = [path / "run.trec"] if (path / "run.trec").is_file() else sorted(path.glob("*/run.trec"))
        names = [r.parent.name for r in runs]
        if task is not None and runs and runs[0].parent != path:
            runs = [r for r in runs if r.parent.name == task]
            if not runs:
                raise ValueError(f"{path}: an obliq output folder without task {task!r} (its tasks: {names})")
        if len(runs) > 1:
            raise ValueError(f"{path}: an obliq output folder of several tasks {names}: name one with --task")
        if runs:
            return read_run(runs[0])
    if path.is_dir() or path.name.endswith(".json"):
        return read_mteb_predictions(path, task, subset, split)
    return read_run(path)


def top_k(docs: dict[str, float], k: int) -> list[str]:
    """The ``k`` best document ids of one query's run, in trec_eval's order (score descending, then
    document id descending); ``k`` at least the run's length gives the whole ranking."""
    return [d for d, _ in sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)[:k]]


def write_run(path: str | Path, run: Run, tag: str = "obliq", task: Task | None = None) -> None:
    """Write a run in TREC format, ranked as trec_eval ranks it (score desc, then doc id desc).

    Scores are written with ``repr`` so that reading the file back gives the same floats, hence
    the same ranking and metrics (:func:`read_run`). With ``task`` (the task the run was retrieved
    from), its record is written beside it (:func:`run_record`); without, a record left there by an
    earlier write is removed (it would describe another run).

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
    record = run_record(path)
    if task is None:
        record.unlink(missing_ok=True)
    else:
        made = {"run_sha256": file_sha256(path), "task": task.name, "corpus_sha256": task.corpus_sha256}
        write_json(record, made | {"n_docs": len(task.doc_ids)})


def run_record(path: str | Path) -> Path:
    """Where the record of what a run was retrieved from lies: ``<run>.json`` beside it (module notes)."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def check_run_corpus(path: str | Path, run: Run, task: Task) -> None:
    """Refuse the run read from ``path`` for scoring on ``task`` when it was not retrieved from the task's
    corpus (module notes; issue 49 §3): its record (:func:`run_record`) names another corpus digest, or no
    longer describes the file; or the run ranks, for a query of the task, a document the corpus lacks (the
    one check a foreign TREC file, without a record, gets).

    Raises:
        ValueError: the record's ``run_sha256`` or ``corpus_sha256`` does not hold, or a ``docid`` is not in
            the task's corpus (the file, the field and an example named).
    """
    path, record_file = Path(path), run_record(path)
    if record_file.is_file():
        record = read_json_object(record_file, "a run's record")
        if record.get("run_sha256") != file_sha256(path):
            raise ValueError(
                f"{record_file}: field run_sha256: {path.name} was changed since obliq wrote it, so its record of "
                f"the corpus no longer holds; remove {record_file.name} to score it as a foreign run"
            )
        if task.corpus_sha256 and record.get("corpus_sha256") != task.corpus_sha256:
            raise ValueError(
                f"{record_file}: field corpus_sha256: {path.name} was retrieved from another corpus "
                f"({str(record.get('corpus_sha256'))[:12]}…, {record.get('n_docs')} documents) than task "
                f"{task.name}'s ({task.corpus_sha256[:12]}…, {len(task.doc_ids)} documents): retrieve it again"
            )
    corpus = set(task.doc_ids)
    absent = sorted({d for q in task.query_ids for d in run.get(q, ()) if d not in corpus})
    if absent:
        raise ValueError(
            f"{path}: field docid: {len(absent)} documents ranked for task {task.name}'s queries are not in its "
            f"corpus {task.path / 'corpus.jsonl'} (e.g. {absent[0]!r}): a run of another corpus"
        )


def fuse_rrf(runs: Sequence[Run], k: int = 60, depth: int | None = None) -> Run:
    """Reciprocal-rank fusion of several runs (Cormack, Clarke & Büttcher, SIGIR 2009): a document's fused
    score is Σ over runs of 1 / (k + its rank in that run), rank 1 = the run's best in trec_eval's order
    (score descending, then document id descending: :func:`top_k`); a run that does not hold the document
    adds nothing. Only ranks are read, so runs on different score scales (a cosine, BM25) fuse alike.

    Args:
        runs: two or more runs (query id → document id → score); a query missing from a run is fused from
            the others.
        k: the rank constant (60, the paper's).
        depth: read at most this many documents of each run per query (None: all it holds), so that a fused
            ranking does not depend on how deep each run went beyond ``depth``.

    Returns:
        The fused run (query id → document id → fused score); ties are ranked as trec_eval ranks them.

    Raises:
        ValueError: fewer than two runs, ``k`` < 1 or ``depth`` < 1.
    """
    if len(runs) < 2:
        raise ValueError(f"fusion needs at least two runs, got {len(runs)}")
    if k < 1 or (depth is not None and depth < 1):
        raise ValueError(f"k and depth must be at least 1, got k={k}, depth={depth}")
    fused: Run = {}
    for run in runs:
        for qid, docs in run.items():
            scores = fused.setdefault(qid, {})
            for rank, did in enumerate(top_k(docs, depth or len(docs)), 1):
                scores[did] = scores.get(did, 0.0) + 1.0 / (k + rank)
    return fused
