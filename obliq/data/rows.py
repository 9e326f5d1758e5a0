"""The training-row format of docs/formats.md: parsing, validation, text repair and text identity.

A training row is one JSON object on one line of a JSONL file::

    {"id": "r1", "task": "writing-news", "source": "synthetic", "query": "...",
     "positive": {"id": "d1", "text": "..."},                  # or "positives": [{"id", "text"}, ...]
     "negatives": [{"id": "d7", "text": "..."}, ...],          # may be empty
     "lens": "...", "instruction": "...", "meta": {...}}       # optional

A row carries exactly one of ``positive`` (one relevant document) and ``positives`` (a non-empty list of
them, e.g. a kNN anchor with all its kept neighbours, issue 47 §2); :attr:`TrainingRow.positives` holds them
in file order either way. Two positives of one row never share an id or a normalised text.

:func:`parse_row` turns one line into a :class:`TrainingRow` or raises :class:`RowError`, whose
message names ``file:line:field``. Every string field (ids, task, query, texts, lens, instruction) is
repaired first (``shared/cases/C17``): each lone UTF-16 surrogate becomes U+FFFD and each NUL becomes
a space, and the number of replaced characters is kept on the row (:attr:`TrainingRow.repairs`).
A row whose negative is one of its positives, by id or by normalised text, is invalid (``shared/cases/C06``).

:func:`obliq.text.normalise_text` / :func:`obliq.text.text_hash` define "the same text": the
negative-vs-positive check here, the document keys of a batch (the loss masks equal keys,
``shared/cases/C05``) and, by the same functions, the hard-negative miner.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obliq.files import strip_bom
from obliq.text import id_hash, normalise_text, repair_text, text_hash

ROW_SOURCES = ("synthetic", "knn", "random-control", "public")
"""Allowed values of a row's ``source`` field (docs/formats.md)."""

ERROR_KINDS = ("json", "unknown-field", "missing", "type", "empty", "value", "negative-is-positive", "duplicate-id")
"""Classes of bad rows, the keys of the skip counts:

- ``json``: the line is not UTF-8, not JSON, or not a JSON object (field ``(row)``);
- ``unknown-field``: a key the format does not define;
- ``missing``: a required field is absent (``positive``: neither ``positive`` nor ``positives``);
- ``type``: a field has the wrong JSON type;
- ``empty``: an id or text is empty or only whitespace; ``positives`` is an empty list;
- ``value``: ``source`` is not one of :data:`ROW_SOURCES`; ``positive`` and ``positives`` both given; two
  positives with one id or one normalised text; ``meta.teacher_scores`` malformed, or on a row with several
  positives;
- ``negative-is-positive``: a negative has a positive's id or normalised text (C06);
- ``duplicate-id``: the row id was already used by an earlier row of the mixture.
"""

_ROW_FIELDS = ("id", "task", "source", "query", "positive", "positives", "negatives", "lens", "instruction", "meta")
_DOC_FIELDS = ("id", "text")


class RowError(ValueError):
    """A bad training row: ``str(err)`` is ``"<file>:<line>:<field>: <reason>"``.

    Attributes:
        path: the file, as given.
        line: 1-based line number in the file.
        field: the offending field, e.g. ``query``, ``negatives[2].text``; ``(row)`` for the whole line.
        kind: one of :data:`ERROR_KINDS`.
        reason: what is wrong, in words.
    """

    def __init__(self, path: str, line: int, field: str, kind: str, reason: str):
        self.path, self.line, self.field, self.kind, self.reason = str(path), int(line), field, kind, reason
        super().__init__(f"{self.path}:{self.line}:{field}: {reason}")

    def __reduce__(self):  # picklable across DataLoader workers
        return RowError, (self.path, self.line, self.field, self.kind, self.reason)


@dataclass(frozen=True, slots=True)
class Doc:
    """A document of a row: its id, its (repaired) text and :func:`obliq.text.text_hash` of that text."""

    id: str
    text: str
    text_hash: int


