"""GradCache step time and peak memory versus a plain step and sentence-transformers' cached loss.

MiniLM (all-MiniLM-L6-v2, full fine-tuning, AdamW, scale 50 = τ 0.02), GradCache chunk 8, two modes:

- ``fixed`` (the original bench, kept for continuity): every text cut to 128 tokens (``--fixed-length``),
  1 hard negative per query; queries, positives and negatives are passages of
  ../shared/data/tasks/writing-news.
- ``real``: real training rows of variable length: the real queries of
  ../shared/data/tasks/hearings-exchanges (median ~21 tokens) with their relevant passage and 4 BM25
  hard negatives mined over the task's corpus by obliq's miner (median ~70 tokens, long tail), in a
  seeded random order, cut at ``--real-length`` tokens (default 256, obliq's evaluation length; the
  MiniLM quickstart trains at 128, where a third of these passages are cut and padding is small;
  MiniLM has 512 positions, the 3B recipe uses 1024).
  obliq builds the batch with its own Collator; sentence-transformers gets the same texts as
  columns (anchor, positive, negative_1..4).

"Padded positions" counts the token positions each method's encoder computes in one pass over the
batch (rows × longest row, per chunk; sentence-transformers cuts trailing padding per mini-batch too).

Methods: ``plain`` (one forward/backward per side, obliq's encoder and loss), ``obliq`` (obliq's
GradCache step as training runs it: length-sorted chunks, last chunk's graph kept), ``st``
(``CachedMultipleNegativesRankingLoss`` with ``mini_batch_size`` = the chunk). ``--levers B…`` adds,
at batches B…, ``obliq-unsorted`` (chunks in batch order) and ``obliq-twice`` (every chunk encoded twice, as before
issue 17; done with ``pad_to`` = the step's own chunk counts, which adds no idle pass).

Each (mode, method, batch) runs in a fresh process (its peak RSS is its own), times ``--steps``
steps after one warm-up step and reports the median; ``--repeat R`` runs every configuration R times,
the methods interleaved, and reports the median over all R × steps steps. The load average is
recorded before and after each run: the ratios measured within one run are what count on a shared
machine. ``--threads`` sets torch's threads (default: torch's own, one per core). ``--clock cpu``
tabulates each step's CPU time of the process (``time.process_time``) instead of its wall time: on
a CPU shared with other jobs, one thread timed by CPU time measures the work done and hardly the
neighbours (wall times are recorded too).

    python bench/gradcache.py [--modes fixed real] [--batches 8 32 128] [--chunk 8] [--steps 3]
                              [--fixed-length 128] [--levers 8 32] [--repeat 1] [--threads N] [--clock wall|cpu]
                              [--out runs/bench/gradcache.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from obliq.argv import options
from obliq.eval.results import made_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
DATA = Path(os.environ.get("OBLIQ_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
METHODS = ["plain", "obliq", "st"]
LEVERS = ["obliq-unsorted", "obliq-twice"]
LENGTH = {"fixed": 128, "real": 256}
NEGATIVES = {"fixed": 1, "real": 4}
REAL_TASK = "hearings-exchanges"


def _fixed_rows(n: int) -> list[dict]:
    texts = [json.loads(line)["text"] for line in (DATA / "tasks/writing-news/corpus.jsonl").open()]
    return [{"query": texts[i], "positive": texts[n + i], "negatives": [texts[2 * n + i]]} for i in range(n)]


def _real_rows(n: int) -> list[dict]:
    """The first ``n`` of the task's (query, relevant passage, 4 BM25 negatives) rows in a seeded order."""
    from obliq.negatives.mine import Bm25sBackend, mine_negatives
    from obliq.tasks import load_task

    task = load_task(DATA / "tasks" / REAL_TASK)
    pos = {d: i for i, d in enumerate(task.doc_ids)}
    rows = [
        {"id": f"{q}:{d}", "query": text, "positive": {"id": d, "text": task.doc_texts[pos[d]]}}
        for q, text in zip(task.query_ids, task.query_texts)
        for d, g in sorted(task.qrels["test"].get(q, {}).items())
        if g > 0 and d in pos
    ]
    random.Random(0).shuffle(rows)
    mined, _ = mine_negatives(rows[: 2 * n], task.doc_ids, task.doc_texts, Bm25sBackend(task.doc_texts), k=4)
    full = [r for r in mined if len(r["negatives"]) == 4][:n]
    if len(full) < n:
        raise ValueError(f"{REAL_TASK} gives only {len(full)} rows with 4 negatives, {n} wanted")
    return [{"id": r["id"], "query": r["query"], "positive": r["positive"], "negatives": r["negatives"]} for r in full]


