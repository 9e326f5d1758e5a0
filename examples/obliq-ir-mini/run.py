"""The OBLIQ-IR recipe in miniature on a CPU: one chain of obliq commands (examples/obliq-ir-mini/README.md).

    python examples/obliq-ir-mini/run.py --docs 24          # from the repository root
    python examples/obliq-ir-mini/run.py --docs 24 --dry_run   # print the commands only

Stages, in order; each runs existing commands (printed before they run) and is skipped when its
outputs are complete, so a killed chain resumes where it stopped:

1. ``split-<task>``: ``obliq task split`` gives each of the four tasks a development side (the
   training callback's) and a test side (the final table's), under ``runs/obliq-ir-mini/tasks``.
2. ``synth-<task>``: ``obliq synth generate`` with ``configs/synth/<task>.yaml`` (its lens, prompts,
   budgets) on a seeded sample of ``--docs`` documents, as two shards side by side (one core each),
   joined by ``obliq synth merge``; then ``obliq synth audit`` (saved as text). Generation resumes by
   itself; the stage is complete when both shards' reports cover their whole share of the sample.
3. ``negatives-<task>``: ``obliq negatives mine`` (4 BM25 hard negatives per synthetic row).
4. ``knn``: ``obliq distill graph`` (stylometric teacher, k = 3) and ``obliq distill pairs`` on writing-news.
5. ``train-<run>``: ``python train.py fit --config configs/obliq-ir-mini.yaml`` for the mixture and
   the two single-source ablations (``--data.sources``), each then ``obliq export``-ed; a killed run
   resumes from its ``last.ckpt``.
6. ``eval-<system>``: ``obliq evaluate`` of BM25, base MiniLM and the three trained models on the
   test side of the four tasks.
7. ``report``: the Table-1-style table with paired significance per task (:mod:`obliq.eval.significance`),
   the per-task dev NDCG@10 curves of the training callback (PNG) and the dose checkpoints' scores.

Every stage's wall time and the load average before and after it go to ``runs/obliq-ir-mini/timings.json``.
A stage whose outputs exist but are older than its inputs (e.g. after a larger ``--docs``) is refused
unless ``--overwrite`` is given, which is passed on to the commands that would replace them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("runs/obliq-ir-mini")
"""Where the chain writes; configs/obliq-ir-mini.yaml reads its rows and dev tasks from here."""
TASKS = ("stance-tweets", "math-theoremqa", "writing-news", "hearings-exchanges")
RECIPE = Path("configs/obliq-ir-mini.yaml")
KNN_TASK = "writing-news"
SHARDS = 2
"""Generation shards run side by side, one CPU thread each (configs/synth/*.yaml ``backend.threads: 1``): both cores."""
SYSTEMS = ("BM25", "MiniLM (base)", "mixture", "kNN only", "synthetic only")
"""The table's rows, in order (the paper's Table 1 lists baselines first, then its models)."""
RUNS = {"mixture": None, "kNN only": "knn", "synthetic only": "synthetic"}
"""training run → the only source it keeps (None: the recipe's mixture)."""


def slug(name: str) -> str:
    """A system's folder name (``kNN only`` → ``knn-only``)."""
    return name.lower().replace(" ", "-").replace("(", "").replace(")", "")


@dataclass
class Stage:
    """One step of the chain: its commands, and the files that say whether it is done.

    Attributes:
        name: the stage's name (timings, log lines).
        commands: argv lists run in order (``stdout`` of the last one saved to ``stdout`` when set).
        inputs: files whose change makes the outputs stale.
        outputs: files the stage writes; done when all exist and none is older than an input.
        complete: replaces the outputs check when given (a stage that resumes by itself): done when
            it says so, else stale when an output exists (an earlier, smaller run), else todo.
        stdout: a file for the last command's standard output.
        parallel: argv lists run side by side before ``commands`` (all must succeed).
        run: a function run in this process instead of commands (the report).
    """

    name: str
    commands: list[list[str]] = field(default_factory=list)
    inputs: list[Path] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)
    complete: object = None
    stdout: Path | None = None
    run: object = None
    parallel: list[list[str]] = field(default_factory=list)

    def state(self) -> str:
        """``done``, ``stale`` (outputs older than an input) or ``todo``."""
        if self.complete is not None:
            if self.complete():
                return "done"
            return "stale" if any(p.exists() for p in self.outputs) else "todo"
        if not self.outputs or not all(p.exists() for p in self.outputs):
            return "todo"
        newest_input = max((p.stat().st_mtime for p in self.inputs if p.exists()), default=0)
        return "done" if min(p.stat().st_mtime for p in self.outputs) >= newest_input else "stale"


def obliq(*args: str) -> list[str]:
    """The argv of ``obliq <args>`` run by this Python (the ``obliq`` entry point is ``obliq.cli:main``)."""
    return [sys.executable, "-m", "obliq.cli", *args]


def synth_complete(rows: Path, docs: int) -> bool:
    """Whether ``synth generate`` covered its whole sample of ``docs`` documents (its report says so)."""
    report = rows.with_name(rows.name + ".report.json")
    if not report.is_file():
        return False
    saved = json.loads(report.read_text())
    r = saved["report"]
    covered = r["already_done"] + r["generated"] + sum(r["skipped"].values())
    return saved["args"]["n_docs"] == docs and covered == r["sampled"]


def final_checkpoint(run_dir: Path) -> Path | None:
    """The newest ``last.ckpt`` of a training run folder (``<run_dir>/version_<n>/checkpoints``), or None."""
    found = sorted(run_dir.glob("version_*/checkpoints/last.ckpt"), key=lambda p: int(p.parts[-3].split("_")[1]))
    return found[-1] if found else None


def recipe_sources(recipe: Path) -> list[dict]:
    """The recipe's ``data.sources`` (paths, counts)."""
    from obliq.trainer import recipe_config

    return recipe_config(recipe)["data"]["sources"]


PLAIN = "--trainer.callbacks=<the recipe's checkpoints alone>"
"""Stands in an ablation's command for :func:`plain_checkpoints` of its run folder (known when it starts)."""


def plain_checkpoints(recipe: Path, folder: Path) -> list[dict]:
    """The recipe's callbacks, for a run in ``folder`` (its version folder, ``${run_dir}`` of train.py),
    without the evaluation and what depends on it (the dev evaluation, the checkpoints chosen by its
    metric, the dose checkpoints): what an ablation run keeps."""
    from obliq.trainer import recipe_config

    callbacks = recipe_config(recipe, run_dir=str(folder))["trainer"]["callbacks"]
    return [c for c in callbacks if not c["class_path"].endswith(("RetrievalEvaluation", "DoseCheckpoints"))
            and "monitor" not in c.get("init_args", {})]


def stages(docs: int, data: Path, recipe: Path = RECIPE, overwrite: bool = False) -> list[Stage]:
    """The chain's stages for a sample of ``docs`` documents per task, reading the shared tasks in ``data``."""
    over = ["--overwrite", "true"] if overwrite else []
    tasks, synth, rows = ROOT / "tasks", ROOT / "synth", ROOT / "rows"
    out: list[Stage] = []
    for t in TASKS:
        out.append(Stage(f"split-{t}", [obliq("task", "split", "--task", str(data / t), "--out", str(tasks / t),
                                              "--dev_fraction", "0.5", "--seed", "0", *over)],
                         inputs=[data / t / "queries.jsonl", data / t / "qrels" / "test.tsv"],
                         outputs=[tasks / t / "task.json"]))
    for t in TASKS:
        generated = synth / f"{t}.jsonl"
        shards = [generated.with_name(f"{t}.shard-{i}-of-{SHARDS}.jsonl") for i in range(SHARDS)]
        generate = [obliq("synth", "generate", "--config", f"configs/synth/{t}.yaml", "--task", str(tasks / t),
                          "--out", str(generated), "--n_docs", str(docs), "--shard.index", str(i),
                          "--shard.count", str(SHARDS)) for i in range(SHARDS)]
        merge = obliq("synth", "merge", "--shards", *map(str, shards), "--out", str(generated), *over)
        out.append(Stage(f"synth-{t}", [merge], parallel=generate, outputs=[generated],
                         complete=lambda g=generated, s=shards: g.is_file() and all(synth_complete(x, docs) for x in s)
                         and all(g.stat().st_mtime >= x.stat().st_mtime for x in s)))
        out.append(Stage(f"audit-{t}", [obliq("synth", "audit", "--rows", str(generated), "--task", str(tasks / t))],
                         inputs=[generated], outputs=[ROOT / "audit" / f"{t}.txt"], stdout=ROOT / "audit" / f"{t}.txt"))
        mine = obliq("negatives", "mine", "--rows", str(generated), "--task", str(tasks / t),
                     "--out", str(rows / "synthetic" / f"{t}.jsonl"), "--k", "4", *over)
        out.append(Stage(f"negatives-{t}", [mine],
                         inputs=[generated], outputs=[rows / "synthetic" / f"{t}.jsonl"]))
    graph, knn = ROOT / "knn" / "graph.json", rows / f"knn-{KNN_TASK.split('-')[0]}.jsonl"
    out.append(Stage("knn", [obliq("distill", "graph", "--task", str(tasks / KNN_TASK), "--teacher", "stylometric",
                                   "--k", "3", "--out", str(graph), *over),
                             obliq("distill", "pairs", "--task", str(tasks / KNN_TASK), "--graph", str(graph),
                                   "--out", str(knn), *over)],
                     inputs=[tasks / KNN_TASK / "task.json"], outputs=[graph, knn]))
    sources = recipe_sources(recipe)
    all_rows = [rows / "synthetic" / f"{t}.jsonl" for t in TASKS] + [knn]
    for name, keep in RUNS.items():
        run_dir = ROOT / "train" / slug(name)
        fit = [sys.executable, "train.py", "fit", "--config", str(recipe), f"--run_dir={run_dir}"]
        if keep is not None:  # an ablation: one source, the same steps; only the plain checkpoints (no dev evaluation)
            kept = [s for s in sources if ("knn" in Path(s["path"]).name) == (keep == "knn")]
            fit += ["--data.sources=" + json.dumps(kept), PLAIN]
        out.append(Stage(f"train-{slug(name)}", [fit], inputs=[recipe, *all_rows],
                         outputs=[run_dir / "model" / "adapter" / "obliq_encoder.json"]))
    models = {"BM25": "bm25", "MiniLM (base)": "minilm",
              **{n: str(ROOT / "train" / slug(n) / "model" / "adapter") for n in RUNS}}
    for name, model in models.items():
        folder = ROOT / "eval" / slug(name)
        command = obliq("evaluate", "--model", model, "--tasks", *(str(tasks / t) for t in TASKS),
                        "--output", str(folder), "--latency_queries", "0", "--retrieval.batch_size", "64")
        out.append(Stage(f"eval-{slug(name)}", [command],
                         inputs=[tasks / t / "task.json" for t in TASKS]
                         + ([] if name in ("BM25", "MiniLM (base)") else [Path(model) / "obliq_encoder.json"]),
                         outputs=[folder / "results.md"]))
    out.append(Stage("report", inputs=[ROOT / "eval" / slug(s) / "results.md" for s in SYSTEMS],
                     outputs=[ROOT / "report.md", ROOT / "curves.png"], run=lambda: report(ROOT, recipe)))
    return out


def _run_stage(stage: Stage, overwrite: bool) -> None:
    """Run a stage's commands (training: fit or resume, then export; evaluation: through a partial folder)."""
    if stage.run is not None:
        stage.run()
        return
    if stage.parallel:
        for argv in stage.parallel:
            print("+ " + " ".join(argv) + " &", flush=True)
        procs = [subprocess.Popen(argv) for argv in stage.parallel]
        failed = [p.args for p in procs if p.wait() != 0]
        if failed:
            raise subprocess.CalledProcessError(1, failed[0])
    for argv in stage.commands:
        if "train.py" in argv:
            _train(argv)
            continue
        if "evaluate" in argv:  # a killed evaluation leaves a partial folder beside the real one, never in it
            final = Path(argv[argv.index("--output") + 1])
            partial = final.with_name(final.name + ".partial")
            argv = [a if a != str(final) else str(partial) for a in argv] + ["--overwrite", "true"]
            if final.exists() and overwrite:
                import shutil

                shutil.rmtree(final)
            _call(argv)
            partial.rename(final)
            continue
        _call(argv, stage.stdout)


def _call(argv: list[str], stdout: Path | None = None, env: dict | None = None) -> None:
    print("+ " + "".join(f"{k}={v} " for k, v in (env or {}).items()) + " ".join(argv), flush=True)
    if stdout is None:
        subprocess.run(argv, check=True, env={**os.environ, **env} if env else None)
        return
    stdout.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True)
    stdout.write_text(result.stdout)
    print(result.stdout, flush=True)


