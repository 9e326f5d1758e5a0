"""Hard negatives for training rows (the OBLIQ-IR paper, §3.1 and §4 "Training data": four BM25 hard
negatives per synthetic query, mined over the task's own corpus), by BM25 or by a dense model or a
teacher, with the filters that keep an oblique query's many unlabelled positives out.

For each row the query is searched against the task corpus and the best-ranked documents become its
``negatives``, except candidates that are not negatives at all (``shared/cases/C06``, ``C17``):

- ``positive_id``: a positive of the row, by id (every one of a row with several ``positives``);
- ``positive_text``: another document whose normalised text (:func:`obliq.text.text_hash`) is a
  positive's text — the same document indexed twice;
- ``same_query_positive``: the positive (by id or text) of another row with the same normalised query,
  e.g. the other relevant documents of a real query;
- ``empty``: a document with no text left after normalisation (BM25 never ranks a document without a
  shared term, so this catches only punctuation-like texts);
- ``query_document``: the row's query's own document — a kNN row's anchor (``obliq distill pairs``: the
  query *is* a corpus document, which every backend ranks first), by ``meta.anchor_id`` or by normalised
  text, or a query copied from the corpus; as a negative it would teach that a text is not relevant to
  itself;
- ``duplicate_text``: a copy (normalised text) of a negative already taken for the row;
- ``veto``: a document the row's attribute rules out (:class:`AttributeVeto`: the same attribute as
  the positive in the task's ``attributes.tsv``, e.g. the same author; :class:`TeacherVeto`: in the
  positive's neighbourhood in the teacher's kNN graph) — an unlabelled positive by the task's own
  definition of relevance;
- ``above_positive``: positive-aware filtering (NV-Retriever's TopK-PercPos, Moreira et al. 2024, the
  default of sentence-transformers' ``mine_hard_negatives`` and of NeMo): a candidate that scores above
  ``max_score_ratio`` × the positive's own score s (0.95: 95% of it; s − |s| · (1 − ratio), so also
  below s when s < 0: :func:`positive_limit`; a row with several positives: its lowest-scoring one's) is
  likely a false negative;
- ``beyond_range``: ranked below ``range_max`` (the candidates are drawn from ranks ≤ ``range_max``);
- ``skipped_rank``: the first ``skip`` candidates that survive the checks above, left out on purpose
  because the very top of a ranking often holds unlabelled positives (sentence-transformers'
  ``range_min``).

The survivors are taken best first (``sampling="top"``) or drawn at random among those within the
range (``sampling="random"``, seeded per row, as sentence-transformers' ``sampling_strategy``).
Every drop is counted by reason in the report. A row whose corpus runs out of candidates keeps fewer
than ``k`` negatives and is counted in ``short_rows``. The search depth starts at
``max(2 (skip + k), skip + k + 10)`` (or ``range_max``) and doubles for the rows that still lack negatives.

Backends (``search(queries, depth) -> [[(doc index, score), ...], ...]``, best first, and
``score(queries, docs)``: the score of one given document per query):

- :class:`Bm25sBackend` (default): obliq's one BM25, :class:`obliq.search.bm25.BM25` (bm25s, Lucene
  scoring, k1 = 0.9, b = 0.4, lowercase ``\\w+`` tokens, Snowball English stemmer);
- :class:`DenseBackend`: a dense model (an alias, a folder, an adapter: :func:`obliq.search.encoders.load_encoder`)
  or the stylometric teacher fitted on the corpus; cosine of unit vectors, exact search;
- :class:`obliq.negatives.pyserini_backend.PyseriniBackend`: a real Lucene index (optional extra; no
  positive-aware filtering).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from obliq.data.rows import row_positives
from obliq.search.bm25 import BM25, BM25_STEMMER, K1, B
from obliq.text import normalise_text, text_hash

log = logging.getLogger(__name__)

DROP_REASONS = (
    "positive_id",
    "positive_text",
    "same_query_positive",
    "empty",
    "query_document",
    "duplicate_text",
    "veto",
    "above_positive",
    "beyond_range",
    "skipped_rank",
)
"""Why a candidate was not kept as a negative (keys of :attr:`MiningReport.dropped`), in the order checked."""

Hits = list[tuple[int, float]]
"""One query's ranking: ``(document index, score)``, best first."""