@dataclass(frozen=True)
class RowCaps:
    """How much of each row a batch brings: ``data.max_negatives`` and ``data.max_positives``, written once
    (:class:`~obliq.data.datamodule.TrainingDataModule` builds it), checked here and read by what fills a batch
    (the collator, the reader's keys) and by a plan that keeps texts apart (its fingerprint).

    Attributes:
        max_negatives: k, the hard negatives kept per row, its first ones in file order (rows may have fewer).
        max_positives: the positives kept per row, its first ones in file order (None: all of them; a
            single-positive row always brings its one). A row's positives beyond it are never its negatives:
            the loss masks them for it (``cut_positive_keys``).

    Raises:
        ValueError: a negative ``max_negatives`` or a ``max_positives`` below 1, naming the setting.
    """

    max_negatives: int = 4
    max_positives: int | None = None

    def __post_init__(self) -> None:
        k = self.max_negatives
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"data.max_negatives must be an integer >= 0, got {k!r}")
        p = self.max_positives
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ValueError(f"data.max_positives must be an integer >= 1 or null (all positives), got {p!r}")

    def positives(self, n: int) -> int:
        """How many of a row's ``n`` positives a batch brings (its first ones)."""
        return n if self.max_positives is None else min(n, self.max_positives)


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """One validated training row (docs/formats.md).

    Attributes:
        id, task, source, query: as in the file (``source`` is one of :data:`ROW_SOURCES`).
        positives: the relevant documents, in file order (at least one; a file's ``positive`` is one);
            no two share an id or a normalised text. A single :class:`Doc` given here is taken as one.
        negatives: hard negatives in file order (possibly none); none has a positive's id or text.
        lens, instruction: optional strings (``None`` when absent).
        meta: optional free-form object, not repaired.
        repairs: number of characters replaced by :func:`obliq.text.repair_text` across the row's strings.
    """

    id: str
    task: str
    source: str
    query: str
    positives: tuple[Doc, ...]
    negatives: tuple[Doc, ...]
    lens: str | None = None
    instruction: str | None = None
    meta: dict[str, Any] | None = field(default=None, compare=False)
    repairs: int = 0

    def __post_init__(self):
        if isinstance(self.positives, Doc):
            object.__setattr__(self, "positives", (self.positives,))
        if not self.positives:
            raise ValueError(f"training row {self.id!r} has no positive")

    @property
    def positive(self) -> Doc:
        """The first positive (the only one of a single-positive row): the document at ``docs[i]`` of a batch."""
        return self.positives[0]

    @property
    def query_id(self) -> str | None:
        """The query's document id when the query is itself a corpus document (a kNN pair's anchor:
        ``meta.anchor_id``), else None."""
        anchor = (self.meta or {}).get("anchor_id")
        return anchor if isinstance(anchor, str) and anchor else None

    def query_key(self) -> tuple[int, int]:
        """``(id key, text key)`` of the query, as the batch's document keys are ``(id_hash(id),
        text_hash(text))``: a query that is a corpus document (:attr:`query_id`) keys by its id; any
        other query by a key no document can have. Two rows share a query when either key is equal."""
        qid = self.query_id
        return id_hash(qid) if qid is not None else id_hash(f"\0query\0{self.id}"), text_hash(self.query)

    def keys(self, caps: RowCaps | None = None) -> list[int]:
        """Every identity key of the row, by role: query (id, text), then each positive (id, text), then each
        negative (id, text); with ``caps``, only those a batch brings (:class:`RowCaps`). What a no-duplicates
        step plan keeps apart (no text twice in a step, in any role); the role of a key follows from the number
        of positives kept (the index stores it: :mod:`obliq.data.index`)."""
        out = [*self.query_key()]
        positives, negatives = self.positives, self.negatives
        if caps is not None:
            positives, negatives = positives[: caps.positives(len(positives))], negatives[: caps.max_negatives]
        for doc in (*positives, *negatives):
            out += [id_hash(doc.id), doc.text_hash]
        return out


