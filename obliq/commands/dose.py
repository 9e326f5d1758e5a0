"""The dose sweep: train one recipe at several kNN doses and read NDCG@10 per task against the dose
(the OBLIQ-IR paper §5 and Figure 2 right: more kNN pairs lift Writing and, past a point, hurt the
other tasks).
"""

from __future__ import annotations

import json
from pathlib import Path

from obliq.claims import claim_outputs
from obliq.search.settings import RetrievalSettings


def dose_sweep(
    recipe: Path,
    doses: list[int],
    tasks: list[str],
    out: Path = Path("runs/dose-sweep"),
    source: str = "knn",
    max_steps: int | None = None,
    retrieval: RetrievalSettings = RetrievalSettings(cache=False),
    overwrite: bool = False,
) -> dict:
    """Train ``recipe`` once per dose of its kNN source and evaluate each model on ``tasks``.

    Each dose is one ``train.py fit`` of the recipe with ``--run_dir=<out>/dose-<n>`` (the recipe
    derives its checkpoint and log folders from ``${run_dir}``) and the named source's ``count`` set to
    the dose (the one dose mechanism, :mod:`obliq.data.mixture`); the final weights are exported to
    ``dose-<n>/model`` and evaluated like ``evaluate`` does. Every dose, the untrained dose 0 included,
    is the recipe's encoder (its prefixes and the retrieval settings' lengths): one reading policy,
    checked and stated with the table. What is held fixed is stated too: with ``max_steps`` (given here
    or in the recipe) every dose trains the same number of rows, so the dose changes only their
    diversity; without it, each dose trains one epoch of its own rows, as the paper's dose is rows per
    epoch. Each dose is compared with the first (paired, per task: :mod:`obliq.eval.report`).

    Args:
        recipe: a ``train.py`` config (YAML).
        doses: kNN rows per epoch to train with (e.g. ``[0, 1000, 5000, 10000]``); 0 drops the source
            (and, when it is the only source, evaluates the untrained encoder).
        tasks: task folders (or folders of task folders) to evaluate on.
        out: output folder: ``dose-<n>/`` per run, ``dose_sweep.md`` / ``.json`` (the comparison report)
            and ``dose_sweep.png``.
        source: the name of the dosed source in ``data.sources`` (``name: knn``).
        max_steps: override the recipe's steps (the same for every dose).
        retrieval: how each model retrieves (as ``evaluate``'s ``--retrieval``).
        overwrite: replace an earlier sweep in ``out`` (refused otherwise).

    Returns:
        ``{"doses": [...], "ndcg@10": {task: [value per dose]}, "report": the comparison report}``.

    Raises:
        ValueError: a negative dose, or no source of that name.
        FileExistsError: ``out`` holds an earlier sweep and ``overwrite`` is false.
    """
    from obliq.commands.train import fit_and_export
    from obliq.data import named_source
    from obliq.eval.report import report_markdown, systems_report, write_systems_report
    from obliq.eval.results import evaluate_tasks
    from obliq.model.encoder import BiEncoder
    from obliq.recipes import recipe_config
    from obliq.search.retrieval import make_retriever
    from obliq.tasks import find_tasks, load_task

    if any(d < 0 for d in doses):
        raise ValueError(f"doses must be >= 0, got {doses}")
    if not doses:
        raise ValueError("no dose to train")
    base = recipe_config(recipe)
    steps = max_steps or (base.get("trainer") or {}).get("max_steps") or -1
    held = (
        f"every dose trains {steps} steps of {base['data'].get('batch_size', 32)} rows: the same rows seen, the "
        "dose changes only their diversity"
        if steps > 0
        else "each dose trains one epoch of its own rows (the paper's dose: rows per epoch): larger doses train longer"
    )
    index = named_source(base["data"]["sources"], source, recipe)
    loaded = [load_task(p) for p in find_tasks(tasks)]
    with claim_outputs(
        {"out": out},
        command="dose-sweep",
        inputs=[recipe, *find_tasks(tasks)],
        overwrite=overwrite,
        what="a dose sweep",
        folders=["out"],
    ) as claimed:
        out = claimed["out"]
        systems = {}
        for dose in doses:
            folder = out / f"dose-{dose}"
            sources = [dict(s) for s in base["data"]["sources"]]
            if dose == 0:
                sources.pop(index)
            else:
                sources[index]["count"] = dose
            if sources:
                args = ["fit", "--config", str(recipe), f"--run_dir={folder}", "--data.sources=" + json.dumps(sources)]
                args += [f"--trainer.max_steps={max_steps}"] if max_steps else []
                encoder = str(fit_and_export(args, folder / "model", overwrite=True).adapter)
            else:  # nothing left to train on: the recipe's encoder as it starts
                init = {k: v for k, v in base["model"]["encoder"].get("init_args", {}).items() if k != "lora"}
                encoder = BiEncoder(**init).eval()
            evaluate_tasks(
                make_retriever(encoder, retrieval), loaded, folder / "eval", f"dose-{dose}", ["NDCG@10", "Recall@100"]
            )
            systems[f"dose {dose}"] = folder / "eval"
        first = f"dose {doses[0]}"
        report = systems_report(
            systems,
            [(name, first) for name in systems if name != first],
            title=f"Dose sweep of {recipe} (source {source!r}): {held}.",
            tasks=[t.name for t in loaded],
            same_reading=list(systems),
        )
        write_systems_report(report, out / "dose_sweep")
        table = {t.name: [report["systems"][f"dose {d}"]["metrics"][t.name]["NDCG@10"] for d in doses] for t in loaded}
        result = {"recipe": str(recipe), "doses": list(doses), "ndcg@10": table, "held_fixed": held, "report": report}
        _plot(result, out / "dose_sweep.png")
        print(report_markdown(report))
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
