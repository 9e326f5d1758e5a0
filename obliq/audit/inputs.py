"""Inputs of the audit: the query sets of a task, the query-attributes file, document leans.

- **Query sets.** A task folder's ``queries.jsonl`` is judged by ``qrels/test.tsv``; a further set
  over the same corpus is ``queries-<name>.jsonl`` judged by ``qrels/<name>.tsv`` (health-dialect's
  ``queries-translated.jsonl`` + ``qrels/translated.tsv``). Each set is loaded and validated by
  :func:`obliq.tasks.load_task`; :func:`load_query_sets` joins them into one task whose
  ``qrels["test"]`` holds every set's judgements.
- **Query attributes** (TSV, header line optional): ``query-id<TAB>group<TAB>pair-id[<TAB>cluster-id]``.
  ``group`` is the identity signal (dialect, lean, …; the header names it); queries sharing a
  ``pair-id`` are variants of one question that share its gold documents; ``cluster-id`` (optional)
  groups pairs that are not independent, e.g. several pairs built from one source article (default:
  the pair-id). A missing ``pair-id`` column makes every query its own pair.
- **Document attributes** (TSV, header optional): ``corpus-id<TAB>lean``, a number per document
  (e.g. −1 left, 0 centre, +1 right), read with :func:`obliq.files.read_id_table`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from obliq.files import open_text, read_id_table
from obliq.tasks import Task, load_task

log = logging.getLogger(__name__)

GOLD = "test"
"""Key of the joined judgements in :attr:`Task.qrels` (the key obliq.eval reads as gold)."""

_HEADER_IDS = ("query-id", "query_id", "qid", "_id", "id")


@dataclass(frozen=True)
class QueryAttribute:
    """One line of a query-attributes file."""

    query_id: str
    group: str
    pair_id: str
    cluster_id: str
    line: int


@dataclass
class QueryAttributes:
    """A query-attributes file, read and checked (see the module docstring)."""

    path: Path
    attribute: str
    """Name of the group column (from the header; ``group`` without one), e.g. ``dialect``."""
    rows: dict[str, QueryAttribute]
    """query id → its attributes, in file order."""

    def groups(self) -> list[str]:
        """The group values, in order of first appearance."""
        return list(dict.fromkeys(r.group for r in self.rows.values()))

    def members(self, group: str) -> list[QueryAttribute]:
        """The queries of one group, in file order."""
        return [r for r in self.rows.values() if r.group == group]

    def check_groups(self, names: Sequence[str]) -> None:
        """Raise ValueError naming the file and the groups it has if a name is not one of them."""
        known = self.groups()
        for name in names:
            if name not in known:
                raise ValueError(f"{self.path}: no query has {self.attribute} {name!r}; the groups are {known}")


def read_query_attributes(path: str | Path) -> QueryAttributes:
    """Read ``query-id<TAB>group<TAB>pair-id[<TAB>cluster-id]`` lines.

    Returns:
        The attributes; every pair-id's queries share one cluster-id.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line with another number of columns, an empty field, a query id given twice,
            or a pair whose queries name different clusters (file, line and field named).
    """
    path = Path(path)
    rows: dict[str, QueryAttribute] = {}
    attribute, names = "group", ("query-id", "group", "pair-id", "cluster-id")
    first = True
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            cols = [c.strip() for c in line.split("\t")]
            if first and cols[0].lower() in _HEADER_IDS:
                first = False
                if len(cols) > 1 and cols[1]:
                    attribute = cols[1]
                    names = ("query-id", attribute, "pair-id", "cluster-id")
                continue
            first = False
            if not 2 <= len(cols) <= 4:
                raise ValueError(
                    f"{path}:{lineno}: expected 2 to 4 tab-separated columns "
                    f"(query-id, {attribute}, pair-id, cluster-id), got {len(cols)}"
                )
            for name, value in zip(names, cols):
                if not value:
                    raise ValueError(f"{path}:{lineno}: field {name!r} is empty")
            qid, group = cols[0], cols[1]
            pair = cols[2] if len(cols) > 2 else qid
            cluster = cols[3] if len(cols) > 3 else pair
            if qid in rows:
                raise ValueError(f"{path}:{lineno}: field 'query-id': {qid!r} already given on line {rows[qid].line}")
            rows[qid] = QueryAttribute(qid, group, pair, cluster, lineno)
    if not rows:
        raise ValueError(f"{path}: no query attributes")
    cluster_of: dict[str, QueryAttribute] = {}
    for r in rows.values():
        seen = cluster_of.setdefault(r.pair_id, r)
        if seen.cluster_id != r.cluster_id:
            raise ValueError(
                f"{path}:{r.line}: field 'cluster-id': pair {r.pair_id!r} is in cluster "
                f"{r.cluster_id!r} here and {seen.cluster_id!r} on line {seen.line}"
            )
    return QueryAttributes(path, attribute, rows)


def read_document_lean(path: str | Path, doc_ids: Sequence[str] | None = None) -> dict[str, float]:
    """Read ``corpus-id<TAB>lean`` (a finite number per document).

    Args:
        path: the file.
        doc_ids: the corpus; ids of the file that are not in it are counted in a warning.

    Returns:
        corpus id → lean. Documents without a line have no lean (lean@k skips them).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed line (see read_id_table) or a lean that is not a finite number
            (file, line and field named).
    """
    path = Path(path)
    table = read_id_table(path, "lean")
    lean: dict[str, float] = {}
    for doc, value in table.items():
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            raise ValueError(f"{path}:{_line_of(path, doc)}: field 'lean' must be a finite number, got {value!r}")
        lean[doc] = x
    if doc_ids is not None:
        corpus = set(doc_ids)
        extra = sum(d not in corpus for d in lean)
        unlabelled = sum(d not in lean for d in corpus)
        if extra:
            log.warning("%s: %d ids are not in the corpus (ignored)", path, extra)
        if unlabelled:
            log.warning("%s: %d of %d corpus documents have no lean (lean@k skips them)", path, unlabelled, len(corpus))
    return lean


def _line_of(path: Path, doc: str) -> int:
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.split("\t", 1)[0].strip() == doc:
                return lineno
    return 0


def query_set_files(folder: str | Path, query_sets: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """The ``(queries file, qrels split)`` pairs of a task folder.

    Args:
        folder: the task folder.
        query_sets: entries ``FILE`` or ``FILE:SPLIT`` (files relative to the folder). ``FILE`` alone
            takes its split from the name: ``queries.jsonl`` → ``test``, ``queries-<name>.jsonl`` →
            ``<name>``. None: ``queries.jsonl`` plus every ``queries-<name>.jsonl`` that has a
            ``qrels/<name>.tsv``.

    Raises:
        ValueError: an entry whose split cannot be derived from its name.
    """
    folder = Path(folder)
    if query_sets is None:
        found = [("queries.jsonl", "test")]
        for file in sorted(folder.glob("queries-*.jsonl")):
            split = file.name[len("queries-") : -len(".jsonl")]
            if (folder / "qrels" / f"{split}.tsv").is_file():
                found.append((file.name, split))
        return found
    out = []
    for entry in query_sets:
        file, sep, split = entry.partition(":")
        if not sep:
            name = Path(file).name
            if name == "queries.jsonl":
                split = "test"
            elif name.startswith("queries-") and name.endswith(".jsonl"):
                split = name[len("queries-") : -len(".jsonl")]
            else:
                raise ValueError(f"query set {entry!r}: give its qrels split as FILE:SPLIT (qrels/SPLIT.tsv)")
        out.append((file, split))
    return out


def load_query_sets(folder: str | Path, query_sets: Sequence[str] | None = None) -> Task:
    """Load a task with all its query sets joined (see :func:`query_set_files`).

    Each set goes through :func:`obliq.tasks.load_task` (validation, warnings, report); the
    joined task has every set's queries in order, their judgements in ``qrels["test"]`` and their
    candidate sets (``top_ranked/<split>.jsonl``) when any set has them; its ``report`` maps each
    queries file to that set's validation report.

    Raises:
        FileNotFoundError: a queries file or its qrels file is missing.
        ValueError: a query id in two sets (both files named), or as :func:`load_task`.
    """
    parts = [
        (file, load_task(folder, queries=file, splits=(split,))) for file, split in query_set_files(folder, query_sets)
    ]
    first = parts[0][1]
    source: dict[str, str] = {}
    query_ids, query_texts, gold, report = [], [], {}, {}
    candidates = None if all(task.candidates is None for _, task in parts) else {}
    for file, task in parts:
        for qid, text in zip(task.query_ids, task.query_texts):
            if qid in source:
                raise ValueError(f"{Path(folder) / file}: query id {qid!r} is also in {source[qid]}")
            source[qid] = file
            query_ids.append(qid)
            query_texts.append(text)
        (split,) = task.qrels
        gold.update(task.qrels[split])
        report[file] = task.report
        if candidates is not None:  # a set without candidates ranks over the corpus: every document its candidate
            candidates.update(task.candidates or dict.fromkeys(task.query_ids, task.doc_ids))
    return dataclasses.replace(
        first, query_ids=query_ids, query_texts=query_texts, qrels={GOLD: gold}, report=report, candidates=candidates
    )


def restrict_queries(task: Task, attributes: QueryAttributes, files: str = "") -> Task:
    """The task with only the queries listed in the attributes file, in that file's order.

    Raises:
        ValueError: a listed query id that no queries file holds (attributes file, line and field named).
    """
    texts = dict(zip(task.query_ids, task.query_texts))
    for r in attributes.rows.values():
        if r.query_id not in texts:
            where = f" ({files})" if files else ""
            raise ValueError(
                f"{attributes.path}:{r.line}: field 'query-id': {r.query_id!r} is in none of "
                f"the task's queries files{where}"
            )
    ids = list(attributes.rows)
    skipped = len(texts) - len(ids)
    if skipped:
        log.info("%d queries of %s have no attributes and are not audited", skipped, task.name)
    gold = {q: task.qrels[GOLD][q] for q in ids if q in task.qrels[GOLD]}
    return dataclasses.replace(task, query_ids=ids, query_texts=[texts[q] for q in ids], qrels={GOLD: gold})
