"""Evaluation: trec_eval metrics, significance, result files and reports (finding documents: :mod:`obliq.search`).

One implementation of each: :func:`obliq.eval.metrics.evaluate_run` is the project's only metric code,
:mod:`obliq.eval.significance` its one statistics path.
"""

from obliq.eval.metrics import DEFAULT_MEASURES, Evaluation, evaluate_run
from obliq.eval.significance import Comparison, compare, sign_flip_test

__all__ = [
    "DEFAULT_MEASURES",
    "Comparison",
    "Evaluation",
    "compare",
    "evaluate_run",
    "sign_flip_test",
]
