"""Retrieval for evaluation: one settings object and one dispatch from a model to a retriever.

Every command that retrieves a task (``evaluate``, ``audit``, the training callback, the quickstart,
the dose sweep) describes how with a :class:`RetrievalSettings` and gets its retriever from
:func:`make_retriever`, which knows three kinds of model:

- ``bm25``: :class:`obliq.eval.bm25.BM25` over the task corpus (Lucene scoring, k1, b, stemmer);
- a TREC run file (``*.trec``, e.g. written on a GPU machine): read as it is;
- anything else is a dense encoder: an alias, a folder, an adapter, a hub id
  (:func:`obliq.eval.encoders.load_encoder`), or an encoder object already in memory (the module
  being trained). Passages and queries are encoded with the settings' own max lengths (passed to
  each ``encode`` call, never written into the encoder), the corpus embeddings are cached on disk
  keyed by the model's files, the encoder kind, the passage length and the corpus file's digest,
  and search is exact (:mod:`obliq.eval.index`).

Latency (the paper §6.4) is measured per query, one query at a time after one warm-up query, on the
first ``latency_queries`` queries: query encoding (BM25: tokenizing) and search, in ms.

**On several processes** (a ``torch.distributed`` group: DDP or FSDP training, or ``torchrun
evaluate.py``), every rank encodes its share of the texts (:func:`encode_texts`: ranks take every
world-th text, padded to the same number so that every rank makes the same forward passes, which a
sharded model needs), the embeddings are gathered, and each rank holds the whole matrix; search and
metrics are then the one-process ones. Latency is measured only on one process.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

import numpy as np

from obliq.distributed import world
from obliq.eval.bm25 import BM25, BM25_STEMMER, K1, B
from obliq.eval.encoders import Encoder, EncoderKind, fingerprint, load_encoder
from obliq.eval.index import DenseIndex, unit_float32
from obliq.eval.metrics import Run, read_run, run_from_search
from obliq.files import atomic_write, cache_dir, safe_name
from obliq.model.encoder import PASSAGE_MAX_LENGTH, QUERY_MAX_LENGTH
from obliq.tasks import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetrievalSettings:
    """How a model retrieves a task: the settings every evaluating command shares (frozen: one object
    can be shared by every caller, and a default argument never changes; derive another with
    ``dataclasses.replace``).

    Attributes:
        encoder: ``auto`` (from the model's files), ``obliq`` (BiEncoder: its prefixes, mean pooling)
            or ``sentence-transformers`` (the model's own pooling and prompts).
        top_k: documents retrieved per query (Recall@1000 needs 1000).
        batch_size: texts per forward pass.
        query_max_length: query truncation in tokens (the OBLIQ-IR paper §4: 256).
        passage_max_length: passage truncation in tokens (the model card: 1024); either length is cut
            to what the model can read.
        cache: cache corpus embeddings on disk, keyed by the model's files and the corpus.
        cache_dir: where; default ``$OBLIQ_CACHE/embeddings`` (``~/.cache/obliq/embeddings``).
        bm25_k1: BM25 term-frequency saturation (Anserini's default 0.9).
        bm25_b: BM25 length normalisation (Anserini's default 0.4).
        bm25_stemmer: PyStemmer language for BM25, or null for unstemmed tokens.
        trust_remote_code: let the model run its own code (only for models you trust).
    """

    encoder: EncoderKind = "auto"
    top_k: int = 1000
    batch_size: int = 32
    query_max_length: int = QUERY_MAX_LENGTH
    passage_max_length: int = PASSAGE_MAX_LENGTH
    cache: bool = True
    cache_dir: Path | None = None
    bm25_k1: float = K1
    bm25_b: float = B
    bm25_stemmer: str | None = BM25_STEMMER
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        for key in ("top_k", "batch_size", "query_max_length", "passage_max_length"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"retrieval.{key}: must be an integer >= 1, got {value!r}")


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


Retriever = Callable[[Task], Retrieval]
"""A task → its :class:`Retrieval`."""


def _latency(texts: Sequence[str], encode_one: Callable, search_one: Callable) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"query_encoding": [], "search": []}
    if texts:
        search_one(encode_one(texts[0]))  # warm-up, not counted
    for text in texts:
        t0 = perf_counter()
        q = encode_one(text)
        t1 = perf_counter()
        search_one(q)
        t2 = perf_counter()
        samples["query_encoding"].append((t1 - t0) * 1e3)
        samples["search"].append((t2 - t1) * 1e3)
    return samples


def corpus_cache_file(folder: Path, model_key: str, task: Task) -> Path:
    """Where a task's corpus embeddings for a model are cached: ``<folder>/<task>-<key>.npy``.

    ``model_key`` must change whenever the vectors would (model files, encoder kind, passage max
    length); the key also covers the corpus file's SHA-256.
    """
    key = hashlib.sha256(f"{model_key}|{task.corpus_sha256}".encode()).hexdigest()[:20]
    return Path(folder) / f"{safe_name(task.name, 'task name')}-{key}.npy"


def encode_texts(encoder: Encoder, texts: Sequence[str], kind: str, batch_size: int, max_length: int | None):
    """``encoder.encode`` of every text, shared among the ranks of a process group (see the module
    notes); one process encodes them all itself.

    Returns:
        (n, d) embeddings in the order of ``texts``: numpy or torch, as the encoder returns them (one
        process), or a float32 CPU tensor (several).
    """
    import torch
    import torch.distributed as dist

    rank, size = world()
    if size == 1:
        return encoder.encode(list(texts), kind=kind, batch_size=batch_size, max_length=max_length)
    per = -(-len(texts) // size)
    mine = list(texts[rank::size])
    mine += [texts[0]] * (per - len(mine))  # the same number of texts, hence of forward passes, on every rank
    local = torch.as_tensor(encoder.encode(mine, kind=kind, batch_size=batch_size, max_length=max_length)).float()
    if dist.get_backend() == "nccl":
        local = local.cuda()
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous())
    out = torch.empty(len(texts), local.shape[1])
    for r, part in enumerate(parts):
        out[r::size] = part[: len(range(r, len(texts), size))].cpu()
    return out


def retrieve_dense(
    encoder: Encoder,
    task: Task,
    settings: RetrievalSettings,
    cache: Path | None = None,
    latency_queries: int = 0,
) -> Retrieval:
    """Encode the corpus (or read it from ``cache``) and the queries, then search exactly.

    Args:
        encoder: anything with ``encode(texts, kind, batch_size, max_length)``.
        task: the task.
        settings: ``top_k`` (capped at the corpus size), ``batch_size`` and the two max lengths.
        cache: an ``.npy`` file for the corpus embeddings (see :func:`corpus_cache_file`);
            None encodes every time.
        latency_queries: queries timed one at a time (0 skips the latency measurement; skipped on
            several processes).

    Returns:
        The run (cosine scores) with its timings; every rank of a process group gets the same run.
    """

    def encode(texts: Sequence[str], kind: str, batch_size: int):
        length = settings.query_max_length if kind == "query" else settings.passage_max_length
        return encode_texts(encoder, texts, kind, batch_size, length)

    timing: dict[str, float] = {}
    t = perf_counter()
    docs, status = None, "off"
    if cache is not None:
        status = "miss"
        if cache.is_file():
            try:
                docs = np.load(cache, allow_pickle=False)
                if not isinstance(docs, np.ndarray) or docs.dtype.kind != "f":  # an .npz, a pickle, ints …
                    raise ValueError(f"not an array of floats ({type(docs).__name__})")
                status = "checked"  # an array of floats: what is wrong with it is said in full
                if docs.ndim != 2 or docs.shape[0] != len(task.doc_ids) or not np.isfinite(docs).all():
                    raise ValueError(f"shape {docs.shape} for {len(task.doc_ids)} documents, or non-finite values")
                status = "hit"
            except Exception as err:  # a corrupt or foreign cache file, whatever numpy raises: rebuilt
                why = str(err) if status == "checked" else f"not a float array obliq wrote: {type(err).__name__}"
                log.warning("%s: unusable cached embeddings (%s); discarded and re-encoded", cache, why)
                docs, status = None, "miss"
    if docs is None:
        docs = unit_float32(encode(task.doc_texts, "passage", settings.batch_size), "corpus embeddings")
        if cache is not None:
            with atomic_write(cache, "wb") as f:
                np.save(f, docs)
    timing["encode_corpus"] = perf_counter() - t

    t = perf_counter()
    queries = encode(task.query_texts, "query", settings.batch_size)
    timing["encode_queries"] = perf_counter() - t

    t = perf_counter()
    index = DenseIndex(docs, ids=task.doc_ids)  # ties by id: the ranking at top_k is every deeper one's prefix
    scores, indices = index.search(queries, settings.top_k)
    timing["search"] = perf_counter() - t

    latency = _latency(
        task.query_texts[:latency_queries] if world()[1] == 1 else [],  # one query at a time: one process
        lambda text: encode([text], "query", 1),
        lambda q: index.search(q, settings.top_k),
    )
    policy = getattr(encoder, "text_policy", None)
    reads = policy(settings.query_max_length, settings.passage_max_length) if policy else {"texts": "whole"}
    return Retrieval(
        run_from_search(task.query_ids, task.doc_ids, scores, indices), settings.top_k, timing, reads, latency, status
    )


def retrieve_bm25(task: Task, settings: RetrievalSettings, latency_queries: int = 0) -> Retrieval:
    """BM25 retrieval of a task (see :mod:`obliq.eval.bm25` for the scoring and text analysis).

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
    hits = [index.search_tokens(q, settings.top_k) for q in tokens]
    timing["search"] = perf_counter() - t
    latency = _latency(
        task.query_texts[:latency_queries],
        lambda text: index.tokenize([text])[0],
        lambda q: index.search_tokens(q, settings.top_k),
    )
    run = run_from_search(task.query_ids, task.doc_ids, [h[0] for h in hits], [h[1] for h in hits])
    reads = {"bm25_k1": settings.bm25_k1, "bm25_b": settings.bm25_b, "bm25_stemmer": settings.bm25_stemmer}
    return Retrieval(run, settings.top_k, timing, reads, latency, "off")


def is_run_file(model: object) -> bool:
    """True when ``model`` names an existing ``.trec`` file."""
    return isinstance(model, (str, Path)) and str(model).endswith(".trec") and Path(model).is_file()


def retrieve_run_file(path: str | Path, task: Task) -> Retrieval:
    """A task's run read from a TREC run file (its queries of other tasks are left out; a task query
    missing from the file scores 0 on every measure, with a warning)."""
    run = read_run(path)
    if not set(run) & set(task.query_ids):
        seen = f"its ids look like {next(iter(run))!r}" if run else "it is empty"
        raise ValueError(
            f"{path}: holds no query of task {task.name} ({seen}; the task's like {task.query_ids[0]!r}): "
            "a run of another task?"
        )
    missing = [q for q in task.query_ids if q not in run]
    if missing:
        log.warning(
            "%s: %d queries of %s have no results (they score 0; e.g. %s)", path, len(missing), task.name, missing[0]
        )
    run = {q: run[q] for q in task.query_ids if q in run}
    return Retrieval(run, max((len(docs) for docs in run.values()), default=0), {}, {"run_file": str(path)})


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
        FileNotFoundError / OSError / ValueError: from :func:`obliq.eval.encoders.load_encoder`.
    """
    settings = settings or RetrievalSettings()
    if isinstance(model, str) and model.lower() == "bm25":
        return lambda task: retrieve_bm25(task, settings, latency_queries)
    if is_run_file(model):
        return lambda task: retrieve_run_file(model, task)
    if isinstance(model, str):
        encoder = load_encoder(model, settings.encoder, settings.trust_remote_code)
        key = f"{fingerprint(model)}|{type(encoder).__name__}|{settings.encoder}|{settings.passage_max_length}"
    else:
        encoder, key = model, None  # an encoder in memory (training): its weights change, nothing is cached
    folder = Path(settings.cache_dir) if settings.cache_dir is not None else cache_dir() / "embeddings"

    def retrieve(task: Task) -> Retrieval:
        file = corpus_cache_file(folder, key, task) if settings.cache and key is not None else None
        return retrieve_dense(encoder, task, settings, file, latency_queries)

    return retrieve