TRAIN_THREADS = {"OMP_NUM_THREADS": "1"}
"""Torch CPU threads of a training process: on 2 cores shared with other work, a MiniLM step with 16 anchors
took 25 s with 1 thread and 207 s with 2 (OpenMP workers wait on each other while descheduled)."""


def _train(fit: list[str]) -> None:
    """``train.py fit`` (resumed from ``last.ckpt`` when the run has one and is not finished; one CPU thread,
    :data:`TRAIN_THREADS`), then export."""
    import torch

    from obliq.trainer import recipe_config

    run_dir = Path(next(a for a in fit if a.startswith("--run_dir=")).split("=", 1)[1])
    steps = recipe_config(fit[fit.index("--config") + 1])["trainer"]["max_steps"]
    last = final_checkpoint(run_dir)
    done = last is not None and torch.load(last, map_location="cpu", weights_only=False)["global_step"] >= steps
    if not done:
        from obliq.trainer import run_folder

        resume = ["--ckpt_path", "last"] if last is not None else []
        folder = run_folder(run_dir, "last" if resume else None)[0]  # where train.py will put this run
        plain = "--trainer.callbacks=" + json.dumps(plain_checkpoints(fit[fit.index("--config") + 1], folder))
        _call([plain if a == PLAIN else a for a in fit] + resume, env=TRAIN_THREADS)
        last = final_checkpoint(run_dir)
    _call(obliq("export", "--checkpoint", str(last), "--out", str(run_dir / "model"), "--overwrite", "true"))


