"""Evaluation: trec_eval metrics, significance, result files and reports (finding documents: :mod:`obliq.search`).

One implementation of each: :func:`obliq.eval.metrics.evaluate_run` is the project's only metric code,
:mod:`obliq.eval.significance` its one statistics path.
"""

from obliq.eval.metrics import DEFAULT_MEASURES, Evaluation, evaluate_run

__all__ = [
    "DEFAULT_MEASURES",
    "Comparison",
    "Evaluation",
    "compare",
    "evaluate_run",
    "sign_flip_test",
]

_SIGNIFICANCE = {"Comparison", "compare", "sign_flip_test"}


def __getattr__(name: str):
    """Import the statistics (and scipy, ~1 s) only when they are asked for: a command that writes or
    scores runs (``obliq encode``, ``obliq evaluate``) stays light."""
    if name in _SIGNIFICANCE:
        from obliq.eval import significance

        return getattr(significance, name)
    raise AttributeError(f"module 'obliq.eval' has no attribute {name!r}")