def _slots(chunks) -> int:
    """Token positions the encoder computes over these chunks: rows × the longest row, per chunk."""
    return sum(c["attention_mask"].shape[0] * int(c["attention_mask"].sum(1).max()) for c in chunks)


def _one(mode: str, method: str, batch: int, chunk: int, steps: int, threads: int | None) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    length = LENGTH[mode]
    rows = _fixed_rows(batch) if mode == "fixed" else _real_rows(batch)
    text = lambda doc: doc if isinstance(doc, str) else doc["text"]  # noqa: E731
    if method == "st":
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

        from obliq.aliases import resolve_model

        model = SentenceTransformer(resolve_model("minilm"), device="cpu")
        model.max_seq_length = length
        loss = CachedMultipleNegativesRankingLoss(model, scale=50.0, mini_batch_size=chunk)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        columns = [[r["query"] for r in rows], [text(r["positive"]) for r in rows]] + [
            [text(r["negatives"][k]) for r in rows] for k in range(NEGATIVES[mode])
        ]
        feats = [model.tokenize(c) for c in columns]
        tokens = sum(int(f["attention_mask"].sum()) for f in feats)
        from obliq.model.gradcache import split

        slots = sum(_slots(split(f, chunk)) for f in feats)  # each column chunked in order, trailing padding cut
        model.train()

        def step():
            opt.zero_grad()
            loss(feats, None).backward()
            opt.step()
    else:
        from obliq.data import Collator, RowCaps  # the collator alone: no Lightning to import
        from obliq.data.rows import parse_row
        from obliq.losses import InfoNCE, StepView
        from obliq.model import BiEncoder
        from obliq.model.gradcache import chunk_counts_across_ranks, grad_cache_step, sorted_chunks, split

        enc = BiEncoder(
            "minilm", query_prefix="", passage_prefix="", query_max_length=length, passage_max_length=length
        )
        enc.train()
        opt = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=2e-5)
        doc = lambda i, d: d if isinstance(d, dict) else {"id": f"d{i}", "text": d}  # noqa: E731
        training_rows = [
            parse_row(
                json.dumps(
                    {
                        "id": r.get("id", str(i)),
                        "task": mode,
                        "source": "public",
                        "query": r["query"],
                        "positive": doc(f"{i}p", r["positive"]),
                        "negatives": [doc(f"{i}n{k}", n) for k, n in enumerate(r["negatives"])],
                    }
                ).encode(),
                "bench",
                i + 1,
            )
            for i, r in enumerate(rows)
        ]
        b = Collator(enc.text, RowCaps(max_negatives=NEGATIVES[mode]))(training_rows)  # tokenized once, here
        q, d, target, keys = b["query"], b["docs"], b["positive_index"], b["doc_keys"]
        tokens = int(q["attention_mask"].sum() + d["attention_mask"].sum())
        slots = (
            _slots([q, d])
            if method == "plain"
            else _slots(
                split(q, chunk) + split(d, chunk)
                if method == "obliq-unsorted"
                else sorted_chunks(q, chunk)[0] + sorted_chunks(d, chunk)[0]
            )
        )
        info_nce, view = InfoNCE(temperature=0.02), StepView.of({"positive_index": target, "doc_keys": keys})
        loss_fn = lambda a, c: info_nce(a, c, view)  # noqa: E731
        pad_to = chunk_counts_across_ranks(q, d, chunk) if method == "obliq-twice" else None

        def step():
            opt.zero_grad()
            if method == "plain":
                loss_fn(enc(q), enc(d)).backward()
            else:
                grad_cache_step(enc, q, d, loss_fn, chunk, pad_to=pad_to, sort_by_length=method != "obliq-unsorted")
            opt.step()

    load_before = os.getloadavg()[0]
    step()  # warm-up
    times, cpu_times = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "mode": mode,
        "method": method,
        "batch": batch,
        "times": times,
        "cpu_times": cpu_times,
        "tokens": tokens,
        "slots": slots,
        "peak_rss_mib": peak_mib,
        "load": [load_before, os.getloadavg()[0]],
        "threads": torch.get_num_threads(),
    }


