"""Exact nearest-neighbour search by inner product over unit vectors, and the one rule of ranking order.

Every exact search (evaluation's flat index and the reference of an approximate one, ``obliq search``,
the training callback, kNN-graph distillation, dense negative mining) goes through :class:`ExactIndex`,
and every result of any search leaves through :func:`ranked` (trec_eval's order, ``-1`` padding last),
so the rule about the order of results is applied in one place; BM25, Lucene, candidate sets and the
faiss indexes of :mod:`obliq.search.faiss_index` order their rankings through it too. Vectors are cast
to float32 and L2-renormalised before indexing (C13): an inner-product index over vectors that are not
unit length ranks by length as much as by direction, and vectors stored in bf16 come back off unit
length by up to ~2e-3. So the score is the cosine similarity.

- **The documents** (:class:`Corpus`): arrays in memory (:meth:`Corpus.from_array`) or memory-mapped
  ``.npy`` shards written by :mod:`obliq.search.store`.
- **Exact search** (:class:`ExactIndex`): on the CPU the corpus is scanned block by block with
  ``faiss.knn`` and the blocks' top-k merged with ``faiss.ResultHeap`` (Tevatron's shard search; Johnson
  et al., 2019). Each block is mapped only while it is scanned, so the vectors are never copied into
  memory and the resident set stays at one block (``IndexFlatIP.add`` would copy the whole matrix). On
  the GPU (faiss built with CUDA, a GPU visible) the vectors are read into a GPU ``IndexFlatIP`` once.
- **Matryoshka truncation** (Kusupati et al., 2022): ``dim`` keeps the first components of every
  vector and re-normalises them (:func:`truncate`), before any index or search.

**Ties and the cut** (issue 24 §2). The same text under two ids is common in real corpora, and gives
two documents the same score. faiss keeps an arbitrary subset of a tie group that straddles the cut
at ``k``, so NDCG@k and Recall@k used to change with ``k``. Here every ranking is ordered by score
descending, then by document id descending — trec_eval's order, :func:`ranked` with the corpus's
:func:`tie_keys` — *before* the cut, so the top ``k`` of a deeper ranking is the ranking at ``k``,
whatever the depth. Exact search asks faiss for more than ``k`` candidates, recomputes each
candidate's cosine exactly (float64 over the stored float32 vectors, the same arithmetic for every
document, so equal vectors tie exactly on any device and at any depth, then rounded to float32), and
searches deeper while a document not returned could still tie the ``k``-th score (within faiss's
float32 rounding bound). An approximate index orders what it found the same way (rescored in float64
with ``rescore``); which documents it finds is its own approximation, reported as recall against exact.

faiss runs with ``distance_compute_blas_threshold`` = 20 (its former default): at 1.15's 128000 a
batch of fewer than 128000 / d queries is searched without BLAS, 9× slower at 100 queries × 384.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

BLOCK_BYTES = 1 << 28
"""Bytes of float32 vectors scanned or added at a time (256 MiB)."""

FAULT_AROUND_BYTES = 1 << 16
"""What Linux maps around each page fault of a file mapping (``fault_around_bytes``, 64 KiB): rows
gathered from a mapped file keep up to this much each resident while the file stays mapped."""

_GPU_MAX_K = 2048  # faiss GPU flat search returns at most 2048 neighbours


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


class Corpus:
    """Document vectors to search: parts that are arrays in memory or ``.npy`` files (memory-mapped
    part by part and block by block, never read whole), each with the corpus rows its vectors are.

    The parts' vectors must be unit-normalised float32 at their full dimension (what
    :func:`unit_float32` returns and :mod:`obliq.search.store` writes); ``dim`` truncates them
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


class ExactIndex:
    """Exact top-``k`` search by cosine over a corpus: obliq's one door for exact vector search (see the
    module notes).

    On the CPU every search scans the corpus block by block (a corpus on disk is never read whole); on
    the GPU, when faiss has one and ``use_gpu`` is not False, the vectors are read once into a GPU
    ``IndexFlatIP`` that searches up to 2048 neighbours (faiss's GPU limit; deeper searches scan on the
    CPU). Either way the result is the same: candidates rescored in float64 and ordered by
    :func:`ranked` before the cut.

    Args:
        docs: a :class:`Corpus`, or (n_docs, d) vectors in memory, any float dtype (renormalised in
            float32, C13: :meth:`Corpus.from_array`).
        use_gpu: None picks the GPU when faiss has one; False forces the CPU.
        ids: with an array, the documents' ids, which break ties (trec_eval's order: id descending);
            None: the row number stands for the id. A :class:`Corpus` carries its own.

    Raises:
        ValueError: see :func:`unit_float32`; ``ids`` of another length, or given with a :class:`Corpus`.
    """

    def __init__(self, docs, use_gpu: bool | None = None, ids=None):
        if not isinstance(docs, Corpus):
            docs = Corpus.from_array(docs, ids=ids)
        elif ids is not None:
            raise ValueError("ExactIndex: a Corpus carries its own ids; pass ids only with an array")
        self.corpus = docs
        self.n_docs, self.dim = docs.n, docs.dim
        self._gpu, self._take = None, docs.take
        faiss = _faiss()
        if use_gpu is not False and getattr(faiss, "get_num_gpus", lambda: 0)() > 0:
            vectors = docs.take(np.arange(docs.n))  # into memory once, as searched (truncated)
            cpu = faiss.IndexFlatIP(self.dim)
            cpu.add(vectors)
            self._res = faiss.StandardGpuResources()
            self._gpu, self._take = faiss.index_cpu_to_gpu(self._res, 0, cpu), vectors.__getitem__

    @property
    def on_gpu(self) -> bool:
        """Whether searches (k ≤ 2048, faiss's GPU limit) run on the GPU."""
        return self._gpu is not None

    def _scan(self, q: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss's float32 top-``depth`` of each query, best first: on the GPU, or block by block."""
        if self._gpu is not None and depth <= _GPU_MAX_K:
            return self._gpu.search(q, depth)
        faiss = _faiss()
        heap = faiss.ResultHeap(len(q), depth, keep_max=True)
        for block, rows in self.corpus.blocks():
            scores, local = faiss.knn(q, block, min(depth, len(block)), metric=faiss.METRIC_INNER_PRODUCT)
            heap.add_result(scores, rows[local])
        heap.finalize()
        return heap.D, heap.I

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` most similar documents of each query, in trec_eval's order (see the module notes:
        ties broken by id before the cut, so every ``k`` gives a prefix of every deeper ranking).

        Args:
            queries: (n_queries, full_dim) vectors, any float dtype (truncated and renormalised as the
                corpus: :meth:`Corpus.prepare`).
            k: neighbours wanted; more than ``n_docs`` returns all ``n_docs`` (no -1 padding).

        Returns:
            ``(scores, indices)``: (n_queries, min(k, n_docs)) float32 cosine similarities (computed
            in float64, rounded once) in descending order, equal scores by id descending, and int64
            corpus rows.

        Raises:
            ValueError: ``k`` < 1, or bad queries (a dimension mismatch, see :func:`unit_float32`).
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        q = self.corpus.prepare(queries)
        return _cut_clear_of_ties(q, min(k, self.n_docs), self.n_docs, self._scan, self._take, self.corpus.keys)


def set_threads(threads: int | None) -> None:
    """faiss's OpenMP threads for this process (None: leave them; faiss reads ``OMP_NUM_THREADS``)."""
    if threads is not None:
        _faiss().omp_set_num_threads(int(threads))
