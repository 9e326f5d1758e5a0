"""Retrieval: one dispatch from a model to a retriever.

Every command that retrieves a task (``evaluate``, ``obliq search``, ``audit``, the training callback,
the quickstart, the dose sweep) describes how with a :class:`~obliq.search.settings.RetrievalSettings`
(one settings object, :mod:`obliq.search.settings`) and gets its retriever
from :func:`make_retriever`, which knows three kinds of model:

- ``bm25``: :class:`obliq.search.bm25.BM25` over the task corpus (Lucene scoring, k1, b, stemmer);
- a TREC run file (``*.trec``, e.g. written on a GPU machine): read as it is;
- anything else is a dense encoder: an alias, a folder, an adapter, a hub id
  (:func:`obliq.search.encoders.load_encoder`), or an encoder object already in memory (the module
  being trained). Passages and queries are encoded with the settings' own max lengths (passed to
  each ``encode`` call, never written into the encoder).

The corpus embeddings of a named encoder live in a store (:mod:`obliq.search.store`, the format
``obliq encode`` writes) keyed by the model's files, the encoder kind, the passage length and the
corpus file's digest (:meth:`obliq.search.store.Store.of`): a complete store is read,
memory-mapped, never copied into memory; a missing one is encoded block by block into a one-shard
store first. Search goes through :mod:`obliq.search.faiss_index`: exact (``index: flat``) or an approximate or
quantized faiss index saved beside the embeddings; an approximate search also runs exact search on
the same queries and reports its recall@k against it (:attr:`Retrieval.index`). ``dim`` evaluates the
first ``dim`` components of every vector, re-normalised (Matryoshka).

**Ties.** Every ranking made here (dense, BM25, candidate sets) is in trec_eval's order — score
descending, then document id descending — decided before the cut at ``top_k``
(:func:`obliq.search.exact.ranked` with the task's :func:`~obliq.search.exact.tie_keys`), so a metric at
depth k is the same whatever ``top_k`` was (issue 24 §2); a run file's lines are ordered so by the
metrics.

**Candidate sets.** A task with per-query candidate sets (``Task.candidates``, mteb's ``top_ranked``:
OBLIQ-Bench Math and Writing exclude each query's same-source documents) is ranked over each query's
candidates only, by every kind of model, here and nowhere else: a dense encoder scores the candidates
exactly (float32 inner products of unit vectors, the whole corpus encoded and cached as usual),
BM25 scores them over its index of the whole corpus (document frequencies from every document),
and a run file keeps only their lines. The ``top_k`` best candidates are kept; ties at that cut are
broken as trec_eval ranks them (document id descending). Judged documents outside a query's
candidates still count in its ideal DCG and recall denominators, as in mteb (:mod:`obliq.eval.metrics`).

**Task prompts.** An encoder whose ``encode`` takes a ``task`` keyword gets the task being retrieved:
it may read the task's instruction (:class:`obliq.model.BiEncoder` trained with instructions) or a
per-task prompt (:class:`obliq.search.encoders.SentenceTransformerEncoder`: ``<prompt_name>-query``, as
mteb looks it up).

Latency (the paper §6.4) is measured per query, one query at a time after one warm-up query, on the
first ``latency_queries`` queries: query encoding (BM25: tokenizing) and search, in ms.

**On several processes** (a ``torch.distributed`` group: DDP or FSDP training, or ``torchrun
evaluate.py``), every rank encodes its share of the texts (:func:`encode_texts`: ranks take every
world-th text, padded to the same number so that every rank makes the same forward passes, which a
sharded model needs), the embeddings are gathered, each rank holds the whole matrix (rank 0 writes the
store), and search and metrics are the one-process ones. Latency is measured only on one process.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

import numpy as np

from obliq.distributed import world
from obliq.search.bm25 import BM25
from obliq.search.candidates import best_candidates, candidate_rows, candidate_scores
from obliq.search.encoders import Encoder, load_encoder
from obliq.search.exact import Corpus, ExactIndex, set_threads, tie_keys, unit_float32
from obliq.search.faiss_index import VectorIndex, factory_string, recall_vs_exact
from obliq.search.maxsim import maxsim_search
from obliq.search.runs import Run, check_run_corpus, read_run, run_from_search
from obliq.search.settings import RetrievalSettings
from obliq.search.store import IncompleteStore, Store
from obliq.shards import Shard
from obliq.tasks import Task
from obliq.windows import Windows

log = logging.getLogger(__name__)


@dataclass
class Retrieval:
    """What retrieving one task produced."""

    run: Run
    depth: int
    """How many documents per query the ranking was asked to hold (``top_k``; a run file: its longest
    ranking); a query may hold fewer (BM25 returns only documents sharing a term)."""
    timing_s: dict[str, float]
    """Wall time of ``encode_corpus``, ``encode_queries`` and ``search`` (whole task), seconds."""
    reads: dict = field(default_factory=dict)
    """How the system read the texts: a dense encoder's prefixes and token lengths
    (``text_policy``), BM25's k1, b and stemmer; what a report states beside its numbers."""
    latency_ms: dict[str, list[float]] = field(default_factory=dict)
    """Per-query samples of ``query_encoding`` and ``search``, milliseconds."""
    corpus_cache: str = "off"
    """``hit``, ``miss`` or ``off``."""
    dense_run: Run | None = None
    """The run before reranking (None when not reranked)."""
    rerank: dict = field(default_factory=dict)
    """What reranking did (method, depth, backend, cost); empty without a policy."""
    index: dict = field(default_factory=dict)
    """How a dense corpus was searched (:meth:`obliq.search.faiss_index.VectorIndex.describe`: the index, its
    parameters, the dimension) and, for an approximate search, ``recall_vs_exact``: its Recall@k
    against exact search on the same queries, with ``n_queries``; empty for BM25 and run files."""


