"""Baselines on every task: BM25 and MiniLM NDCG@10 / Recall@100, and the time per stage.

    python bench/eval_baselines.py --output runs/baselines [--tasks ../shared/data/tasks] [--models bm25 minilm]

Each model is evaluated with :func:`obliq.commands.evaluate.evaluate` into ``<output>/<model>/`` (a model
whose ``results.md`` is already there is not re-run); the closing table is printed as markdown.
MiniLM on the 4,000-document tasks takes minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from obliq.commands.evaluate import evaluate
from obliq.eval.results import made_with
from obliq.tasks import find_tasks

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--tasks", nargs="+", default=[str(REPO.parent / "shared" / "data" / "tasks")])
    parser.add_argument("--models", nargs="+", default=["bm25", "minilm"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    tasks = [p.name for p in find_tasks(args.tasks)]
    summaries = {}
    for model in args.models:
        out = args.output / model.replace("/", "_")
        if not (out / "results.md").is_file():
            evaluate(model, args.tasks, out)
        summaries[model] = {t: json.loads((out / t / "summary.json").read_text()) for t in tasks}

    head = " | ".join(f"{m} NDCG@10 | {m} R@100" for m in args.models)
    print(f"| task | docs | queries | {head} |")
    print("|---|---:|---:|" + "---:|" * 2 * len(args.models))
    for t in tasks:
        first = summaries[args.models[0]][t]
        cells = " | ".join(
            f"{summaries[m][t]['metrics']['NDCG@10']:.4f} | {summaries[m][t]['metrics']['Recall@100']:.4f}"
            for m in args.models
        )
        print(f"| {t} | {first['n_docs']} | {first['n_queries']} | {cells} |")

    print("\nTime per stage (s) and latency per query (ms, p50 / p95):\n")
    print(
        "| task | model | encode corpus | encode queries | search | metrics | corpus cache "
        "| query enc. p50 / p95 | search p50 / p95 |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|---:|")
    for t in tasks:
        for m in args.models:
            s = summaries[m][t]
            tm, lat = s["timing_s"], s["latency_ms"]
            print(
                f"| {t} | {m} | {tm['encode_corpus']:.2f} | {tm['encode_queries']:.2f} | {tm['search']:.3f} | "
                f"{tm['metrics']:.3f} | {s['corpus_cache']} | {lat['query_encoding']['p50']} / "
                f"{lat['query_encoding']['p95']} | {lat['search']['p50']} / {lat['search']['p95']} |"
            )


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
