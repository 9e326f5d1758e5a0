"""The obliq-ir-mini chain's report (its ``report`` stage, run by ``run.py``): the Table-1-style comparison
of every system on the test side, which source carried each gain, the filter's counts, the dev NDCG@10
curves of the training runs and the step checkpoints, and the stages' timings."""

from __future__ import annotations

import json
from pathlib import Path

from mini_systems import RECIPE, ROOT, RUNS, SYSTEMS, TASKS, slug


def carried(knn_only: dict, synthetic_only: dict, alpha: float = 0.05) -> str:
    """Which source carried a task's gain over the base model, from the two single-source comparisons
    (a report's comparisons, trained − base): a source carried it when its model alone is better than
    base with p < ``alpha`` and a 95% interval above 0."""
    won = [
        name
        for name, c in (("kNN pairs", knn_only), ("synthetic queries", synthetic_only))
        if c["diff"] > 0 and c["ci_low"] > 0 and c["p_value"] < alpha
    ]
    return " and ".join(won) if won else "neither (no single-source model is significantly above base)"


def filter_summary(root: Path = ROOT) -> dict[str, dict]:
    """Per task, the ``synth filter`` report (``<root>/filter/<task>.jsonl.report.json``) of the tasks that have one."""
    out = {}
    for t in TASKS:
        file = root / "filter" / f"{t}.jsonl.report.json"
        if file.is_file():
            out[t] = json.loads(file.read_text())["report"]
    return out


def report(root: Path = ROOT, recipe: Path = RECIPE) -> dict:
    """Write ``<root>/report.md`` / ``.json`` (the comparison report of :mod:`obliq.eval.report`, which
    source carried each gain, the filter's counts per task and reason, the step checkpoints' dev scores)
    and ``<root>/curves.png`` from the chain's evaluation, filter and training folders; returns the JSON.

    A system not evaluated yet (a chain stopped early) is listed as such, and the comparisons that
    need it are left out.

    Raises:
        ValueError: two MiniLM systems that read texts differently (the comparison would not measure the
            training); BM25 or the base model not evaluated.
    """
    from obliq.eval.report import comparison, report_markdown, systems_report, write_systems_report
    from obliq.files import write_text
    from obliq.synth.filter import DROP_REASONS

    folders = {s: root / "eval" / slug(s) for s in SYSTEMS}
    missing = [
        s for s in ("BM25", "MiniLM (base)") if not all((folders[s] / t / "summary.json").is_file() for t in TASKS)
    ]
    if missing:
        raise ValueError(f"{root}/eval: BM25 and the base model must be evaluated first ({', '.join(missing)} is not)")
    pairs = [
        ("mixture", "MiniLM (base)"),
        ("mixture interpolated", "MiniLM (base)"),
        ("mixture interpolated", "mixture"),
        ("kNN only", "MiniLM (base)"),
        ("synthetic only", "MiniLM (base)"),
        ("mixture", "synthetic only"),
        ("mixture", "kNN only"),
    ]
    result = systems_report(
        folders,
        pairs,
        tasks=list(TASKS),
        same_reading=list(SYSTEMS[1:]),
        title="# obliq-ir-mini: test queries of the four tasks",
        notes=["", "The test side of each task's query split, laid out like the OBLIQ-IR paper's Table 1."],
    )
    result["carried"], result["mixture_vs_base"], result["interpolated_vs_base"] = {}, {}, {}
    lines = [report_markdown(result).rstrip(), "", "## Verdicts per task", ""]
    for t in TASKS:
        for system in ("mixture", "mixture interpolated"):
            c = comparison(result, f"{system} − MiniLM (base)", t)
            if c is not None:
                verdict = _verdict(c)
                result["mixture_vs_base" if system == "mixture" else "interpolated_vs_base"][t] = verdict
                lines.append(f"- {t}: the {system} is {verdict} base")
        knn, synthetic = (comparison(result, f"{s} − MiniLM (base)", t) for s in ("kNN only", "synthetic only"))
        if knn is not None and synthetic is not None:
            result["carried"][t] = carried(knn, synthetic)
            lines.append(f"- {t}: the gain over base was carried by: {result['carried'][t]}")
    choice = root / "wise" / "choice.json"
    result["wise"] = json.loads(choice.read_text()) if choice.is_file() else None
    if result["wise"]:
        scores = result["wise"]["dev_ndcg@10"]
        lines += [
            "",
            f"## The mixture interpolated toward base (WiSE-FT): alpha {result['wise']['alpha']:g}, chosen on dev",
            "",
            f"Rule: {result['wise']['rule']} (alpha 0: base MiniLM, 1: the mixture). Dev NDCG@10:",
            "",
            "| alpha | " + " | ".join(TASKS) + " | mean |",
            "|---:|" + "---:|" * (len(TASKS) + 1),
            *(f"| {a} | " + " | ".join(f"{row[t]:.4f}" for t in (*TASKS, "mean")) + " |" for a, row in scores.items()),
        ]
    result["filter"] = filter_summary(root)
    if result["filter"]:
        lines += [
            "",
            "## Synthetic queries: the filter (thresholds from each task's dev queries)",
            "",
            "| task | candidates | kept (documents) | " + " | ".join(DROP_REASONS) + " | BM25 rank dropped ≤ | "
            "MiniLM top-K | leak rate ≤ |",
            "|---|---:|---:|" + "---:|" * (len(DROP_REASONS) + 3),
        ]
        for t, r in result["filter"].items():
            th = r["thresholds"]
            leak = f"{100 * th['leak_rate']:.1f} %" if th["leak_rate"] is not None else "–"
            lines.append(
                f"| {t} | {r['candidates']} | {r['kept']} ({r['documents_kept']} of {r['documents']}) | "
                + " | ".join(str(r["dropped"][k]) for k in DROP_REASONS)
                + f" | {th['bm25_max_rank_dropped']} | {th['dense_top_k'] if th['dense_top_k'] is not None else '–'} | "
                f"{leak} |"
            )
    curves = _curves(root, recipe)
    result["curves"] = curves
    lines += [
        "",
        "## Dev NDCG@10 during training (the RetrievalEvaluation callback) and the step checkpoints",
        "",
        "| run | step | kNN rows seen (expected) | " + " | ".join(TASKS) + " | mean |",
        "|---|---:|---:|" + "---:|" * (len(TASKS) + 1),
    ]
    for run, points in curves.items():
        for p in points:
            mark = " (step checkpoint)" if p["step_checkpoint"] else ""
            lines.append(
                f"| {run} | {p['step']}{mark} | {p['knn_rows']:.0f} | "
                + " | ".join(f"{p['ndcg'].get(t, float('nan')):.4f}" for t in TASKS)
                + f" | {p['ndcg'].get('mean', float('nan')):.4f} |"
            )
    timings_file = root / "timings.json"
    result["timings"] = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    if result["timings"]:
        total = sum(t["seconds"] for t in result["timings"].values())
        lines += [
            "",
            "## Stage timings (`timings.json`: wall time, 1-minute load average before → after)",
            "",
            "| stage | --docs | wall (s) | load | finished |",
            "|---|---:|---:|---|---|",
            *(
                f"| {name} | {t['docs']} | {t['seconds']:.1f} | {t['load_before']:.2f} → {t['load_after']:.2f} | "
                f"{t['finished']} |"
                for name, t in result["timings"].items()
            ),
            f"| **all stages above** | | **{total:.0f}** ({total / 60:.1f} min) | | |",
        ]
    write_systems_report(result, root / "report")
    write_text(root / "report.md", "\n".join(lines) + "\n")
    _plot(curves, root / "curves.png")
    print("\n".join(lines))
    return result


