"""What the obliq-ir-mini chain compares and where it writes: its four tasks, the systems of its table, the
training runs that make them, and the recipe's work folder (a part of ``run.py``, which imports it; so
does ``mini_report.py``)."""

from __future__ import annotations

from pathlib import Path

TASKS = ("stance-tweets", "math-theoremqa", "writing-news", "hearings-exchanges")
RECIPE = Path("configs/obliq-ir-mini.yaml")
SYSTEMS = ("BM25", "MiniLM (base)", "mixture", "mixture interpolated", "kNN only", "synthetic only")
"""The table's rows, in order (the paper's Table 1 lists baselines first, then its models)."""
RUNS = {
    "mixture": None,
    "kNN only": Path("configs/ablations/obliq-ir-mini-knn-only.yaml"),
    "synthetic only": Path("configs/ablations/obliq-ir-mini-synthetic-only.yaml"),
}
"""training run → the ablation recipe stacked on the recipe (None: the recipe's mixture)."""


def work_dir(recipe: Path = RECIPE) -> Path:
    """The recipe's one folder (``work_dir``, relative to the repository root the chain runs in)."""
    from obliq.recipes import recipe_config

    return Path(recipe_config(Path(__file__).resolve().parents[2] / recipe)["work_dir"])


ROOT = work_dir()
"""Where the chain writes: configs/obliq-ir-mini.yaml's ``work_dir``."""


def slug(name: str) -> str:
    """A system's folder name (``kNN only`` → ``knn-only``)."""
    return name.lower().replace(" ", "-").replace("(", "").replace(")", "")
