"""Evaluation tasks in BEIR layout: reading, repairing and validating them.

A task is a folder (docs/formats.md): ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``), ``qrels/test.tsv`` (gold) and optionally ``qrels/pooled.tsv``,
optionally per-query candidate sets ``top_ranked/test.jsonl`` (mteb's ``top_ranked``: each query is
ranked over its candidates only), plus an optional ``task.json`` with ``name``, ``mechanism``,
``instruction``, ``prompt_name`` and ``judgements``.

Bad input fails with the file, line and field named; data problems that do not stop an evaluation
are logged as warnings with a count and kept in :attr:`Task.report`:

- duplicate ids in the corpus or the queries: the first occurrence is kept (C08's keep-first);
- qrels rows repeated identically: de-duplicated (C08); the same pair with two different grades is
  an error;
- qrels documents missing from the corpus: kept (they count in recall denominators, as in
  trec_eval) and reported; qrels queries missing from the queries file: dropped and reported;
- empty texts: kept and reported; lone surrogates become U+FFFD and NUL bytes a space (C17);
- candidate sets: a query or document id that the task lacks, or a query listed twice, is an error
  (file and line named); a document listed twice for a query is kept once; a query without a line
  has no candidates (nothing is retrieved for it and it scores 0, as in mteb), counted and reported.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from obliq.files import bounded_lines, open_text, read_json_object, strip_bom
from obliq.text import repair_text

log = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]
"""query id → document id → relevance grade (a grade ≥ 1 is relevant, as in trec_eval)."""

QRELS_SPLITS = ("test", "pooled")
"""The qrels files an evaluation reads: ``test`` (gold, required) and ``pooled`` (when present)."""

Candidates = dict[str, list[str]]
"""query id → the ids of the documents it is ranked over (a candidate set, mteb's ``top_ranked``)."""

JUDGEMENTS = ("gold", "pooled")
"""What a task's main qrels (``qrels/test.tsv``) are, as ``task.json``'s ``judgements`` says (default gold)."""


def check_id(value: str, where: str) -> str:
    """``value`` when a TREC run line can hold it as one column.

    Raises:
        ValueError: ``value`` is empty or holds whitespace (the message starts with ``where``, C25).
    """
    if not value or any(c.isspace() for c in value):
        raise ValueError(
            f"{where}: id {value!r} cannot be written in a TREC run or qrels (empty or holds whitespace); "
            "give it an id without spaces"
        )
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
        for lineno, raw in enumerate(bounded_lines(f, path), 1):  # a line past MAX_LINE is refused
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


HEADER_SCORES = frozenset({"score", "grade", "relevance", "rel", "label"})
"""What the score column of a qrels header line is called; any other first line whose grade is not a number
is refused, not skipped as a header (a headerless file would lose its first judgement)."""


def read_qrels(path: str | Path) -> Qrels:
    """Read relevance judgements in BEIR TSV or TREC qrels format.

    - BEIR: ``query-id<TAB>corpus-id<TAB>score``, with an optional header line (a first line whose
      score column is named: :data:`HEADER_SCORES`); a grade written ``1.0`` is the integer 1.
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
            (file and lines named); bytes that are not UTF-8, or a line over
            :data:`obliq.files.MAX_LINE` characters (file and line named: :func:`obliq.files.open_text`).
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
                value = float(grade)
            except ValueError:
                if header and grade.lower() in HEADER_SCORES:  # `query-id corpus-id score`: BEIR's header
                    continue
                raise ValueError(f"{path}:{lineno}: field 'score' must be an integer, got {grade!r}") from None
            if not value.is_integer():  # "1.0" (BEIR exports) is the grade 1, as trec_eval reads it
                raise ValueError(f"{path}:{lineno}: field 'score' must be an integer, got {grade!r}")
            g = int(value)
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
    candidates: Candidates | None = None
    """Per-query candidate sets (``top_ranked/<split>.jsonl``): every retriever ranks a query over its
    candidates only; None ranks over the whole corpus."""
    instruction: str | None = None
    """The task's query instruction (``task.json``; the OBLIQ-IR paper's B.3 prefixes for OBLIQ-Bench),
    read by an encoder trained with instructions."""
    prompt_name: str | None = None
    """The name a model's per-task prompts are keyed by (``<prompt_name>-query`` / ``-document``, as mteb
    looks them up: the mteb task name); None: the model's default prompts."""
    judgements: str = "gold"
    """What ``qrels["test"]`` holds: ``gold`` or ``pooled`` judgements (``task.json``)."""

    @property
    def max_ranked(self) -> int:
        """The most documents one query is ranked over: its largest candidate set, or the whole corpus
        (what a measure's cut-off is checked against, :func:`obliq.eval.metrics.check_depth`)."""
        if self.candidates is None:
            return len(self.doc_ids)
        return max((len(c) for c in self.candidates.values()), default=0)


