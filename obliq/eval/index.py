"""Nearest-neighbour search by inner product over unit vectors: obliq's one place of vector search.

Every caller (evaluation, ``obliq search``, the training callback, kNN-graph distillation, dense
negative mining) searches through this module, and every result leaves it through :func:`ranked`
(trec_eval's order, ``-1`` padding last), so the rule about the order of results is applied in one
place; BM25, Lucene and candidate sets order their rankings through it too. Vectors are cast to float32 and
L2-renormalised before indexing (C13): an inner-product index over vectors that are not unit length
ranks by length as much as by direction, and vectors stored in bf16 come back off unit length by up
to ~2e-3. So the score is the cosine similarity.

- **Exact search in memory**: :class:`DenseIndex`, faiss's ``IndexFlatIP`` (Johnson et al., 2019), on
  the GPU when faiss was built with CUDA and a GPU is visible.
- **Exact search over a corpus on disk** (:class:`Corpus`: memory-mapped ``.npy`` shards written by
  :mod:`obliq.eval.store`, or an array): :func:`exact_search` scans the corpus block by block with
  ``faiss.knn`` and merges the blocks' top-k with ``faiss.ResultHeap`` (Tevatron's shard search).
  Each block is mapped only while it is scanned, so the vectors are never copied into memory and
  the resident set stays at one block (``IndexFlatIP.add`` would copy the whole matrix).
- **Approximate and quantized search** (:class:`VectorIndex` with an :class:`IndexSpec`): any faiss
  index factory string over the float vectors (``HNSW32,Flat``, ``IVF1024,Flat``, ``IVF1024,PQ24``,
  ``SQ8``, ``HNSW32,SQ8`` …; Malkov & Yashunin 2018, Jégou et al. 2011), or over their sign bits
  (``BFlat``, ``BHNSW32``, ``BIVF1024``: binary embeddings, Hamming distance), with optional
  rescoring of ``rescore × k`` candidates by the float32 vectors read back from disk
  (sentence-transformers' quantization recipe, ``semantic_search_faiss``; it rescores against the
  quantized codes it keeps, obliq against the full-precision vectors it keeps on disk). An index is
  trained on a seeded sample, saved beside the embeddings and memory-mapped when reused
  (``IO_FLAG_MMAP_IFC``: read-only, never added to). ``int8`` is faiss's 8-bit scalar quantizer, whose
  per-dimension min/max ranges are sentence-transformers' int8 calibration.
- **Matryoshka truncation** (Kusupati et al., 2022): ``dim`` keeps the first components of every
  vector and re-normalises them (:func:`truncate`), before any index or search.
- :func:`recall_vs_exact`: the share of exact search's top-k an approximate search found.

**Ties and the cut** (issue 24 §2). The same text under two ids is common in real corpora, and gives
two documents the same score. faiss keeps an arbitrary subset of a tie group that straddles the cut
at ``k``, so NDCG@k and Recall@k used to change with ``k``. Here every ranking is ordered by score
descending, then by document id descending — trec_eval's order, :func:`ranked` with the corpus's
:func:`tie_keys` — *before* the cut, so the top ``k`` of a deeper ranking is the ranking at ``k``,
whatever the depth. Exact search (:class:`DenseIndex`, :func:`exact_search`, a flat
:class:`VectorIndex`) asks faiss for more than ``k`` candidates, recomputes each candidate's cosine
exactly (float64 over the stored float32 vectors, the same arithmetic for every document, so equal
vectors tie exactly on any device and at any depth, then rounded to float32), and searches deeper
while a document not returned could still tie the ``k``-th score (within faiss's float32 rounding
bound). An approximate index orders what it found the same way (rescored in float64 with
``rescore``); which documents it finds is its own approximation, reported as recall against exact.

faiss runs with ``distance_compute_blas_threshold`` = 20 (its former default): at 1.15's 128000 a
batch of fewer than 128000 / d queries is searched without BLAS, 9× slower at 100 queries × 384.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from obliq.files import publish

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 28
"""Bytes of float32 vectors scanned or added at a time (256 MiB)."""

FAULT_AROUND_BYTES = 1 << 16
"""What Linux maps around each page fault of a file mapping (``fault_around_bytes``, 64 KiB): rows
gathered from a mapped file keep up to this much each resident while the file stays mapped."""

_GPU_MAX_K = 2048  # faiss GPU flat search returns at most 2048 neighbours

PRESETS = {
    "flat": "Flat",
    "hnsw": "HNSW32,Flat",
    "hnsw-int8": "HNSW32,SQ8",
    "ivf-flat": "IVF{nlist},Flat",
    "ivf-pq": "IVF{nlist},PQ{m}",
    "int8": "SQ8",
    "binary": "BFlat",
}
"""Index names → faiss factory strings; ``nlist`` (IVF lists) and ``m`` (PQ bytes per vector) are filled
in from the corpus: :func:`factory_string`."""


def _faiss():
    import faiss

    faiss.cvar.distance_compute_blas_threshold = 20  # see the module notes
    return faiss


def unit_float32(x, what: str = "vectors") -> np.ndarray:
    """Return ``x`` as a C-contiguous float32 array of L2-normalised rows.

    Args:
        x: (n, d) array-like (numpy, or a torch tensor on any device and dtype).
        what: a name for error messages.

    Returns:
        (n, d) float32 array of unit rows (to float32 rounding).

    Raises:
        ValueError: ``x`` is not 2-D, has a non-finite value or a zero row.

    The norms and the division are computed in float64 and rounded to float32 once, so the result
    does not depend on which of numpy's vector kernels sums the squares (a float32 norm differs in
    its last bit between CPUs, and a kNN cut near a tie with it; issue 31 §0). Float64 input (e.g. a
    teacher's features) is read in float64; rows are done in blocks, so memory stays at the output.
    """
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x)
    if x.dtype != np.float64:
        x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array (n, d), got shape {x.shape}")
    out = np.empty(x.shape, dtype=np.float32)
    step = max(1, (1 << 22) // max(1, x.shape[1]))  # about 32 MB of float64 at a time
    for start in range(0, len(x), step):
        block = x[start : start + step].astype(np.float64)
        if not np.isfinite(block).all():
            raise ValueError(f"{what}: contains NaN or infinite values")
        norms = np.sqrt(np.einsum("ij,ij->i", block, block))[:, None]
        if not np.isfinite(norms).all():  # e.g. a float64 overflow in the norm (|v| ~ 1e160)
            raise ValueError(f"{what}: a row is too long to normalise (|v| overflows)")
        if (norms == 0).any():
            row = start + int(np.flatnonzero(norms[:, 0] == 0)[0])
            raise ValueError(f"{what}: row {row} is all zeros (no direction)")
        out[start : start + step] = block / norms
    return out


def truncate(x, dim: int | None, what: str = "vectors") -> np.ndarray:
    """The first ``dim`` components of each row, re-normalised (Matryoshka truncation; sentence-transformers'
    ``truncate_dim`` cuts without re-normalising, which an inner-product index would rank by length).

    Args:
        x: (n, d) vectors, any float dtype.
        dim: components kept (None: all).

    Returns:
        (n, dim) float32 unit rows.

    Raises:
        ValueError: ``dim`` > d, or what :func:`unit_float32` refuses (a truncated row of zeros too).
    """
    if dim is not None:
        width = x.shape[1] if getattr(x, "ndim", 0) == 2 else None
        if width is not None and dim > width:
            raise ValueError(f"{what}: retrieval.dim {dim} is larger than the vectors' dimension {width}")
        x = x[:, :dim]
    return unit_float32(x, what)


def tie_keys(ids, n: int) -> np.ndarray:
    """Each document's place in id order, (n,) int64: what :func:`ranked` breaks ties by. ``ids``
    None: the row number stands for the id.

    Raises:
        ValueError: ``ids`` of another length than ``n``.
    """
    if ids is None:
        return np.arange(n, dtype=np.int64)
    ids = [str(d) for d in ids]
    if len(ids) != n:
        raise ValueError(f"{len(ids)} ids for {n} documents")
    keys = np.empty(n, dtype=np.int64)
    keys[sorted(range(n), key=ids.__getitem__)] = np.arange(n)
    return keys


def ranked(scores: np.ndarray, indices: np.ndarray, keys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The one exit of every search here, and the one place the order of a ranking is decided:
    trec_eval's order — score descending, then document id descending — with padding (index ``-1``,
    score ``-inf``) last. Cut a ranking only after it (see the module notes).

    Args:
        scores: (n_queries, m) similarities, or (m,) for one query; indices: the same shape of corpus
            rows, ``-1`` = no result.
        keys: :func:`tie_keys` of the corpus (one per corpus row); None: the row number stands for the id.

    Returns:
        ``(scores, indices int64)`` of the same shape; scores keep a float64 dtype, anything else
        becomes float32.
    """
    scores = np.array(scores, dtype=np.float64 if np.asarray(scores).dtype == np.float64 else np.float32)
    indices = np.array(indices, dtype=np.int64)
    empty = (indices < 0) | ~np.isfinite(scores)
    scores[empty], indices[empty] = -np.inf, -1
    ties = indices if keys is None else np.where(empty, -1, np.asarray(keys)[np.maximum(indices, 0)])
    order = np.lexsort((-ties, -scores), axis=-1)
    return np.take_along_axis(scores, order, axis=-1), np.take_along_axis(indices, order, axis=-1)


def _cosines(queries: np.ndarray, found: np.ndarray, take) -> np.ndarray:
    """The cosine of each query with each of its candidates, (n, m) float32 from float64 sums (``-inf``
    where ``found`` is ``-1``); ``take(rows)`` gives the (len(rows), d) float32 vectors of corpus rows."""
    out = np.full(found.shape, -np.inf, dtype=np.float32)
    step = max(1, 2**22 // max(1, found.shape[1] * queries.shape[1]))  # about 32 MB of float64 at a time
    for start in range(0, len(found), step):
        rows = found[start : start + step]
        which, slot = np.nonzero(rows >= 0)  # (query, candidate) pairs that hold a document
        docs = take(rows[which, slot]).astype(np.float64)
        out[start + which, slot] = (docs * queries[start + which].astype(np.float64)).sum(-1)
    return out


def _cut_clear_of_ties(queries, k: int, n: int, search_at, take, keys) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` in trec_eval's order decided before the cut (see the module notes): ``search_at``
    (float32 faiss search of (queries, depth), best first) is asked for ``2k + 16`` candidates, they are
    rescored in float64 (:func:`_cosines`) and ordered by :func:`ranked`, and queries whose deepest
    candidate could still tie the ``k``-th score are searched again twice as deep.

    Args:
        queries: (n_queries, d) unit float32 vectors; k: at most ``n``; n: documents in the corpus;
        take: corpus rows → their float32 vectors; keys: :func:`tie_keys` of the corpus or None.

    Returns:
        ``(scores, indices)`` (n_queries, k) float32 and int64.
    """
    scores = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    tolerance = 2.0 * queries.shape[1] * 2.0**-24  # faiss's float32 dot of unit vectors is off by at most d·u
    pending, depth = np.arange(len(queries)), min(n, 2 * k + 16)
    while len(pending):
        rough, found = search_at(queries[pending], depth)
        found = np.asarray(found, dtype=np.int64)
        exact, found = ranked(_cosines(queries[pending], found, take), found, keys)
        # complete: nothing faiss left out can reach the k-th score
        done = (depth == n) | (rough[:, -1] < exact[:, k - 1] - tolerance)
        scores[pending[done]], indices[pending[done]] = exact[done, :k], found[done, :k]
        pending, depth = pending[~done], min(n, 2 * depth)
    return scores, indices


class DenseIndex:
    """An exact inner-product index over unit-normalised float32 document vectors held in memory.

    Args:
        docs: (n_docs, d) vectors, any float dtype; renormalised in float32 (C13).
        use_gpu: None picks the GPU when faiss has one; False forces the CPU.
        ids: the documents' ids, which break ties (trec_eval's order: id descending); None: the row
            number stands for the id.

    Raises:
        ValueError: see :func:`unit_float32`; ``ids`` of another length.
    """

    def __init__(self, docs, use_gpu: bool | None = None, ids=None):
        faiss = _faiss()
        docs = unit_float32(docs, "docs")
        self.n_docs, self.dim = docs.shape
        self._cpu = faiss.IndexFlatIP(self.dim)
        self._cpu.add(docs)
        self._docs = faiss.rev_swig_ptr(self._cpu.get_xb(), self.n_docs * self.dim).reshape(self.n_docs, self.dim)
        self._keys = tie_keys(ids, self.n_docs)
        gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        self._gpu = None
        if (use_gpu is None or use_gpu) and gpus > 0:
            self._res = faiss.StandardGpuResources()
            self._gpu = faiss.index_cpu_to_gpu(self._res, 0, self._cpu)

    @property
    def on_gpu(self) -> bool:
        """Whether searches (k ≤ 2048, faiss's GPU limit) run on the GPU."""
        return self._gpu is not None

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` most similar documents of each query, in trec_eval's order (see the module notes:
        ties broken by id before the cut, so every ``k`` gives a prefix of every deeper ranking).

        Args:
            queries: (n_queries, d) vectors, any float dtype; renormalised in float32.
            k: neighbours wanted; more than ``n_docs`` returns all ``n_docs`` (no -1 padding).

        Returns:
            ``(scores, indices)``: (n_queries, min(k, n_docs)) float32 cosine similarities (computed
            in float64, rounded once) in descending order, equal scores by id descending, and int64
            row indices into ``docs``.

        Raises:
            ValueError: bad vectors, a dimension mismatch, or ``k < 1``.
        """
        queries = unit_float32(queries, "queries")
        if queries.shape[1] != self.dim:
            raise ValueError(f"queries have dimension {queries.shape[1]}, docs {self.dim}")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        k = min(k, self.n_docs)

        def search_at(q: np.ndarray, depth: int):
            return (self._gpu if self._gpu is not None and depth <= _GPU_MAX_K else self._cpu).search(q, depth)

        return _cut_clear_of_ties(queries, k, self.n_docs, search_at, self._docs.__getitem__, self._keys)


def search(queries, docs, k: int, use_gpu: bool | None = None, ids=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` inner-product search of unit-normalised ``queries`` against ``docs`` in memory.

    Args:
        queries: (n_queries, d) vectors; docs: (n_docs, d) vectors; any float dtype, renormalised
            in float32 (C13).
        k: neighbours per query; capped at ``n_docs``.
        use_gpu: None uses the GPU when faiss has one.
        ids: the documents' ids, for ties (see :class:`DenseIndex`).

    Returns:
        ``(scores, indices)`` of shape (n_queries, min(k, n_docs)): float32 cosine similarities,
        descending (ties by id, descending), and int64 document rows.

    Raises:
        ValueError: see :class:`DenseIndex`.
    """
    return DenseIndex(docs, use_gpu=use_gpu, ids=ids).search(queries, k)


# ---------------------------------------------------------------------------------------------- corpus


class Corpus:
    """Document vectors to search: parts that are arrays in memory or ``.npy`` files (memory-mapped
    part by part and block by block, never read whole), each with the corpus rows its vectors are.

    The parts' vectors must be unit-normalised float32 at their full dimension (what
    :func:`unit_float32` returns and :mod:`obliq.eval.store` writes); ``dim`` truncates them
    (:func:`truncate`) wherever they are read.

    Args:
        parts: ``(vectors, rows)`` pairs: an (n_i, d) float32 array or the path of an ``.npy`` file
            holding one, and the (n_i,) int64 corpus rows of its vectors (together a permutation of
            ``0 … n - 1``).
        dim: Matryoshka truncation (None: the full dimension).
        token: a string that changes whenever the vectors may have (saved indexes record it).
        ids: the document id of each corpus row, which breaks ties (:func:`tie_keys`); None: the row
            number stands for the id.

    Raises:
        ValueError: a part's shape or dtype is wrong, parts of different dimensions, the rows are not
            a permutation of the corpus, ``dim`` larger than the vectors, ``ids`` of another length.
    """

    def __init__(
        self,
        parts: Sequence[tuple[np.ndarray | Path, np.ndarray]],
        dim: int | None = None,
        token: str = "",
        ids: Sequence[str] | None = None,
    ):
        self.parts = []
        widths = set()
        for vectors, rows in parts:
            rows = np.asarray(rows, dtype=np.int64)
            shape, dtype = (vectors.shape, vectors.dtype) if isinstance(vectors, np.ndarray) else npy_header(vectors)
            if len(shape) != 2 or shape[0] != len(rows) or dtype != np.float32:
                raise ValueError(
                    f"{vectors if not isinstance(vectors, np.ndarray) else 'vectors'}: shape {shape} "
                    f"{dtype}, expected ({len(rows)}, d) float32"
                )
            widths.add(shape[1])
            self.parts.append((vectors, rows))
        if len(widths) > 1:
            raise ValueError(f"corpus parts of different dimensions: {sorted(widths)}")
        self.full_dim = widths.pop() if widths else 0
        if dim is not None and not 1 <= dim <= self.full_dim:
            raise ValueError(f"retrieval.dim {dim} must lie in 1 … {self.full_dim} (the vectors' dimension)")
        self.dim = dim or self.full_dim
        self.truncated = self.dim != self.full_dim
        self.token = token
        self.n = sum(len(rows) for _, rows in self.parts)
        self._part = np.full(self.n, -1, dtype=np.int32)
        self._local = np.zeros(self.n, dtype=np.int64)
        for p, (_, rows) in enumerate(self.parts):
            if len(rows) and (rows.min() < 0 or rows.max() >= self.n or (self._part[rows] >= 0).any()):
                raise ValueError(
                    "corpus parts: their rows are not a permutation of the corpus (a row twice or out of range)"
                )
            self._part[rows] = p
            self._local[rows] = np.arange(len(rows))
        if (self._part < 0).any():
            raise ValueError("corpus parts: some corpus rows are in no part")
        self.ids = ids
        self.keys = tie_keys(ids, self.n)

    @classmethod
    def from_array(cls, x, dim: int | None = None, ids: Sequence[str] | None = None) -> Corpus:
        """A corpus held in memory: ``x`` (n, d), any float dtype, renormalised (:func:`unit_float32`)."""
        x = unit_float32(x, "docs")
        return cls([(x, np.arange(len(x)))], dim, token=f"memory:{id(x)}", ids=ids)

    def prepare(self, x, what: str = "queries") -> np.ndarray:
        """Queries (or any vectors) as this corpus is searched: truncated to ``dim``, unit float32.

        Raises:
            ValueError: their dimension is not the corpus's full one, or see :func:`unit_float32`.
        """
        width = x.shape[1] if getattr(x, "ndim", 0) == 2 else None
        if width is not None and width != self.full_dim:
            raise ValueError(f"{what} have dimension {width}, docs {self.full_dim}")
        return truncate(x, self.dim if self.truncated else None, what)

    def _view(self, vectors, rows: slice | np.ndarray) -> np.ndarray:
        """Vectors of one part (rows of it), as searched: a view when nothing is to be done, else a copy."""
        out = vectors[rows]
        return truncate(out, self.dim, "docs") if self.truncated else np.ascontiguousarray(out)

    def block_rows(self) -> int:
        """Vectors per block: :data:`BLOCK_BYTES` of float32."""
        return max(1, BLOCK_BYTES // (4 * self.full_dim))

    def blocks(self, rows_per_block: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every vector once, block by block: ``(vectors (b, dim) float32, corpus rows (b,))``.

        A file part is memory-mapped afresh for each block and unmapped after it, so the resident set
        holds one block of it at a time.
        """
        step = rows_per_block or self.block_rows()
        for vectors, rows in self.parts:
            for start in range(0, len(rows), step):
                part = vectors if isinstance(vectors, np.ndarray) else np.load(vectors, mmap_mode="r")
                yield self._view(part, slice(start, start + step)), rows[start : start + step]
                del part

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of corpus ``rows`` (any order, repeats allowed), as searched: (len(rows), dim).

        Each file is read in order, mapped afresh for every :data:`BLOCK_BYTES` /
        :data:`FAULT_AROUND_BYTES` rows and unmapped after them: the pages the kernel maps around each
        row count in the resident set while mapped, so one mapping for a training sample of 131K rows
        of a 6.2 GB store (508K × 3072) held the whole file resident (9 GB peak of ``evaluate``).
        """
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        parts = self._part[rows]
        step = max(1, BLOCK_BYTES // max(FAULT_AROUND_BYTES, 4 * self.full_dim))
        for p in np.unique(parts):
            at = np.flatnonzero(parts == p)
            local = self._local[rows[at]]
            order = np.argsort(local, kind="stable")  # read each file in order
            vectors = self.parts[p][0]
            for start in range(0, len(order), step):
                chunk = order[start : start + step]
                source = vectors if isinstance(vectors, np.ndarray) else np.load(vectors, mmap_mode="r")
                out[at[chunk]] = self._view(source, local[chunk])
                del source
        return out

    def sample(self, size: int, seed: int = 0) -> np.ndarray:
        """``min(size, n)`` vectors drawn uniformly without replacement (seeded), as searched."""
        if size >= self.n:
            return self.take(np.arange(self.n))
        rows = np.sort(np.random.default_rng(seed).choice(self.n, size=size, replace=False))
        return self.take(rows)


def npy_header(path: str | os.PathLike) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of an ``.npy`` file, read from its header only (the size is checked against it).

    Raises:
        ValueError: not an ``.npy`` file, a Fortran-ordered one, or shorter than its header says.
        OSError: it cannot be read.
    """
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        offset = f.tell()
    if fortran:
        raise ValueError(f"{path}: a Fortran-ordered array (obliq writes C order)")
    need = offset + int(np.prod(shape)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < need:
        raise ValueError(f"{path}: {size} bytes, its header needs {need} (cut short)")
    return tuple(shape), dtype


def exact_search(queries, corpus: Corpus, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` search of ``queries`` over a corpus, block by block (see the module notes).

    Args:
        queries: (n_queries, full_dim) vectors, any float dtype (truncated and renormalised as the corpus).
        corpus: the documents.
        k: neighbours per query; capped at the corpus size.

    Returns:
        ``(scores, indices)``: (n_queries, min(k, n)) float32 cosine similarities (float64, rounded
        once), best first in trec_eval's order (ties by ``corpus.ids``, descending, decided before the
        cut), and int64 corpus rows — the same as :class:`DenseIndex` over the whole matrix.

    Raises:
        ValueError: ``k`` < 1, or bad queries (:meth:`Corpus.prepare`).
    """
    faiss = _faiss()
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    q = corpus.prepare(queries)
    k = min(k, corpus.n)

    def scan(q: np.ndarray, depth: int):
        heap = faiss.ResultHeap(len(q), depth, keep_max=True)
        for block, rows in corpus.blocks():
            scores, local = faiss.knn(q, block, min(depth, len(block)), metric=faiss.METRIC_INNER_PRODUCT)
            heap.add_result(scores, rows[local])
        heap.finalize()
        return heap.D, heap.I

    return _cut_clear_of_ties(q, k, corpus.n, scan, corpus.take, corpus.keys)


def recall_vs_exact(found: np.ndarray, exact: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """Mean over queries of |found top-k ∩ exact top-k| / |exact top-k|, for each k.

    Args:
        found: (n_queries, ≥ max k) rows an approximate search returned, best first (``-1``: none).
        exact: (n_queries, ≥ max k) rows of exact search on the same queries, best first.
        ks: cut-offs (each at most both widths).

    Returns:
        ``{"Recall@k": value}`` (documents tied at exact's k-th score count as exact returned them).
    """
    out = {}
    for k in ks:
        hits = [
            len(set(f[:k][f[:k] >= 0].tolist()) & set(e[:k][e[:k] >= 0].tolist())) / max(1, int((e[:k] >= 0).sum()))
            for f, e in zip(found, exact)
        ]
        out[f"Recall@{k}"] = float(np.mean(hits)) if hits else float("nan")
    return out


# ---------------------------------------------------------------------------------------------- indexes


@dataclass(frozen=True)
class IndexSpec:
    """How to search a corpus (:class:`obliq.eval.retrieval.RetrievalSettings` carries the same fields).

    Attributes:
        index: a name of :data:`PRESETS` (``flat``: exact; ``hnsw``, ``hnsw-int8``, ``ivf-flat``,
            ``ivf-pq``, ``int8``, ``binary``) or a faiss factory string, over the float vectors
            (``HNSW32,Flat``, ``IVF4096,PQ96``, ``SQ8``…) or, starting with ``B``, over their sign bits
            (``BFlat``, ``BHNSW32``, ``BIVF1024``).
        nprobe: inverted lists visited per query (IVF indexes).
        ef_search: HNSW candidate list while searching (at least k is used).
        ef_construction: HNSW candidate list while building.
        rescore: 0, or rescore the top ``rescore × k`` candidates with the float32 vectors.
        train_size: vectors sampled (seeded) to train IVF centroids, PQ codebooks and SQ ranges.
        seed: the training sample's seed.
    """

    index: str = "flat"
    nprobe: int = 32
    ef_search: int = 128
    ef_construction: int = 40
    rescore: int = 0
    train_size: int = 131072
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("nprobe", "ef_search", "ef_construction", "train_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"retrieval.{key}: must be an integer >= 1, got {value!r}")
        if isinstance(self.rescore, bool) or not isinstance(self.rescore, int) or self.rescore < 0:
            raise ValueError(f"retrieval.rescore: must be an integer >= 0, got {self.rescore!r}")
        if not isinstance(self.index, str) or not self.index.strip():
            raise ValueError(f"retrieval.index: must be an index name or a faiss factory string, got {self.index!r}")
        if self.exact and self.rescore:
            raise ValueError("retrieval.rescore: flat search is exact, there is nothing to rescore")

    @property
    def exact(self) -> bool:
        """Flat search (no index is built: exact search, block by block)."""
        return self.index.strip().lower() == "flat"

    @property
    def binary(self) -> bool:
        """An index over sign bits (Hamming distance)."""
        return self.index.strip().lower() == "binary" or bool(re.match(r"B[A-Z]", self.index.strip()))


def _nlist(n: int, train: int) -> int:
    """IVF lists for ``n`` vectors: the power of two nearest 4·√n (faiss's guideline 4–16·√n), lowered to
    a power of two with at least 39 training vectors per list (faiss warns below)."""
    nlist = 2 ** max(0, round(np.log2(max(1.0, 4 * np.sqrt(n)))))
    cap = 2 ** int(np.log2(max(1, min(n, train) // 39)))
    return int(min(nlist, cap))


def _untrainable(factory: str, n_train: int) -> str | None:
    """Why faiss cannot train ``factory`` on ``n_train`` vectors (its ``'nx >= k' failed`` assertion), or
    None: an IVF, IMI or binary IVF quantizer needs a vector per list, a PQ or OPQ codebook one per
    centroid (2^bits, 8 bits unless ``PQ<m>x<bits>``; C42, faiss #237 / #2513)."""
    for lists in re.findall(r"IVF(\d+)", factory):
        if int(lists) > n_train:
            return f"{lists} inverted lists need at least {lists} training vectors"
    for bits in re.findall(r"IMI2x(\d+)", factory):
        if 2 ** int(bits) > n_train:
            return f"IMI2x{bits} needs at least {2 ** int(bits)} training vectors"
    for kind, bits in re.findall(r"(?<![A-Za-z])(O?PQ)\d+(?:x(\d+))?", factory):
        centroids = 2 ** int(bits or 8)
        if centroids > n_train:
            return f"{kind} with {int(bits or 8)}-bit codes trains {centroids} centroids per sub-vector"
    return None


def factory_string(spec: IndexSpec, n: int, dim: int | None = None) -> tuple[str, str | None]:
    """The faiss factory string an index name stands for, at ``n`` vectors of ``dim`` components
    (``ivf-*``: :func:`_nlist` lists; ``ivf-pq``: dim / 16 bytes per vector, 16-d sub-vectors, 8-bit
    codes, fewer bits when the corpus is too small to train 256 centroids), checked against what faiss
    can train on the corpus (C42). ``dim`` None checks only what the corpus size decides (before encoding).

    Returns:
        ``(factory, adjusted)``: ``adjusted`` says what was changed to make a preset trainable, or None.

    Raises:
        ValueError: an index faiss cannot train on ``n`` vectors (the setting and the size named);
            ``ivf-pq`` with a dimension that is not a multiple of 16; a binary index over a dimension
            that is not a multiple of 8.
    """
    name = spec.index.strip()
    factory = PRESETS.get(name.lower(), name)
    if dim is not None and "{m}" in factory and dim % 16:
        raise ValueError(f"retrieval.index ivf-pq: the dimension {dim} is not a multiple of 16; give a factory string")
    if dim is not None and spec.binary and dim % 8:
        raise ValueError(f"retrieval.index {name}: binary codes need a dimension that is a multiple of 8, got {dim}")
    n_train = min(n, spec.train_size)
    factory = factory.format(nlist=_nlist(n, spec.train_size), m=(dim or 16) // 16)
    adjusted = None
    if name.lower() == "ivf-pq" and n_train < 256:
        bits = int(np.log2(max(1, n_train)))
        if bits >= 1:
            factory = f"{factory}x{bits}"
            adjusted = f"ivf-pq with {bits}-bit codes: {n_train} training vectors cannot train 256 centroids"
    why = _untrainable(factory, n_train)
    if why:
        raise ValueError(
            f"retrieval.index {name!r} ({factory}): {why}, and the corpus gives {n_train} "
            f"({n} documents, retrieval.train_size {spec.train_size}); use flat or hnsw, or a smaller index"
        )
    return factory, adjusted


def _parts(index, faiss) -> list:
    """An index and the indexes inside it (a pre-transform's, an HNSW's storage, a refinement's base)."""
    out = [index]
    for attr in ("index", "storage", "base_index"):
        sub = getattr(index, attr, None)
        if sub is not None and isinstance(sub, faiss.Index):
            out += _parts(faiss.downcast_index(sub), faiss)
    return out


class VectorIndex:
    """A corpus ready to search as ``spec`` says: exactly (flat) or through a faiss index, built or
    loaded from ``folder`` (see the module notes).

    An index is saved as ``<folder>/index-<name>-<key>.faiss`` with ``.json`` (what it is, how it was
    built) and ``.rows.npy`` (the corpus row of each indexed vector); it is reused when its record
    matches the corpus (its ``token``, size, dimension) and the build settings, and rebuilt otherwise.

    Args:
        corpus: the documents.
        spec: how to search.
        folder: where to save and find the index (None: built in memory, not saved).
        use_gpu: flat search on the GPU (the vectors are then read into memory) when faiss has one (None).

    Raises:
        ValueError: a factory string faiss cannot parse or build, or see :func:`factory_string`.
    """

    def __init__(self, corpus: Corpus, spec: IndexSpec = IndexSpec(), folder: Path | None = None, use_gpu=None):
        self.corpus, self.spec = corpus, spec
        self.index, self.labels, self._dense = None, None, None
        self.info: dict = {"index": spec.index, "dim": corpus.dim, "full_dim": corpus.full_dim, "n_docs": corpus.n}
        if spec.exact:
            self.info.update(factory="Flat", exact=True)
            faiss = _faiss()
            if use_gpu is not False and getattr(faiss, "get_num_gpus", lambda: 0)() > 0:
                self._dense = DenseIndex(corpus.take(np.arange(corpus.n)), use_gpu=use_gpu, ids=corpus.ids)
            return
        factory, adjusted = factory_string(spec, corpus.n, corpus.dim)
        if adjusted:
            log.warning("%s (a corpus of %d documents)", adjusted, corpus.n)
        build = {"factory": factory, "dim": corpus.dim, "train_size": spec.train_size, "seed": spec.seed}
        if "HNSW" in factory:
            build["ef_construction"] = spec.ef_construction
        record = {**build, "n_docs": corpus.n, "corpus": corpus.token, "faiss": _faiss().__version__}
        key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]
        stem = re.sub(r"[^\w.\-]+", "_", factory)
        self.path = Path(folder) / f"index-{stem}-d{corpus.dim}-{key}.faiss" if folder is not None else None
        loaded = self._load(record) if self.path is not None else False
        if not loaded:
            self._build(factory)
            if self.path is not None:
                self._save(record)
        self._set_search_parameters()
        self.info.update(
            factory=factory,
            **({"adjusted": adjusted} if adjusted else {}),
            exact=False,
            binary=spec.binary,
            params=self._search_parameters(),
            build={k: v for k, v in build.items() if k not in ("factory", "dim")},
            rescore=spec.rescore,
            reused=loaded,
            build_s=self.build_s,
            file=str(self.path) if self.path is not None else None,
            bytes=self.path.stat().st_size if self.path is not None else None,
        )

    # ------------------------------------------------------------ build, save, load
    def _build(self, factory: str) -> None:
        faiss, corpus, spec = _faiss(), self.corpus, self.spec
        t0 = time.perf_counter()
        try:
            if spec.binary:
                index = faiss.index_binary_factory(corpus.dim, factory)
            else:
                index = faiss.index_factory(corpus.dim, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as err:
            why = _first_line(err)
            raise ValueError(f"retrieval.index {spec.index!r}: faiss cannot build {factory!r} ({why})") from None
        if not spec.binary:
            for part in _parts(index, faiss):
                if hasattr(part, "do_polysemous_training"):  # the factory turns it on: 14× the PQ training time
                    part.do_polysemous_training = False
        if getattr(index, "hnsw", None) is not None:
            index.hnsw.efConstruction = spec.ef_construction
        code = _sign_bits if spec.binary else (lambda x: x)
        if not index.is_trained:
            try:
                index.train(code(corpus.sample(spec.train_size, spec.seed)))
            except RuntimeError as err:  # what factory_string's check does not foresee
                why = _first_line(err)
                raise ValueError(f"retrieval.index {spec.index!r}: faiss cannot train {factory!r} ({why})") from None
        labels = []
        for block, rows in corpus.blocks():
            index.add(code(block))
            labels.append(rows)
        self.index, self.labels = index, np.concatenate(labels) if labels else np.zeros(0, np.int64)
        self.build_s = round(time.perf_counter() - t0, 3)

    def _save(self, record: dict) -> None:
        faiss = _faiss()
        with publish(self.path) as tmp:
            (faiss.write_index_binary if self.spec.binary else faiss.write_index)(self.index, str(tmp))
            np.save(self.path.with_suffix(".rows.npy"), self.labels)
        meta = {**record, "build_s": self.build_s, "n_indexed": int(self.index.ntotal), "sha256": _sha256(self.path)}
        self.path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")

    def _load(self, record: dict) -> bool:
        """Load a saved index that matches ``record`` (memory-mapped, read-only); False when there is none
        or it is unusable (logged)."""
        faiss = _faiss()
        meta_file = self.path.with_suffix(".json")
        if not (self.path.is_file() and meta_file.is_file()):
            return False
        try:
            meta = json.loads(meta_file.read_text())
            if {k: meta.get(k) for k in record} != record:
                raise ValueError("built for other vectors or with other settings")
            if meta.get("sha256") != _sha256(self.path):  # another index's file under this one's name
                raise ValueError("its file is not the one built (checksum differs from its record)")
            read = faiss.read_index_binary if self.spec.binary else faiss.read_index
            index = read(str(self.path), faiss.IO_FLAG_MMAP_IFC)  # read-only: never add to it (faiss aborts)
            labels = np.load(self.path.with_suffix(".rows.npy"), allow_pickle=False)
            if index.ntotal != self.corpus.n or labels.shape != (self.corpus.n,) or index.d != self.corpus.dim:
                raise ValueError(f"holds {index.ntotal} vectors of dimension {index.d}")
        except (ValueError, OSError, RuntimeError) as err:
            log.warning("%s: unusable saved index (%s); rebuilt", self.path, _first_line(err))
            return False
        self.index, self.labels, self.build_s = index, labels.astype(np.int64), meta.get("build_s")
        return True

    # ------------------------------------------------------------ search
    def _ivf(self):
        faiss = _faiss()
        if self.spec.binary:
            return self.index if isinstance(self.index, faiss.IndexBinaryIVF) else None
        return faiss.try_extract_index_ivf(self.index)

    def _set_search_parameters(self) -> None:
        ivf = self._ivf()
        if ivf is not None:
            ivf.nprobe = min(self.spec.nprobe, ivf.nlist)
        if getattr(self.index, "hnsw", None) is not None:  # a list longer than the corpus adds only time
            self.index.hnsw.efSearch = min(self.spec.ef_search, max(1, self.corpus.n))

    def _search_parameters(self) -> dict:
        out = {}
        ivf = self._ivf()
        if ivf is not None:
            out.update(nlist=int(ivf.nlist), nprobe=int(ivf.nprobe))
        if getattr(self.index, "hnsw", None) is not None:
            out.update(ef_search=int(self.index.hnsw.efSearch), ef_construction=int(self.index.hnsw.efConstruction))
        return out

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best documents of each query as this index finds them.

        Args:
            queries: (n_queries, full_dim) vectors, any float dtype.
            k: documents per query (capped at the corpus size).

        Returns:
            ``(scores, indices)`` (n_queries, min(k, n)): float32 scores, best first in trec_eval's
            order (:func:`ranked`, ties by ``corpus.ids``), and int64 corpus rows; an approximate index
            may find fewer than k (index ``-1``, score ``-inf``). Scores are cosine similarities (flat,
            rescored: float64, rounded once), faiss's approximate inner products (HNSW, IVF, PQ, SQ8),
            or 1 − 2·Hamming / bits (binary, without rescoring).

        Raises:
            ValueError: ``k`` < 1, bad queries.
        """
        if self.spec.exact:
            if self._dense is not None:
                return self._dense.search(self.corpus.prepare(queries), k)
            return exact_search(queries, self.corpus, k)
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        q = self.corpus.prepare(queries)
        k = min(k, self.corpus.n)
        wide = min(self.corpus.n, k * max(1, self.spec.rescore))
        if self.spec.binary:
            distances, found = self.index.search(_sign_bits(q), wide)
            scores = 1.0 - 2.0 * distances.astype(np.float32) / self.corpus.dim
        else:
            scores, found = self.index.search(q, wide)
        found = np.where(found >= 0, self.labels[np.maximum(found, 0)], -1)
        if self.spec.rescore:  # cosines with the float32 vectors read back from the corpus
            scores = _cosines(q, found, self.corpus.take)
        scores, found = ranked(scores, found, self.corpus.keys)
        return scores[:, :k], found[:, :k]

    def describe(self) -> dict:
        """What was searched with, for a summary: the index name and factory string, dimension, search
        and build parameters, rescoring, whether a saved index was reused, build seconds, file and bytes."""
        return dict(self.info)


def _sign_bits(x: np.ndarray) -> np.ndarray:
    """Binary codes: bit j of a row is ``x[j] > 0``, packed 8 to a byte (sentence-transformers' ``ubinary``)."""
    return np.packbits(np.asarray(x) > 0, axis=-1)


def set_threads(threads: int | None) -> None:
    """faiss's OpenMP threads for this process (None: leave them; faiss reads ``OMP_NUM_THREADS``)."""
    if threads is not None:
        _faiss().omp_set_num_threads(int(threads))


def _sha256(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__
