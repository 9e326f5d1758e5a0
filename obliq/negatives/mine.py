"""BM25 hard negatives for training rows (the OBLIQ-IR paper, §3.1 and §4 "Training data": four BM25
hard negatives per synthetic query, mined over the task's own corpus).

For each row the query is searched against the task corpus and the best-ranked documents become its
``negatives``, except candidates that are not negatives at all (``shared/cases/C06``, ``C17``):

- ``positive_id``: the row's positive, by id;
- ``positive_text``: another document whose normalised text (:func:`obliq.text.text_hash`) is a
  positive's text — the same document indexed twice;
- ``same_query_positive``: the positive (by id or text) of another row with the same normalised query,
  e.g. the other relevant documents of a real query;
- ``empty``: a document with no text left after normalisation (BM25 never ranks a document without a
  shared term, so this catches only punctuation-like texts);
- ``duplicate_text``: a copy (normalised text) of a negative already taken for the row;
- ``skipped_rank``: the first ``skip`` candidates that survive the checks above, left out on purpose
  because the very top of a BM25 list often holds unlabelled positives (as sentence-transformers'
  ``mine_hard_negatives`` ``range_min``).

Every drop is counted by reason in the report. A row whose corpus runs out of candidates keeps fewer
than ``k`` negatives and is counted in ``short_rows``. The search depth starts at
``max(2 (skip + k), skip + k + 10)`` and doubles for the rows that still lack negatives.

Backends (``search(queries, depth) -> [[(doc index, score), ...], ...]``, best first):

- :class:`Bm25sBackend` (default): obliq's one BM25, :class:`obliq.eval.bm25.BM25` (bm25s, Lucene
  scoring, k1 = 0.9, b = 0.4, lowercase ``\\w+`` tokens, Snowball English stemmer);
- :class:`obliq.negatives.pyserini_backend.PyseriniBackend`: a real Lucene index (optional extra).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from obliq.eval.bm25 import BM25, BM25_STEMMER, K1, B
from obliq.text import normalise_text, text_hash

log = logging.getLogger(__name__)

DROP_REASONS = ("positive_id", "positive_text", "same_query_positive", "empty", "duplicate_text", "skipped_rank")
"""Why a BM25 candidate was not kept as a negative (keys of :attr:`MiningReport.dropped`)."""

Hits = list[tuple[int, float]]
"""One query's ranking: ``(document index, BM25 score)``, best first."""


class SearchBackend(Protocol):
    """A lexical retriever over one corpus: ``search(queries, depth)`` → one :data:`Hits` per query.

    ``name`` describes it (written into rows' ``meta`` and the report).
    """

    name: str

    def search(self, queries: Sequence[str], depth: int) -> list[Hits]: ...


class Bm25sBackend:
    """The default backend: :class:`obliq.eval.bm25.BM25` over the corpus texts.

    Args:
        texts: the corpus, in index order.
        k1, b: BM25 parameters (default 0.9, 0.4: Anserini's defaults).
        stemmer: PyStemmer language, or None (default ``english``, Snowball Porter2).
    """

    def __init__(
        self,
        texts: Sequence[str],
        k1: float = K1,
        b: float = B,
        stemmer: str | None = BM25_STEMMER,
        ids: Sequence[str] | None = None,
    ):
        self.index = BM25(texts, k1=k1, b=b, stemmer=stemmer, ids=ids)
        self.name = f"bm25s(k1={k1}, b={b}, stemmer={stemmer})"

    def search(self, queries: Sequence[str], depth: int) -> list[Hits]:
        """Top ``depth`` documents per query (score > 0 only; equal scores by id, descending)."""
        return [list(zip(idx.tolist(), sc.tolist())) for sc, idx in self.index.search(queries, depth)]


@dataclass
class MiningReport:
    """What a mining run did.

    Attributes:
        backend: the backend's name.
        rows: rows processed.
        negatives: negatives written in all.
        k, skip: the settings.
        short_rows: rows that got fewer than ``k`` negatives (the corpus ran out of candidates).
        dropped: candidates dropped, by reason (:data:`DROP_REASONS`).
        rows_with_negatives_replaced: input rows that already had negatives (they are replaced).
        index_seconds: time to build the backend's index.
        search_seconds: time to search and filter.
        rows_per_s: ``rows / search_seconds``.
    """

    backend: str = ""
    rows: int = 0
    negatives: int = 0
    k: int = 4
    skip: int = 0
    short_rows: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    rows_with_negatives_replaced: int = 0
    index_seconds: float = 0.0
    search_seconds: float = 0.0
    rows_per_s: float = 0.0