class _Checker:
    """Field checks for one line; collects the repair count."""

    def __init__(self, path: str, line: int):
        self.path, self.line, self.repairs = path, line, 0

    def fail(self, name: str, kind: str, reason: str) -> RowError:
        return RowError(self.path, self.line, name, kind, reason)

    def string(self, obj: dict, key: str, name: str, *, required: bool = True) -> str | None:
        if key not in obj:
            if required:
                raise self.fail(name, "missing", "required field is missing")
            return None
        value = obj[key]
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise self.fail(name, "type", f"expected a string, got {type(value).__name__}")
        value, n = repair_text(value)
        self.repairs += n
        if required and not value.strip():
            raise self.fail(name, "empty", "is empty")
        return value

    def doc(self, obj: Any, name: str) -> Doc:
        if not isinstance(obj, dict):
            raise self.fail(name, "type", f"expected an object with id and text, got {type(obj).__name__}")
        for key in obj:
            if key not in _DOC_FIELDS:
                raise self.fail(
                    f"{name}.{key}", "unknown-field", f"unknown field (a document has {', '.join(_DOC_FIELDS)})"
                )
        doc_id = self.string(obj, "id", f"{name}.id")
        text = self.string(obj, "text", f"{name}.text")
        return Doc(doc_id, text, text_hash(text))


