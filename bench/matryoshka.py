"""A Matryoshka-trained student against its plain twin: NDCG@10 at the full, 1/2, 1/4 and 1/8 dimension.

Both students train the same recipe (default ``configs/writing-cpu.yaml``: all-MiniLM-L6-v2 + LoRA on
writing-news's kNN pairs, one epoch on 2 CPU cores) from the same seed and data order; the Matryoshka
twin wraps the recipe's loss in ``obliq.losses.Matryoshka`` with ``dims: [d, d/2, d/4, d/8]`` (the loss at each
truncated, re-normalised dimension, summed with weight 1: :func:`obliq.losses.matryoshka`). Base MiniLM is
evaluated beside them.

Every system is evaluated by ``obliq evaluate`` on the tasks' test queries at each dimension
(``--retrieval.dim``: the first components, re-normalised), exact search; the corpus is encoded once
per model and task (its store serves every dimension). The comparison report
(:mod:`obliq.eval.report`) gives, per task, each dimension's NDCG@10, Matryoshka − plain at each
dimension and each system's truncated − full, as paired differences with a bootstrap interval and a
sign-flip p-value (method and n stated). The retention table gives NDCG@10 at d / 2^i as a share of
the same system's full-dimension NDCG@10.

The recipe's kNN pairs must exist (the commands are in the recipe's header). Full size::

    python bench/matryoshka.py --recipe configs/writing-cpu.yaml --tasks ../shared/data/tasks/writing-news \\
        ../shared/data/tasks/math-theoremqa ../shared/data/tasks/health-dialect

Writes ``<out>/report.md``, ``report.json`` and ``results.json`` (default ``runs/bench/matryoshka``); a
rerun reuses trained students and evaluations. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from obliq.eval.results import made_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DATA = Path(os.environ.get("OBLIQ_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "tasks"


def full_dimension(recipe: str) -> int:
    """The recipe's backbone's hidden size (the embedding size: mean pooling)."""
    from transformers import AutoConfig

    from obliq.aliases import resolve_model
    from obliq.recipes import recipe_config

    backbone = recipe_config(recipe)["model"]["encoder"]["init_args"]["backbone"]
    return int(AutoConfig.from_pretrained(resolve_model(backbone)).hidden_size)


def matryoshka_loss(recipe: str, dims: list[int]) -> dict:
    """The recipe's loss (its ``model.loss``; InfoNCE by default) at ``dims``, as a config."""
    from obliq.recipes import recipe_config

    loss = recipe_config(recipe)["model"].get("loss") or {"class_path": "obliq.losses.InfoNCE"}
    return {"class_path": "obliq.losses.Matryoshka", "init_args": {"loss": loss, "dims": dims}}


def train(recipe: str, out: Path, extra: list[str]) -> str:
    """Train the recipe (with ``extra`` overrides) and export its adapter; reused when already exported."""
    from obliq.commands.train import fit_and_export

    adapter = out / "export" / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        fit_and_export(
            ["fit", "--config", recipe, f"--run_dir={out / 'train'}", *extra], out / "export", overwrite=True
        )
    return str(adapter)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="configs/writing-cpu.yaml")
    parser.add_argument(
        "--tasks", nargs="+", default=[str(DATA / t) for t in ("writing-news", "math-theoremqa", "health-dialect")]
    )
    parser.add_argument("--tokens", type=int, default=256, help="query and passage tokens at evaluation")
    parser.add_argument("--out", default="runs/bench/matryoshka")
    args = parser.parse_args(argv)

    from obliq.commands.evaluate import evaluate
    from obliq.eval.report import report_markdown, systems_report, write_systems_report
    from obliq.search.settings import RetrievalSettings

    out = Path(args.out)
    full = full_dimension(args.recipe)
    dims = [full, full // 2, full // 4, full // 8]
    models = {
        "MiniLM (base)": "minilm",
        "plain": train(args.recipe, out / "plain", []),
        "Matryoshka": train(
            args.recipe, out / "matryoshka", [f"--model.loss={json.dumps(matryoshka_loss(args.recipe, dims))}"]
        ),
    }
    systems = {}
    for name, model in models.items():
        for d in dims:
            folder = out / "eval" / f"{name.split()[0].lower()}-{d}"
            systems[f"{name} @{d}"] = folder
            if not list(folder.glob("*/summary.json")):
                settings = RetrievalSettings(
                    query_max_length=args.tokens,
                    passage_max_length=args.tokens,
                    dim=None if d == full else d,
                    cache_dir=out / "cache",
                )
                evaluate(
                    model, args.tasks, folder, settings, ["NDCG@10", "Recall@100"], latency_queries=0, overwrite=True
                )
    pairs = [(f"Matryoshka @{d}", f"plain @{d}", f"Matryoshka − plain @{d}") for d in dims]
    pairs += [(f"{n} @{d}", f"{n} @{full}", f"{n} @{d} − @{full}") for n in models for d in dims[1:]]
    report = systems_report(
        systems,
        pairs,
        title=f"Matryoshka vs plain twin ({Path(args.recipe).name}), NDCG@10 at dimensions {dims}",
        notes=[f"exact search; the first d components re-normalised; {args.tokens} tokens per query and passage"],
        same_reading=[f"{n} @{d}" for n in ("plain", "Matryoshka") for d in dims],
    )
    write_systems_report(report, out / "report")

    names = list(report["tasks"])
    lines = [
        "",
        "NDCG@10 (test queries) at each dimension, and as a share of the same system's full dimension:",
        "",
        "| system | task | queries | " + " | ".join([f"@{d}" for d in dims] + [f"% @{d}" for d in dims[1:]]) + " |",
        "|---|---|---:|" + "---:|" * (2 * len(dims) - 1),
    ]
    retention = {}
    for name in models:
        for task in names:
            values = [report["systems"][f"{name} @{d}"]["metrics"][task]["NDCG@10"] for d in dims]
            shares = [v / values[0] if values[0] else float("nan") for v in values[1:]]
            retention[f"{name}|{task}"] = dict(zip(dims, values)) | {f"share@{d}": s for d, s in zip(dims[1:], shares)}
            lines.append(
                f"| {name} | {task} | {report['tasks'][task]['n_queries']} | "
                + " | ".join(f"{v:.4f}" for v in values)
                + " | "
                + " | ".join(f"{100 * s:.1f}" for s in shares)
                + " |"
            )
    kept = [t for t in names if retention[f"Matryoshka|{t}"][f"share@{dims[2]}"] >= 0.97]
    at_full = [c for c in report["comparisons"] if c["label"] == f"Matryoshka − plain @{full}"]
    lines += [
        "",
        f"Matryoshka @{dims[2]} (1/4) keeps ≥ 97 % of its full-dimension NDCG@10 on {len(kept)} of {len(names)} tasks"
        f"{': ' + ', '.join(kept) if kept else ''} (goal: ≥ 2).",
        "At the full dimension, Matryoshka − plain: " + "; ".join(f"{c['task']}: {c['text']}" for c in at_full),
    ]
    print(report_markdown(report) + "\n".join(lines))
    (out / "results.json").write_text(json.dumps({"dims": dims, "retention": retention, "report": report}, indent=1))


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
