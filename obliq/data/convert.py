"""The training data users already have, in the layouts of sentence-transformers, Tevatron and ReasonIR (the
command ``obliq data convert``, :func:`obliq.commands.data.convert`, gives each format and its source), read from
JSONL, Parquet or Arrow files, a ``datasets`` ``save_to_disk`` folder or a dataset folder whose configurations and
splits ``datasets`` resolves (:mod:`obliq.data.convert_inputs`), turned into obliq's training rows
(docs/formats.md, "Converting training data").

Every row is built, serialised and checked by :func:`obliq.data.rows.parse_row`, obliq's own check of a training
row; a refusal (:class:`ConvertError`) names the input's file, its line (JSONL, 1-based) or ``row <i>`` (Parquet
and Arrow, 0-based) and the input's column, e.g. ``train.jsonl:17:positive_passages[0].text: empty text``.
Nothing is written unless every record converts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from obliq.data.convert_inputs import ConvertError, Record
from obliq.data.rows import RowError, parse_row, positive_fields
from obliq.text import normalise_text, repair_text, text_hash

log = logging.getLogger(__name__)

FORMATS = ("sentence-transformers", "tevatron", "reasonir")
"""The record formats :func:`convert` reads (module docstring)."""

ST_QUERY_COLUMNS = ("anchor", "query", "question")
"""The names a sentence-transformers data set gives its query column (exactly one of them is read)."""

DOC_ID_PREFIX = "doc:"
QUERY_ID_PREFIX = "q:"

_FORMAT_TEXT = (
    "sentence-transformers (anchor | query | question, positive, negative | negative_1, negative_2, …), "
    "tevatron (query_id, query, positive_passages, negative_passages), reasonir (query, pos, neg)"
)
_NEGATIVE_N = re.compile(r"negative_(\d+)")
_ROLES = {
    "sentence-transformers": (*ST_QUERY_COLUMNS, "positive", "negative"),
    "tevatron": ("query_id", "query", "positive_passages", "negative_passages"),
    "reasonir": ("query", "pos", "neg"),
}
"""The columns each format reads, its positive and negative columns last (:func:`near_column`)."""
COUNTED = "positives negatives rows_with_several_positives missing_negatives document_instructions repaired_characters"
"""What :func:`write_rows` counts, beside ``rows``, for the report of ``obliq data convert``."""
_FIXED = {
    "tevatron": ("query", "positive_passages", "negative_passages", "query_id"),
    "reasonir": ("query", "pos", "neg", None),
}


@dataclass
class _Doc:
    """A document of a converted row and how the input names it (for messages)."""

    id: str
    text: str
    label: str  # the document as a whole: ``positive_passages[0]``, ``negative_2``, ``pos[1]``
    id_label: str  # its id: ``positive_passages[0].docid``; the text's label when the id is derived
    text_label: str  # its text: ``positive_passages[0].text``, ``negative_2``, ``pos[1][1]``
    instruction: str | None = None  # a ReasonIR document's own instruction


@dataclass
class _Example:
    query: str
    query_label: str
    positives: list[_Doc]
    negatives: list[_Doc]
    query_id: str | None = None  # None: one from the query's text
    instruction: str | None = None
    instruction_label: str = "instruction"


@dataclass
class _Layout:
    """Which of a record's columns play which role in a format."""

    query: str
    positives: str
    negatives: list[str]  # sentence-transformers: negative columns in order; else the one list column or none
    query_id: str | None = None
    ignored: list[str] = field(default_factory=list)


class _NoColumn(ValueError):
    """``(column, reason)``: a required column is absent (the caller adds where)."""


def detect_format(columns: list[str], where: object = "the input") -> str:
    """The format whose positive column ``columns`` hold: ``positive_passages`` (tevatron), ``pos`` (reasonir)
    or ``positive`` (sentence-transformers).

    Raises:
        ValueError: none of them, or several (naming the columns seen and the formats known).
    """
    found = [f for f, col in zip(FORMATS, ("positive", "positive_passages", "pos")) if col in columns]
    seen = ", ".join(columns) or "none"
    if not found:
        raise ValueError(f"{where}: columns {seen} match no format obliq converts; the formats: {_FORMAT_TEXT}")
    if len(found) > 1:
        raise ValueError(f"{where}: columns {seen} fit several formats ({', '.join(found)}): name one with --format")
    return found[0]