def _table(mode: str, batches: list[int], by: dict, levers: list[int], chunk: int, clock: str) -> str:
    loads = [x for (m, *_), r in by.items() if m == mode for x in r["load"]]
    levers = [b for b in levers if b in batches]
    lines = [
        f"{mode}: MiniLM-L6, "
        f"{f'all texts {LENGTH[mode]} tokens, 1' if mode == 'fixed' else f'real rows ≤ {LENGTH[mode]} tokens, 4'} "
        f"hard negative(s), chunk {chunk}, "
        f"median {clock} time of {len(by[(mode, 'obliq', batches[0])]['times'])} steps, "
        f"{by[(mode, 'obliq', batches[0])]['threads']} "
        f"threads; 1-min load average {min(loads):.2f}–{max(loads):.2f} during the runs\n",
        "| batch | real tokens | padded positions obliq / ST | plain s | obliq s | obliq / plain | "
        "ST cached MNRL s | ST / obliq | RSS plain / obliq / ST MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in batches:
        p, g, s = (by[(mode, m, b)] for m in METHODS)
        lines.append(
            f"| {b} | {g['tokens']} | {g['slots']} / {s['slots']} | {p['step_s']:.2f} | {g['step_s']:.2f} | "
            f"{g['step_s'] / p['step_s']:.2f} | "
            f"{s['step_s']:.2f} | {s['step_s'] / g['step_s']:.2f} | "
            f"{p['peak_rss_mib']:.0f} / {g['peak_rss_mib']:.0f} / {s['peak_rss_mib']:.0f} |"
        )
    if levers:
        lines += [
            "",
            "| batch | obliq s | unsorted s | unsorted / obliq | twice s | twice / obliq |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for b in levers:
            g, u, t = (by[(mode, m, b)] for m in ["obliq", *LEVERS])
            lines.append(
                f"| {b} | {g['step_s']:.2f} | {u['step_s']:.2f} | {u['step_s'] / g['step_s']:.2f} | "
                f"{t['step_s']:.2f} | {t['step_s'] / g['step_s']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", choices=["fixed", "real"], default=["fixed", "real"])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--real-length", type=int, default=LENGTH["real"], help="token cut of the real rows")
    parser.add_argument("--fixed-length", type=int, default=LENGTH["fixed"], help="token cut of the fixed rows")
    parser.add_argument(
        "--levers",
        type=int,
        nargs="*",
        default=[],
        metavar="BATCH",
        help="at these batches also time obliq without each of its savings",
    )
    parser.add_argument("--repeat", type=int, default=1, help="fresh processes per configuration")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="the step time tabulated")
    parser.add_argument("--out", type=Path, help="write every measurement to this JSON file")
    parser.add_argument("--one", nargs=3, metavar=("MODE", "METHOD", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    LENGTH["real"], LENGTH["fixed"] = args.real_length, args.fixed_length
    if args.one:
        print(json.dumps(_one(args.one[0], args.one[1], int(args.one[2]), args.chunk, args.steps, args.threads)))
        return
    results = []
    for mode in args.modes:
        for batch in args.batches:
            for _ in range(args.repeat):
                for method in METHODS + (LEVERS if batch in args.levers else []):
                    one = {"one": [mode, method, batch], "chunk": args.chunk, "steps": args.steps}
                    one |= {"real-length": args.real_length, "fixed-length": args.fixed_length}
                    one |= {"threads": args.threads or None}
                    cmd = [sys.executable, __file__, *options(one)]
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                    results.append(json.loads(out.strip().splitlines()[-1]))
                    r = results[-1]
                    print(
                        f"done {mode} {method} batch {batch}: wall {statistics.median(r['times']):.2f} s, cpu "
                        f"{statistics.median(r['cpu_times']):.2f} s (load {r['load'][0]:.2f})",
                        file=sys.stderr,
                        flush=True,
                    )
    by: dict = {}
    for r in results:  # the repeats of one configuration: median over all their steps
        key = (r["mode"], r["method"], r["batch"])
        if key in by:
            old = by[key]
            r = dict(
                r,
                times=old["times"] + r["times"],
                cpu_times=old["cpu_times"] + r["cpu_times"],
                load=old["load"] + r["load"],
                peak_rss_mib=max(old["peak_rss_mib"], r["peak_rss_mib"]),
            )
        by[key] = dict(r, step_s=statistics.median(r["cpu_times" if args.clock == "cpu" else "times"]))
    for mode in args.modes:
        print(_table(mode, args.batches, by, args.levers, args.chunk, args.clock) + "\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
