"""The dose sweep: train one recipe at several kNN doses and read NDCG@10 per task against the dose
(the OBLIQ-IR paper §5 and Figure 2 right: more kNN pairs lift Writing and, past a point, hurt the
other tasks).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml


def _relocate(trainer: dict, folder: Path) -> None:
    """Point every output of a trainer config (root dir, logger, checkpoint folders) into ``folder``."""
    trainer["default_root_dir"] = str(folder)
    loggers = trainer.get("logger")
    for item in loggers if isinstance(loggers, list) else [loggers]:
        if isinstance(item, dict) and "save_dir" in item.get("init_args", {}):
            item["init_args"]["save_dir"] = str(folder)
    for item in trainer.get("callbacks") or []:
        if isinstance(item, dict) and "dirpath" in item.get("init_args", {}):
            item["init_args"]["dirpath"] = str(folder / "checkpoints")


def dose_sweep(
    recipe: Path,
    doses: list[int],
    tasks: list[str],
    out: Path = Path("runs/dose-sweep"),
    source: int = -1,
    max_steps: int | None = None,
    batch_size: int = 32,
) -> dict:
    """Train ``recipe`` once per dose of its kNN source and evaluate each model on ``tasks``.

    Args:
        recipe: a ``train.py`` config (YAML).
        doses: kNN rows per epoch to train with (e.g. ``[0, 1000, 5000, 10000]``); 0 drops the source
            (and, when it is the only source, evaluates the untrained encoder).
        tasks: task folders (or folders of task folders) to evaluate on.
        out: output folder: ``dose-<n>/`` per run, ``dose_sweep.md``, ``dose_sweep.json`` and
            ``dose_sweep.png``.
        source: index of the kNN source in ``data.sources``.
        max_steps: override the recipe's steps (the same for every dose).
        batch_size: texts per forward pass when evaluating.

    Returns:
        ``{"doses": [...], "ndcg@10": {task: [value per dose]}}``.

    Raises:
        ValueError: a negative dose, or a source index out of range.
    """
    from obliq.eval.encoders import load_encoder
    from obliq.eval.evaluate import evaluate_tasks, find_tasks, retrieve_dense
    from obliq.eval.tasks import load_task
    from obliq.export import export
    from obliq.model.encoder import BiEncoder
    from obliq.trainer import cli

    if any(d < 0 for d in doses):
        raise ValueError(f"doses must be >= 0, got {doses}")
    base = yaml.safe_load(Path(recipe).read_text())
    n_sources = len(base["data"]["sources"])
    if not -n_sources <= source < n_sources:
        raise ValueError(f"source {source} out of range: {recipe} has {n_sources} data sources")
    loaded = [load_task(p) for p in find_tasks(tasks)]
    out = Path(out)
    table: dict[str, list[float]] = {t.name: [] for t in loaded}
    for dose in doses:
        folder = out / f"dose-{dose}"
        cfg = copy.deepcopy(base)
        sources = cfg["data"]["sources"]
        if dose == 0:
            sources.pop(source)
        else:
            sources[source] = {"path": sources[source]["path"], "count": dose}
        if max_steps:
            cfg["trainer"]["max_steps"] = max_steps
        _relocate(cfg["trainer"], folder)
        folder.mkdir(parents=True, exist_ok=True)
        if sources:
            (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
            run = cli(["fit", "--config", str(folder / "config.yaml")])
            run.trainer.save_checkpoint(folder / "final.ckpt")
            export(folder / "final.ckpt", folder / "model")
            encoder = load_encoder(str(folder / "model" / "adapter"))
        else:  # nothing left to train on: the recipe's encoder as it starts
            args = {k: v for k, v in cfg["model"]["encoder"].get("init_args", {}).items() if k != "lora"}
            encoder = BiEncoder(**args).eval()
        summaries = evaluate_tasks(
            lambda t: retrieve_dense(encoder, t, batch_size=batch_size, latency_queries=0),
            loaded, folder / "eval", f"dose-{dose}", ["NDCG@10", "Recall@100"],
        )
        for s in summaries:
            table[s["task"]].append(s["metrics"]["NDCG@10"])
    result = {"recipe": str(recipe), "doses": list(doses), "ndcg@10": table}
    (out / "dose_sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| dose | " + " | ".join(table) + " |", "|---:|" + "---:|" * len(table)]
    for i, dose in enumerate(doses):
        lines.append(f"| {dose} | " + " | ".join(f"{table[t][i]:.4f}" for t in table) + " |")
    (out / "dose_sweep.md").write_text("\n".join(lines) + "\n")
    _plot(result, out / "dose_sweep.png")
    print("\n".join(lines))
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for task, values in result["ndcg@10"].items():
        ax.plot(result["doses"], values, marker="o", label=task)
    ax.set(xlabel="kNN pairs (dose)", ylabel="NDCG@10", title="Dose response")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
