"""The OBLIQ-IR recipe in miniature on a CPU: one chain of obliq commands (examples/obliq-ir-mini/README.md).

    python examples/obliq-ir-mini/run.py --docs 24          # from the repository root
    python examples/obliq-ir-mini/run.py --docs 24 --dry_run   # print the commands only

Stages, in order; each runs existing commands (printed before they run) and is skipped when its
outputs are complete, so a killed chain resumes where it stopped:

1. ``split-<task>``: ``obliq task split`` gives each of the four tasks a development side (the
   training callback's) and a test side (the final table's), under ``runs/obliq-ir-mini/tasks``.
2. ``synth-<task>``: ``obliq synth generate`` with ``configs/synth/<task>.yaml`` (its lens, prompts,
   budgets, few-shot examples from the split's development side, ``samples`` candidates per document)
   on a seeded sample of ``--docs`` documents, as two shards side by side (one core each), joined by
   ``obliq synth merge``; then ``obliq synth audit`` of every candidate (saved as text). Generation
   resumes by itself; the stage is complete when both shards' reports cover their whole share of the
   candidates.
3. ``filter-<task>``: ``obliq synth filter`` keeps the candidates worth training on (thresholds from the
   development queries; best-of-n), its table saved as text; ``audit-kept-<task>`` audits the kept rows
   against the real test queries as ``audit-<task>`` audits all of them (before / after).
4. ``negatives-<task>``: ``obliq negatives mine`` (4 BM25 hard negatives per kept row).
5. ``knn``: ``obliq distill graph`` (stylometric teacher, k = 3) and ``obliq distill pairs`` on writing-news.
6. ``train-<run>``: ``python train.py fit --config configs/obliq-ir-mini.yaml`` for the mixture, and
   with ``--config configs/ablations/obliq-ir-mini-<source>-only.yaml`` stacked on it for the two
   single-source ablations, each for one epoch of the mixture (:func:`epoch_steps`), then ``obliq export``-ed; a
   killed run resumes from its ``last.ckpt``.
7. ``eval-<system>``: ``obliq evaluate`` of BM25, base MiniLM and the three trained models on the
   test side of the four tasks.
8. ``wise``: the mixture interpolated toward base MiniLM (``obliq interpolate``, WiSE-FT) at each α of
   :data:`ALPHAS`, α chosen on the dev side of the four tasks, the chosen model evaluated on the test side.
9. ``report``: the Table-1-style comparison report (:mod:`obliq.eval.report`: paired significance per
   task), which source carried each gain, the per-task dev NDCG@10 curves of the training callback
   (PNG) and the step checkpoints' scores.

Everything goes to the recipe's ``work_dir`` (``runs/obliq-ir-mini``), and every path the recipe reads
(the rows of its sources named ``synthetic`` and ``knn``, its dev tasks) is where the chain writes.
Every stage's wall time and the load average before and after it go to ``<work_dir>/timings.json``.
A stage whose outputs exist but are older than its inputs (e.g. after a larger ``--docs``) is refused
unless ``--overwrite`` is given, which is passed on to the commands that would replace them.

Its parts lie beside it: ``mini_systems.py`` (the tasks, the systems compared, the runs that train them, the
work folder) and ``mini_report.py`` (the ``report`` stage).
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

from mini_report import report
from mini_systems import RECIPE, ROOT, RUNS, SYSTEMS, TASKS, slug

from obliq.argv import options
from obliq.recipes import WorkDir

KNN_TASK = "writing-news"
SHARDS = 2
"""Generation shards run side by side, one CPU thread each (configs/synth/*.yaml ``backend.threads: 1``): both cores."""
ALPHAS = (0.5, 0.75)
"""The WiSE-FT interpolations of the mixture toward base MiniLM tried on the dev side, beside α = 0 (base) and
α = 1 (the mixture): ``obliq interpolate``, chosen by the mean dev NDCG@10 of the four tasks."""


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


def synth_complete(rows: Path, docs: int, config: Path | None = None) -> bool:
    """Whether ``synth generate`` covered every candidate of its sample of ``docs`` documents (its report
    says so: each of its ``samples`` per document written or given up) with the settings of the synth
    ``config`` now (its ``samples`` and ``fewshot``, and the prompts' text): an output an earlier
    configuration wrote is not complete, and the stage is then stale."""
    report = rows.with_name(rows.name + ".report.json")
    if not report.is_file():
        return False
    saved = json.loads(report.read_text())
    r = saved["report"]
    covered = r["already_done"] + r["generated"] + sum(r["skipped"].values())
    if saved["args"]["n_docs"] != docs or covered != r.get("candidates", r["sampled"]):
        return False
    if config is None:
        return True
    import yaml

    from obliq.commands.synth import prompts_digest
    from obliq.synth.prompts import TaskSpec

    cfg = yaml.safe_load(config.read_text())
    fewshot = saved["args"].get("fewshot") or {}
    return (
        saved["args"].get("samples", 1) == cfg.get("samples", 1)
        and all(fewshot.get(k) == v for k, v in (cfg.get("fewshot") or {}).items())
        and saved.get("prompts") == prompts_digest(TaskSpec(**cfg["spec"]), cfg.get("prompt_dir"))
    )


def source_path(recipe: Path, name: str) -> Path:
    """Where the recipe reads its source called ``name`` (``knn``, ``synthetic``)."""
    from obliq.data import named_source
    from obliq.recipes import recipe_config

    sources = recipe_config(recipe)["data"]["sources"]
    return Path(sources[named_source(sources, name, recipe)]["path"])


def run_dir(recipe: Path, ablation: Path | None) -> Path:
    """The ``run_dir`` of the recipe, or of an ablation recipe stacked on it."""
    from obliq.recipes import recipe_config

    return Path(recipe_config(recipe, *([ablation] if ablation else []))["run_dir"])


def stages(docs: int, data: Path, recipe: Path = RECIPE, overwrite: bool = False) -> list[Stage]:
    """The chain's stages for a sample of ``docs`` documents per task, reading the shared tasks in ``data``."""
    over = options(overwrite=True) if overwrite else []
    tasks, synth, kept = WorkDir(ROOT).tasks, ROOT / "synth", ROOT / "filter"
    synthetic = source_path(recipe, "synthetic").parent  # the recipe reads <this folder>/*.jsonl
    out: list[Stage] = []
    for t in TASKS:
        split = obliq("task", "split", *options(task=data / t, out=tasks / t, dev_fraction=0.5, seed=0), *over)
        out.append(
            Stage(
                f"split-{t}",
                [split],
                inputs=[data / t / "queries.jsonl", data / t / "qrels" / "test.tsv"],
                outputs=[tasks / t / "task.json"],
            )
        )
    for t in TASKS:
        generated = synth / f"{t}.jsonl"
        shards = [generated.with_name(f"{t}.shard-{i}-of-{SHARDS}.jsonl") for i in range(SHARDS)]
        sample = options(config=f"configs/synth/{t}.yaml", task=tasks / t, out=generated, n_docs=docs)
        generate = [
            obliq("synth", "generate", *sample, *options(shard={"index": i, "count": SHARDS})) for i in range(SHARDS)
        ]
        merge = obliq("synth", "merge", *options(shards=shards, out=generated), *over)
        out.append(
            Stage(
                f"synth-{t}",
                [merge],
                parallel=generate,
                outputs=[generated],
                complete=lambda g=generated, s=shards, c=Path(f"configs/synth/{t}.yaml"): (
                    g.is_file()
                    and all(synth_complete(x, docs, c) for x in s)
                    and all(g.stat().st_mtime >= x.stat().st_mtime for x in s)
                ),
            )
        )
        out.append(
            Stage(
                f"audit-{t}",
                [obliq("synth", "audit", *options(rows=generated, task=tasks / t))],
                inputs=[generated],
                outputs=[ROOT / "audit" / f"{t}.txt"],
                stdout=ROOT / "audit" / f"{t}.txt",
            )
        )
        rows = kept / f"{t}.jsonl"
        out.append(
            Stage(
                f"filter-{t}",
                [obliq("synth", "filter", *options(rows=generated, task=tasks / t, out=rows), *over)],
                inputs=[generated],
                outputs=[rows, kept / f"{t}.txt"],
                stdout=kept / f"{t}.txt",
            )
        )
        out.append(
            Stage(
                f"audit-kept-{t}",
                [obliq("synth", "audit", *options(rows=rows, task=tasks / t))],
                inputs=[rows],
                outputs=[ROOT / "audit" / f"{t}-kept.txt"],
                stdout=ROOT / "audit" / f"{t}-kept.txt",
            )
        )
        mine = obliq("negatives", "mine", *options(rows=rows, task=tasks / t, out=synthetic / f"{t}.jsonl", k=4), *over)
        out.append(Stage(f"negatives-{t}", [mine], inputs=[rows], outputs=[synthetic / f"{t}.jsonl"]))
    graph, knn = ROOT / "knn" / "graph.json", source_path(recipe, "knn")
    teacher = options(task=tasks / KNN_TASK, teacher="stylometric", k=3, out=graph)
    out.append(
        Stage(
            "knn",
            [
                obliq("distill", "graph", *teacher, *over),
                obliq("distill", "pairs", *options(task=tasks / KNN_TASK, graph=graph, out=knn), *over),
            ],
            inputs=[tasks / KNN_TASK / "task.json"],
            outputs=[graph, knn],
        )
    )
    all_rows = [synthetic / f"{t}.jsonl" for t in TASKS] + [knn]
    for name, ablation in RUNS.items():
        fit = [sys.executable, "train.py", "fit", "--config", str(recipe)] + (
            ["--config", str(ablation)] if ablation else []
        )
        out.append(
            Stage(
                f"train-{slug(name)}",
                [fit],
                inputs=[recipe, *([ablation] if ablation else []), *all_rows],
                outputs=[run_dir(recipe, ablation) / "model" / "adapter" / "obliq_encoder.json"],
            )
        )
    models = {
        "BM25": "bm25",
        "MiniLM (base)": "minilm",
        **{n: str(run_dir(recipe, a) / "model" / "adapter") for n, a in RUNS.items()},
    }
    for name, model in models.items():
        folder = ROOT / "eval" / slug(name)
        command = obliq("evaluate", *options(model=model), *_reading(folder))
        out.append(
            Stage(
                f"eval-{slug(name)}",
                [command],
                inputs=[tasks / t / "task.json" for t in TASKS]
                + ([] if name in ("BM25", "MiniLM (base)") else [Path(model) / "obliq_encoder.json"]),
                outputs=[folder / "results.md"],
            )
        )
    mixture = run_dir(recipe, None) / "model" / "adapter"
    out.append(
        Stage(
            "wise",
            inputs=[tasks / t / "task.json" for t in TASKS] + [mixture / "obliq_encoder.json"],
            outputs=[ROOT / "wise" / "choice.json", ROOT / "eval" / slug("mixture interpolated") / "results.md"],
            run=lambda: wise(recipe),
        )
    )
    out.append(
        Stage(
            "report",
            inputs=[ROOT / "eval" / slug(s) / "results.md" for s in SYSTEMS],
            outputs=[ROOT / "report.md", ROOT / "curves.png"],
            run=lambda: report(ROOT, recipe),
        )
    )
    return out


def _reading(output: Path, split: str = "test") -> list[str]:
    """The options of every ``obliq evaluate`` of the chain: the four split tasks (``split``: ``test`` or
    ``dev``), one reading (64 texts a batch, no latency timing), into ``output``."""
    tasks = [WorkDir(ROOT).tasks / t for t in TASKS]
    return options(tasks=tasks, output=output, latency_queries=0, retrieval={"batch_size": 64}) + (
        options(split=split) if split != "test" else []
    )


def wise(recipe: Path = RECIPE) -> dict:
    """The ``wise`` stage (issue 33 §3): the mixture's final weights interpolated toward base MiniLM
    (``obliq interpolate``, WiSE-FT) at each α of :data:`ALPHAS`, each exported; base (α = 0), these and the
    mixture (α = 1) evaluated on the dev side of the four tasks; the α of the best mean dev NDCG@10 (a tie:
    the larger α, the smaller change) is then evaluated on the test side as ``mixture interpolated``.
    Writes ``<work_dir>/wise/choice.json`` (α, the dev scores per α and task); returns it. Each step is
    skipped when its output is there, so a killed stage resumes."""
    from obliq.runs import latest_run

    mixture = run_dir(recipe, None)
    models: dict[float, str] = {0.0: "minilm", 1.0: str(mixture / "model" / "adapter")}
    for alpha in ALPHAS:
        out = ROOT / "wise" / f"alpha-{alpha:g}"
        if not (out / "adapter" / "obliq_encoder.json").is_file():
            ckpt = out.with_suffix(".ckpt")
            newest = latest_run(mixture).newest
            _call(obliq("interpolate", *options(checkpoints=[newest], alpha=alpha, out=ckpt, overwrite=True)))
            _call(obliq("export", *options(checkpoint=ckpt, out=out, overwrite=True)))
        models[alpha] = str(out / "adapter")
    dev: dict[float, dict[str, float]] = {}
    for alpha, model in sorted(models.items()):
        folder = ROOT / "wise" / "dev" / f"alpha-{alpha:g}"
        if not (folder / "results.md").is_file():
            _call(obliq("evaluate", *options(model=model), *_reading(folder, "dev"), *options(overwrite=True)))
        dev[alpha] = {
            t: json.loads((folder / f"{t}-dev" / "summary.json").read_text())["metrics"]["NDCG@10"] for t in TASKS
        }
    mean = {alpha: sum(scores.values()) / len(scores) for alpha, scores in dev.items()}
    chosen = max(mean, key=lambda a: (mean[a], a))
    folder = ROOT / "eval" / slug("mixture interpolated")
    _call(obliq("evaluate", *options(model=models[chosen]), *_reading(folder), *options(overwrite=True)))
    choice = {
        "alpha": chosen,
        "model": models[chosen],
        "dev_ndcg@10": {f"{a:g}": {**dev[a], "mean": mean[a]} for a in sorted(dev)},
        "rule": "the best mean dev NDCG@10 of the four tasks; a tie: the larger alpha",
    }
    (ROOT / "wise" / "choice.json").write_text(json.dumps(choice, indent=2) + "\n")
    return choice


def _run_stage(stage: Stage, overwrite: bool, fresh: bool = False) -> None:
    """Run a stage's commands (training: fit or resume, then export, a new run when ``fresh``; evaluation:
    through a partial folder)."""
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
            _train(argv, fresh)
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
"""Torch CPU threads of a training process (docs/decisions.md, "Threads on a shared 2-core CPU")."""


def epoch_steps(recipe: Path = RECIPE) -> int:
    """Optimizer steps of one epoch of the recipe's mixture: every source's rows (its ``count`` when set, at
    most its non-empty lines unless it has ``repeat: true``; else every non-empty line of its files) over
    ``data.batch_size``, rounded up to a multiple of the callbacks' intervals (``every_n_train_steps``,
    ``every_n_steps``: the last step is checkpointed and evaluated). Every training run of the chain takes
    this many steps, so the mixture sees each kept synthetic row and each dosed kNN pair at least once, and
    the single-source ablations get the same budget (issue 33).

    Raises:
        ValueError: a source with no rows (the chain's earlier stages have not written them).
    """
    import glob
    import math

    from obliq.recipes import recipe_config

    config = recipe_config(recipe)
    rows = 0
    for source in config["data"]["sources"]:
        lines = 0
        for file in sorted(glob.glob(str(source["path"]))):
            with open(file, encoding="utf-8") as f:
                lines += sum(1 for line in f if line.strip())
        if not lines:
            raise ValueError(f"{recipe}: data.sources {source.get('name')!r}: no rows at {source['path']}")
        count = source.get("count")
        rows += lines if not count else count if source.get("repeat") else min(lines, count)
    intervals = [
        c["init_args"][k]
        for c in config["trainer"]["callbacks"]
        for k in ("every_n_train_steps", "every_n_steps")
        if c.get("init_args", {}).get(k)
    ]
    every = math.lcm(*intervals) if intervals else 1
    return math.ceil(rows / config["data"]["batch_size"] / every) * every


def _train(fit: list[str], fresh: bool = False) -> None:
    """``train.py fit`` for :func:`epoch_steps` steps, then export its newest checkpoint. The newest run is
    resumed (``--ckpt_path last``) when it has a checkpoint, was started for the same number of steps and is
    not finished; a new run is started when ``fresh`` (the stage is redone: ``--overwrite`` after its rows
    changed) or the newest run was started for another number of steps (its lr schedule spans those). One
    CPU thread, :data:`TRAIN_THREADS`."""
    import yaml

    from obliq.model.checkpoint import checkpoint_info
    from obliq.recipes import recipe_config
    from obliq.runs import latest_run

    configs = [fit[i + 1] for i, a in enumerate(fit) if a == "--config"]
    config = recipe_config(*configs)
    steps = epoch_steps(Path(configs[0]))
    run = None if fresh else latest_run(config["run_dir"])
    if run is not None and (run.path / "config.yaml").is_file():
        if yaml.safe_load((run.path / "config.yaml").read_text())["trainer"]["max_steps"] != steps:
            run = None
    if run is None or checkpoint_info(run.newest).step < steps:
        argv = fit + options(trainer={"max_steps": steps})
        _call(argv + (["--ckpt_path", "last"] if run is not None else []), env=TRAIN_THREADS)
        run = latest_run(config["run_dir"])
    _call(obliq("export", *options(checkpoint=run.newest, out=Path(config["run_dir"]) / "model", overwrite=True)))


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
    parser.add_argument(
        "--docs",
        type=int,
        default=24,
        help="documents sampled per task for synthetic queries, each with the synth configs' `samples` "
        "candidates (the one setting that scales the chain; the synth configs say 100)",
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data/tasks"), help="the shared task folders")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the training recipe")
    parser.add_argument(
        "--overwrite", action="store_true", help="redo stages whose outputs are older than their inputs"
    )
    parser.add_argument("--dry_run", action="store_true", help="print each stage's state and commands, run nothing")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="run only these stages (e.g. from a second shell: "
        "the evaluations of BM25 and the base model need no earlier stage but the splits)",
    )
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
                steps = " --trainer.max_steps <one epoch of the mixture: epoch_steps>" if "train.py" in argv else ""
                print("   " + " ".join(argv) + steps)
            if stage.run is not None:
                print(f"   run.py's {stage.name}(), in this process")
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
            _run_stage(stage, args.overwrite, fresh=state == "stale")
        finally:
            lock.unlink()
        timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}  # another shell's too
        timings[stage.name] = {
            "seconds": round(time.perf_counter() - t0, 1),
            "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "docs": args.docs,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        ROOT.mkdir(parents=True, exist_ok=True)
        timings_file.write_text(json.dumps(timings, indent=2) + "\n")
        print(
            f"== {stage.name}: {timings[stage.name]['seconds']} s (load {load:.2f} → "
            f"{timings[stage.name]['load_after']:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
