"""``obliq encode`` split over processes: two shards give the embeddings one process gives (to 1e-6),
and a shard killed with SIGKILL resumes without redoing the other.

1. one process encodes the task's corpus (``--shard.count 1``): the reference store;
2. two processes encode shards 0 and 1 of 2 side by side: largest |difference| to the reference;
3. shard 0 of 2 is encoded while shard 1, started beside it, is SIGKILLed at a random moment of its
   encoding (after its first block is on disk), then both are run again side by side as a user would:
   shard 0 must be skipped (its file's inode and mtime unchanged), shard 1 encoded, and the store equal
   the reference.

Each encoding is a real ``obliq encode`` process (MiniLM, ``--retrieval.passage_max_length``; the encoder
kind ``--encoder``: ``auto`` loads MiniLM through sentence-transformers, ``obliq`` through obliq's own
BiEncoder, which skips importing sentence-transformers, seconds per process: what the smoke test uses).

    python bench/encode_shards.py [--task ../shared/data/tasks/hearings-exchanges] [--docs N] \\
        [--encoder auto|obliq|sentence-transformers] [--out runs/bench/encode-shards]

Prints a table and exits 1 when a check fails. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from obliq.eval.results import made_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DATA = Path(os.environ.get("OBLIQ_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "tasks"


def task_copy(src: Path, out: Path, docs: int | None) -> Path:
    """The task itself, or a copy holding its first ``docs`` documents, the judgements of those and
    the queries they judge."""
    if docs is None:
        return src
    from obliq.tasks import read_jsonl, read_qrels

    corpus = [o for _, o in read_jsonl(src / "corpus.jsonl")][:docs]
    kept = {o["_id"] for o in corpus}
    qrels = {
        q: {d: g for d, g in judged.items() if d in kept}
        for q, judged in read_qrels(src / "qrels" / "test.tsv").items()
    }
    qrels = {q: judged for q, judged in qrels.items() if judged}
    queries = [o for _, o in read_jsonl(src / "queries.jsonl") if o["_id"] in qrels]
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps(o) + "\n" for o in corpus), encoding="utf-8")
    (out / "queries.jsonl").write_text("".join(json.dumps(o) + "\n" for o in queries), encoding="utf-8")
    rows = "".join(f"{q}\t{d}\t{g}\n" for q, judged in qrels.items() for d, g in judged.items())
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows, encoding="utf-8")
    if (src / "task.json").is_file():
        shutil.copy(src / "task.json", out / "task.json")
    return out


def command(task: Path, cache: Path, args, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "obliq.cli", "encode",
        "--model", args.model,
        "--tasks", str(task),
        "--retrieval.cache_dir", str(cache),
        "--retrieval.passage_max_length", str(args.length),
        "--retrieval.batch_size", str(args.batch_size),
        "--retrieval.encoder", args.encoder,
        *extra,
    ]  # fmt: skip


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def encode(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{") :])


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """``cmd`` started in the background, its standard output and error in ``log.out`` / ``log.err``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, env=ENV)


def finish(proc: subprocess.Popen, log: Path) -> dict:
    """Wait for a process of :func:`start`; its JSON report (exits with its log when it failed)."""
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(proc.args)}\nfailed:\n{Path(f'{log}.err').read_text()[-3000:]}")
    stdout = Path(f"{log}.out").read_text()
    return json.loads(stdout[stdout.index("{") :])


def _settings(cache: Path, args):
    from obliq.search.settings import RetrievalSettings

    return RetrievalSettings(
        cache_dir=cache, passage_max_length=args.length, batch_size=args.batch_size, encoder=args.encoder
    )


def store_of(task: Path, cache: Path, args):
    """The store ``obliq encode`` writes for these settings (:meth:`obliq.search.store.Store.of`)."""
    from obliq.search.store import Store
    from obliq.tasks import load_task

    return Store.of(args.model, _settings(cache, args), load_task(task))


