"""Approximate and quantized search at the benchmark's scale: memory, build time, queries/s and recall
against exact search per index type, at 384 and 3072 dimensions, on a ≥ 500K-vector corpus; and the
peak RSS of ``obliq evaluate`` on such a corpus with an int8 or PQ index.

**Vectors.** The shared tasks' corpora hold ~10.8K documents, so real vectors do not suffice at 500K:

- real: all-MiniLM-L6-v2 (384-d) embeddings of every shared task's documents and queries (256 tokens);
- simulated beyond them (stated in every table): draws from a Gaussian with the real documents'
  mean and covariance (384-d). At a larger dimension D (3072) real and simulated vectors alike are
  lifted: ``x·Qᵀ + ε``, Q a random D × 384 matrix with orthonormal columns, ε isotropic noise carrying
  a quarter of the variance (an encoder's spectrum at 3072-d is not known here; this keeps the 384-d
  neighbourhood structure and adds full-rank noise).

The corpus (real documents first, then simulated ones, to ``--n``) is written into an obliq embedding
store (what ``obliq encode`` writes) for a synthetic task of ``--n`` documents, with ``--queries`` real
queries (lifted alike) as the queries. Each index configuration then runs in its own process
(``bench/vector_search.py one``): build or load the index (saved beside the store), search all queries
at once (queries/s) and one at a time (latency), recall@10/@100 against exact search on the same
queries (flat, computed once), the index file's size, the process's RSS after the build and its peak.

**evaluate.** ``--evaluate flat int8:rescore=4 ivf-pq:rescore=10`` runs ``obliq evaluate`` (top 100)
on the synthetic task with a randomly initialised one-layer BERT whose hidden size is the dimension
(it only encodes the queries: the corpus is the store, found by its fingerprint) and reports each
run's peak RSS (``wait4``); these runs come before the other configurations, so each builds its index
(training sample, codes) as a first evaluation would, then searches and runs exact search for its
recall.

Full size (the lead's run; hours on 2 cores, ~16 GB of disk)::

    python bench/vector_search.py --n 508000 --dims 384 3072 --queries 1000 --threads 2

Tiny (the smoke test)::

    python bench/vector_search.py --n 3000 --dims 384 512 --queries 20 --real_docs 60 \\
        --tasks ../shared/data/tasks/math-theoremqa --evaluate int8 --workdir /tmp/vs

Prints a table per dimension and writes ``<workdir>/results.json``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from obliq.eval.results import made_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DATA = Path(os.environ.get("OBLIQ_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "tasks"
CONFIGS = [
    "flat",
    "hnsw",
    "hnsw:ef_search=256",
    "hnsw-int8:rescore=2",
    "ivf-flat:nprobe=32",
    "ivf-flat:nprobe=128",
    "ivf-pq:nprobe=32,rescore=10",
    "int8",
    "int8:rescore=4",
    "binary:rescore=10",
    "binary:rescore=40",
]
"""``index[:key=value,…]``: an index name or factory string and its RetrievalSettings overrides."""
READ_TOKENS = 32  # the synthetic task's texts are a few words


def rss_mb() -> float:
    """This process's resident set now (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    """This process's peak resident set (VmHWM), MiB. (``ru_maxrss`` would also count the parent's
    resident set at the fork that started this process.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def parse_config(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    params = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        params[key.strip()] = int(value)
    return name, params


# ---------------------------------------------------------------------------------------------- vectors


def real_vectors(tasks: list[str], per_task: int | None, work: Path) -> tuple[np.ndarray, np.ndarray]:
    """MiniLM embeddings (unit, float32) of the tasks' documents (the first ``per_task`` of each) and
    queries, cached in ``work``."""
    docs_file, queries_file = work / "real-docs.npy", work / "real-queries.npy"
    if docs_file.is_file() and queries_file.is_file():
        return np.load(docs_file), np.load(queries_file)
    from obliq.search.encoders import load_encoder
    from obliq.tasks import find_tasks, load_task

    encoder = load_encoder("minilm")
    docs, queries = [], []
    for path in find_tasks(tasks):
        task = load_task(path)
        texts = task.doc_texts[:per_task] if per_task else task.doc_texts
        docs.append(encoder.encode(texts, kind="passage", batch_size=32, max_length=256).numpy())
        queries.append(encoder.encode(task.query_texts, kind="query", batch_size=32, max_length=256).numpy())
    docs, queries = np.concatenate(docs), np.concatenate(queries)
    np.save(docs_file, docs)
    np.save(queries_file, queries)
    return docs, queries


class Simulation:
    """Draws from a Gaussian fitted to real 384-d vectors, lifted to ``dim`` (see the module notes)."""

    def __init__(self, real: np.ndarray, dim: int, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.mean = real.mean(axis=0)
        cov = np.cov(real, rowvar=False)
        self.chol = np.linalg.cholesky(cov + 1e-6 * np.eye(len(cov)))
        self.dim, self.base = dim, real.shape[1]
        if dim > self.base:
            q, _ = np.linalg.qr(np.random.default_rng(seed + 1).standard_normal((dim, self.base)))
            self.lift = q  # (dim, base), orthonormal columns
            self.sigma = float(np.sqrt(np.trace(cov) / (3 * dim)))  # noise: a quarter of the variance
        elif dim < self.base:
            raise ValueError(f"--dims: {dim} is below the real vectors' {self.base}")

    def lifted(self, x: np.ndarray) -> np.ndarray:
        if self.dim == self.base:
            return x.astype(np.float32)
        noise = self.rng.standard_normal((len(x), self.dim), dtype=np.float32)
        return (x @ self.lift.T).astype(np.float32) + np.float32(self.sigma) * noise

    def draw(self, n: int) -> np.ndarray:
        return self.lifted(self.mean + self.rng.standard_normal((n, self.base)) @ self.chol.T)


def synthetic_task(folder: Path, n: int, queries: int) -> Path:
    """A task of ``n`` documents and ``queries`` queries with few-word texts and one random judgement each."""
    if (folder / "qrels" / "test.tsv").is_file():
        return folder
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with (folder / "corpus.jsonl").open("w") as f:
        for i in range(n):
            f.write(json.dumps({"_id": f"d{i}", "text": f"document number {i}"}) + "\n")
    with (folder / "queries.jsonl").open("w") as f:
        for i in range(queries):
            f.write(json.dumps({"_id": f"q{i}", "text": f"query number {i}"}) + "\n")
    rows = "".join(f"q{i}\td{int(rng.integers(n))}\t1\n" for i in range(queries))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows)
    (folder / "task.json").write_text(json.dumps({"name": folder.name}))
    return folder


def random_model(folder: Path, dim: int) -> Path:
    """A randomly initialised one-layer BERT of hidden size ``dim`` with MiniLM's tokenizer (mean pooling)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from obliq.aliases import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("minilm"))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=dim,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def settings(work: Path, **kw):
    from obliq.search.settings import RetrievalSettings

    return RetrievalSettings(
        cache_dir=work / "stores",
        query_max_length=READ_TOKENS,
        passage_max_length=READ_TOKENS,
        encoder="sentence-transformers",
        **kw,
    )


def prepare(work: Path, dim: int, n: int, n_queries: int, real: tuple[np.ndarray, np.ndarray]) -> dict:
    """The synthetic task, its model, the store of its corpus vectors and the query vectors for ``dim``."""
    from obliq.search.store import Store
    from obliq.shards import Shard
    from obliq.tasks import load_task

    task_dir = synthetic_task(work / f"task-{dim}", n, n_queries)
    model = random_model(work / f"model-{dim}", dim)
    task = load_task(task_dir)
    store = Store.of(str(model), settings(work), task)
    docs, queries = real
    n_real = min(len(docs), n)
    queries_file = work / f"queries-{dim}.npy"
    if store.done(Shard(0, 1)) is None or not queries_file.is_file():
        sim = Simulation(docs, dim)
        t0 = time.perf_counter()

        def blocks():
            yield sim.lifted(docs[:n_real])
            for start in range(n_real, n, 16384):
                yield sim.draw(min(16384, n - start))

        store.write(Shard(0, 1), task.doc_ids, blocks(), overwrite=True)
        order = np.random.default_rng(0).permutation(len(queries))[:n_queries]
        np.save(queries_file, sim.lifted(queries[order]))
        print(
            f"dim {dim}: wrote {n} vectors ({n_real} real) in {time.perf_counter() - t0:.0f} s to {store.folder}",
            flush=True,
        )
    return {"task": str(task_dir), "model": str(model), "store": str(store.folder), "queries": str(queries_file),
            "n_real": n_real}  # fmt: skip


# ---------------------------------------------------------------------------------------------- one index


def one(args) -> None:
    """One configuration in this process: build or load, search, recall against the exact reference."""
    from obliq.search.exact import ExactIndex, set_threads
    from obliq.search.faiss_index import VectorIndex, recall_vs_exact
    from obliq.search.store import Store
    from obliq.tasks import load_task

    set_threads(args.threads)
    work = Path(args.workdir)
    task = load_task(args.task)
    name, params = parse_config(args.config)
    spec = settings(work, index=name, top_k=args.k, **params).index_spec()
    rss0 = rss_mb()
    store = Store.of(args.model, settings(work), task)
    corpus = Store(args.store, store.fingerprint).open(task.doc_ids)
    queries = np.load(args.queries)
    t0 = time.perf_counter()
    index = VectorIndex(corpus, spec, folder=Path(args.store))
    build_s = time.perf_counter() - t0
    rss_built = rss_mb()
    t0 = time.perf_counter()
    scores, found = index.search(queries, args.k)
    batch_s = time.perf_counter() - t0
    single = []
    for q in queries[: args.single]:
        t1 = time.perf_counter()
        index.search(q[None], args.k)
        single.append((time.perf_counter() - t1) * 1e3)
    exact_file = Path(args.store) / f"exact-top{args.k}-{Path(args.queries).stem}.npy"
    if spec.exact:
        np.save(exact_file, found)
    exact = (
        np.load(exact_file) if exact_file.is_file() else ExactIndex(corpus, use_gpu=False).search(queries, args.k)[1]
    )
    info = index.describe()
    ks = [k for k in (10, 100) if k <= args.k]
    out = {
        "config": args.config,
        "factory": info.get("factory"),
        "params": {**info.get("params", {}), **({"rescore": spec.rescore} if spec.rescore else {})},
        "reused": info.get("reused", False),
        "build_s": round(build_s if not info.get("reused") else float(info.get("build_s") or 0), 2),
        "index_mb": round((info.get("bytes") or 0) / 2**20, 1),
        "rss_before_mb": round(rss0, 1),
        "rss_built_mb": round(rss_built, 1),
        "peak_rss_mb": round(peak_mb(), 1),
        "queries": len(queries),
        "batch_qps": round(len(queries) / batch_s, 2),
        "single_ms_p50": round(float(np.median(single)), 2) if single else None,
        **{k: round(v, 4) for k, v in recall_vs_exact(found, exact, ks).items()},
    }
    Path(args.out).write_text(json.dumps(out) + "\n")


def prepare_in_child(work: Path, dim: int, args) -> dict:
    """:func:`prepare` in its own process: this one stays small (numpy only), so that the ``wait4``
    peak of the ``evaluate`` processes it starts is theirs (a child's ``ru_maxrss`` counts the resident
    set its parent had when it forked)."""
    cmd = [sys.executable, __file__, "prepare", "--workdir", str(work), "--dim", str(dim), "--n", str(args.n),
           "--queries", str(args.queries), "--tasks", *args.tasks]  # fmt: skip
    if args.real_docs:
        cmd += ["--real_docs", str(args.real_docs)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    if done.returncode != 0:
        raise SystemExit(f"prepare {dim}: failed\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    print("\n".join(lines[:-1]), flush=True)  # what it did (the vectors written)
    return json.loads(lines[-1])


def run_one(work: Path, prepared: dict, config: str, args) -> dict:
    out = work / "lines" / f"{Path(prepared['store']).name}-{config.replace(':', '_').replace(',', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        __file__,
        "one",
        "--workdir", str(work),
        "--task", prepared["task"],
        "--model", prepared["model"],
        "--store", prepared["store"],
        "--queries", prepared["queries"],
        "--config", config,
        "--k", str(args.k),
        "--single", str(args.single),
        "--threads", str(args.threads),
        "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"{config}: failed\n{done.stderr[-2000:]}", flush=True)
        return {"config": config, "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------- evaluate


def evaluate_rss(work: Path, prepared: dict, index: str, args) -> dict:
    """``obliq evaluate`` on the synthetic task with ``index``; its peak RSS from ``wait4``."""
    name, params = parse_config(index)
    output = work / "evaluate" / f"{Path(prepared['store']).name}-{index.replace(':', '_')}"
    cmd = [
        sys.executable, "-m", "obliq.cli", "evaluate",
        "--model", prepared["model"],
        "--tasks", prepared["task"],
        "--output", str(output),
        "--overwrite", "true",
        "--latency_queries", "0",
        "--measures", "[NDCG@10,Recall@100]",
        "--retrieval.cache_dir", str(work / "stores"),
        "--retrieval.encoder", "sentence-transformers",
        "--retrieval.query_max_length", str(READ_TOKENS),
        "--retrieval.passage_max_length", str(READ_TOKENS),
        "--retrieval.top_k", "100",
        "--retrieval.index", name,
        "--retrieval.threads", str(args.threads),
        *[a for k, v in params.items() for a in (f"--retrieval.{k}", str(v))],
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})  # fmt: skip
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        print(f"evaluate {index}: failed\n{err[-2000:]}", flush=True)
        return {"index": index, "error": err.strip().splitlines()[-1] if err.strip() else f"status {status}"}
    summary = json.loads(next(output.glob("*/summary.json")).read_text())
    return {
        "index": index,
        "factory": summary.get("index", {}).get("factory"),
        "built": not summary.get("index", {}).get("reused", True),
        "build_s": summary.get("index", {}).get("build_s"),
        "corpus_cache": summary["corpus_cache"],
        "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),
        "wall_s": round(wall, 1),
        "recall_vs_exact": summary.get("index", {}).get("recall_vs_exact"),
    }


# ---------------------------------------------------------------------------------------------- main


def table(dim: int, n: int, n_real: int, rows: list[dict]) -> str:
    flat = next((r for r in rows if r.get("config") == "flat" and "error" not in r), None)
    lines = [
        f"\n### {dim} dimensions, {n:,} vectors ({n_real:,} real MiniLM document vectors"
        f"{', lifted' if dim > 384 else ''}; the rest simulated), {rows[0].get('queries', '?')} real queries",
        "",
        "| config | factory | parameters | build s | index MiB | RSS built MiB | peak RSS MiB | batch q/s | × flat | "
        "1 query ms | Recall@10 | Recall@100 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | failed: {r['error'][:80]} |")
            continue
        speed = f"{r['batch_qps'] / flat['batch_qps']:.1f}" if flat else "–"
        params = ", ".join(f"{k} {v}" for k, v in r["params"].items()) or "–"
        lines.append(
            f"| {r['config']} | {r['factory']} | {params} | {r['build_s']}{' (reused)' if r['reused'] else ''} | "
            f"{r['index_mb']} | {r['rss_built_mb']} | {r['peak_rss_mb']} | {r['batch_qps']} | {speed} | "
            f"{r['single_ms_p50']} | {r.get('Recall@10', '–')} | {r.get('Recall@100', '–')} |"
        )
    if flat:
        met = [r["config"] for r in rows if "error" not in r and r.get("Recall@100", 0) >= 0.95
               and r["batch_qps"] >= 10 * flat["batch_qps"]]  # fmt: skip
        lines.append(
            f"\nGoal (recall@100 ≥ 0.95 at ≥ 10× flat's queries/s): {'met by ' + ', '.join(met) if met else 'not met'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    p0 = sub.add_parser("prepare", help="vectors, task, model and store for one dimension (run by the main command)")
    p0.add_argument("--workdir", required=True)
    p0.add_argument("--dim", type=int, required=True)
    p0.add_argument("--n", type=int, required=True)
    p0.add_argument("--queries", type=int, required=True)
    p0.add_argument("--tasks", nargs="+", required=True)
    p0.add_argument("--real_docs", type=int, default=None)
    p1 = sub.add_parser("one", help="one configuration (run by the main command in its own process)")
    for name in ("workdir", "task", "model", "store", "queries", "config", "out"):
        p1.add_argument(f"--{name}", required=True)
    p1.add_argument("--k", type=int, default=100)
    p1.add_argument("--single", type=int, default=50)
    p1.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", default="runs/bench/vector-search")
    parser.add_argument("--n", type=int, default=508_000, help="corpus vectors")
    parser.add_argument("--dims", type=int, nargs="+", default=[384, 3072])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--single", type=int, default=50, help="queries timed one at a time")
    parser.add_argument("--configs", nargs="+", default=CONFIGS)
    parser.add_argument(
        "--evaluate", nargs="*", default=["flat", "int8:rescore=4", "ivf-pq:rescore=10"], help="evaluate's indexes"
    )
    parser.add_argument("--tasks", nargs="+", default=[str(DATA)], help="the tasks whose vectors are real")
    parser.add_argument("--real_docs", type=int, default=None, help="documents per task encoded (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "one":
        return one(args)
    if args.command == "prepare":
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        real = real_vectors(args.tasks, args.real_docs, work)
        if len(real[1]) < args.queries:
            raise SystemExit(f"--queries {args.queries}: the tasks hold only {len(real[1])} queries")
        print(json.dumps(prepare(work, args.dim, args.n, args.queries, real)))
        return None
    if args.configs[0] != "flat":
        args.configs = ["flat", *[c for c in args.configs if c != "flat"]]  # the exact reference first
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    results = {"n": args.n, "queries": args.queries, "k": args.k, "threads": args.threads, "dims": {}}
    for dim in args.dims:
        prepared = prepare_in_child(work, dim, args)
        rows = [run_one(work, prepared, args.configs[0], args)]  # flat: the exact reference
        # evaluate before the other configurations, so that it builds its index as a first evaluation would
        evaluated = [evaluate_rss(work, prepared, ix, args) for ix in args.evaluate]
        for config in args.configs[1:]:
            rows.append(run_one(work, prepared, config, args))
            print(json.dumps(rows[-1]), flush=True)
        results["dims"][dim] = {"prepared": prepared, "indexes": rows, "evaluate": evaluated}
        print(table(dim, args.n, prepared["n_real"], rows), flush=True)
        if evaluated:
            print(
                f"\n`obliq evaluate` on {args.n:,} × {dim} (peak RSS, wait4; its queries are the random model's"
                " encodings of the task's texts, not the real queries above, so its recall is not comparable):\n"
            )
            print("| index | factory | index built here (s) | corpus cache | peak RSS GB | wall s | recall vs exact |")
            print("|---|---|---|---|---:|---:|---|")
            for e in evaluated:
                if "error" in e:
                    print(f"| {e['index']} | failed: {e['error'][:80]} |")
                    continue
                built = f"yes ({e['build_s']})" if e["built"] and e["factory"] != "Flat" else "–"
                cells = [e["index"], e["factory"], built, e["corpus_cache"], e["peak_rss_gb"], e["wall_s"]]
                print("| " + " | ".join(map(str, [*cells, e["recall_vs_exact"]])) + " |")
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {work / 'results.json'}")


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