def read_task_meta(file: Path) -> dict:
    """A task's ``task.json`` ({} when absent), checked: an object whose ``name``, ``mechanism``,
    ``instruction`` and ``prompt_name``, when given, are non-empty strings, and whose ``judgements`` is
    one of :data:`JUDGEMENTS`.

    Raises:
        ValueError: not JSON, not an object, or a field of the wrong type (the file named).
    """
    if not file.is_file():
        return {}
    meta = read_json_object(file, "a task's settings (name, mechanism, …)")
    for key in ("name", "mechanism", "instruction", "prompt_name"):
        if key in meta and meta[key] is not None and (not isinstance(meta[key], str) or not meta[key].strip()):
            raise ValueError(f"{file}: field {key!r} must be a non-empty string, got {meta[key]!r}")
    if meta.get("judgements", "gold") not in JUDGEMENTS:
        raise ValueError(f"{file}: field 'judgements' must be one of {list(JUDGEMENTS)}, got {meta['judgements']!r}")
    return meta


def read_candidates(path: str | Path, query_ids: Sequence[str], doc_ids: Sequence[str]) -> tuple[Candidates, dict]:
    """Read per-query candidate sets: JSONL, one ``{"query-id": str, "corpus-ids": [str, …]}`` a line
    (mteb's ``top_ranked`` columns).

    Args:
        path: the file (``top_ranked/<split>.jsonl``).
        query_ids / doc_ids: the task's queries and documents.

    Returns:
        ``(candidates, report)``: query id → candidate document ids (first occurrence kept, in file
        order), and counts: ``queries``, ``queries_without_candidates`` (the task's queries without a
        line: nothing is retrieved for them), ``repeated_candidates`` (dropped), and the candidates per
        query ``min`` / ``mean`` / ``max``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not an object with ``query-id`` (string) and ``corpus-ids`` (list of
            strings), a query id that is not one of the task's queries, a query given on two lines, or a
            document id not in the corpus (file, line and field named).
    """
    path = Path(path)
    queries, docs = set(query_ids), set(doc_ids)
    out: Candidates = {}
    line_of: dict[str, int] = {}
    repeated = 0
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from None
            qid, ids = (obj.get("query-id"), obj.get("corpus-ids")) if isinstance(obj, dict) else (None, None)
            if isinstance(qid, int) and not isinstance(qid, bool):
                qid = str(qid)
            if not isinstance(qid, str):
                raise ValueError(f"{path}:{lineno}: field 'query-id' must be a string (a query of the task)")
            if not isinstance(ids, list) or not all(isinstance(d, str) for d in ids):
                raise ValueError(f"{path}:{lineno}: field 'corpus-ids' must be a list of document id strings")
            if qid not in queries:
                raise ValueError(f"{path}:{lineno}: field 'query-id': {qid!r} is not a query of the task")
            if qid in line_of:
                raise ValueError(
                    f"{path}:{lineno}: field 'query-id': {qid!r} already has candidates (line {line_of[qid]})"
                )
            unknown = next((d for d in ids if d not in docs), None)
            if unknown is not None:
                raise ValueError(f"{path}:{lineno}: field 'corpus-ids': {unknown!r} is not a document of the corpus")
            kept = list(dict.fromkeys(ids))
            repeated += len(ids) - len(kept)
            out[qid], line_of[qid] = kept, lineno
    sizes = [len(out.get(q, ())) for q in query_ids]
    report = {
        "file": path.name,
        "queries": len(out),
        "queries_without_candidates": sum(q not in out for q in query_ids),
        "repeated_candidates": repeated,
        "min": min(sizes),
        "mean": round(sum(sizes) / len(sizes), 2),
        "max": max(sizes),
    }
    if repeated:
        log.warning("%s: %d repeated candidate ids dropped (kept once)", path, repeated)
    if report["queries_without_candidates"]:
        log.warning(
            "%s: %d queries have no candidate set: nothing is retrieved for them (they score 0)",
            path,
            report["queries_without_candidates"],
        )
    return out, report


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
            when present (default ``test`` then ``pooled``). The first also names the queries'
            candidate sets, ``top_ranked/<split>.jsonl``, read when present (:func:`read_candidates`).

    Returns:
        The task; its :attr:`Task.report` holds the validation counts.

    Raises:
        FileNotFoundError: the folder, ``corpus.jsonl``, the queries file or the first split's qrels
            (by default ``qrels/test.tsv``) is missing.
        ValueError: a malformed line (see :func:`read_jsonl`, :func:`read_qrels`,
            :func:`read_candidates`), no document or query, or every document (or every query) with an
            empty text; a ``task.json`` field of the wrong type.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"task folder not found: {path}")
    meta = read_task_meta(path / "task.json")
    report: dict = {}

    corpus_file, queries_file = path / "corpus.jsonl", path / queries
    for file in (corpus_file, queries_file):
        if not file.is_file():
            raise FileNotFoundError(f"{file}: not found ({LAYOUT})")
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

    for what, ids, texts, file in (
        ("docs", doc_ids, doc_texts, corpus_file),
        ("queries", query_ids, query_texts, queries_file),
    ):
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
            log.warning(
                "%s: %d query ids not in %s, ignored (e.g. %s)", file, len(unknown_q), queries_file.name, unknown_q[0]
            )
        if missing_docs:
            log.warning(
                "%s: %d judged doc ids not in %s (kept: they count as relevant-but-unretrievable)",
                file,
                missing_docs,
                corpus_file.name,
            )
        if no_relevant:
            log.warning("%s: %d queries have no relevant document; they are excluded from the means", file, no_relevant)
        qrels[split] = split_qrels

    if meta.get("judgements") == "pooled" and "pooled" in qrels:
        raise ValueError(
            f"{path / 'task.json'}: judgements 'pooled' says qrels/test.tsv is pooled, yet qrels/pooled.tsv exists"
        )
    candidates = None
    top_ranked = path / "top_ranked" / f"{splits[0]}.jsonl"
    if top_ranked.is_file():
        candidates, report["candidates"] = read_candidates(top_ranked, query_ids, doc_ids)

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
        candidates=candidates,
        instruction=meta.get("instruction"),
        prompt_name=meta.get("prompt_name"),
        judgements=meta.get("judgements", "gold"),
    )