def _verdict(c: dict) -> str:
    """A trained − base comparison in words: significantly above or below base (95% interval clear of 0 and
    p < .05), or neither."""
    if c["ci_low"] > 0 and c["p_value"] < 0.05:
        return "significantly ABOVE"
    if c["ci_high"] < 0 and c["p_value"] < 0.05:
        return "significantly BELOW"
    return "not significantly different from"


def _curves(root: Path, recipe: Path = RECIPE) -> dict[str, list[dict]]:
    """Per training run (the newest version of its ``run_dir``, the recipe's work folder taken as ``root``):
    the dev NDCG@10 the callback logged (CSV logger's ``metrics.csv``) per step, the kNN rows the run had
    seen by then (expected: step × batch × the share of the source named ``knn`` in an epoch) and whether a
    step checkpoint was written there."""
    import csv

    from obliq.recipes import recipe_config
    from obliq.runs import latest_run

    out = {}
    for name, ablation in RUNS.items():
        run = latest_run(recipe_config(recipe, *([ablation] if ablation else []), work_dir=str(root))["run_dir"])
        saved, metrics = (sorted(run.path.rglob(n)) if run is not None else [] for n in ("config.yaml", "metrics.csv"))
        if not saved or not metrics:
            continue
        cfg = recipe_config(saved[-1])  # the run's own resolved settings (LoggedConfig, in the logger's folder)
        batch, sources = cfg["data"]["batch_size"], cfg["data"]["sources"]
        sizes = [s.get("count") or sum(1 for f in sorted(Path().glob(s["path"])) for _ in f.open()) for s in sources]
        share = sum(n for s, n in zip(sources, sizes) if s.get("name") == "knn") / max(sum(sizes), 1)
        checkpoint_steps = {
            s
            for c in cfg["trainer"]["callbacks"]
            if c["class_path"].endswith("StepCheckpoints")
            for s in c["init_args"]["steps"]
        }
        points: dict[int, dict] = {}
        with metrics[-1].open() as f:
            for row in csv.DictReader(f):
                for key, value in row.items():
                    if key.startswith("eval/") and key.endswith("/NDCG@10") and value not in ("", None):
                        step = int(row["step"])
                        task = key.split("/")[1].removesuffix("-dev")  # the callback's name of a dev side
                        point = points.setdefault(
                            step,
                            {
                                "step": step,
                                "knn_rows": step * batch * share,
                                "step_checkpoint": step in checkpoint_steps,
                                "ndcg": {},
                            },
                        )
                        point["ndcg"][task] = float(value)
        out[name] = [points[s] for s in sorted(points)]
    return out


def _plot(curves: dict[str, list[dict]], path: Path) -> None:
    """One panel per task (and the mean): dev NDCG@10 against the step, one line per run, step checkpoints marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [*TASKS, "mean"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, task in zip(axes[0], panels):
        for run, points in curves.items():
            xs = [p["step"] for p in points if task in p["ndcg"]]
            ys = [p["ndcg"][task] for p in points if task in p["ndcg"]]
            line = ax.plot(xs, ys, marker="o", label=run)[0]
            dose = [(p["step"], p["ndcg"][task]) for p in points if p["step_checkpoint"] and task in p["ndcg"]]
            if dose:
                ax.scatter(*zip(*dose), s=90, facecolors="none", edgecolors=line.get_color())
        ax.set(title=task, xlabel="step", ylabel="dev NDCG@10")
        ax.grid(alpha=0.3)
    if curves:
        axes[0][0].legend(fontsize="small", title="open circles: step checkpoints", title_fontsize="x-small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