Retriever = Callable[[Task], Retrieval]
"""A task → its :class:`Retrieval`."""


def _latency(texts: Sequence[str], encode_one: Callable, search_one: Callable) -> dict[str, list[float]]:
    """Per-query timings; ``search_one(q, i)`` searches for the i-th query (its candidate set)."""
    samples: dict[str, list[float]] = {"query_encoding": [], "search": []}
    if texts:
        search_one(encode_one(texts[0]), 0)  # warm-up, not counted
    for i, text in enumerate(texts):
        t0 = perf_counter()
        q = encode_one(text)
        t1 = perf_counter()
        search_one(q, i)
        t2 = perf_counter()
        samples["query_encoding"].append((t1 - t0) * 1e3)
        samples["search"].append((t2 - t1) * 1e3)
    return samples


ENCODE_BLOCK = 4096
"""Passages encoded, then written, at a time when a store is filled (memory: one block of vectors)."""


def encode_shard(
    encoder: Encoder,
    task: Task,
    settings: RetrievalSettings,
    store: Store,
    shard: Shard,
    block_size: int = ENCODE_BLOCK,
    overwrite: bool = False,
) -> dict:
    """Encode one shard of a task's corpus (documents ``shard.index``, ``+ shard.count``, …) into a store,
    ``block_size`` passages at a time, in this process (:meth:`obliq.search.store.Store.write`).

    Returns:
        The shard's record.
    """
    positions = shard.select(range(len(task.doc_ids)))
    texts = [task.doc_texts[p] for p in positions]
    blocks = (
        encoder.encode(
            texts[s : s + block_size],
            kind="passage",
            batch_size=settings.batch_size,
            max_length=settings.passage_max_length,
            **({"task": task} if takes_task(encoder.encode) else {}),
            **windows_argument(encoder, settings.windows),
        )
        for s in range(0, len(texts), block_size)
    )
    return store.write(shard, [task.doc_ids[p] for p in positions], blocks, overwrite)


