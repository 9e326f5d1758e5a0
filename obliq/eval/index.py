"""Exact nearest-neighbour search by inner product over unit vectors: obliq's one search.

Every caller (evaluation, the training callback, kNN-graph distillation) searches through this
module. Vectors are cast to float32 and L2-renormalised before indexing (C13): an inner-product
index over vectors that are not unit length ranks by length as much as by direction, and vectors
stored in bf16 come back off unit length by up to ~2e-3. So the score is the cosine similarity.

The index is faiss's exact ``IndexFlatIP`` (Johnson et al., 2019), on the GPU when faiss was built
with CUDA and a GPU is visible, on the CPU otherwise.
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


class DenseIndex:
    """An exact inner-product index over unit-normalised float32 document vectors.

    Args:
        docs: (n_docs, d) vectors, any float dtype; renormalised in float32 (C13).
        use_gpu: None picks the GPU when faiss has one; False forces the CPU.

    Raises:
        ValueError: see :func:`unit_float32`.
    """

    def __init__(self, docs, use_gpu: bool | None = None):
        import faiss

        docs = unit_float32(docs, "docs")
        self.n_docs, self.dim = docs.shape
        self._cpu = faiss.IndexFlatIP(self.dim)
        self._cpu.add(docs)
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
        """The ``k`` most similar documents of each query, best first.

        Args:
            queries: (n_queries, d) vectors, any float dtype; renormalised in float32.
            k: neighbours wanted; more than ``n_docs`` returns all ``n_docs`` (no -1 padding).

        Returns:
            ``(scores, indices)``: (n_queries, min(k, n_docs)) float32 cosine similarities in
            descending order and int64 row indices into ``docs``.

        Raises:
            ValueError: bad vectors, a dimension mismatch, or ``k < 1``.
        """
        queries = unit_float32(queries, "queries")
        if queries.shape[1] != self.dim:
            raise ValueError(f"queries have dimension {queries.shape[1]}, docs {self.dim}")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        k = min(k, self.n_docs)
        index = self._gpu if self._gpu is not None and k <= _GPU_MAX_K else self._cpu
        scores, indices = index.search(queries, k)
        return scores, indices.astype(np.int64, copy=False)


def search(queries, docs, k: int, use_gpu: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` inner-product search of unit-normalised ``queries`` against ``docs``.

    Args:
        queries: (n_queries, d) vectors; docs: (n_docs, d) vectors; any float dtype, renormalised
            in float32 (C13).
        k: neighbours per query; capped at ``n_docs``.
        use_gpu: None uses the GPU when faiss has one.

    Returns:
        ``(scores, indices)`` of shape (n_queries, min(k, n_docs)): float32 cosine similarities,
        descending, and int64 document rows.

    Raises:
        ValueError: see :class:`DenseIndex`.
    """
    return DenseIndex(docs, use_gpu=use_gpu).search(queries, k)
