"""Evaluation: retrieval, exact search, BM25, trec_eval metrics, significance, result files (tasks: :mod:`obliq.tasks`).

One implementation of each: :mod:`obliq.eval.index` is the project's only vector search (exact and
faiss indexes), :mod:`obliq.eval.store` its one format of corpus embeddings on disk,
:class:`obliq.eval.bm25.BM25` its only BM25, :func:`obliq.eval.metrics.evaluate_run` its only metric code.
"""

from obliq.eval.bm25 import BM25
from obliq.eval.index import DenseIndex, search, unit_float32
from obliq.eval.metrics import DEFAULT_MEASURES, Evaluation, evaluate_run, read_run, write_run
from obliq.eval.significance import Comparison, compare, sign_flip_test

__all__ = [
    "BM25",
    "DEFAULT_MEASURES",
    "Comparison",
    "DenseIndex",
    "Evaluation",
    "compare",
    "evaluate_run",
    "read_run",
    "search",
    "sign_flip_test",
    "unit_float32",
    "write_run",
]