def _stored_corpus(store: Store, task: Task) -> Corpus | None:
    """The store's corpus when it is complete and sound; None when there is none or it is unusable (a
    one-shard store is then discarded, logged). A store split over several shards with some missing is
    an error: its shards are ``obliq encode``'s to write, not one evaluation's."""
    try:
        return store.open(task.doc_ids)
    except FileNotFoundError:
        return None
    except IncompleteStore as err:
        if err.count > 1:
            raise
        log.warning("%s: unusable cached embeddings (%s); discarded and re-encoded", store.folder, err.problems[0])
    except Exception as err:  # a corrupt or foreign store, whatever numpy raises: rebuilt when it is one shard
        shards = store.recorded_shards()
        if shards > 1:  # other shards are other processes' finished work: never deleted here
            raise ValueError(
                f"{store.folder}: a store of {shards} shards is unusable ({err}); re-encode the damaged shard "
                "(obliq encode --shard.index …, --overwrite) or remove the store"
            ) from None
        log.warning("%s: unusable cached embeddings (%s); discarded and re-encoded", store.folder, err)
    store.clear()
    return None


def takes_task(fn: Callable) -> bool:
    """Whether an encoder's ``encode`` (or ``text_policy``) takes the ``task`` keyword (see the module notes)."""
    try:
        return "task" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def windows_argument(encoder: Encoder, windows: Windows | None) -> dict:
    """``{"windows": windows}`` for an encoder's ``encode`` when windows are asked for (``retrieval.windows``),
    else ``{}``.

    Raises:
        ValueError: windows asked of an encoder that reads texts its own way (sentence-transformers').
    """
    if windows is None:
        return {}
    try:
        takes = "windows" in inspect.signature(encoder.encode).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        raise ValueError(
            f"retrieval.windows: the {type(encoder).__name__} reads texts its own way and cannot read them in "
            "windows: use retrieval.encoder obliq"
        )
    return {"windows": windows}


def encode_texts(
    encoder: Encoder,
    texts: Sequence[str],
    kind: str,
    batch_size: int,
    max_length: int | None,
    task: Task | None = None,
    windows: Windows | None = None,
):
    """``encoder.encode`` of every text, shared among the ranks of a process group (see the module
    notes); one process encodes them all itself. ``task`` is passed on to an encoder that takes it,
    ``windows`` (:func:`windows_argument`) when given.

    Returns:
        (n, d) embeddings in the order of ``texts``: numpy or torch, as the encoder returns them (one
        process), or a float32 CPU tensor (several).
    """
    import torch
    import torch.distributed as dist

    rank, size = world()
    extra = {"task": task} if task is not None and takes_task(encoder.encode) else {}
    extra |= windows_argument(encoder, windows)
    if size == 1:
        return encoder.encode(list(texts), kind=kind, batch_size=batch_size, max_length=max_length, **extra)
    per = -(-len(texts) // size)
    mine = list(texts[rank::size])
    mine += [texts[0]] * (per - len(mine))  # the same number of texts, hence of forward passes, on every rank
    local = torch.as_tensor(
        encoder.encode(mine, kind=kind, batch_size=batch_size, max_length=max_length, **extra)
    ).float()
    if dist.get_backend() == "nccl":
        local = local.cuda()
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous())
    out = torch.empty(len(texts), local.shape[1])
    for r, part in enumerate(parts):
        out[r::size] = part[: len(range(r, len(texts), size))].cpu()
    return out