class SearchBackend(Protocol):
    """A retriever over one corpus: ``search(queries, depth)`` → one :data:`Hits` per query, and
    ``score(queries, docs)`` → the score of one given document per query (on the ranking's scale: what
    positive-aware filtering compares with).

    ``name`` describes it (written into rows' ``meta`` and the report).
    """

    name: str

    def search(self, queries: Sequence[str], depth: int) -> list[Hits]: ...

    def score(self, queries: Sequence[str], docs: Sequence[int]) -> list[float]: ...


class Bm25sBackend:
    """The default backend: :class:`obliq.search.bm25.BM25` over the corpus texts.

    Args:
        texts: the corpus, in index order.
        k1, b: BM25 parameters (default 0.9, 0.4: Anserini's defaults).
        stemmer: PyStemmer language, or None (default ``english``, Snowball Porter2).
        ids: the documents' ids, which break ties (trec_eval's order: id descending); None: the row
            number stands for the id.
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

    def score(self, queries: Sequence[str], docs: Sequence[int]) -> list[float]:
        """The BM25 score of document ``docs[i]`` for ``queries[i]`` (0 when they share no term)."""
        return [float(self.index.scores(t)[d]) for t, d in zip(self.index.tokenize(queries), docs)]


class DenseBackend:
    """Dense (or teacher) mining: the corpus encoded once, queries searched exactly by cosine
    (:class:`obliq.search.exact.ExactIndex`).

    Args:
        texts: the corpus, in index order.
        model: an alias (``minilm``), a folder, an adapter or a hub id (:func:`obliq.search.encoders.load_encoder`),
            or ``stylometric``: the stylometric teacher fitted on the corpus (:mod:`obliq.search.teachers`).
        batch_size: texts per forward pass.
        query_max_length, passage_max_length: the reading lengths (tokens; the evaluation's defaults).
        trust_remote_code: let a hub model run its own code (only for models you trust).
        ids: the documents' ids, which break ties (trec_eval's order: id descending, decided before the
            cut at ``depth``); None: the row number stands for the id.
    """

    def __init__(
        self,
        texts: Sequence[str],
        model: str = "minilm",
        batch_size: int = 32,
        query_max_length: int | None = None,
        passage_max_length: int | None = None,
        trust_remote_code: bool = False,
        ids: Sequence[str] | None = None,
    ):
        from obliq.search.encoders import load_encoder
        from obliq.search.exact import ExactIndex, unit_float32
        from obliq.search.retrieval import encode_texts
        from obliq.search.settings import RetrievalSettings
        from obliq.search.teachers import STYLOMETRIC, TeacherEncoder

        defaults = RetrievalSettings()
        self.lengths = {
            "query": query_max_length or defaults.query_max_length,
            "passage": passage_max_length or defaults.passage_max_length,
        }
        self.batch_size = batch_size
        if model == STYLOMETRIC:
            self.encoder = TeacherEncoder.stylometric(texts)
        else:
            self.encoder = load_encoder(model, "auto", trust_remote_code)
        self._encode = lambda t, kind: unit_float32(  # noqa: E731
            encode_texts(self.encoder, list(t), kind, batch_size, self.lengths[kind]), f"{kind} embeddings"
        )
        self.docs = self._encode(texts, "passage")
        self.index = ExactIndex(self.docs, ids=ids)
        self._queries: dict[str, np.ndarray] = {}
        self.name = f"dense({model}, query ≤ {self.lengths['query']} tokens, passage ≤ {self.lengths['passage']})"

    def _vectors(self, queries: Sequence[str]) -> np.ndarray:
        new = sorted({q for q in queries if q not in self._queries})
        if new:
            self._queries.update(zip(new, self._encode(new, "query")))
        return np.stack([self._queries[q] for q in queries])

    def search(self, queries: Sequence[str], depth: int) -> list[Hits]:
        """Top ``depth`` documents per query by cosine (equal scores by id, descending)."""
        scores, indices = self.index.search(self._vectors(queries), min(depth, len(self.docs)))
        return [list(zip(i.tolist(), s.tolist())) for s, i in zip(scores, indices)]

    def score(self, queries: Sequence[str], docs: Sequence[int]) -> list[float]:
        """The cosine of document ``docs[i]`` and ``queries[i]``, summed in float64 and rounded to float32
        as :meth:`search` scores it (so a threshold and a ranking agree, on any CPU)."""
        vectors = self._vectors(queries).astype(np.float64)
        return [float(np.float32(v @ self.docs[d].astype(np.float64))) for v, d in zip(vectors, docs)]


class AttributeVeto:
    """Rules out, for a row, every document with its positive's attribute (``attributes.tsv`` of a
    task: ``corpus-id<TAB>attribute``, e.g. the author on an authorship task, where the same attribute
    is relevance itself).

    Args:
        table: corpus id → attribute.
        doc_ids: the corpus, in index order.

    Raises:
        ValueError: the table covers none of the corpus.
    """

    def __init__(self, table: dict[str, str], doc_ids: Sequence[str]):
        self.by_doc = [table.get(d) for d in doc_ids]
        if not any(a is not None for a in self.by_doc):
            raise ValueError("the attribute table names no document of the corpus")
        self.groups: dict[str, set[int]] = {}
        for j, a in enumerate(self.by_doc):
            if a is not None:
                self.groups.setdefault(a, set()).add(j)
        self.name = "attribute"

    def __call__(self, positive: int) -> set[int]:
        """The documents ruled out for a row whose positive is document ``positive``."""
        a = self.by_doc[positive]
        return self.groups.get(a, set()) if a is not None else set()


class TeacherVeto:
    """Rules out, for a row, the ``k`` nearest neighbours of its positive in a teacher's space (the
    kNN graph of kNN-graph distillation, §3.2: what the teacher calls the same attribute).

    Args:
        texts: the corpus, in index order.
        teacher: ``stylometric`` (fitted on the corpus) or an encoder name (:func:`obliq.search.teachers.load_teacher`).
        k: neighbours ruled out per positive.
        ids: the documents' ids, which decide which of tied neighbours are ruled out (id descending, as
            every ranking); None: the row number stands for the id.
    """

    def __init__(self, texts: Sequence[str], teacher: str = "stylometric", k: int = 10, ids=None):
        from obliq.search.exact import ExactIndex
        from obliq.search.teachers import load_teacher

        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        vectors = load_teacher(teacher).encode(list(texts))
        _, self.neighbours = ExactIndex(vectors, ids=ids).search(vectors, min(k + 1, len(texts)))
        self.name = f"teacher({teacher}, k={k})"

    def __call__(self, positive: int) -> set[int]:
        """The documents ruled out for a row whose positive is document ``positive``."""
        return {int(j) for j in self.neighbours[positive] if j != positive}


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


Veto = Callable[[int], set[int]]
"""A row's vetoed documents from its positive's index (:class:`AttributeVeto`, :class:`TeacherVeto`)."""


def mine_negatives(
    rows: Sequence[dict],
    doc_ids: Sequence[str],
    doc_texts: Sequence[str],
    backend: SearchBackend,
    k: int = 4,
    skip: int = 0,
    report: MiningReport | None = None,
    all_rows: Sequence[dict] | None = None,
    max_score_ratio: float | None = None,
    range_max: int | None = None,
    sampling: Literal["top", "random"] = "top",
    veto: Veto | None = None,
    seed: int = 0,
) -> tuple[list[dict], MiningReport]:
    """Fill each row's ``negatives`` with its best-ranked documents that are real negatives (module notes).

    Args:
        rows: training rows as dicts (docs/formats.md format: ``query``, ``positive`` {``id``, ``text``} or
            ``positives`` [...], ...).
        doc_ids, doc_texts: the task corpus, in the backend's index order.
        backend: a :class:`SearchBackend` built over ``doc_texts``.
        k: negatives per row (the paper: 4).
        skip: surviving candidates to leave out at the top of each ranking (0 = none).
        report: a report to fill (its ``index_seconds`` is kept); a new one by default.
        all_rows: every row of the file when ``rows`` is one shard of it: the positives of rows with
            the same query are excluded across shards too, so a row's negatives never depend on the
            sharding (default: ``rows``).
        max_score_ratio: positive-aware filtering: drop a candidate scoring above this share of the
            positive's own score (NV-Retriever's TopK-PercPos: 0.95); None keeps every score.
        range_max: take candidates only from the first ``range_max`` ranks of the backend's ranking;
            None: as deep as needed.
        sampling: ``top`` (the best surviving candidates) or ``random`` (``k`` drawn among the survivors
            within ``range_max``, which it then requires; seeded per row id).
        veto: a callable, positive's document index → the document indexes ruled out for the row (every
            positive's, for a row with several) (:class:`AttributeVeto`, :class:`TeacherVeto`); None rules out none.
        seed: seed of ``random`` sampling.

    Returns:
        New row dicts (input rows are not modified) with ``negatives`` = up to ``k`` ``{"id", "text"}``
        in rank order and ``meta["mined_negatives"]`` = ``{"backend", "ranks", "scores", "positive_score"}``
        (1-based ranks in the backend's ranking), and the :class:`MiningReport`.

    Raises:
        ValueError: ``k`` < 1, ``skip`` < 0, a ratio outside (0, 1], ``range_max`` < ``skip + k``,
            ``random`` sampling without ``range_max``, a positive that is not a corpus document (with
            a veto or a ratio), or ``doc_ids`` and ``doc_texts`` of different lengths.
    """
    if k < 1 or skip < 0:
        raise ValueError(f"need k >= 1 and skip >= 0, got k={k}, skip={skip}")
    if len(doc_ids) != len(doc_texts):
        raise ValueError(f"{len(doc_ids)} doc ids but {len(doc_texts)} doc texts")
    if max_score_ratio is not None and not 0 < max_score_ratio <= 1:
        raise ValueError(f"max_score_ratio must be in (0, 1], got {max_score_ratio}")
    if range_max is not None and range_max < skip + k:
        raise ValueError(f"range_max ({range_max}) leaves fewer than skip + k ({skip + k}) ranks to draw from")
    if sampling not in ("top", "random"):
        raise ValueError(f"sampling must be 'top' or 'random', got {sampling!r}")
    if sampling == "random" and range_max is None:
        raise ValueError("random sampling draws among the first range_max ranks: give range_max")
    report = report or MiningReport()
    report.backend, report.k, report.skip, report.rows = backend.name, k, skip, len(rows)
    start = time.perf_counter()
    hashes = [text_hash(t) for t in doc_texts]
    empty = [not normalise_text(t) for t in doc_texts]
    where = {d: j for j, d in enumerate(doc_ids)}
    positives = [[where.get(p["id"]) for p in row_positives(row)] for row in rows]
    if veto is not None or max_score_ratio is not None:
        for row, found in zip(rows, positives):
            if None in found:
                missing = row_positives(row)[found.index(None)]["id"]
                raise ValueError(f"row {row['id']!r}: positive {missing!r} is not a corpus document")
    positive_scores = [None] * len(rows)
    if max_score_ratio is not None:
        positive_scores = _lowest_scores(backend, [r["query"] for r in rows], positives)
    limit = [None if s is None else positive_limit(s, max_score_ratio) for s in positive_scores]

    # Positives of every row with the same normalised query are excluded for all of them.
    by_query: dict[int, tuple[set[str], set[int]]] = {}
    for row in rows if all_rows is None else all_rows:
        ids, texts = by_query.setdefault(text_hash(row["query"]), (set(), set()))
        ids.update(p["id"] for p in row_positives(row))
        texts.update(text_hash(p["text"]) for p in row_positives(row))

    want = k if sampling == "top" else range_max  # random: every survivor within the range, then a draw
    chosen: list[list[tuple[int, int, float]]] = [[] for _ in rows]  # (doc index, rank, score)
    dropped = Counter()
    pending = list(range(len(rows)))
    seen_depth = [0] * len(rows)  # ranks already examined per row
    survivors = [0] * len(rows)  # candidates that passed the checks (for skip)
    taken_hashes: list[set[int]] = [set() for _ in rows]
    vetoed = [set().union(*(veto(p) for p in ps)) if veto is not None else set() for ps in positives]
    depth = range_max or max(2 * (skip + k), skip + k + 10)
    while pending:
        rankings = backend.search([rows[i]["query"] for i in pending], depth)
        still = []
        for i, hits in zip(pending, rankings):
            row = rows[i]
            pos_ids = {p["id"] for p in row_positives(row)}
            pos_hashes = {text_hash(p["text"]) for p in row_positives(row)}
            query_hash, anchor = text_hash(row["query"]), (row.get("meta") or {}).get("anchor_id")
            group_ids, group_hashes = by_query[query_hash]
            for rank, (j, score) in enumerate(hits[seen_depth[i] :], start=seen_depth[i] + 1):
                if len(chosen[i]) == want:
                    break
                seen_depth[i] = rank
                reason = None
                if doc_ids[j] in pos_ids:
                    reason = "positive_id"
                elif hashes[j] in pos_hashes:
                    reason = "positive_text"
                elif doc_ids[j] in group_ids or hashes[j] in group_hashes:
                    reason = "same_query_positive"
                elif empty[j]:
                    reason = "empty"
                elif hashes[j] == query_hash or doc_ids[j] == anchor:
                    reason = "query_document"
                elif hashes[j] in taken_hashes[i]:
                    reason = "duplicate_text"
                elif j in vetoed[i]:
                    reason = "veto"
                elif limit[i] is not None and score > limit[i]:
                    reason = "above_positive"
                elif range_max is not None and rank > range_max:
                    reason = "beyond_range"
                elif survivors[i] < skip:
                    survivors[i] += 1
                    reason = "skipped_rank"
                if reason:
                    dropped[reason] += 1
                    continue
                chosen[i].append((j, rank, score))
                taken_hashes[i].add(hashes[j])
            deeper = range_max is None and len(hits) == depth and depth < len(doc_ids)
            if len(chosen[i]) < want and deeper:
                still.append(i)  # the ranking was cut at depth: look deeper
        pending, depth = still, depth * 2
    if sampling == "random":
        for i, row in enumerate(rows):
            picks = random.Random(f"{seed}:{row['id']}").sample(chosen[i], min(k, len(chosen[i])))
            chosen[i] = sorted(picks, key=lambda p: p[1])

    out = []
    for row, picks, positive_score in zip(rows, chosen, positive_scores):
        new = dict(row)
        if row.get("negatives"):
            report.rows_with_negatives_replaced += 1
        new["negatives"] = [{"id": doc_ids[j], "text": doc_texts[j]} for j, _, _ in picks]
        meta = dict(row.get("meta") or {})
        meta.pop("teacher_scores", None)  # they scored the negatives replaced here
        meta["mined_negatives"] = {
            "backend": backend.name,
            "ranks": [r for _, r, _ in picks],
            "scores": [round(s, 6) for _, _, s in picks],
            **({"positive_score": round(float(positive_score), 6)} if positive_score is not None else {}),
        }
        new["meta"] = meta
        report.negatives += len(picks)
        report.short_rows += len(picks) < k
        out.append(new)
    report.dropped = {r: dropped[r] for r in DROP_REASONS}
    report.search_seconds = time.perf_counter() - start
    report.rows_per_s = len(rows) / report.search_seconds if report.search_seconds > 0 else 0.0
    return out, report


def _lowest_scores(backend: SearchBackend, queries: Sequence[str], positives: Sequence[Sequence[int]]) -> list[float]:
    """Each query's lowest score over its row's positives (one scoring call for all): the positive-aware threshold
    of a row with several positives is its weakest positive's, the cautious choice (more candidates dropped)."""
    flat = backend.score([q for q, ps in zip(queries, positives) for _ in ps], [p for ps in positives for p in ps])
    out, at = [], 0
    for ps in positives:
        out.append(min(flat[at : at + len(ps)]))
        at += len(ps)
    return out


def positive_limit(positive_score: float, ratio: float) -> float:
    """The positive-aware threshold (NV-Retriever's TopK-PercPos): a candidate scoring above it is
    taken for a false negative. ``s − |s| · (1 − ratio)``: ``ratio · s`` for a positive score s ≥ 0, and
    as far *below* s when s < 0, where ``ratio · s`` would lie above the positive (C40;
    sentence-transformers #3819, fixed in #3821).

    Args:
        positive_score: the query's score with its positive (any scale: cosine, BM25, logits).
        ratio: in (0, 1]; 1 keeps everything up to the positive's own score.
    """
    return positive_score - abs(positive_score) * (1.0 - ratio)


def filter_negatives(
    rows: Sequence[dict],
    doc_ids: Sequence[str],
    backend: SearchBackend | None = None,
    max_score_ratio: float | None = None,
    veto: Veto | None = None,
) -> tuple[list[dict], dict]:
    """Drop the negatives of existing rows that the filters of :func:`mine_negatives` would not have
    taken: vetoed ones (``veto``) and those scoring above ``max_score_ratio`` × the positive's score
    under ``backend`` (positive-aware filtering). Nothing is mined anew.

    Args:
        rows: training rows as dicts, with their negatives.
        doc_ids: the task corpus's ids, in the backend's index order.
        backend: scores queries against documents (needed with ``max_score_ratio``).
        max_score_ratio: the positive-aware threshold (0.95: NV-Retriever's TopK-PercPos); None: off.
        veto: positive's document index → the documents ruled out for the row; None: off.

    Returns:
        ``(rows, counts)``: new rows (inputs untouched) and ``{"rows", "negatives", "kept", "dropped":
        {"veto", "above_positive"}, "rows_left_without_negatives"}``.

    Raises:
        ValueError: a ratio outside (0, 1] or without a backend; a positive or negative that is not
            a corpus document (rows of another task).
    """
    if max_score_ratio is not None and (not 0 < max_score_ratio <= 1 or backend is None):
        raise ValueError("max_score_ratio must be in (0, 1] and needs a backend to score with")
    where = {d: j for j, d in enumerate(doc_ids)}
    counts = {
        "rows": len(rows),
        "negatives": 0,
        "kept": 0,
        "dropped": {"veto": 0, "above_positive": 0},
        "rows_left_without_negatives": 0,
    }
    out = []
    for row in rows:
        negatives = row.get("negatives") or []
        missing = [d["id"] for d in [*row_positives(row), *negatives] if d["id"] not in where]
        if missing:
            raise ValueError(f"row {row['id']!r}: {missing[0]!r} is not a document of the task's corpus")
        pos = [where[p["id"]] for p in row_positives(row)]
        banned = set().union(*(veto(p) for p in pos)) if veto is not None else set()
        limit = None
        if max_score_ratio is not None and negatives:
            docs = pos + [where[d["id"]] for d in negatives]  # the positives' scores, then the negatives'
            scores = backend.score([row["query"]] * len(docs), docs)
            limit, negative_scores = positive_limit(min(scores[: len(pos)]), max_score_ratio), scores[len(pos) :]
        kept = []
        for n, doc in enumerate(negatives):
            if where[doc["id"]] in banned:
                counts["dropped"]["veto"] += 1
            elif limit is not None and negative_scores[n] > limit:
                counts["dropped"]["above_positive"] += 1
            else:
                kept.append(doc)
        counts["negatives"] += len(negatives)
        counts["kept"] += len(kept)
        counts["rows_left_without_negatives"] += bool(negatives) and not kept
        meta = row.get("meta")
        scores = (meta or {}).get("teacher_scores")
        if isinstance(scores, list) and len(scores) == 1 + len(negatives):  # the kept negatives' scores only
            keep = [doc["id"] for doc in kept]
            kept_scores = [scores[0]] + [scores[1 + n] for n, doc in enumerate(negatives) if doc["id"] in keep]
            meta = {**meta, "teacher_scores": kept_scores}
        out.append({**row, "negatives": kept, **({"meta": meta} if meta is not None else {})})
    return out, counts
