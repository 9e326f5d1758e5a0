"""Evaluate a retriever on tasks: encode, search, score, and write the files (DESIGN.md, "Formats").

Per task, under ``<output>/<task name>/``:

- ``run.trec``: the top ``top_k`` documents of every query (TREC run format);
- ``per_query.jsonl``: one line per evaluated query and qrels split (``test`` = gold, ``pooled``);
- ``summary.json``: ``{"task", "mechanism", "model", "metrics", "n_queries", "n_excluded", …}``
  with the pooled metrics, the Recall@k curve, the time per stage and latency p50/p95.

Over all tasks, under ``<output>/``: ``results.md`` (a markdown table), ``recall_at_k.png`` (the
Recall@k curve, k = 10…1000, the OBLIQ-IR paper §6.1) and ``config.json`` (the arguments).

With ``rerank`` (a policy file, :mod:`obliq.rerank.config`), the dense top-N of each task the policy
names is reranked by its language-model reranker before scoring (the OBLIQ-IR paper, §3.4, Table 5):
``run.trec`` is then the reranked run, ``run.dense.trec`` the dense one, and the summary's
``rerank`` entry holds the method, the prompt file, the dense metrics and the cost (calls, tokens
in/out, seconds; totals and per query, the paper's Table 8); ``results.md`` gets a reranking table
and the policy, as loaded (its relative paths made absolute), is written to
``<output>/rerank_policy.yaml``. Tasks the policy does not name keep the dense run.

Dense retrieval encodes passages and queries with their own max lengths (1024 / 256, the paper
§4), caches corpus embeddings on disk keyed by the model's files and the corpus file's digest, and
searches exactly with :mod:`obliq.eval.index`. BM25 uses :mod:`obliq.eval.bm25`. Metrics follow
:mod:`obliq.eval.metrics` (trec_eval conventions; queries without relevant documents excluded).

Latency (the paper §6.4) is measured per query, one query at a time after one warm-up query, on the
first ``latency_queries`` queries: query encoding (BM25: tokenizing) and search, in ms.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Callable, Sequence

import numpy as np

from obliq.eval.bm25 import B, BM25, K1
from obliq.eval.encoders import Encoder, EncoderKind, fingerprint, load_encoder
from obliq.eval.index import DenseIndex, unit_float32
from obliq.eval.metrics import (
    DEFAULT_MEASURES,
    RECALL_CURVE_K,
    Run,
    evaluate_run,
    parse_measures,
    run_from_search,
    write_run,
)
from obliq.eval.tasks import Task, load_task

log = logging.getLogger(__name__)

SPLIT_NAMES = {"test": "gold", "pooled": "pooled"}


@dataclass
class Retrieval:
    """What retrieving one task produced."""

    run: Run
    timing_s: dict[str, float]
    """Wall time of ``encode_corpus``, ``encode_queries`` and ``search`` (whole task), seconds."""
    latency_ms: dict[str, list[float]] = field(default_factory=dict)
    """Per-query samples of ``query_encoding`` and ``search``, milliseconds."""
    corpus_cache: str = "off"
    """``hit``, ``miss`` or ``off``."""
    dense_run: Run | None = None
    """The run before reranking (None when not reranked)."""
    rerank: dict = field(default_factory=dict)
    """What reranking did (method, depth, backend, cost); empty without a policy."""


def _latency(texts: Sequence[str], encode_one: Callable, search_one: Callable) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"query_encoding": [], "search": []}
    if texts:
        search_one(encode_one(texts[0]))  # warm-up, not counted
    for text in texts:
        t0 = perf_counter()
        q = encode_one(text)
        t1 = perf_counter()
        search_one(q)
        t2 = perf_counter()
        samples["query_encoding"].append((t1 - t0) * 1e3)
        samples["search"].append((t2 - t1) * 1e3)
    return samples


def corpus_cache_file(cache_dir: Path, model_key: str, task: Task) -> Path:
    """Where a task's corpus embeddings for a model are cached: ``<cache_dir>/<task>-<key>.npy``.

    ``model_key`` must change whenever the vectors would (model files, encoder kind, passage max
    length); the key also covers the corpus file's SHA-256.
    """
    key = hashlib.sha256(f"{model_key}|{task.corpus_sha256}".encode()).hexdigest()[:20]
    return Path(cache_dir) / f"{task.name}-{key}.npy"


def _save_atomic(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def retrieve_dense(
    encoder: Encoder,
    task: Task,
    top_k: int = 1000,
    batch_size: int = 32,
    cache: Path | None = None,
    latency_queries: int = 100,
) -> Retrieval:
    """Encode the corpus (or read it from ``cache``) and the queries, then search exactly.

    Args:
        encoder: anything with ``encode(texts, kind, batch_size)``.
        task: the task.
        top_k: documents kept per query (capped at the corpus size).
        batch_size: texts per forward pass.
        cache: an ``.npy`` file for the corpus embeddings (see :func:`corpus_cache_file`);
            None encodes every time.
        latency_queries: queries timed one at a time (0 skips the latency measurement).

    Returns:
        The run (cosine scores) with its timings.
    """
    timing: dict[str, float] = {}
    t = perf_counter()
    docs, status = None, "off"
    if cache is not None:
        status = "miss"
        if cache.is_file():
            docs = np.load(cache)
            if docs.ndim != 2 or docs.shape[0] != len(task.doc_ids):
                log.warning("%s: cached embeddings have shape %s for %d docs; re-encoding", cache, docs.shape, len(task.doc_ids))
                docs = None
            else:
                status = "hit"
    if docs is None:
        docs = unit_float32(encoder.encode(task.doc_texts, kind="passage", batch_size=batch_size), "corpus embeddings")
        if cache is not None:
            _save_atomic(cache, docs)
    timing["encode_corpus"] = perf_counter() - t

    t = perf_counter()
    queries = encoder.encode(task.query_texts, kind="query", batch_size=batch_size)
    timing["encode_queries"] = perf_counter() - t

    t = perf_counter()
    index = DenseIndex(docs)
    scores, indices = index.search(queries, top_k)
    timing["search"] = perf_counter() - t

    latency = _latency(
        task.query_texts[:latency_queries],
        lambda text: encoder.encode([text], kind="query", batch_size=1),
        lambda q: index.search(q, top_k),
    )
    return Retrieval(run_from_search(task.query_ids, task.doc_ids, scores, indices), timing, latency, status)


def retrieve_bm25(
    task: Task,
    top_k: int = 1000,
    k1: float = K1,
    b: float = B,
    stemmer: str | None = "english",
    latency_queries: int = 100,
) -> Retrieval:
    """BM25 retrieval of a task (see :mod:`obliq.eval.bm25` for the scoring and text analysis).

    Timings: ``encode_corpus`` = tokenizing and indexing, ``encode_queries`` = tokenizing queries.
    """
    timing: dict[str, float] = {}
    t = perf_counter()
    index = BM25(task.doc_texts, k1=k1, b=b, stemmer=stemmer)
    timing["encode_corpus"] = perf_counter() - t
    t = perf_counter()
    tokens = index.tokenize(task.query_texts)
    timing["encode_queries"] = perf_counter() - t
    t = perf_counter()
    hits = [index.search_tokens(q, top_k) for q in tokens]
    timing["search"] = perf_counter() - t
    latency = _latency(
        task.query_texts[:latency_queries],
        lambda text: index.tokenize([text])[0],
        lambda q: index.search_tokens(q, top_k),
    )
    run = run_from_search(task.query_ids, task.doc_ids, [h[0] for h in hits], [h[1] for h in hits])
    return Retrieval(run, timing, latency, "off")


def _percentiles(samples: list[float]) -> dict:
    if not samples:
        return {"p50": None, "p95": None, "n": 0}
    p50, p95 = np.percentile(samples, [50, 95])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "n": len(samples)}


def evaluate_task(
    task: Task,
    retrieval: Retrieval,
    output: Path,
    model: str,
    measures: str | Sequence[str] = DEFAULT_MEASURES,
) -> dict:
    """Score a task's run under each qrels split and write its files into ``output``.

    Returns:
        The summary written to ``summary.json``.
    """
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    panel = list(parse_measures(measures))
    curve = {k: f"Recall@{k}" for k in RECALL_CURVE_K}
    names = panel + [c for c in curve.values() if c not in panel]
    write_run(output / "run.trec", retrieval.run, tag=Path(model).name or model)

    t = perf_counter()
    results = {split: evaluate_run(qrels, retrieval.run, names, task.query_ids) for split, qrels in task.qrels.items()}
    timing = dict(retrieval.timing_s, metrics=perf_counter() - t)

    with (output / "per_query.jsonl").open("w", encoding="utf-8") as f:
        for split, ev in results.items():
            for qid, values in ev.per_query.items():
                f.write(json.dumps({"query_id": qid, "qrels": SPLIT_NAMES[split], **{n: values[n] for n in panel}}) + "\n")

    gold = results["test"]
    rerank = dict(retrieval.rerank)
    if retrieval.dense_run is not None:
        write_run(output / "run.dense.trec", retrieval.dense_run, tag=Path(model).name or model)
        rerank["dense_metrics"] = evaluate_run(task.qrels["test"], retrieval.dense_run, panel, task.query_ids).aggregate
    summary = {
        "task": task.name,
        "mechanism": task.mechanism,
        "model": model,
        "metrics": {n: gold.aggregate[n] for n in panel},
        "n_queries": gold.n_queries,
        "n_excluded": gold.n_excluded,
        "n_docs": len(task.doc_ids),
        "recall_curve": {str(k): gold.aggregate[name] for k, name in curve.items()},
        "timing_s": {k: round(v, 4) for k, v in timing.items()},
        "latency_ms": {k: _percentiles(v) for k, v in retrieval.latency_ms.items()},
        "corpus_cache": retrieval.corpus_cache,
        "validation": task.report,
        **({"rerank": rerank} if rerank else {}),
    }
    if "pooled" in results:
        pooled = results["pooled"]
        summary["pooled"] = {
            "metrics": {n: pooled.aggregate[n] for n in panel},
            "n_queries": pooled.n_queries,
            "n_excluded": pooled.n_excluded,
        }
    (output / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s on %s: %s (%d queries, %d excluded)", model, task.name,
             ", ".join(f"{n}={v:.4f}" for n, v in summary["metrics"].items()), gold.n_queries, gold.n_excluded)
    return summary


def write_report(summaries: list[dict], output: Path) -> None:
    """Write ``results.md`` (metrics, time per stage, latency) and ``recall_at_k.png`` over all tasks."""
    from matplotlib.figure import Figure

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    if not summaries:
        return
    panel = list(summaries[0]["metrics"])
    fmt = lambda v: "–" if v is None or v != v else f"{v:.4f}"  # noqa: E731  (NaN → dash)
    lines = [f"# Retrieval results: {summaries[0]['model']}", "",
             "| task | mechanism | qrels | queries | excluded | " + " | ".join(panel) + " |",
             "|---|---|---|---:|---:|" + "---:|" * len(panel)]
    for s in summaries:
        rows = [("gold", s)] + ([("pooled", s["pooled"])] if "pooled" in s else [])
        for label, r in rows:
            lines.append(f"| {s['task']} | {s['mechanism'] or ''} | {label} | {r['n_queries']} | {r['n_excluded']} | "
                         + " | ".join(fmt(r["metrics"][n]) for n in panel) + " |")
    lines += ["", "Time per stage (s) and latency per query (ms, p50 / p95):", "",
              "| task | docs | encode corpus | encode queries | search | metrics | corpus cache | "
              "query encoding p50 / p95 | search p50 / p95 |",
              "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for s in summaries:
        t, lat = s["timing_s"], s["latency_ms"]
        pct = lambda k: f"{lat[k]['p50']} / {lat[k]['p95']}" if lat.get(k, {}).get("n") else "–"  # noqa: E731
        lines.append(f"| {s['task']} | {s['n_docs']} | {t['encode_corpus']:.2f} | {t['encode_queries']:.2f} | "
                     f"{t['search']:.2f} | {t['metrics']:.2f} | {s['corpus_cache']} | "
                     f"{pct('query_encoding')} | {pct('search')} |")
    reranked = [s for s in summaries if "dense_metrics" in s.get("rerank", {})]
    if reranked:
        m = panel[0]
        lines += ["", f"Reranking (gold {m} before / after; cost per reranked query, and failed and repaired "
                  "calls out of all calls):", "",
                  f"| task | method | depth | dense {m} | reranked {m} | queries | calls / query | tokens in / query | "
                  "tokens out / query | seconds / query | failed / all calls | repaired / all calls |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in reranked:
            r, c, q = s["rerank"], s["rerank"]["cost"], s["rerank"]["cost"]["per_query"]
            lines.append(f"| {s['task']} | {r['method']} | {r['depth']} | {fmt(r['dense_metrics'][m])} | "
                         f"{fmt(s['metrics'][m])} | {c['queries']} | {q['calls']:.1f} | {q['prompt_tokens']:.0f} | "
                         f"{q['new_tokens']:.0f} | {q['seconds']:.2f} | {c['failed_calls']} / {c['calls']} | "
                         f"{c['repaired_calls']} / {c['calls']} |")
    (output / "results.md").write_text("\n".join(lines) + "\n")

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for s in summaries:
        ks = [int(k) for k in s["recall_curve"]]
        ax.plot(ks, list(s["recall_curve"].values()), marker="o", label=s["task"])
    ax.set(xscale="log", xlabel="k", ylabel="Recall@k (gold)", ylim=(0, 1.02), title=summaries[0]["model"])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(output / "recall_at_k.png", dpi=120)


def evaluate_tasks(
    retrieve: Callable[[Task], Retrieval],
    tasks: Sequence[Task],
    output: Path,
    model: str,
    measures: str | Sequence[str] = DEFAULT_MEASURES,
) -> list[dict]:
    """Retrieve and score every task, write each task's files and the report over all of them.

    Raises:
        ValueError: two tasks share a name (their files would collide).
    """
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be unique, got {names}")
    summaries = [evaluate_task(t, retrieve(t), Path(output) / t.name, model, measures) for t in tasks]
    write_report(summaries, output)
    return summaries


def with_reranking(retrieve: Callable[[Task], Retrieval], reranker) -> Callable[[Task], Retrieval]:
    """Wrap a retrieval function so that each task's run goes through the policy's reranker.

    Args:
        retrieve: task → dense :class:`Retrieval`.
        reranker: an :class:`obliq.rerank.reranker.Reranker` (its config is the policy).

    Returns:
        task → :class:`Retrieval` whose ``run`` is reranked (``dense_run`` keeps the dense one) for the
        tasks the policy names with a reranker; ``rerank`` records the method, the prompt file and
        the cost.
    """
    cfg = reranker.config

    def wrapped(task: Task) -> Retrieval:
        retrieval = retrieve(task)
        method = cfg.method(task.name)
        if method == "identity":
            return replace(retrieval, rerank={"method": "identity"})
        run, stats = reranker.rerank_run(task, retrieval.run, method)
        info = {"method": method, "depth": cfg.depth, "backend": f"{cfg.backend.name}:{cfg.backend.model}",
                "prompt": cfg.prompt(method, task.name).path, "cost": stats.as_dict()}
        return replace(retrieval, run=run, dense_run=retrieval.run, rerank=info)

    return wrapped


def find_tasks(paths: Sequence[str | Path]) -> list[Path]:
    """Task folders from paths that are task folders or folders of task folders (sorted).

    Raises:
        FileNotFoundError: a path is neither.
    """
    out = []
    for p in map(Path, paths):
        if (p / "corpus.jsonl").is_file():
            out.append(p)
        elif p.is_dir() and (subs := sorted(s for s in p.iterdir() if (s / "corpus.jsonl").is_file())):
            out.extend(subs)
        else:
            raise FileNotFoundError(f"{p}: not a task folder (no corpus.jsonl) nor a folder of task folders")
    return out


def evaluate(
    model: str,
    tasks: list[str],
    output: Path,
    encoder: EncoderKind = "auto",
    top_k: int = 1000,
    batch_size: int = 32,
    query_max_length: int = 256,
    passage_max_length: int = 1024,
    measures: str | list[str] = list(DEFAULT_MEASURES),
    cache: bool = True,
    cache_dir: Path | None = None,
    latency_queries: int = 100,
    bm25_k1: float = K1,
    bm25_b: float = B,
    bm25_stemmer: str | None = "english",
    trust_remote_code: bool = False,
    rerank: Path | None = None,
) -> list[dict]:
    """Evaluate a model (or BM25) on tasks and write runs, metrics, a table and a Recall@k plot.

    Args:
        model: ``bm25``; a folder saved by obliq (``BiEncoder.save_pretrained``: full model or
            LoRA adapter); a peft adapter folder; a sentence-transformers or transformers folder;
            an alias (``minilm``); or a hub id (needs the hub cache offline).
        tasks: task folders in BEIR layout, or folders holding task folders.
        output: folder for the results.
        encoder: ``auto`` (from the model's files), ``obliq`` (BiEncoder: ``query: ``/``passage: ``
            prefixes, mean pooling) or ``sentence-transformers`` (the model's own pooling and prompts).
        top_k: documents retrieved per query (the Recall@1000 panel needs 1000).
        batch_size: texts per forward pass.
        query_max_length: query truncation in tokens (the paper §4: 256).
        passage_max_length: passage truncation in tokens (the model card: 1024).
        measures: metrics reported (trec_eval names accepted), e.g. ``[NDCG@10,Recall@100]``.
        cache: cache corpus embeddings on disk, keyed by the model's files and the corpus.
        cache_dir: where; default ``$OBLIQ_CACHE/embeddings`` (``~/.cache/obliq/embeddings``).
        latency_queries: queries timed one at a time for latency p50/p95 (0: none).
        bm25_k1: BM25 k1 (Anserini's default 0.9).
        bm25_b: BM25 b (Anserini's default 0.4).
        bm25_stemmer: PyStemmer language for BM25, or null for unstemmed tokens.
        trust_remote_code: let the model run its own code (only for models you trust).
        rerank: a reranking policy file (configs/rerank/…, or one written by ``obliq rerank
            policy``): the tasks it names get their reranker over the dense top-N; the others keep
            the dense run. Cost (calls, tokens, seconds per query) is reported next to the metrics.

    Returns:
        One summary per task (as written to ``summary.json``).
    """
    config = dict(locals())
    from obliq.models import cache_dir as obliq_cache

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    loaded = [load_task(p) for p in find_tasks(tasks)]
    parse_measures(measures)  # fail before any encoding
    policy = None
    if rerank is not None:
        from obliq.rerank.config import dump_policy, load_policy

        policy = load_policy(rerank)  # fail before any encoding (its prompt files are checked too)
        dump_policy(policy, output / "rerank_policy.yaml", f"The reranking policy {rerank}, as loaded by evaluate.py.")
        unknown = sorted(set(policy.tasks) - {t.name for t in loaded})
        if unknown:
            log.warning("%s names tasks not evaluated here: %s", rerank, ", ".join(unknown))

    if model.lower() == "bm25":
        retrieve = partial(retrieve_bm25, top_k=top_k, k1=bm25_k1, b=bm25_b, stemmer=bm25_stemmer,
                           latency_queries=latency_queries)
        name = "bm25"
    else:
        enc = load_encoder(model, encoder, query_max_length, passage_max_length, trust_remote_code)
        model_key = f"{fingerprint(model)}|{type(enc).__name__}|{encoder}|{passage_max_length}"
        folder = Path(cache_dir) if cache_dir is not None else obliq_cache() / "embeddings"

        def retrieve(task: Task) -> Retrieval:
            file = corpus_cache_file(folder, model_key, task) if cache else None
            return retrieve_dense(enc, task, top_k, batch_size, file, latency_queries)

        name = model
    if policy is not None:
        from obliq.rerank.reranker import Reranker

        retrieve = with_reranking(retrieve, Reranker(policy))
    return evaluate_tasks(retrieve, loaded, output, name, measures)