def corpus_embeddings(
    encoder: Encoder,
    task: Task,
    settings: RetrievalSettings,
    store: Store | None = None,
) -> tuple[Corpus, str]:
    """A task's corpus embeddings: read from ``store`` when it is complete, else encoded (into it).

    Args:
        encoder: anything with ``encode(texts, kind, batch_size, max_length)``.
        task: the task.
        settings: ``batch_size``, ``passage_max_length`` and ``dim`` (the first ``dim`` components).
        store: the corpus's store (:meth:`Store.of <obliq.search.store.Store.of>`); None encodes in memory.

    Returns:
        ``(corpus, "hit" | "miss" | "off")``: unit float32 rows in ``task.doc_ids`` order, and whether
        the store held them.

    Raises:
        IncompleteStore: a store of several shards with some not written.
    """
    rank, size = world()
    corpus, status = None, "off"
    if store is not None:
        corpus = _stored_corpus(store, task)
        status = "hit" if corpus is not None else "miss"
    if corpus is None and store is not None and size == 1:  # block by block into the store, then mapped
        encode_shard(encoder, task, settings, store, Shard(0, 1), overwrite=True)
        corpus = store.open(task.doc_ids)
    elif corpus is None:
        docs = encode_texts(
            encoder, task.doc_texts, "passage", settings.batch_size, settings.passage_max_length, task, settings.windows
        )
        docs = unit_float32(docs, "corpus embeddings")
        if store is not None and rank == 0:
            store.write(Shard(0, 1), task.doc_ids, [docs], overwrite=True)
        corpus = Corpus.from_array(docs)
    # Matryoshka: the first dim components; ties by the task's document ids (trec_eval's order)
    return Corpus(corpus.parts, settings.dim, corpus.token, ids=task.doc_ids), status


def check_index(settings: RetrievalSettings, task: Task, windows: Windows | None = None) -> None:
    """Refuse, before any encoding, an index that faiss cannot train on ``task``'s corpus (C42; a task with
    candidate sets is searched exactly and needs none), and, for MaxSim over windows (``windows``, else
    ``settings.windows``: searched exactly over the whole corpus), an approximate index or candidate sets.

    Raises:
        ValueError: naming ``retrieval.index``, what it needs and the corpus size (:func:`factory_string`), or why
            MaxSim cannot search it."""
    spec, rows, windows = settings.index_spec(), candidate_rows(task), windows or settings.windows
    if windows is not None and windows.reduce == "maxsim" and not spec.exact:
        raise ValueError(f"retrieval.index {settings.index!r}: MaxSim over windows is searched exactly: use flat")
    if windows is not None and windows.reduce == "maxsim" and rows is not None:
        raise ValueError(f"{task.name}: a task with candidate sets is not searched by MaxSim over windows")
    if not spec.exact and rows is None:
        factory_string(spec, len(task.doc_ids))