def carried(knn_only, synthetic_only, alpha: float = 0.05) -> str:
    """Which source carried a task's gain over the base model, from the two single-source comparisons
    (:class:`obliq.eval.significance.Comparison`, trained − base): a source carried it when its
    model alone is better than base with p < ``alpha`` and a 95% interval above 0."""
    won = [name for name, c in (("kNN pairs", knn_only), ("synthetic queries", synthetic_only))
           if c.diff > 0 and c.ci_low > 0 and c.p_value < alpha]
    return " and ".join(won) if won else "neither (no single-source model is significantly above base)"


def report(root: Path = ROOT, recipe: Path = RECIPE) -> dict:
    """Write ``<root>/report.md`` (the table, the significance per task, the dose checkpoints' dev
    scores), ``<root>/report.json`` and ``<root>/curves.png`` from the chain's evaluation and training
    folders; returns the JSON.

    A system not evaluated yet (a chain stopped early) is listed as such, and the comparisons that
    need it are left out.

    Raises:
        ValueError: two MiniLM systems that read texts differently (the comparison would not measure the
            training); BM25 or the base model not evaluated.
    """
    from obliq.eval.results import read_per_query, reads_text
    from obliq.eval.significance import compare
    from obliq.files import write_json, write_text

    ready = [s for s in SYSTEMS if all((root / "eval" / slug(s) / t / "summary.json").is_file() for t in TASKS)]
    if not {"BM25", "MiniLM (base)"} <= set(ready):
        raise ValueError(f"{root}/eval: BM25 and the base model must be evaluated first (found {ready})")
    summaries = {s: {t: json.loads((root / "eval" / slug(s) / t / "summary.json").read_text()) for t in TASKS}
                 for s in ready}
    for s in ready[2:]:
        for t in TASKS:
            if summaries[s][t]["reads"] != summaries["MiniLM (base)"][t]["reads"]:
                raise ValueError(f"{s} reads {t} as {reads_text(summaries[s][t]['reads'])}, base MiniLM as "
                                 f"{reads_text(summaries['MiniLM (base)'][t]['reads'])}")
    n = {t: summaries["BM25"][t]["n_queries"] - summaries["BM25"][t].get("n_excluded", 0) for t in TASKS}
    lines = ["# obliq-ir-mini: test queries of the four tasks", "",
             "NDCG@10 / Recall@100 on the test side of each task's query split (gold qrels), laid out like the "
             "OBLIQ-IR paper's Table 1.", "",
             "| system | " + " | ".join(f"{t} (n={n[t]})" for t in TASKS) + " |", "|---|" + "---:|" * len(TASKS)]
    for s in SYSTEMS:
        if s not in ready:
            lines.append(f"| {s} | " + " | ".join("not evaluated" for _ in TASKS) + " |")
            continue
        lines.append(f"| {s} | " + " | ".join(f"{summaries[s][t]['metrics']['NDCG@10']:.4f} / "
                                              f"{summaries[s][t]['metrics']['Recall@100']:.4f}" for t in TASKS) + " |")
    per_query = {s: {t: read_per_query(root / "eval" / slug(s) / t / "per_query.jsonl") for t in TASKS} for s in ready}
    pairs = [(b, a) for b, a in [("mixture", "MiniLM (base)"), ("kNN only", "MiniLM (base)"),
                                 ("synthetic only", "MiniLM (base)"), ("mixture", "synthetic only"),
                                 ("mixture", "kNN only")] if a in ready and b in ready]
    result: dict = {"systems": {s: {t: summaries[s][t]["metrics"] for t in TASKS} for s in ready},
                    "reads": reads_text(summaries["MiniLM (base)"][TASKS[0]]["reads"]),
                    "comparisons": {}, "carried": {}}
    lines += ["", f"Every MiniLM system reads texts as: {result['reads']}.", "",
              "Paired differences in NDCG@10 per task (95% paired-bootstrap interval; sign-flip test, its method "
              "and n):", ""]
    for t in TASKS:
        lines.append(f"**{t}**")
        found = {}
        for b, a in pairs:
            c = compare(per_query[a][t], per_query[b][t], seed=0)
            found[(b, a)] = c
            result["comparisons"].setdefault(t, {})[f"{b} − {a}"] = c.as_dict()
            lines.append(f"- {c.text(f'{b} − {a}')}")
        worse = found.get(("mixture", "MiniLM (base)"))
        if worse is not None:
            verdict = ("significantly WORSE than base" if worse.diff < 0 and worse.ci_high < 0 and worse.p_value < 0.05
                       else "not significantly worse than base")
            result.setdefault("mixture_vs_base", {})[t] = verdict
            lines.append(f"- the mixture is {verdict}")
        if ("kNN only", "MiniLM (base)") in found and ("synthetic only", "MiniLM (base)") in found:
            result["carried"][t] = carried(found[("kNN only", "MiniLM (base)")],
                                           found[("synthetic only", "MiniLM (base)")])
            lines.append(f"- the gain over base was carried by: {result['carried'][t]}")
        lines.append("")
    curves = _curves(root)
    result["curves"] = curves
    lines += ["## Dev NDCG@10 during training (the RetrievalEvaluation callback) and the dose checkpoints", "",
              "| run | step | kNN rows seen (expected) | " + " | ".join(TASKS) + " | mean |", "|---|---:|---:|"
              + "---:|" * (len(TASKS) + 1)]
    for run, points in curves.items():
        for p in points:
            mark = " (dose checkpoint)" if p["dose_checkpoint"] else ""
            lines.append(f"| {run} | {p['step']}{mark} | {p['knn_rows']:.0f} | "
                         + " | ".join(f"{p['ndcg'].get(t, float('nan')):.4f}" for t in TASKS)
                         + f" | {p['ndcg'].get('mean', float('nan')):.4f} |")
    write_text(root / "report.md", "\n".join(lines) + "\n")
    write_json(root / "report.json", result)
    _plot(curves, root / "curves.png")
    print("\n".join(lines))
    return result


