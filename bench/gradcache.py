"""GradCache step time and peak memory versus a plain step and sentence-transformers' cached loss.

MiniLM (all-MiniLM-L6-v2, full fine-tuning, AdamW), 128-token texts, 1 hard negative per query,
real passages from ../shared/data/tasks/writing-news. Each (method, batch) runs in a fresh process
so that its peak RSS is its own. Prints a markdown table.

    python bench/gradcache.py [--batches 8 32 128] [--chunk 8] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
DATA = Path(os.environ.get("OBLIQ_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
METHODS = ["plain", "obliq-gradcache", "st-cached-mnrl"]


def _texts(n: int) -> tuple[list[str], list[str], list[str]]:
    rows = [json.loads(line)["text"] for line in (DATA / "tasks/writing-news/corpus.jsonl").open()]
    return rows[:n], rows[n : 2 * n], rows[2 * n : 3 * n]


def _one(method: str, batch: int, chunk: int, steps: int) -> dict:
    import torch

    torch.manual_seed(0)
    queries, positives, negatives = _texts(batch)
    if method == "st-cached-mnrl":
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

        from obliq.aliases import resolve_model

        model = SentenceTransformer(resolve_model("minilm"), device="cpu")
        model.max_seq_length = 128
        loss = CachedMultipleNegativesRankingLoss(model, scale=50.0, mini_batch_size=chunk)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        feats = [model.tokenize(t) for t in (queries, positives, negatives)]
        model.train()

        def step():
            opt.zero_grad()
            loss(feats, None).backward()
            opt.step()
    else:
        from obliq.loss import InfoNCELoss
        from obliq.model import BiEncoder
        from obliq.model.gradcache import grad_cache_step

        enc = BiEncoder("minilm", query_prefix="", passage_prefix="", query_max_length=128, passage_max_length=128)
        enc.train()
        opt = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=2e-5)
        q = enc.tokenize(queries, "query")
        d = enc.tokenize(positives + negatives, "passage")
        info_nce = InfoNCELoss(temperature=0.02)
        target = torch.arange(batch)

        def step():
            opt.zero_grad()
            if method == "plain":
                info_nce(enc(q), enc(d), target).backward()
            else:
                grad_cache_step(enc, q, d, lambda a, b: info_nce(a, b, target), chunk)
            opt.step()

    step()  # warm-up
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": method, "batch": batch, "step_s": statistics.median(times), "peak_rss_mib": peak_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one[0], int(args.one[1]), args.chunk, args.steps)))
        return
    results = []
    for batch in args.batches:
        for method in METHODS:
            cmd = [sys.executable, __file__, "--one", method, str(batch), "--chunk", str(args.chunk),
                   "--steps", str(args.steps)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(f"done {method} batch {batch}", file=sys.stderr)
    by = {(r["method"], r["batch"]): r for r in results}
    print(f"MiniLM-L6, 128 tokens, 1 hard negative, chunk {args.chunk}, median of {args.steps} steps, "
          f"torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}\n")
    print("| batch | plain step s | obliq GradCache s | ratio | ST cached MNRL s | plain RSS MiB | "
          "GradCache RSS MiB | ST RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in args.batches:
        p, g, s = (by[(m, b)] for m in METHODS)
        print(f"| {b} | {p['step_s']:.2f} | {g['step_s']:.2f} | {g['step_s'] / p['step_s']:.2f} | "
              f"{s['step_s']:.2f} | {p['peak_rss_mib']:.0f} | {g['peak_rss_mib']:.0f} | {s['peak_rss_mib']:.0f} |")
    lo, hi = by[("obliq-gradcache", args.batches[0])], by[("obliq-gradcache", args.batches[-1])]
    print(f"\nGradCache peak RSS batch {hi['batch']} / batch {lo['batch']}: {hi['peak_rss_mib'] / lo['peak_rss_mib']:.2f}")


if __name__ == "__main__":
    main()
