"""How a model retrieves a task: the settings every evaluating command shares (``--retrieval.*``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from obliq.files import cache_dir
from obliq.model.tokenizer import PASSAGE_MAX_LENGTH, QUERY_MAX_LENGTH
from obliq.search.bm25 import BM25_STEMMER, K1, B
from obliq.search.encoders import EncoderKind
from obliq.search.faiss_index import IndexSpec
from obliq.windows import Windows


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
        cache: keep corpus embeddings on disk (a store, :mod:`obliq.search.store`), keyed by the model's
            files and the corpus; the store ``obliq encode`` wrote is read from here.
        cache_dir: where; default ``$OBLIQ_CACHE/embeddings`` (``~/.cache/obliq/embeddings``).
        index: how the corpus is searched (:class:`obliq.search.faiss_index.IndexSpec`): ``flat`` (exact),
            ``hnsw``, ``hnsw-int8``, ``ivf-flat``, ``ivf-pq``, ``int8`` (8-bit scalar quantization),
            ``binary`` (sign bits, Hamming), or a faiss factory string (``HNSW32,Flat``, ``IVF4096,PQ96``,
            ``SQ8``; ``BHNSW32`` over sign bits). An index is saved beside the cached embeddings and reused.
        nprobe: inverted lists visited per query (IVF indexes).
        ef_search: HNSW candidate list while searching (at least top_k is used).
        ef_construction: HNSW candidate list while building.
        rescore: 0, or rescore the top ``rescore × top_k`` candidates of an approximate or quantized
            index with the float32 embeddings (sentence-transformers' ``rescore_multiplier``).
        train_size: embeddings sampled (seeded) to train IVF centroids, PQ codebooks and int8 ranges.
        dim: evaluate the first ``dim`` components of each embedding, re-normalised (Matryoshka);
            null: all of them.
        threads: faiss's CPU threads (null: faiss's default, ``OMP_NUM_THREADS``).
        bm25_k1: BM25 term-frequency saturation (Anserini's default 0.9).
        bm25_b: BM25 length normalisation (Anserini's default 0.4).
        bm25_stemmer: PyStemmer language for BM25, or null for unstemmed tokens.
        trust_remote_code: let the model run its own code (only for models you trust).
        windows: read long texts in token windows (:class:`obliq.windows.Windows`: ``size``, ``stride``,
            ``reduce`` ``mean`` or ``maxsim``, ``queries``); null: the model's own (an obliq encoder trained with
            windows keeps them), else texts are cut at the max lengths. ``obliq`` encoders only; ``maxsim`` is
            searched exactly, never cached (:func:`obliq.search.maxsim.maxsim_search`).
    """

    encoder: EncoderKind = "auto"
    top_k: int = 1000
    batch_size: int = 32
    query_max_length: int = QUERY_MAX_LENGTH
    passage_max_length: int = PASSAGE_MAX_LENGTH
    cache: bool = True
    cache_dir: Path | None = None
    index: str = IndexSpec.index  # the index settings' defaults are IndexSpec's
    nprobe: int = IndexSpec.nprobe
    ef_search: int = IndexSpec.ef_search
    ef_construction: int = IndexSpec.ef_construction
    rescore: int = IndexSpec.rescore
    train_size: int = IndexSpec.train_size
    dim: int | None = None
    threads: int | None = None
    bm25_k1: float = K1
    bm25_b: float = B
    bm25_stemmer: str | None = BM25_STEMMER
    trust_remote_code: bool = False
    windows: Windows | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "windows", Windows.of(self.windows, "retrieval.windows"))
        for key in ("top_k", "batch_size", "query_max_length", "passage_max_length"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"retrieval.{key}: must be an integer >= 1, got {value!r}")
        for key, high in (("bm25_k1", 1e6), ("bm25_b", 1.0)):  # Robertson's k1 >= 0, b in [0, 1]
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
                raise ValueError(f"retrieval.{key}: must be a number in [0, {high:g}], got {value!r}")
        for key in ("dim", "threads"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"retrieval.{key}: must be an integer >= 1 or null, got {value!r}")
        self.index_spec()  # its own checks

    def index_spec(self) -> IndexSpec:
        """The search part of these settings.

        Raises:
            ValueError: a bad index setting (named ``retrieval.<key>``).
        """
        return IndexSpec(
            index=self.index,
            nprobe=self.nprobe,
            ef_search=self.ef_search,
            ef_construction=self.ef_construction,
            rescore=self.rescore,
            train_size=self.train_size,
        )

    def store_root(self) -> Path:
        """Where corpus stores live: ``cache_dir``, or ``$OBLIQ_CACHE/embeddings``."""
        return Path(self.cache_dir) if self.cache_dir is not None else cache_dir() / "embeddings"