LAYOUT = "a task folder holds corpus.jsonl, queries.jsonl and qrels/test.tsv"
"""The BEIR layout in a few words, for the messages of a task file not found."""

TASK_MARKS = ("queries.jsonl", "qrels", "task.json")
"""Files only a task folder holds: a folder with one of them and no ``corpus.jsonl`` is a task without its corpus."""


def find_tasks(paths: Sequence[str | Path]) -> list[Path]:
    """Task folders from paths that are task folders or folders of task folders (sorted).

    Raises:
        FileNotFoundError: a path is neither; a task folder (one holding :data:`TASK_MARKS`) without its
            ``corpus.jsonl`` (the missing file named); or, in a folder of task folders, a subfolder is not a
            task (no ``corpus.jsonl``: a task that cannot be read is an error, never skipped).
    """
    out = []
    for p in map(Path, paths):
        if (p / "corpus.jsonl").is_file():
            out.append(p)
            continue
        held = [name for name in TASK_MARKS if (p / name).exists()]
        if held:  # a task folder without its corpus, not a folder of tasks (whose `qrels` would be blamed)
            raise FileNotFoundError(f"{p / 'corpus.jsonl'}: not found: {p} holds a task's {', '.join(held)} ({LAYOUT})")
        subs = sorted(s for s in p.iterdir() if s.is_dir() and not s.name.startswith(".")) if p.is_dir() else []
        if not subs:
            raise FileNotFoundError(f"{p}: not a task folder (no corpus.jsonl) nor a folder of task folders")
        broken = [s for s in subs if not (s / "corpus.jsonl").is_file()]
        if broken:
            raise FileNotFoundError(f"{broken[0]}: in the folder of tasks {p}, but not a task (no corpus.jsonl)")
        out.extend(subs)
    return out
