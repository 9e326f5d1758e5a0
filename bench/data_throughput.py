"""Throughput and memory of obliq.data: rows/s through the DataModule (reading, validation and
tokenization with the real all-MiniLM-L6-v2 tokenizer) and peak RSS with a small and a large file.

    python bench/data_throughput.py                        # 200k- and 2k-row files under /tmp/obliq-bench
    python bench/data_throughput.py --rows 200000 --small 2000 --batches 200 --num-workers 2

Rows are generated from the shared tasks (../shared/data/tasks): a random query, a random
positive and four random other documents as negatives, so text lengths are those of real data.
Each measurement runs in a fresh process (``--child``), so peak RSS is that of one run:
``index`` builds the file's index (first setup); ``train`` iterates ``--batches`` batches of 32
through the loader (index already cached). RSS: the main process's peak (``ru_maxrss``) and the
largest peak of its loader workers (``RUSAGE_CHILDREN``); CPU seconds of the main process over the
measured part and of the workers over their life (the machine may be shared: rows per CPU second
is the figure that does not depend on the load). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from obliq.argv import options
from obliq.eval.results import made_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
TASKS = Path(os.environ.get("OBLIQ_DATA", REPO.parent / "shared" / "data")) / "tasks"


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Write ``rows`` valid training rows built from the shared tasks' texts."""
    import numpy as np

    from obliq.text import text_hash

    rng = np.random.default_rng(seed)
    docs, queries = [], []
    for task in sorted(p for p in TASKS.iterdir() if p.is_dir()):
        with open(task / "corpus.jsonl", encoding="utf-8") as f:
            docs += [(task.name, d["_id"], d["text"]) for d in map(json.loads, f)]
        with open(task / "queries.jsonl", encoding="utf-8") as f:
            queries += [q["text"] for q in map(json.loads, f)]
    hashes = [text_hash(t) for _, _, t in docs]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            p = int(rng.integers(len(docs)))
            negs = []
            while len(negs) < 4:
                n = int(rng.integers(len(docs)))
                if n != p and hashes[n] != hashes[p] and docs[n][1] != docs[p][1] and n not in negs:
                    negs.append(n)
            row = {
                "id": f"bench-{i}",
                "task": docs[p][0],
                "source": "synthetic",
                "query": queries[int(rng.integers(len(queries)))],
                "positive": {"id": docs[p][1], "text": docs[p][2]},
                "negatives": [{"id": docs[n][1], "text": docs[n][2]} for n in negs],
            }
            f.write(json.dumps(row) + "\n")


def child(mode: str, path: str, index_dir: str, batches: int, num_workers: int) -> dict:
    """One measurement in this process (see the module docstring)."""
    from transformers import AutoTokenizer

    from obliq.aliases import resolve_model
    from obliq.data import Source, TrainingDataModule
    from obliq.model import TextTokenizer

    tokenize = TextTokenizer(
        AutoTokenizer.from_pretrained(resolve_model("minilm")), query_max_length=64, passage_max_length=256
    )  # what the encoder hands the loader in training

    dm = TrainingDataModule(
        [Source(path)], batch_size=32, num_workers=num_workers, index_dir=index_dir, tokenize=tokenize
    )
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = me.ru_utime + me.ru_stime
    start = time.perf_counter()
    dm.setup()
    setup_s = time.perf_counter() - start
    out = {"mode": mode, "rows": dm.stats["rows_per_epoch"], "setup_s": round(setup_s, 3)}
    if mode == "train":
        loader = dm.make_dataloader()
        it = iter(loader)
        next(it)  # workers started, first batch ready
        me = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = me.ru_utime + me.ru_stime
        start, rows = time.perf_counter(), 0
        for _ in range(min(batches, len(loader) - 1)):
            rows += len(next(it)["row_ids"])
        elapsed = time.perf_counter() - start
        out.update(rows_read=rows, rows_per_s=round(rows / elapsed, 1), seconds=round(elapsed, 2))
        del it, loader  # workers exit, so RUSAGE_CHILDREN holds their peak
        import gc

        gc.collect()
    else:
        out["index_rows_per_s"] = round(out["rows"] / setup_s, 1)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out["cpu_s_main"] = round(me.ru_utime + me.ru_stime - cpu0, 2)  # since the measured part began
    out["cpu_s_workers"] = round(kids.ru_utime + kids.ru_stime, 2)
    out["peak_rss_main_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["peak_rss_worker_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the large file")
    parser.add_argument("--small", type=int, default=2_000, help="rows of the small file")
    parser.add_argument("--batches", type=int, default=200, help="batches of 32 timed in the train run")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--workdir", default="/tmp/obliq-bench")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = Path(args.workdir)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], str(work / "index"), args.batches, args.num_workers)))
        return

    results = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "runs": []}
    for rows in (args.rows, args.small):
        path = work / f"rows-{rows}.jsonl"
        if not path.is_file():
            start = time.perf_counter()
            generate(path, rows)
            results[f"generate_{rows}_s"] = round(time.perf_counter() - start, 1)
        results[f"file_{rows}_mb"] = round(path.stat().st_size / 2**20, 1)
        for mode in ("index", "train"):
            if mode == "index":
                shutil.rmtree(work / "index", ignore_errors=True)
            run = {"child": [mode, path], "workdir": work, "batches": args.batches, "num-workers": args.num_workers}
            cmd = [sys.executable, __file__, *options(run)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results["runs"].append(json.loads(done.stdout.strip().splitlines()[-1]))
    results["load_average_after"] = os.getloadavg()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
