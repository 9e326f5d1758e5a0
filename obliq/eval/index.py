"""Exact nearest-neighbour search by inner product over unit vectors: obliq's one search.

Every caller (evaluation, the training callback, kNN-graph distillation) searches through this
module. Vectors are cast to float32 and L2-renormalised before indexing (C13): an inner-product
index over vectors that are not unit length ranks by length as much as by direction, and vectors
stored in bf16 come back off unit length by up to ~2e-3. So the score is the cosine similarity.

The index is faiss's exact ``IndexFlatIP`` (Johnson et al., 2019), on the GPU when faiss was built
with CUDA and a GPU is visible, on the CPU otherwise.

**Ties and the cut** (issue 24 §2). The same text under two ids is common in real corpora, and gives
two documents the same score. faiss keeps an arbitrary subset of a tie group that straddles the cut
at ``k``, so NDCG@k and Recall@k used to change with ``k``. Here every ranking is ordered by score
descending, then by document id descending — trec_eval's order — *before* the cut, so the top ``k``
of a deeper ranking is the ranking at ``k``, whatever the depth: faiss is asked for more than ``k``
candidates, each candidate's cosine is recomputed exactly (float64 over the stored float32 vectors,
the same arithmetic for every document, so equal vectors tie exactly on any device and at any depth,
then rounded to float32), and the search goes deeper while a document not returned could still tie
the ``k``-th score (within faiss's float32 rounding bound). :func:`tie_order` is that order, for the
callers that rank other scores (BM25).
"""

from __future__ import annotations

import numpy as np

NORM_TOLERANCE = 1e-3
"""Largest | ‖v‖ − 1 | accepted after renormalisation (C13)."""

_GPU_MAX_K = 2048  # faiss GPU flat search returns at most 2048 neighbours


def unit_float32(x, what: str = "vectors") -> np.ndarray:
    """Return ``x`` as a C-contiguous float32 array of L2-normalised rows.

    Args:
        x: (n, d) array-like (numpy, or a torch tensor on any device and dtype).
        what: a name for error messages.

    Returns:
        (n, d) float32 array, each row with | ‖v‖ − 1 | ≤ :data:`NORM_TOLERANCE`.

    Raises:
        ValueError: ``x`` is not 2-D, has a non-finite value or a zero row.
    """
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().float().cpu().numpy()
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array (n, d), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: contains NaN or infinite values")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError(f"{what}: row {int(np.flatnonzero(norms[:, 0] == 0)[0])} is all zeros (no direction)")
    x = x / norms
    worst = float(np.abs(np.linalg.norm(x, axis=1) - 1).max()) if len(x) else 0.0
    if worst > NORM_TOLERANCE:  # e.g. a float32 overflow in the norm (|v| ~ 1e20)
        raise ValueError(f"{what}: a row is off unit length by {worst:.2e} after renormalisation")
    return x


def tie_keys(ids, n: int) -> np.ndarray:
    """Each document's place in id order, (n,) int64: what :func:`tie_order` breaks ties by. ``ids``
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


def tie_order(scores: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The positions of ``scores`` in trec_eval's order: score descending, then id descending (``keys``
    from :func:`tie_keys`, one per score). 1-D, or row by row for 2-D arrays."""
    return np.lexsort((-keys, -scores), axis=-1)


class DenseIndex:
    """An exact inner-product index over unit-normalised float32 document vectors.

    Args:
        docs: (n_docs, d) vectors, any float dtype; renormalised in float32 (C13).
        use_gpu: None picks the GPU when faiss has one; False forces the CPU.
        ids: the documents' ids, which break ties (trec_eval's order: id descending); None: the row
            number stands for the id.

    Raises:
        ValueError: see :func:`unit_float32`; ``ids`` of another length.
    """

    def __init__(self, docs, use_gpu: bool | None = None, ids=None):
        import faiss

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
        scores = np.empty((len(queries), k), dtype=np.float32)
        indices = np.empty((len(queries), k), dtype=np.int64)
        tolerance = 2.0 * self.dim * 2.0**-24  # faiss's float32 dot of unit vectors is off by at most d·u
        pending, depth = np.arange(len(queries)), min(self.n_docs, 2 * k + 16)
        while len(pending):
            index = self._gpu if self._gpu is not None and depth <= _GPU_MAX_K else self._cpu
            rough, found = index.search(queries[pending], depth)
            found = found.astype(np.int64, copy=False)
            exact = self._exact(queries[pending], found)
            order = tie_order(exact, self._keys[found])
            exact, found = np.take_along_axis(exact, order, 1), np.take_along_axis(found, order, 1)
            # complete: nothing faiss left out can reach the k-th score
            done = (depth == self.n_docs) | (rough[:, -1] < exact[:, k - 1] - tolerance)
            scores[pending[done]], indices[pending[done]] = exact[done, :k], found[done, :k]
            pending, depth = pending[~done], min(self.n_docs, 2 * depth)
        return scores, indices

    def _exact(self, queries: np.ndarray, found: np.ndarray) -> np.ndarray:
        """The cosine of each query with each of its candidates, (n, depth) float32 from float64 sums."""
        out = np.empty(found.shape, dtype=np.float32)
        step = max(1, 2**22 // max(1, found.shape[1] * self.dim))  # about 32 MB of float64 at a time
        for start in range(0, len(found), step):
            rows = slice(start, start + step)
            docs = self._docs[found[rows]].astype(np.float64)
            out[rows] = (docs * queries[rows, None, :].astype(np.float64)).sum(-1)
        return out


def search(queries, docs, k: int, use_gpu: bool | None = None, ids=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` inner-product search of unit-normalised ``queries`` against ``docs``.

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
