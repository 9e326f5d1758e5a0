"""Approximate and quantized vector search through faiss indexes (:class:`VectorIndex` with an
:class:`IndexSpec`); exact search is :class:`obliq.search.exact.ExactIndex`, which a flat spec uses.

Any faiss index factory string over the float vectors (``HNSW32,Flat``, ``IVF1024,Flat``,
``IVF1024,PQ24``, ``SQ8``, ``HNSW32,SQ8`` …; Malkov & Yashunin 2018, Jégou et al. 2011), or over their
sign bits (``BFlat``, ``BHNSW32``, ``BIVF1024``: binary embeddings, Hamming distance), with optional
rescoring of ``rescore × k`` candidates by the float32 vectors read back from disk
(sentence-transformers' quantization recipe, ``semantic_search_faiss``; it rescores against the
quantized codes it keeps, obliq against the full-precision vectors it keeps on disk). An index is
trained on a seeded sample, saved beside the embeddings and memory-mapped when reused
(``IO_FLAG_MMAP_IFC``: read-only, never added to). ``int8`` is faiss's 8-bit scalar quantizer, whose
per-dimension min/max ranges are sentence-transformers' int8 calibration. What an index finds is
ordered by :func:`obliq.search.exact.ranked` (trec_eval's order) before the cut;
:func:`recall_vs_exact` is the share of exact search's top-k it found.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from obliq.files import publish
from obliq.search.exact import Corpus, ExactIndex, _cosines, _faiss, ranked

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class IndexSpec:
    """How to search a corpus (:class:`obliq.search.settings.RetrievalSettings` carries the same fields).

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
        self.index, self.labels, self._exact = None, None, None
        self.info: dict = {"index": spec.index, "dim": corpus.dim, "full_dim": corpus.full_dim, "n_docs": corpus.n}
        if spec.exact:
            self.info.update(factory="Flat", exact=True)
            self._exact = ExactIndex(corpus, use_gpu=use_gpu)
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
            return self._exact.search(queries, k)
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
