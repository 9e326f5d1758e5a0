"""BM25 hard-negative mining speed (rows/s) with each backend, and how far the two agree.

    python bench/negatives_throughput.py [--tasks math-theoremqa hearings-exchanges] [--data ../shared/data/tasks]

Rows are each task's real (query, relevant document) pairs from ``qrels/test.tsv``; 4 negatives per
row. Prints, per task and backend, the index time, the mining time and rows/s, and whether the two
backends chose the same negatives. The pyserini backend needs the ``pyserini`` extra.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from obliq.eval.results import made_with
from obliq.negatives.mine import Bm25sBackend, MiningReport, mine_negatives
from obliq.tasks import load_task

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "tasks")
    parser.add_argument("--tasks", nargs="+", default=["math-theoremqa", "hearings-exchanges"])
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()

    print("| task | backend | rows | docs | index s | mine s | rows/s | same negatives as bm25s |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name in args.tasks:
        task = load_task(args.data / name)
        pos = {d: i for i, d in enumerate(task.doc_ids)}
        rows = [
            {
                "id": f"{q}:{d}",
                "task": name,
                "source": "public",
                "query": text,
                "positive": {"id": d, "text": task.doc_texts[pos[d]]},
                "negatives": [],
            }
            for q, text in zip(task.query_ids, task.query_texts)
            for d, g in sorted(task.qrels["test"].get(q, {}).items())
            if g > 0 and d in pos
        ]
        reference = None
        for backend in ("bm25s", "pyserini"):
            start = time.perf_counter()
            if backend == "bm25s":
                engine = Bm25sBackend(task.doc_texts)
            else:
                from obliq.negatives.pyserini_backend import PyseriniBackend

                engine = PyseriniBackend(task.doc_texts)
            report = MiningReport(index_seconds=time.perf_counter() - start)
            mined, report = mine_negatives(rows, task.doc_ids, task.doc_texts, engine, k=args.k, report=report)
            if hasattr(engine, "close"):
                engine.close()
            ids = [[n["id"] for n in r["negatives"]] for r in mined]
            same = "-" if reference is None else f"{sum(a == b for a, b in zip(ids, reference))}/{len(ids)} rows"
            reference = reference or ids
            print(
                f"| {name} | {backend} | {len(rows)} | {len(task.doc_ids)} | {report.index_seconds:.2f} | "
                f"{report.search_seconds:.2f} | {report.rows_per_s:.0f} | {same} |",
                flush=True,
            )


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