def _layout(fmt: str, columns: list[str]) -> _Layout:
    """The roles of ``columns`` in format ``fmt``.

    Raises:
        _NoColumn: a required column is absent, or the columns are ambiguous.
    """
    present = set(columns)
    if fmt == "sentence-transformers":
        queries = [c for c in ST_QUERY_COLUMNS if c in present]
        if not queries:
            raise _NoColumn(ST_QUERY_COLUMNS[0], f"no query column ({' or '.join(ST_QUERY_COLUMNS)})")
        if len(queries) > 1:
            raise _NoColumn(queries[1], f"two query columns, {queries[0]} and {queries[1]}: keep one")
        if "positive" not in present:
            raise _NoColumn("positive", "no positive column")
        if scored := next((c for c in ("label", "score") if c in present), None):  # scored pairs: not all relevant
            raise _NoColumn(scored, f"a {scored} column: scored pairs are not all relevant; drop it if they are")
        numbered = sorted((int(m[1]), c) for c in columns if (m := _NEGATIVE_N.fullmatch(c)))
        if numbered and "negative" in present:
            raise _NoColumn("negative", f"both negative and {numbered[0][1]}: keep one naming")
        negatives = ["negative"] if "negative" in present else [c for _, c in numbered]
        used = {queries[0], "positive", *negatives}
        layout = _Layout(queries[0], "positive", negatives, ignored=[c for c in columns if c not in used])
    else:
        query, positives, negatives, query_id = _FIXED[fmt]
        for col in (query, positives):
            if col not in present:
                raise _NoColumn(col, f"no {col} column")
        negatives = [negatives] if negatives in present else []
        query_id = query_id if query_id in present else None
        used = {query, positives, *negatives, query_id}
        layout = _Layout(query, positives, negatives, query_id, [c for c in columns if c not in used])
    for col in layout.ignored:
        if near := near_column(col, fmt):
            reason = f"not read, but named like {near} (rename it {near} if it is that column, or drop it)"
            raise _NoColumn(col, reason)
    return layout


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by one character inserted, deleted or replaced."""
    a, b = (a, b) if len(a) >= len(b) else (b, a)
    if a == b or len(a) - len(b) > 1:
        return False
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
    return a[i + 1 :] == (b[i + 1 :] if len(a) == len(b) else b[i:])


def near_column(column: str, fmt: str) -> str | None:
    """The column of format ``fmt`` that ``column``, one it does not read, looks meant to be, or None: the same
    name but for case, separators and a plural (``negatives``, ``Negative``, ``negative-1``), one letter off
    (``postive``, ``anchr``; names of 5 letters or more), or a name holding ``positive`` or ``negative``
    (``hard_negatives``). Such a column is refused rather than dropped (it holds data the user meant to give).
    """
    plain = re.sub(r"[^a-z0-9]", "", column.lower())
    for role in _ROLES[fmt]:
        name = re.sub(r"[^a-z0-9]", "", role.lower())
        if plain in (name, name + "s", name + "es") or (len(name) >= 5 and _one_edit(plain, name)):
            return role
    word = next((w for w in ("positive", "negative") if w in plain), None)
    return None if word is None else _ROLES[fmt][-2 if word == "positive" else -1]


def _doc_id(text: str, prefix: str = DOC_ID_PREFIX) -> str:
    """An id from a text alone: the same text, the same id (obliq masks false negatives by id)."""
    return prefix + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class _Reader:
    """Values of one record, type-checked and repaired, refused with the record's place and the field's name."""

    def __init__(self, rec: Record, counts: Counter):
        self.rec, self.counts = rec, counts

    def fail(self, label: str, kind: str, reason: str) -> ConvertError:
        return ConvertError(self.rec.path, self.rec.where, label, kind, reason)

    def text(self, value: Any, label: str, number: bool = False) -> str:
        """A string (with ``number``, an integer too: an id), repaired; refused when missing or of another type."""
        if number and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if value is None:
            raise self.fail(label, "missing", "missing (null)")
        if not isinstance(value, str):
            raise self.fail(label, "type", f"expected a string, got {type(value).__name__}")
        value, n = repair_text(value)
        self.counts["repaired_characters"] += n
        return value

    def items(self, value: Any, label: str, *, required: bool) -> list:
        if value is None:
            if required:
                raise self.fail(label, "missing", "missing (null)")
            return []
        if not isinstance(value, (list, tuple)):
            raise self.fail(label, "type", f"expected a list, got {type(value).__name__}")
        if required and not value:
            raise self.fail(label, "empty", "no positive (a row needs at least one)")
        return list(value)

    def pair(self, value: Any, label: str) -> tuple[str | None, str, str]:
        """A ReasonIR ``[instruction, text]`` pair, or a plain text: ``(instruction, text, text's label)``."""
        if isinstance(value, str) or value is None:
            return None, self.text(value, label), label
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            got = f"a list of {len(value)}" if isinstance(value, (list, tuple)) else type(value).__name__
            raise self.fail(label, "type", f"expected [instruction, text] or a text, got {got}")
        return self.text(value[0], f"{label}[0]"), self.text(value[1], f"{label}[1]"), f"{label}[1]"


def _sentence_transformers(rec: Record, layout: _Layout, read: _Reader) -> _Example:
    query = read.text(rec.values.get(layout.query), layout.query)
    texts = []  # (column, text): the positive, then the negatives
    for col in (layout.positives, *layout.negatives):
        if col != layout.positives and rec.values.get(col) is None:  # fewer negatives than the table has columns
            read.counts["missing_negatives"] += 1
        else:
            texts.append((col, read.text(rec.values.get(col), col)))
    docs = [_Doc(_doc_id(text), text, col, col, col) for col, text in texts]
    return _Example(query, layout.query, docs[:1], docs[1:])


def _tevatron(rec: Record, layout: _Layout, read: _Reader) -> _Example:
    values = rec.values
    qid = values.get(layout.query_id) if layout.query_id else None
    qid = None if qid is None else read.text(qid, layout.query_id, number=True)

    def passage(value: Any, label: str) -> _Doc:
        if not isinstance(value, dict):
            raise read.fail(label, "type", f"expected an object with docid, title, text, got {type(value).__name__}")
        docid = read.text(value.get("docid"), f"{label}.docid", number=True)
        body = read.text(value.get("text"), f"{label}.text")
        if not body.strip():
            raise read.fail(f"{label}.text", "empty", "empty text")
        title = "" if value.get("title") is None else read.text(value["title"], f"{label}.title")
        return _Doc(docid, f"{title} {body}" if title.strip() else body, label, f"{label}.docid", f"{label}.text")

    query = read.text(values.get("query"), "query")
    cols = [(layout.positives, True)] + [(col, False) for col in layout.negatives]
    docs = [
        [passage(p, f"{col}[{i}]") for i, p in enumerate(read.items(values.get(col), col, required=required))]
        for col, required in cols
    ]
    return _Example(query, "query", docs[0], [d for part in docs[1:] for d in part], qid or None)


def _reasonir(rec: Record, layout: _Layout, read: _Reader) -> _Example:
    values = rec.values
    instruction, query, query_label = read.pair(values.get("query"), "query")

    def docs(col: str, required: bool) -> list[_Doc]:
        out = []
        for i, item in enumerate(read.items(values.get(col), col, required=required)):
            doc_instruction, text, text_label = read.pair(item, f"{col}[{i}]")
            out.append(_Doc(_doc_id(text), text, f"{col}[{i}]", text_label, text_label, doc_instruction or None))
        return out

    negatives = [d for col in layout.negatives for d in docs(col, False)]
    return _Example(query, query_label, docs("pos", True), negatives, None, instruction or None, "query[0]")


_BUILDERS = {"sentence-transformers": _sentence_transformers, "tevatron": _tevatron, "reasonir": _reasonir}


def _row(ex: _Example, row_id: str, task: str, source: str) -> dict:
    row: dict = {"id": row_id, "task": task, "source": source, "query": ex.query}
    if ex.instruction:
        row["instruction"] = ex.instruction
    row.update(positive_fields([{"id": d.id, "text": d.text} for d in ex.positives]))
    row["negatives"] = [{"id": d.id, "text": d.text} for d in ex.negatives]
    meta: dict = {"query_id": ex.query_id or _doc_id(ex.query, QUERY_ID_PREFIX)}
    instructions = {d.id: d.instruction for d in (*ex.positives, *ex.negatives) if d.instruction}
    if instructions:
        meta["document_instructions"] = instructions
    row["meta"] = meta
    return row


def _refusal(err: RowError, ex: _Example, rec: Record) -> ConvertError:
    """``parse_row``'s refusal of a converted row, in the input's terms: its file, line or row, and column."""
    one = len(ex.positives) == 1
    docs = {("positive" if one else f"positives[{i}]"): d for i, d in enumerate(ex.positives)}
    docs |= {f"negatives[{i}]": d for i, d in enumerate(ex.negatives)}
    name, _, part = err.field.partition(".")
    doc = docs.get(name)
    if doc is not None:
        label = {"id": doc.id_label, "text": doc.text_label}.get(part, doc.label)
    else:
        label = {"query": ex.query_label, "instruction": ex.instruction_label, "task": "--task"}.get(
            err.field, err.field
        )
    reason = err.reason
    if err.kind == "empty" and (part == "text" or err.field == "query"):
        reason = "empty text"
    elif err.kind == "negative-is-positive" and doc is not None:
        by_id = part == "id"
        match = (lambda p: p.id == doc.id) if by_id else (lambda p: normalise_text(p.text) == normalise_text(doc.text))
        same = next(filter(match, ex.positives), None)
        if same is not None:  # an id derived from the text (its label is the text's) is the same text
            reason = (
                f"the negative is a positive: the id {doc.id!r} of {same.label}"
                if by_id and doc.id_label != doc.text_label
                else f"the negative is a positive: the text of {same.label} (normalised)"
            )
    else:
        reason = re.sub(r"positives\[\d+\]", lambda m: docs[m[0]].label if m[0] in docs else m[0], reason)
        if "positive" in docs:
            reason = reason.replace("the positive", docs["positive"].label)
    return ConvertError(rec.path, rec.where, label, err.kind, reason)


def write_rows(f, records: Iterator, fmt: str, prefix: str, task: str, source: str) -> tuple[Counter, set, str | None]:
    """Convert and check every record, writing each row to ``f``: the counts, the columns ignored and,
    when every ReasonIR positive is a single word (document ids?), the first of them.

    Raises:
        ConvertError, ValueError: see :func:`obliq.commands.data.convert`.
    """
    counts, ignored, layouts, documents = Counter(), set(), {}, {}  # documents: Tevatron docid → (text hash, where)
    ids_like: str | None = ""  # ReasonIR: the first positive while every positive is one word (None: not so)
    for rec, table_columns in records:
        columns = table_columns if table_columns is not None else list(rec.values)
        if tuple(columns) not in layouts:
            try:
                layouts[tuple(columns)] = _layout(fmt, columns)
            except _NoColumn as err:
                (column, reason), seen = err.args, ", ".join(columns) or "none"
                if table_columns is None:  # a JSONL record
                    reason = f"{reason} for {fmt} (fields: {seen})"
                    raise ConvertError(rec.path, rec.where, column, "missing", reason) from None
                raise ValueError(f"{rec.path}: {column}: {reason} for {fmt} (columns: {seen})") from None
            ignored.update(layouts[tuple(columns)].ignored)
        ex = _BUILDERS[fmt](rec, layouts[tuple(columns)], _Reader(rec, counts))
        if fmt == "tevatron":
            _check_documents(ex, rec, documents)
        if fmt == "reasonir" and ids_like is not None:
            first = ex.positives[0]
            several = any(len(doc.text.split()) > 1 for doc in ex.positives)
            ids_like = (
                None if several else ids_like or f"{rec.path}:{rec.where}:{first.text_label}: {first.text[:80]!r}"
            )
        row = _row(ex, f"{prefix}{rec.number}", task, source)
        line = json.dumps(row, ensure_ascii=False)
        try:
            parse_row(line, f.name, counts["rows"] + 1)
        except RowError as err:
            raise _refusal(err, ex, rec) from None
        f.write(line + "\n")
        counts.update(rows=1, positives=len(ex.positives), negatives=len(ex.negatives))
        counts["rows_with_several_positives"] += len(ex.positives) > 1
        counts["document_instructions"] += len(row["meta"].get("document_instructions", {}))
    return counts, ignored, ids_like or None


def _check_documents(ex: _Example, rec: Record, seen: dict[str, tuple[int, str]]) -> None:
    """Refuse a Tevatron ``docid`` given two different texts (normalised), naming both places."""
    for doc in (*ex.positives, *ex.negatives):
        hashed = text_hash(doc.text)
        here = f"{rec.path}:{rec.where}:{doc.text_label}"
        first = seen.setdefault(doc.id, (hashed, here))
        if first[0] != hashed:
            reason = f"document {doc.id!r} has another text here than at {first[1]} (one id, one document)"
            raise ConvertError(rec.path, rec.where, doc.id_label, "conflict", reason)