def parse_row(raw: bytes | str, path: str, line: int) -> TrainingRow:
    """Parse and validate one JSONL line of the training-row format.

    Args:
        raw: the line (bytes as read from the file, or text), with or without its newline.
        path: the file, for error messages.
        line: the 1-based line number, for error messages.

    Returns:
        The row, with strings repaired (:func:`obliq.text.repair_text`) and the repair count in ``repairs``.

    Raises:
        RowError: the first problem found, as ``file:line:field: reason``; ``kind`` is one of
            :data:`ERROR_KINDS` except ``duplicate-id`` (a property of the whole mixture).
    """
    check = _Checker(path, line)
    if line == 1:  # a byte-order mark before the first row (C28)
        raw = strip_bom(raw) if isinstance(raw, bytes) else raw.removeprefix("\ufeff")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise check.fail("(row)", "json", f"not UTF-8: {err.reason} at byte {err.start}") from None
    try:
        obj = json.loads(raw, strict=False)  # strict=False: raw control characters (NUL) are repaired below
    except json.JSONDecodeError as err:
        raise check.fail("(row)", "json", f"not valid JSON: {err}") from None
    if not isinstance(obj, dict):
        raise check.fail("(row)", "json", f"expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in _ROW_FIELDS:
            raise check.fail(key, "unknown-field", f"unknown field (a row has {', '.join(_ROW_FIELDS)})")

    row_id = check.string(obj, "id", "id")
    task = check.string(obj, "task", "task")
    source = check.string(obj, "source", "source")
    if source not in ROW_SOURCES:
        raise check.fail("source", "value", f"{source!r} is not one of {', '.join(ROW_SOURCES)}")
    query = check.string(obj, "query", "query")
    positives = _positives(check, obj)
    if "negatives" not in obj:
        raise check.fail("negatives", "missing", "required field is missing (use [] for none)")
    if not isinstance(obj["negatives"], list):
        raise check.fail("negatives", "type", f"expected a list, got {type(obj['negatives']).__name__}")
    negatives = []
    for i, item in enumerate(obj["negatives"]):
        doc = check.doc(item, f"negatives[{i}]")
        for name, pos in zip(_positive_names(obj, len(positives)), positives):
            if doc.id == pos.id:
                raise check.fail(f"negatives[{i}].id", "negative-is-positive", f"negative has {name}'s id {doc.id!r}")
            if doc.text_hash == pos.text_hash and normalise_text(doc.text) == normalise_text(pos.text):
                raise check.fail(
                    f"negatives[{i}].text",
                    "negative-is-positive",
                    f"negative {doc.id!r} has {name}'s text (normalised)",
                )
        negatives.append(doc)
    lens = check.string(obj, "lens", "lens", required=False)
    instruction = check.string(obj, "instruction", "instruction", required=False)
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise check.fail("meta", "type", f"expected an object, got {type(meta).__name__}")
    scores = (meta or {}).get("teacher_scores")
    if scores is not None:  # the positive's score, then one per negative (obliq distill pairs --teacher_scores)
        if len(positives) > 1:
            raise check.fail(
                "meta.teacher_scores",
                "value",
                f"teacher scores are for single-positive rows; this row has {len(positives)} positives",
            )
        if not isinstance(scores, list) or len(scores) != 1 + len(negatives):
            got = f"{len(scores)} scores" if isinstance(scores, list) else type(scores).__name__
            raise check.fail(
                "meta.teacher_scores", "value", f"expected a list of {1 + len(negatives)} numbers, got {got}"
            )
        for i, value in enumerate(scores):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise check.fail(f"meta.teacher_scores[{i}]", "value", f"expected a finite number, got {value!r}")
    return TrainingRow(row_id, task, source, query, positives, tuple(negatives), lens, instruction, meta, check.repairs)


def _positives(check: _Checker, obj: dict) -> tuple[Doc, ...]:
    """The row's positives from exactly one of ``positive`` and ``positives``; none sharing an id or a
    normalised text with another."""
    if "positive" in obj and "positives" in obj:
        raise check.fail("positives", "value", "a row has either positive or positives, not both")
    if "positive" in obj:
        return (check.doc(obj["positive"], "positive"),)
    if "positives" not in obj:
        raise check.fail("positive", "missing", "required field is missing (positive, or a list of positives)")
    items = obj["positives"]
    if not isinstance(items, list):
        raise check.fail("positives", "type", f"expected a list, got {type(items).__name__}")
    if not items:
        raise check.fail("positives", "empty", "is an empty list (a row needs at least one positive)")
    out: list[Doc] = []
    for i, item in enumerate(items):
        doc = check.doc(item, f"positives[{i}]")
        for j, other in enumerate(out):
            if doc.id == other.id:
                raise check.fail(f"positives[{i}].id", "value", f"positive has the id of positives[{j}], {doc.id!r}")
            if doc.text_hash == other.text_hash and normalise_text(doc.text) == normalise_text(other.text):
                raise check.fail(
                    f"positives[{i}].text", "value", f"positive {doc.id!r} has the text of positives[{j}] (normalised)"
                )
        out.append(doc)
    return tuple(out)


def _positive_names(obj: dict, n: int) -> list[str]:
    """How a message names each positive: ``the positive``, or ``positives[i]``."""
    return ["the positive"] if "positive" in obj else [f"positives[{i}]" for i in range(n)]


def row_positives(row: dict) -> list[dict]:
    """The positives of a row held as a JSON dict (``{"id", "text"}`` each, file order): its ``positives``, or
    its one ``positive``. For the stages that read rows as dicts (negatives, synth, distill, benches).

    Raises:
        KeyError: the row has neither field (rows are checked with :func:`parse_row` when read).
    """
    if "positives" in row:
        return list(row["positives"])
    return [row["positive"]]


def positive_fields(docs: Sequence[dict]) -> dict:
    """The field a row is written with: ``{"positive": doc}`` for one document, ``{"positives": [...]}`` for
    several (docs/formats.md).

    Raises:
        ValueError: no document.
    """
    if not docs:
        raise ValueError("a training row needs at least one positive")
    return {"positive": dict(docs[0])} if len(docs) == 1 else {"positives": [dict(d) for d in docs]}


def read_rows(path: str | Path) -> list[dict]:
    """Read a JSONL file of training rows, each validated with :func:`obliq.data.rows.parse_row`, their
    strings repaired as it repairs them (lone surrogates, NUL).

    Blank lines are skipped.

    Raises:
        FileNotFoundError: no such file.
        obliq.data.rows.RowError: a bad row (``file:line:field: reason``).
    """
    path = Path(path)
    rows = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            raw = strip_bom(raw) if lineno == 1 else raw
            if not raw.strip():
                continue
            parse_row(raw, str(path), lineno)
            rows.append(_repaired(json.loads(raw.decode("utf-8"), strict=False)))
    return rows


def _repaired(value):
    """``value`` (a JSON-loaded row) with every string repaired as :func:`parse_row` repairs its fields
    (:func:`obliq.text.repair_text`: a lone surrogate would fail when the row is written out again)."""
    if isinstance(value, str):
        return repair_text(value)[0]
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    if isinstance(value, dict):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    return value