def retrieve_dense(
    encoder: Encoder,
    task: Task,
    settings: RetrievalSettings,
    store: Store | None = None,
    latency_queries: int = 0,
) -> Retrieval:
    """Read the corpus embeddings from ``store`` (or encode them, into it), encode the queries, search.

    Args:
        encoder: anything with ``encode(texts, kind, batch_size, max_length)``.
        task: the task.
        settings: ``top_k`` (capped at the corpus size), ``batch_size``, the two max lengths, ``dim`` and
            the index settings.
        store: the corpus's store (:meth:`Store.of <obliq.search.store.Store.of>`); None encodes every
            time, in memory.
        latency_queries: queries timed one at a time (0 skips the latency measurement; skipped on
            several processes).

    Returns:
        The run with its timings and how it was searched (:attr:`Retrieval.index`); every rank of a
        process group gets the same run. A task with candidate sets is ranked over each query's
        candidates only, exactly (see the module notes).

    Raises:
        IncompleteStore: a store of several shards with some not written.
        ValueError: ``dim`` larger than the embeddings, a bad index setting.
    """
    if (task.instruction or task.prompt_name) and not takes_task(encoder.encode):
        log.warning(
            "%s: the encoder takes no task, so it reads %s's queries without its instruction or prompt",
            type(encoder).__name__,
            task.name,
        )

    def encode(texts: Sequence[str], kind: str, batch_size: int):
        length = settings.query_max_length if kind == "query" else settings.passage_max_length
        return encode_texts(encoder, texts, kind, batch_size, length, task, settings.windows)

    rank, size = world()
    set_threads(settings.threads)
    check_index(settings, task)
    rows, spec = candidate_rows(task), settings.index_spec()
    windows = settings.windows or getattr(encoder, "windows", None)
    if windows is not None and windows.reduce == "maxsim":
        return retrieve_maxsim(encoder, task, settings, windows, encode, latency_queries)
    timing: dict[str, float] = {}
    t = perf_counter()
    corpus, status = corpus_embeddings(encoder, task, settings, store)
    timing["encode_corpus"] = perf_counter() - t

    t = perf_counter()
    queries = encode(task.query_texts, "query", settings.batch_size)
    timing["encode_queries"] = perf_counter() - t

    t = perf_counter()
    if rows is not None:  # each query over its candidates, exactly: no index
        queries = corpus.prepare(queries)
        docs = corpus.take(np.arange(corpus.n))
        keys = tie_keys(task.doc_ids, len(task.doc_ids))
        best = lambda s, i: best_candidates(s, rows[i], settings.top_k, keys)  # noqa: E731
        search_one = lambda q, i: best(candidate_scores(corpus.prepare(q), docs, [rows[i]])[0], i)  # noqa: E731
        scores, indices = zip(*(best(s, i) for i, s in enumerate(candidate_scores(queries, docs, rows))))
        timing["search"] = perf_counter() - t
        searched = {"name": "exact over candidates", "dim": corpus.dim}
    else:
        index = VectorIndex(corpus, spec, folder=store.folder if store is not None and rank == 0 else None)
        if not spec.exact:
            timing["index"] = perf_counter() - t  # built, or loaded
        t = perf_counter()
        scores, indices = index.search(queries, settings.top_k)
        search_one = lambda q, i: index.search(q, settings.top_k)  # noqa: E731
        timing["search"] = perf_counter() - t
        searched = index.describe()
        if not spec.exact:  # the reference: exact search on the same queries
            t = perf_counter()
            _, exact = ExactIndex(corpus, use_gpu=False).search(queries, settings.top_k)
            timing["exact_search"] = perf_counter() - t
            ks = sorted({k for k in (10, 100) if k <= exact.shape[1]} | {exact.shape[1]})
            searched["recall_vs_exact"] = {**recall_vs_exact(indices, exact, ks), "n_queries": len(exact)}

    latency = _latency(
        task.query_texts[:latency_queries] if size == 1 else [],  # one query at a time: one process
        lambda text: encode([text], "query", 1),
        search_one,
    )
    found = [np.asarray(i) >= 0 for i in indices]  # an approximate index may find fewer than top_k
    run = run_from_search(
        task.query_ids, task.doc_ids, [s[f] for s, f in zip(scores, found)], [i[f] for i, f in zip(indices, found)]
    )
    return Retrieval(run, settings.top_k, timing, text_policy(encoder, task, settings), latency, status, index=searched)


def text_policy(encoder: Encoder, task: Task, settings: RetrievalSettings) -> dict:
    """How the encoder read the task's texts (its ``text_policy``, with the settings' windows), what a report
    states of a system; ``{"texts": "whole"}`` for an encoder without one."""
    policy = getattr(encoder, "text_policy", None)
    if policy is None:
        return {"texts": "whole"}
    extra = {"task": task} if takes_task(policy) else {}
    if settings.windows is not None:
        extra["windows"] = settings.windows
    return policy(settings.query_max_length, settings.passage_max_length, **extra)