def _curves(root: Path) -> dict[str, list[dict]]:
    """Per training run: the dev NDCG@10 the callback logged (CSV logger's ``metrics.csv``) per step,
    the kNN rows the run had seen by then (expected: step × batch × kNN share of an epoch) and whether
    a dose checkpoint was written there."""
    import csv

    from obliq.trainer import recipe_config

    out = {}
    for name in RUNS:
        run_dir = root / "train" / slug(name)
        config_file = sorted(run_dir.glob("version_*/config.yaml")) or sorted(run_dir.glob("**/config.yaml"))
        metrics = sorted(run_dir.glob("**/metrics.csv"))
        if not config_file or not metrics:
            continue
        cfg = recipe_config(config_file[-1])
        batch, sources = cfg["data"]["batch_size"], cfg["data"]["sources"]
        sizes = [s.get("count") or sum(1 for f in sorted(Path().glob(s["path"])) for _ in f.open()) for s in sources]
        share = sum(n for s, n in zip(sources, sizes) if "knn" in Path(s["path"]).name) / max(sum(sizes), 1)
        dose_steps = {s for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("DoseCheckpoints")
                      for s in c["init_args"]["steps"]}
        points: dict[int, dict] = {}
        with metrics[-1].open() as f:
            for row in csv.DictReader(f):
                for key, value in row.items():
                    if key.startswith("eval/") and key.endswith("/NDCG@10") and value not in ("", None):
                        step = int(row["step"])
                        task = key.split("/")[1].removesuffix("-dev")  # the callback's name of a dev side
                        point = points.setdefault(step, {"step": step, "knn_rows": step * batch * share,
                                                         "dose_checkpoint": step in dose_steps, "ndcg": {}})
                        point["ndcg"][task] = float(value)
        out[name] = [points[s] for s in sorted(points)]
    return out