def vectors(task: Path, cache: Path, args):
    """The store's vectors in the task's document order (read whole: a benchmark-sized corpus)."""
    from obliq.tasks import load_task

    return store_of(task, cache, args).read_vectors(load_task(task).doc_ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default=str(DATA / "hearings-exchanges"))
    parser.add_argument("--docs", type=int, default=None, help="encode only the first N documents (a copy)")
    parser.add_argument("--model", default="minilm")
    parser.add_argument(
        "--encoder",
        default="auto",
        choices=["auto", "obliq", "sentence-transformers"],
        help="--retrieval.encoder of every process: auto (MiniLM through sentence-transformers) or obliq "
        "(through obliq's BiEncoder: no sentence-transformers import, seconds less per process)",
    )
    parser.add_argument("--length", type=int, default=256, help="passage tokens")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--block_size", type=int, default=256, help="passages written at a time by the killed shard")
    parser.add_argument(
        "--kill_delay", type=float, default=2.0, help="the kill comes up to this long after the first block"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench/encode-shards")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    task = task_copy(Path(args.task), out / "task", args.docs)
    rows, ok = [], True

    t0 = time.perf_counter()
    encode(command(task, out / "one", args))
    one_s = time.perf_counter() - t0
    reference = vectors(task, out / "one", args)
    rows.append(("1 process", f"{one_s:.1f} s", f"{len(reference)} × {reference.shape[1]}", "reference"))

    t0 = time.perf_counter()
    logs = [out / "logs" / f"two-{i}" for i in range(2)]
    procs = [
        start(command(task, out / "two", args, "--shard.index", str(i), "--shard.count", "2"), log)
        for i, log in enumerate(logs)
    ]
    for p, log in zip(procs, logs):
        finish(p, log)
    two_s = time.perf_counter() - t0
    two = vectors(task, out / "two", args)
    worst = float(abs(two - reference).max())
    ok &= worst <= 1e-6
    rows.append(
        (
            "2 processes side by side",
            f"{two_s:.1f} s",
            f"max |Δ| = {worst:.2e}",
            "≤ 1e-6" if worst <= 1e-6 else "FAILED",
        )
    )

    cache = out / "killed"
    store = store_of(task, cache, args).folder
    first = start(command(task, cache, args, "--shard.index", "0", "--shard.count", "2"), out / "logs" / "killed-0")
    victim = subprocess.Popen(
        command(task, cache, args, "--shard.index", "1", "--shard.count", "2", "--block_size", str(args.block_size)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV,
    )  # fmt: skip
    while not list(store.glob(".shard-1-of-2.npy.*.tmp")) and victim.poll() is None:
        time.sleep(0.01)
    time.sleep(random.Random(args.seed).uniform(0, args.kill_delay))  # a random moment after the first block
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    finish(first, out / "logs" / "killed-0")
    finished = (store / "shard-1-of-2.json").is_file()  # the kill came too late: nothing to resume
    killed_at = "after it finished (use more --docs)" if finished else "while encoding"
    before = (store / "shard-0-of-2.npy").stat()
    logs = [out / "logs" / f"resumed-{i}" for i in range(2)]
    procs = [
        start(command(task, cache, args, "--shard.index", str(i), "--shard.count", "2"), log)
        for i, log in enumerate(logs)
    ]
    resumed = [finish(p, log) for p, log in zip(procs, logs)]
    statuses = [next(iter(r["tasks"].values()))["status"] for r in resumed]
    after = (store / "shard-0-of-2.npy").stat()
    untouched = (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    again = vectors(task, cache, args)
    worst_resumed = float(abs(again - reference).max())
    passed = not finished and statuses == ["done", "encoded"] and untouched and worst_resumed <= 1e-6
    ok &= passed
    rows.append((
        f"shard 1 SIGKILLed {killed_at}, both rerun side by side",
        f"statuses {statuses}",
        f"shard 0 untouched: {untouched}; max |Δ| = {worst_resumed:.2e}",
        "resumed" if passed else "FAILED",
    ))  # fmt: skip

    name = Path(args.task).name
    print(
        f"\n`obliq encode` of {len(reference)} passages of {name} ({args.model}, {args.encoder} encoder, "
        f"{args.length} tokens)\n"
    )
    print("| run | time / status | result | check |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0 if ok else 1


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    sys.exit(main())