def retrieve_maxsim(
    encoder: Encoder, task: Task, settings: RetrievalSettings, windows: Windows, encode: Callable, latency_queries: int
) -> Retrieval:
    """:func:`retrieve_dense` for documents read as windows and scored by their best one (``windows.reduce``
    ``maxsim``): every document's windows encoded (in memory: a store holds one vector a document), searched
    exactly and reduced to documents (:func:`obliq.search.maxsim.maxsim_search`, exact against brute force).

    Raises:
        ValueError: what :func:`check_index` refuses for MaxSim; an encoder without ``encode_windows``.
    """
    check_index(settings, task, windows)
    if not hasattr(encoder, "encode_windows"):
        raise ValueError(
            f"retrieval.windows: the {type(encoder).__name__} cannot read texts in windows: use retrieval.encoder obliq"
        )
    timing: dict[str, float] = {}
    t = perf_counter()
    vectors, window_doc = encoder.encode_windows(task.doc_texts, "passage", settings.batch_size, windows)
    timing["encode_corpus"] = perf_counter() - t
    t = perf_counter()
    queries = encode(task.query_texts, "query", settings.batch_size)
    timing["encode_queries"] = perf_counter() - t
    t = perf_counter()
    index = ExactIndex(Corpus(Corpus.from_array(vectors).parts, settings.dim), use_gpu=False)
    search = lambda q: maxsim_search(q, index, window_doc, settings.top_k, doc_ids=task.doc_ids)  # noqa: E731
    scores, indices = search(queries)
    timing["search"] = perf_counter() - t
    latency = _latency(
        task.query_texts[:latency_queries] if world()[1] == 1 else [],
        lambda text: encode([text], "query", 1),
        lambda q, i: search(q),
    )
    searched = {"name": "exact MaxSim over windows", "dim": index.dim, "windows": int(len(window_doc))}
    run = run_from_search(task.query_ids, task.doc_ids, list(scores), list(indices))
    return Retrieval(run, settings.top_k, timing, text_policy(encoder, task, settings), latency, "off", index=searched)


def retrieve_bm25(task: Task, settings: RetrievalSettings, latency_queries: int = 0) -> Retrieval:
    """BM25 retrieval of a task (see :mod:`obliq.search.bm25` for the scoring and text analysis); a task
    with candidate sets is ranked over each query's candidates (those sharing a term with it).

    Timings: ``encode_corpus`` = tokenizing and indexing, ``encode_queries`` = tokenizing queries.
    """
    timing: dict[str, float] = {}
    t = perf_counter()
    index = BM25(
        task.doc_texts, k1=settings.bm25_k1, b=settings.bm25_b, stemmer=settings.bm25_stemmer, ids=task.doc_ids
    )
    timing["encode_corpus"] = perf_counter() - t
    t = perf_counter()
    tokens = index.tokenize(task.query_texts)
    timing["encode_queries"] = perf_counter() - t
    t = perf_counter()
    rows = candidate_rows(task)
    if rows is None:
        search_one = lambda q, i: index.search_tokens(q, settings.top_k)
    else:
        keys = tie_keys(task.doc_ids, len(task.doc_ids))

        def search_one(q, i):
            s = index.scores(q)[rows[i]]
            hit = s > 0  # as over the corpus: only documents sharing a term with the query
            return best_candidates(s[hit], rows[i][hit], settings.top_k, keys)

    hits = [search_one(q, i) for i, q in enumerate(tokens)]
    timing["search"] = perf_counter() - t
    latency = _latency(task.query_texts[:latency_queries], lambda text: index.tokenize([text])[0], search_one)
    run = run_from_search(task.query_ids, task.doc_ids, [h[0] for h in hits], [h[1] for h in hits])
    reads = {"bm25_k1": settings.bm25_k1, "bm25_b": settings.bm25_b, "bm25_stemmer": settings.bm25_stemmer}
    return Retrieval(run, settings.top_k, timing, reads, latency, "off")


def is_run_file(model: object) -> bool:
    """True when ``model`` names an existing ``.trec`` file."""
    return isinstance(model, (str, Path)) and str(model).endswith(".trec") and Path(model).is_file()