def _plot(curves: dict[str, list[dict]], path: Path) -> None:
    """One panel per task (and the mean): dev NDCG@10 against the step, one line per run, dose checkpoints marked."""
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
            dose = [(p["step"], p["ndcg"][task]) for p in points if p["dose_checkpoint"] and task in p["ndcg"]]
            if dose:
                ax.scatter(*zip(*dose), s=90, facecolors="none", edgecolors=line.get_color())
        ax.set(title=task, xlabel="step", ylabel="dev NDCG@10")
        ax.grid(alpha=0.3)
    if curves:
        axes[0][0].legend(fontsize="small", title="open circles: dose checkpoints", title_fontsize="x-small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _lock(stage: Stage) -> Path | None:
    """Take the stage's lock file (``<ROOT>/locks/<stage>``, holding this process id); while another live
    process holds it (a second shell running ``--only`` stages), wait. Returns the lock, or None when
    the other process finished the stage meanwhile."""
    name, lock = stage.name, ROOT / "locks" / stage.name
    lock.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        try:
            with open(lock, "x") as f:
                f.write(str(os.getpid()))
            if waited and stage.state() == "done":
                lock.unlink()
                return None
            return lock
        except FileExistsError:
            try:
                os.kill(int(lock.read_text() or 0), 0)
            except (ProcessLookupError, ValueError):  # its holder died: take it over
                lock.unlink(missing_ok=True)
                continue
            if not waited:
                print(f"== {name}: running in process {lock.read_text()}, waiting", flush=True)
            waited = True
            time.sleep(10)


def main(argv: list[str] | None = None) -> None:
    """Run the chain (see the module docstring); ``--help`` lists the settings."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=24, help="documents sampled per task for synthetic queries "
                        "(the one setting that scales the chain; the synth configs say 100)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/tasks"), help="the shared task folders")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the training recipe")
    parser.add_argument("--overwrite", action="store_true",
                        help="redo stages whose outputs are older than their inputs")
    parser.add_argument("--dry_run", action="store_true", help="print each stage's state and commands, run nothing")
    parser.add_argument("--only", nargs="+", default=None, help="run only these stages (e.g. from a second shell: "
                        "the evaluations of BM25 and the base model need no earlier stage but the splits)")
    args = parser.parse_args(argv)
    if args.docs < 1:
        parser.error("--docs must be >= 1")
    timings_file = ROOT / "timings.json"
    chain = stages(args.docs, args.data, args.recipe, args.overwrite)
    unknown = sorted(set(args.only or []) - {s.name for s in chain})
    if unknown:
        parser.error(f"no stage {', '.join(unknown)}; the stages: {', '.join(s.name for s in chain)}")
    for stage in chain:
        if args.only and stage.name not in args.only:
            continue
        state = stage.state()
        print(f"== {stage.name}: {state}", flush=True)
        if args.dry_run:
            for argv in stage.parallel + stage.commands:
                print("   " + " ".join(argv))
            continue
        if state == "done":
            continue
        if state == "stale" and not args.overwrite:
            sys.exit(f"{stage.name}: its outputs are older than its inputs; rerun with --overwrite to redo it")
        lock = _lock(stage)
        if lock is None:  # another shell ran it meanwhile
            continue
        load, t0 = os.getloadavg()[0], time.perf_counter()
        try:
            _run_stage(stage, args.overwrite)
        finally:
            lock.unlink()
        timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}  # another shell's too
        timings[stage.name] = {"seconds": round(time.perf_counter() - t0, 1), "load_before": round(load, 2),
                               "load_after": round(os.getloadavg()[0], 2), "docs": args.docs,
                               "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        ROOT.mkdir(parents=True, exist_ok=True)
        timings_file.write_text(json.dumps(timings, indent=2) + "\n")
        print(f"== {stage.name}: {timings[stage.name]['seconds']} s (load {load:.2f} → "
              f"{timings[stage.name]['load_after']:.2f})", flush=True)


if __name__ == "__main__":
    main()
