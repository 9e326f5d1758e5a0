"""The filter stage: the audit's measures (:mod:`obliq.synth.audit`) turned into decisions about which
generated queries to train on, each threshold set from the task's **real development queries**.

Every candidate row (``obliq synth generate``; several per document with ``samples``) is measured
against its source document over the whole task corpus, and so is every (real development query,
gold document) pair of ``queries-<split>.jsonl`` / ``qrels/<split>.tsv`` (grade >= 1; ``obliq task
split`` writes ``dev``). The development pairs give the thresholds; the test side is never read.

A candidate is dropped, for the first reason that applies, in this order:

1. ``duplicate``: its normalised query (:func:`obliq.text.normalise_text`) is an earlier candidate's
   or a development query's.
2. ``too_lexical``: BM25 (:class:`obliq.search.bm25.BM25`, the audit's) ranks its source at rank ≤ ``t``,
   where ``t`` is the **largest rank that at most ``lexical_quantile`` of the development pairs reach**:
   ``t = max{r : #{pairs with rank ≤ r} ≤ q · n}`` (0 when more than that share of them are at rank 1:
   the real queries are themselves that lexical, so no rank is too lexical). A rank is the audit's:
   1 + the documents scoring strictly higher; a source sharing no term with the query is never too
   lexical (a development pair without a shared term counts as rank ``n_docs + 1``). With ``t`` ≥ 1 no
   kept query has its source at BM25 rank 1, so the kept rows' rank-1 rate is 0, within any multiple of
   the real rate; with ``t`` = 0 the real queries reach rank 1 more often than ``q``, and the rank-1
   rate is left to the pick below.
3. ``unanswerable``: a base dense retriever (``model``, MiniLM by default; Promptagator's round-trip
   consistency, Dai et al. 2022, §3.2) ranks its source below ``K``, the ``dense_quantile`` quantile of
   the development pairs' dense ranks (``numpy.quantile(…, method="inverted_cdf")``: the smallest rank
   that at least that share of the pairs reach). Dense ranks are 1 + the documents whose cosine is
   strictly higher, over the whole corpus (exact; the corpus embeddings come from, or go into, the
   embedding store that ``evaluate`` uses, :func:`obliq.search.retrieval.corpus_embeddings`).
4. ``not_best`` (best-of-n): of a document's surviving candidates, ``per_document`` are kept, the best
   first by ``pick``, always those that leak no entity first, ties to the lower sample number:
   ``oblique`` (default) — the smallest ``log(dense rank) − log(BM25 rank)``: the query whose source
   the dense retriever finds much better than BM25 does, i.e. answerable by meaning, not by shared
   words (an unretrieved source counts as BM25 rank ``n_docs + 1``), then the best dense rank;
   ``dense`` — the best dense rank (the query that finds its own document best: Promptagator's
   round-trip), then the least lexical; ``least-lexical`` — the highest BM25 rank, then the best dense
   rank. Without the dense check every pick orders by BM25 rank alone (least lexical first). A pure
   ``dense`` pick favours paraphrases: on math-theoremqa, where no rank is too lexical (``t`` = 0), it
   chose a query equal to its problem (dense 1, BM25 1) over a rewording (dense 7, BM25 328).
5. ``entity_leak``: the kept rows' entity-leak rate (the audit's capitalised-token heuristic,
   :func:`obliq.synth.audit.leaks`) may not exceed the development queries' (the audit's macro rate,
   :attr:`obliq.synth.audit.AuditRow.entity_leak`). When it would, leaking rows are dropped — most leaked
   entity tokens first, then the most lexical, then the row id — until it does not: with ``n`` rows that
   leak nothing, ``floor(rate · n / (1 − rate))`` leaking rows stay.

The run writes the kept rows (each with ``meta.filter``: its BM25 and dense ranks and the entities it
leaks), ``<out>.decisions.jsonl`` (every candidate's measures and decision) and ``<out>.report.json``
(settings, thresholds with the development statistics behind them, counts kept and dropped by reason,
each test's count on its own, and the audit of all candidates, the kept rows and the development
queries), and prints the audit table.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

from obliq.search.bm25 import BM25
from obliq.synth.audit import AuditRow, audit_pairs, leaked, rank_of
from obliq.tasks import Task, load_query_split
from obliq.text import normalise_text

log = logging.getLogger(__name__)

PICKS = ("oblique", "dense", "least-lexical")
"""The best-of-n rules (see the module notes)."""
DROP_REASONS = ("duplicate", "too_lexical", "unanswerable", "not_best", "entity_leak")
"""Why a candidate was not kept (keys of the report's ``dropped``), in the order decided."""


@dataclass
class FilterConfig:
    """The filter's settings (see the module notes for each rule).

    Attributes:
        split: the development side the thresholds come from (``queries-<split>.jsonl``,
            ``qrels/<split>.tsv``); never ``test``.
        lexical_quantile: ``q`` of the ``too_lexical`` rule, in [0, 1) (0: no candidate is too lexical).
        dense_quantile: the quantile of the development pairs' dense ranks that sets ``K``, in (0, 1];
            null: no dense check (no encoding; the ``dense`` pick then orders by BM25 rank alone).
        leaks: apply the entity-leak rule.
        pick: ``oblique``, ``dense`` or ``least-lexical``: which surviving candidates of a document are kept.
        per_document: candidates kept per document, at least 1.
    """

    split: str = "dev"
    lexical_quantile: float = 0.05
    dense_quantile: float | None = 0.95
    leaks: bool = True
    pick: Literal["oblique", "dense", "least-lexical"] = "oblique"
    per_document: int = 1

    def __post_init__(self) -> None:
        if self.split == "test":
            raise ValueError("filter.split: thresholds never come from the test side; use the development side (dev)")
        if not 0 <= self.lexical_quantile < 1:
            raise ValueError(f"lexical_quantile: must be in [0, 1), got {self.lexical_quantile}")
        if self.dense_quantile is not None and not 0 < self.dense_quantile <= 1:
            raise ValueError(f"dense_quantile: must be in (0, 1] or null, got {self.dense_quantile}")
        if self.pick not in PICKS:
            raise ValueError(f"pick: must be one of {', '.join(PICKS)}, got {self.pick!r}")
        if isinstance(self.per_document, bool) or not isinstance(self.per_document, int) or self.per_document < 1:
            raise ValueError(f"per_document: must be an integer >= 1, got {self.per_document!r}")


def lexical_threshold(ranks: Sequence[int], quantile: float) -> int:
    """The largest rank ``t`` that at most ``quantile`` of ``ranks`` reach (``#{r ≤ t} ≤ quantile · n``);
    0 when none may (more than that share at rank 1); the largest rank when all may.

    Raises:
        ValueError: no ranks.
    """
    if not len(ranks):
        raise ValueError("no development pair to set the lexical threshold from")
    r = np.sort(np.asarray(ranks, dtype=np.int64))
    allowed = math.floor(quantile * len(r) + 1e-9)
    return int(r[-1]) if allowed >= len(r) else int(r[allowed]) - 1


def dense_threshold(ranks: Sequence[int], quantile: float) -> int:
    """``K``: the smallest rank that at least ``quantile`` of ``ranks`` reach
    (``numpy.quantile(ranks, quantile, method="inverted_cdf")``).

    Raises:
        ValueError: no ranks.
    """
    if not len(ranks):
        raise ValueError("no development pair to set the dense threshold from")
    return int(np.quantile(np.asarray(ranks, dtype=np.int64), quantile, method="inverted_cdf"))


def dense_ranks(
    model: str, task: Task, queries: Sequence[str], sources: Sequence[Sequence[int]], retrieval=None
) -> list[list[int]]:
    """The dense rank of each query's sources over the whole corpus: 1 + the documents whose cosine with
    the query is strictly higher.

    Args:
        model: an alias (``minilm``), folder or hub id (:func:`obliq.search.encoders.load_encoder`).
        task: the task (its corpus; its instruction or prompt is passed to an encoder that takes one).
        queries: query texts.
        sources: per query, the indices of its source documents.
        retrieval: :class:`obliq.search.settings.RetrievalSettings` (encoder kind, lengths, batch size,
            cache; default settings share ``evaluate``'s embedding store).

    Returns:
        Per query, the ranks of its sources (same order).
    """
    from obliq.search.encoders import load_encoder
    from obliq.search.exact import unit_float32
    from obliq.search.retrieval import corpus_embeddings, encode_texts
    from obliq.search.settings import RetrievalSettings
    from obliq.search.store import Store

    settings = retrieval or RetrievalSettings()
    encoder = load_encoder(model, settings.encoder, settings.trust_remote_code)
    store = Store.of(model, settings, task) if settings.cache else None
    corpus, status = corpus_embeddings(encoder, task, settings, store)
    log.info("%s: corpus embeddings of %s (store: %s)", task.name, model, status)
    docs = corpus.take(np.arange(corpus.n))
    out: list[list[int]] = []
    if not queries:
        return out
    q = encode_texts(encoder, list(queries), "query", settings.batch_size, settings.query_max_length, task)
    q = corpus.prepare(unit_float32(q, "query embeddings"))
    step = max(1, (1 << 22) // max(len(docs), 1))
    for start in range(0, len(q), step):
        scores = q[start : start + step] @ docs.T
        for row, src in zip(scores, sources[start : start + step]):
            out.append([1 + int((row > row[j]).sum()) for j in src])
    return out


@dataclass
class Candidate:
    """One generated row and its measures."""

    row: dict
    index: int
    source: int
    sample: int
    bm25_rank: int | None = None
    dense_rank: int | None = None
    leaked: list[str] = field(default_factory=list)
    decision: str = "kept"


def pick_key(c: Candidate, pick: str, n_docs: int) -> tuple:
    """The sort key of a document's surviving candidates, best first (see the module notes)."""
    lexical = c.bm25_rank if c.bm25_rank is not None else n_docs + 1  # higher: less lexical
    if c.dense_rank is None:  # no dense check
        return (bool(c.leaked), -lexical, c.sample, c.index)
    if pick == "oblique":
        return (bool(c.leaked), math.log(c.dense_rank) - math.log(lexical), c.dense_rank, c.sample, c.index)
    if pick == "dense":
        return (bool(c.leaked), c.dense_rank, -lexical, c.sample, c.index)
    return (bool(c.leaked), -lexical, c.dense_rank, c.sample, c.index)


def filter_candidates(
    rows: Sequence[dict], task: Task, config: FilterConfig | None = None, model: str = "minilm", retrieval=None
) -> tuple[list[Candidate], dict]:
    """Measure and decide every candidate row (see the module notes).

    Args:
        rows: training rows of ``task`` (``obliq synth generate``'s), their positives documents of it.
        task: the task folder, loaded; its development side (``config.split``) sets the thresholds.
        config: the rules' settings.
        model: the base dense retriever of the round-trip check.
        retrieval: its :class:`obliq.search.settings.RetrievalSettings`.

    Returns:
        ``(candidates in row order with their measures and decision, report)``.

    Raises:
        FileNotFoundError: no development side.
        ValueError: a row of another task, a row with several positives, a positive that is not a document of
            the task, a development side without a judged query.
    """
    config = config or FilterConfig()
    index = {d: i for i, d in enumerate(task.doc_ids)}
    dev = load_query_split(task.path, config.split, apart_from=task)  # thresholds never from test queries
    qrels = dev.qrels["test"]
    real_q, real_src = [], []
    for qid, text in zip(dev.query_ids, dev.query_texts):
        src = sorted(index[d] for d, g in qrels.get(qid, {}).items() if g > 0 and d in index)
        if src:
            real_q.append(text)
            real_src.append(src)
    if not real_q:
        raise ValueError(f"{task.path}: no {config.split} query has a gold document in the corpus")
    candidates = []
    for n, row in enumerate(rows):
        if row["task"] != task.name:
            raise ValueError(f"row {row['id']!r} is of task {row['task']!r}, the filter's task is {task.name!r}")
        if "positive" not in row:  # a generated query is checked against the one document it was written for
            raise ValueError(f"row {row['id']!r}: the filter checks rows with one positive, this one has positives")
        if row["positive"]["id"] not in index:
            raise ValueError(
                f"row {row['id']!r}: its positive {row['positive']['id']!r} is not a document of {task.path}"
            )
        sample = (row.get("meta") or {}).get("sample", 0)
        candidates.append(Candidate(row, n, index[row["positive"]["id"]], sample if isinstance(sample, int) else 0))

    bm25 = BM25(task.doc_texts)
    last = len(task.doc_ids) + 1
    real_bm25 = []
    for q, src in zip(real_q, real_src):
        scores = bm25.scores(bm25.tokenize([q])[0])
        real_bm25 += [r if r is not None else last for r in (rank_of(scores, j) for j in src)]
    for c in candidates:
        c.bm25_rank = rank_of(bm25.scores(bm25.tokenize([c.row["query"]])[0]), c.source)
        c.leaked = sorted(leaked(c.row["query"], task.doc_texts[c.source]))
    real_row = audit_pairs(f"real {config.split}", real_q, real_src, task.doc_texts, bm25)
    t = lexical_threshold(real_bm25, config.lexical_quantile)
    thresholds = {
        "split": config.split,
        "real_queries": len(real_q),
        "real_pairs": len(real_bm25),
        "lexical_quantile": config.lexical_quantile,
        "bm25_max_rank_dropped": t,
        "real_bm25_rank1": sum(r == 1 for r in real_bm25) / len(real_bm25),
        "real_bm25_median_rank": float(statistics.median(real_bm25)),
        "leak_rate": real_row.entity_leak if config.leaks else None,
        "dense_model": model if config.dense_quantile is not None else None,
        "dense_quantile": config.dense_quantile,
        "dense_top_k": None,
    }
    if config.dense_quantile is not None:
        ranks = dense_ranks(
            model,
            task,
            real_q + [c.row["query"] for c in candidates],
            real_src + [[c.source] for c in candidates],
            retrieval,
        )
        real_dense = [r for rs in ranks[: len(real_q)] for r in rs]
        for c, (r,) in zip(candidates, ranks[len(real_q) :]):
            c.dense_rank = r
        thresholds["dense_top_k"] = dense_threshold(real_dense, config.dense_quantile)
        thresholds["real_dense_median_rank"] = float(statistics.median(real_dense))
        thresholds["real_dense_rank1"] = sum(r == 1 for r in real_dense) / len(real_dense)

    flagged = dict.fromkeys(("duplicate", "too_lexical", "unanswerable", "entity_leak"), 0)
    seen = {normalise_text(q) for q in real_q}
    for c in candidates:
        key = normalise_text(c.row["query"])
        tests = {
            "duplicate": key in seen,
            "too_lexical": c.bm25_rank is not None and c.bm25_rank <= t,
            "unanswerable": c.dense_rank is not None and c.dense_rank > thresholds["dense_top_k"],
            "entity_leak": bool(c.leaked),
        }
        seen.add(key)
        for name, hit in tests.items():
            flagged[name] += hit
        c.decision = next((name for name in DROP_REASONS[:3] if tests[name]), "kept")

    by_doc: dict[int, list[Candidate]] = {}
    for c in candidates:
        if c.decision == "kept":
            by_doc.setdefault(c.source, []).append(c)
    for group in by_doc.values():
        for c in sorted(group, key=lambda c: pick_key(c, config.pick, len(task.doc_ids)))[config.per_document :]:
            c.decision = "not_best"

    kept = [c for c in candidates if c.decision == "kept"]
    if config.leaks:
        rate = real_row.entity_leak
        leaking = [c for c in kept if c.leaked]
        clean = len(kept) - len(leaking)
        allowed = len(leaking) if rate >= 1 else math.floor(rate * clean / (1 - rate) + 1e-9)
        order = sorted(leaking, key=lambda c: (len(c.leaked), -(c.bm25_rank or len(task.doc_ids) + 1), c.row["id"]))
        for c in order[allowed:]:  # the fewest leaked entities (and least lexical) stay
            c.decision = "entity_leak"
        kept = [c for c in candidates if c.decision == "kept"]

    texts = task.doc_texts
    audit = [
        audit_pairs("generated", [c.row["query"] for c in candidates], [[c.source] for c in candidates], texts, bm25)
        if candidates
        else None,
        audit_pairs("kept", [c.row["query"] for c in kept], [[c.source] for c in kept], texts, bm25) if kept else None,
        real_row,
    ]
    report = {
        "task": task.name,
        "candidates": len(candidates),
        "documents": len({c.source for c in candidates}),
        "kept": len(kept),
        "documents_kept": len({c.source for c in kept}),
        "dropped": {r: sum(c.decision == r for c in candidates) for r in DROP_REASONS},
        "flagged": flagged,
        "thresholds": thresholds,
        "pick": config.pick,
        "per_document": config.per_document,
        "audit": [asdict(a) for a in audit if a is not None],
    }
    return candidates, report


def audit_rows(report: dict) -> list[AuditRow]:
    """The report's audit table as :class:`~obliq.synth.audit.AuditRow` (for :func:`obliq.synth.audit.format_audit`)."""
    return [AuditRow(**a) for a in report["audit"]]