def retrieve_run_file(path: str | Path, task: Task) -> Retrieval:
    """A task's run read from a TREC run file (its queries of other tasks are left out; a task query
    missing from the file scores 0 on every measure, with a warning). A task with candidate sets keeps
    each query's candidates only (the others are dropped, with a warning)."""
    run = read_run(path)
    if not set(run) & set(task.query_ids):
        seen = f"its ids look like {next(iter(run))!r}" if run else "it is empty"
        raise ValueError(
            f"{path}: holds no query of task {task.name} ({seen}; the task's like {task.query_ids[0]!r}): "
            "a run of another task?"
        )
    check_run_corpus(path, run, task)  # a run of another corpus, or ranking documents this corpus lacks
    missing = [q for q in task.query_ids if q not in run]
    if missing:
        log.warning(
            "%s: %d queries of %s have no results (they score 0; e.g. %s)", path, len(missing), task.name, missing[0]
        )
    run = {q: run[q] for q in task.query_ids if q in run}
    if task.candidates is not None:
        allowed = {q: set(task.candidates.get(q, ())) for q in run}
        kept = {q: {d: v for d, v in docs.items() if d in allowed[q]} for q, docs in run.items()}
        dropped = sum(len(docs) - len(kept[q]) for q, docs in run.items())
        if dropped:
            log.warning("%s: %d lines outside the queries' candidate sets of %s dropped", path, dropped, task.name)
        run = kept
    return Retrieval(run, max((len(docs) for docs in run.values()), default=0), {}, {"run_file": str(path)})


def _check_dim(model: str, dim: int | None) -> None:
    """Warn when ``--retrieval.dim`` truncates an obliq export at a dimension it was not trained at
    (its ``obliq_export.json`` records the checkpoint's ``matryoshka_dims``; Kusupati et al., 2022):
    the first ``dim`` components of such a model were never trained to stand alone."""
    from obliq.model.checkpoint import exported_from

    record = exported_from(model) if dim is not None else None
    if record is None or "matryoshka_dims" not in record:
        return
    trained = record["matryoshka_dims"] or []
    if dim not in trained:
        log.warning(
            "%s: retrieval.dim %d is not a dimension it was trained at (matryoshka_dims: %s); its truncated "
            "embeddings are untrained",
            model,
            dim,
            trained or "none",
        )


def make_retriever(
    model: str | Encoder, settings: RetrievalSettings | None = None, latency_queries: int = 0
) -> Retriever:
    """The one dispatch from a model to a retriever (see the module notes).

    Args:
        model: ``bm25``; a TREC run file; an alias, folder, adapter or hub id; or an encoder object.
        settings: how to retrieve (default :class:`RetrievalSettings`).
        latency_queries: queries timed one at a time per task (0: none).

    Returns:
        task → :class:`Retrieval`. A named encoder is loaded now, once, for every task.

    Raises:
        FileNotFoundError / OSError / ValueError: from :func:`obliq.search.encoders.load_encoder`.
    """
    settings = settings or RetrievalSettings()
    if isinstance(model, str) and model.lower() == "bm25":
        if settings.windows is not None:  # said, not refused: one retrieval config serves BM25 and encoders alike
            log.warning("BM25 reads each text whole: retrieval.windows is for encoders and is not used here")
        return lambda task: retrieve_bm25(task, settings, latency_queries)
    if is_run_file(model):
        return lambda task: retrieve_run_file(model, task)
    if isinstance(model, str):
        encoder = load_encoder(model, settings.encoder, settings.trust_remote_code)
        _check_dim(model, settings.dim)
    else:
        encoder = model  # an encoder in memory (training): its weights change, nothing is cached

    def retrieve(task: Task) -> Retrieval:
        if not settings.cache or not isinstance(model, str):
            return retrieve_dense(encoder, task, settings, latency_queries=latency_queries)
        return retrieve_dense(encoder, task, settings, Store.of(model, settings, task), latency_queries)

    return retrieve