def mine_negatives(
    rows: Sequence[dict],
    doc_ids: Sequence[str],
    doc_texts: Sequence[str],
    backend: SearchBackend,
    k: int = 4,
    skip: int = 0,
    report: MiningReport | None = None,
    all_rows: Sequence[dict] | None = None,
) -> tuple[list[dict], MiningReport]:
    """Fill each row's ``negatives`` with its top BM25 documents that are real negatives.

    Args:
        rows: training rows as dicts (docs/formats.md format: ``query``, ``positive`` {``id``, ``text``}, ...).
        doc_ids, doc_texts: the task corpus, in the backend's index order.
        backend: a :class:`SearchBackend` built over ``doc_texts``.
        k: negatives per row (the paper: 4).
        skip: surviving candidates to leave out at the top of each ranking (0 = none).
        report: a report to fill (its ``index_seconds`` is kept); a new one by default.
        all_rows: every row of the file when ``rows`` is one shard of it: the positives of rows with
            the same query are excluded across shards too, so a row's negatives never depend on the
            sharding (default: ``rows``).

    Returns:
        New row dicts (input rows are not modified) with ``negatives`` = up to ``k`` ``{"id", "text"}``
        in rank order and ``meta["bm25_negatives"]`` = ``{"backend", "ranks", "scores"}`` (1-based
        ranks in the BM25 list), and the :class:`MiningReport`.

    Raises:
        ValueError: ``k`` < 1 or ``skip`` < 0, or ``doc_ids`` and ``doc_texts`` differ in length.
    """
    if k < 1 or skip < 0:
        raise ValueError(f"need k >= 1 and skip >= 0, got k={k}, skip={skip}")
    if len(doc_ids) != len(doc_texts):
        raise ValueError(f"{len(doc_ids)} doc ids but {len(doc_texts)} doc texts")
    report = report or MiningReport()
    report.backend, report.k, report.skip, report.rows = backend.name, k, skip, len(rows)
    start = time.perf_counter()
    hashes = [text_hash(t) for t in doc_texts]
    empty = [not normalise_text(t) for t in doc_texts]

    # Positives of every row with the same normalised query are excluded for all of them.
    by_query: dict[int, tuple[set[str], set[int]]] = {}
    for row in rows if all_rows is None else all_rows:
        ids, texts = by_query.setdefault(text_hash(row["query"]), (set(), set()))
        ids.add(row["positive"]["id"])
        texts.add(text_hash(row["positive"]["text"]))

    chosen: list[list[tuple[int, int, float]]] = [[] for _ in rows]  # (doc index, rank, score)
    dropped = Counter()
    pending = list(range(len(rows)))
    seen_depth = [0] * len(rows)  # ranks already examined per row
    survivors = [0] * len(rows)  # candidates that passed the checks (for skip)
    taken_hashes: list[set[int]] = [set() for _ in rows]
    depth = max(2 * (skip + k), skip + k + 10)
    while pending:
        rankings = backend.search([rows[i]["query"] for i in pending], depth)
        still = []
        for i, hits in zip(pending, rankings):
            row = rows[i]
            pos_id, pos_hash = row["positive"]["id"], text_hash(row["positive"]["text"])
            group_ids, group_hashes = by_query[text_hash(row["query"])]
            for rank, (j, score) in enumerate(hits[seen_depth[i] :], start=seen_depth[i] + 1):
                if len(chosen[i]) == k:
                    break
                seen_depth[i] = rank
                reason = None
                if doc_ids[j] == pos_id:
                    reason = "positive_id"
                elif hashes[j] == pos_hash:
                    reason = "positive_text"
                elif doc_ids[j] in group_ids or hashes[j] in group_hashes:
                    reason = "same_query_positive"
                elif empty[j]:
                    reason = "empty"
                elif hashes[j] in taken_hashes[i]:
                    reason = "duplicate_text"
                elif survivors[i] < skip:
                    survivors[i] += 1
                    reason = "skipped_rank"
                if reason:
                    dropped[reason] += 1
                    continue
                chosen[i].append((j, rank, score))
                taken_hashes[i].add(hashes[j])
            if len(chosen[i]) < k and len(hits) == depth and depth < len(doc_ids):
                still.append(i)  # the ranking was cut at depth: look deeper
        pending, depth = still, depth * 2

    out = []
    for row, picks in zip(rows, chosen):
        new = dict(row)
        if row.get("negatives"):
            report.rows_with_negatives_replaced += 1
        new["negatives"] = [{"id": doc_ids[j], "text": doc_texts[j]} for j, _, _ in picks]
        meta = dict(row.get("meta") or {})
        meta["bm25_negatives"] = {
            "backend": backend.name,
            "ranks": [r for _, r, _ in picks],
            "scores": [round(s, 6) for _, _, s in picks],
        }
        new["meta"] = meta
        report.negatives += len(picks)
        report.short_rows += len(picks) < k
        out.append(new)
    report.dropped = {r: dropped[r] for r in DROP_REASONS}
    report.search_seconds = time.perf_counter() - start
    report.rows_per_s = len(rows) / report.search_seconds if report.search_seconds > 0 else 0.0
    return out, report
