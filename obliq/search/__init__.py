"""Finding documents: vector search, the embedding store, BM25, encoders and teachers, the retriever
dispatch, and TREC runs (scoring them is :mod:`obliq.eval`).

One implementation of each: :class:`obliq.search.exact.ExactIndex` is the project's only exact vector
search and :func:`obliq.search.exact.ranked` its one rule of ranking order (faiss indexes:
:mod:`obliq.search.faiss_index`), :mod:`obliq.search.store` its one format of corpus embeddings on disk,
:class:`obliq.search.bm25.BM25` its only BM25, :func:`obliq.search.retrieval.make_retriever` its one
dispatch from a model to a retriever.
"""

from obliq.search.bm25 import BM25
from obliq.search.exact import Corpus, ExactIndex, unit_float32
from obliq.search.runs import Run, read_run, write_run

__all__ = ["BM25", "Corpus", "ExactIndex", "Run", "read_run", "unit_float32", "write_run"]
