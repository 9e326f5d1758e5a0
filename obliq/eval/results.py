"""Score a retriever's runs on tasks and write the result files (docs/formats.md).

Per task, under ``<output>/<task name>/``:

- ``run.trec``: the retrieved documents of every query (TREC run format);
- ``per_query.jsonl``: one line per evaluated query and qrels split (``test`` = gold, ``pooled``);
- ``summary.json``: ``{"task", "mechanism", "model", "metrics", "n_queries", "n_excluded", …}``
  with the pooled metrics, the Recall@k curve, the time per stage and latency p50/p95, what the main
  qrels are (``judgements``: gold, or pooled as in mteb's OBLIQ-Bench Twitter / WildChat / Math), and
  what each query was ranked over (``ranking``: the corpus, or its candidate set with their sizes).

Over all tasks, under ``<output>/``: ``results.md`` (a markdown table) and ``recall_at_k.png`` (the
Recall@k curve, k = 10…1000, the OBLIQ-IR paper §6.1).

Retrieval itself is :mod:`obliq.search.retrieval`; metrics follow :mod:`obliq.eval.metrics`
(trec_eval conventions; queries without relevant documents excluded). A retrieval that was reranked
(:class:`~obliq.search.retrieval.Retrieval` with a ``dense_run``) also writes ``run.dense.trec`` and
the dense metrics and cost in the summary's ``rerank`` entry, and ``results.md`` gets a reranking table.
"""

from __future__ import annotations

import functools
import json
import logging
import platform
import re
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from obliq.eval.metrics import DEFAULT_MEASURES, RECALL_CURVE_K, check_depth, evaluate_run, parse_measures
from obliq.files import json_text, read_text, safe_name, write_json
from obliq.search.runs import write_run
from obliq.tasks import Task

if TYPE_CHECKING:  # torch comes with them: a benchmark's parent process (made_with) stays on numpy
    from obliq.search.retrieval import Retrieval, Retriever

log = logging.getLogger(__name__)

SPLIT_NAMES = {"test": "gold", "pooled": "pooled"}


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: ``|`` escaped, control characters (a newline) shown as ``?``."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", str(text)).replace("|", "\\|")


def _exported_from(model) -> dict | None:
    """:func:`obliq.model.checkpoint.exported_from` of a model folder; None for anything else (BM25, a run
    file, an encoder in memory), without importing that module (and torch) for it."""
    if not isinstance(model, str) or not Path(model).is_dir():
        return None
    from obliq.model.checkpoint import exported_from

    return exported_from(model)


def _percentiles(samples: list[float]) -> dict:
    if not samples:
        return {"p50": None, "p95": None, "n": 0}
    p50, p95 = np.percentile(samples, [50, 95])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "n": len(samples)}


def write_retrieval(task: Task, retrieval: Retrieval, output: Path, model: str) -> dict:
    """Write a task's run into ``output`` (``run.trec``; ``run.dense.trec`` too when reranked, its run
    before reranking), tagged with the model's name: the files ``evaluate`` and ``obliq search`` share.

    Returns:
        What the retrieval itself records (``obliq search``'s ``search.json``): ``task``, ``model``,
        ``n_queries``, ``n_docs``, ``depth``, ``corpus_cache``, ``index``, ``timing_s`` (rounded),
        ``latency_ms`` (every sample), ``reads``.
    """
    output = Path(output)
    tag = Path(model).name or model
    write_run(output / "run.trec", retrieval.run, tag=tag, task=task)  # with the corpus it ranked
    if retrieval.dense_run is not None:
        write_run(output / "run.dense.trec", retrieval.dense_run, tag=tag, task=task)
    return {
        "task": task.name,
        "model": model,
        "n_queries": len(task.query_ids),
        "n_docs": len(task.doc_ids),
        "depth": retrieval.depth,
        "corpus_cache": retrieval.corpus_cache,
        "index": retrieval.index,
        "timing_s": {k: round(v, 4) for k, v in retrieval.timing_s.items()},
        "latency_ms": retrieval.latency_ms,
        "reads": retrieval.reads,
    }


def evaluate_task(
    task: Task,
    retrieval: Retrieval,
    output: Path,
    model: str,
    measures: str | Sequence[str] = DEFAULT_MEASURES,
) -> dict:
    """Score a task's run under each qrels split and write its files into ``output``.

    The Recall@k curve stops where the ranking stops: a cut-off k is kept when the ranking's depth
    (``retrieval.depth``) reaches ``min(k, corpus size)``.

    Returns:
        The summary written to ``summary.json``.

    Raises:
        ValueError: a measure cuts deeper than the ranking (:func:`obliq.eval.metrics.check_depth`).
    """
    output = Path(output)
    panel = list(parse_measures(measures))
    ranking = {"over": "corpus"}
    if task.candidates is not None:
        sizes = [len(task.candidates.get(q, ())) for q in task.query_ids]
        ranking = {
            "over": "candidates",
            "file": task.report.get("candidates", {}).get("file"),
            "queries_without_candidates": sizes.count(0),
            "min": min(sizes),
            "mean": round(sum(sizes) / len(sizes), 2),
            "max": max(sizes),
        }
    n_docs = task.max_ranked
    check_depth(panel, retrieval.depth, n_docs, "the ranking depth")
    output.mkdir(parents=True, exist_ok=True)
    curve = {k: f"Recall@{k}" for k in RECALL_CURVE_K if retrieval.depth >= min(k, n_docs)}
    names = panel + [c for c in curve.values() if c not in panel]
    write_retrieval(task, retrieval, output, model)

    t = perf_counter()
    results = {split: evaluate_run(qrels, retrieval.run, names, task.query_ids) for split, qrels in task.qrels.items()}
    timing = dict(retrieval.timing_s, metrics=perf_counter() - t)

    main = next(iter(task.qrels))  # the task's required split: test (gold), or e.g. dev
    labels = {**SPLIT_NAMES, main: task.judgements if main == "test" else main}
    with (output / "per_query.jsonl").open("w", encoding="utf-8") as f:
        for split, ev in results.items():
            for qid, values in ev.per_query.items():
                row = {"query_id": qid, "qrels": labels.get(split, split), **{n: values[n] for n in panel}}
                f.write(json_text(row, indent=None) + "\n")

    gold = results[main]
    rerank = dict(retrieval.rerank)
    if retrieval.dense_run is not None:
        rerank["dense_metrics"] = evaluate_run(task.qrels[main], retrieval.dense_run, panel, task.query_ids).aggregate
    summary = {
        "task": task.name,
        "mechanism": task.mechanism,
        "model": model,
        "qrels": main,
        "judgements": labels[main],
        "ranking": ranking,
        "metrics": {n: gold.aggregate[n] for n in panel},
        "n_queries": gold.n_queries,
        "n_excluded": gold.n_excluded,
        # evaluated queries the ranking holds nothing for (a run file that misses them): they score 0
        "n_without_results": sum(1 for q in gold.per_query if not retrieval.run.get(q)),
        "n_docs": len(task.doc_ids),
        "recall_curve": {str(k): gold.aggregate[name] for k, name in curve.items()},
        "timing_s": {k: round(v, 4) for k, v in timing.items()},
        "latency_ms": {k: _percentiles(v) for k, v in retrieval.latency_ms.items()},
        "corpus_cache": retrieval.corpus_cache,
        "reads": retrieval.reads,
        **({"index": retrieval.index} if retrieval.index else {}),
        "validation": task.report,
        "environment": environment(),
        # an exported model's record of its checkpoint (what `obliq export --results` matches), else None
        "model_export": _exported_from(model),
        **({"rerank": rerank} if rerank else {}),
    }
    if "pooled" in results:
        pooled = results["pooled"]
        summary["pooled"] = {
            "metrics": {n: pooled.aggregate[n] for n in panel},
            "n_queries": pooled.n_queries,
            "n_excluded": pooled.n_excluded,
        }
    write_json(output / "summary.json", summary)
    log.info(
        "%s on %s: %s (%d queries, %d excluded)",
        model,
        task.name,
        ", ".join(f"{n}={v:.4f}" for n, v in summary["metrics"].items()),
        gold.n_queries,
        gold.n_excluded,
    )
    return summary


def read_per_query(path: str | Path, measure: str = "NDCG@10", qrels: str | None = None) -> dict[str, float]:
    """Query id → ``measure`` under one qrels split (``gold`` or ``pooled``; None: the task's main
    qrels, the file's first label — ``pooled`` for a task whose main judgements are pooled), read from
    a ``per_query.jsonl`` written by :func:`evaluate_task`: the input of paired comparisons
    (:func:`obliq.eval.significance.compare`).

    Raises:
        ValueError: a line that is not JSON, or lacks the measure (file and line named).
    """
    out = {}
    for n, line in enumerate(read_text(path).splitlines(), 1):
        try:
            row = json.loads(line)
            qrels = row["qrels"] if qrels is None else qrels
            if row["qrels"] == qrels:
                out[row["query_id"]] = float(row[measure])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{n}: not a per-query line with {measure} ({type(err).__name__}: {err})") from None
    return out


def reads_text(reads: dict | None) -> str:
    """How a system read the texts, in words: ``query prefix 'query: ' ≤ 256 tokens, passage prefix
    'passage: ' ≤ 256 tokens`` (dense; with its windows, issue 55), the BM25 settings, or what else the retrieval
    recorded."""
    if not reads:
        return "unknown"
    if "query_prefix" in reads:
        w = reads.get("windows")
        return (
            f"query prefix {reads['query_prefix']!r} ≤ {reads['query_max_length']} tokens, passage prefix "
            f"{reads['passage_prefix']!r} ≤ {reads['passage_max_length']} tokens"
        ) + (
            f"; longer texts in windows of {w['size']} tokens, stride {w['stride']}, {w['reduce']}"
            f"{' (queries too)' if w.get('queries') else ' (passages)'}, at most {w['max_windows']} a text"
            if w
            else ""
        )
    return ", ".join(f"{k} {v}" for k, v in reads.items())


def write_report(summaries: list[dict], output: Path) -> None:
    """Write ``results.md`` (metrics, time per stage, latency) and ``recall_at_k.png`` over all tasks."""
    from matplotlib.figure import Figure

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    if not summaries:
        return
    panel = list(summaries[0]["metrics"])
    fmt = lambda v: "–" if v is None or v != v else f"{v:.4f}"  # noqa: E731  (NaN → dash)
    lines = [
        f"# Retrieval results: {summaries[0]['model']}",
        "",
        f"Texts read as: {reads_text(summaries[0].get('reads'))}.",
        "",
        "| task | mechanism | qrels | queries | excluded | " + " | ".join(panel) + " |",
        "|---|---|---|---:|---:|" + "---:|" * len(panel),
    ]
    for s in summaries:
        rows = [(s.get("judgements", "gold"), s)] + ([("pooled", s["pooled"])] if "pooled" in s else [])
        for label, r in rows:
            lines.append(
                f"| {_cell(s['task'])} | {s['mechanism'] or ''} | {label} | {r['n_queries']} | {r['n_excluded']} | "
                + " | ".join(fmt(r["metrics"][n]) for n in panel)
                + " |"
            )
    ranked = [s for s in summaries if s.get("ranking", {}).get("over") == "candidates"]
    if ranked:
        lines += [""] + [
            f"{_cell(s['task'])}: each query ranked over its candidate set only ({r['file']}; {r['min']}–{r['max']} "
            f"documents, mean {r['mean']}); judged documents outside it still count in the ideal DCG and recall."
            for s in ranked
            for r in [s["ranking"]]
        ]
    lines += [
        "",
        "Time per stage (s) and latency per query (ms, p50 / p95):",
        "",
        "| task | docs | encode corpus | encode queries | search | metrics | corpus cache | "
        "query encoding p50 / p95 | search p50 / p95 |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for s in summaries:
        t, lat = s["timing_s"], s["latency_ms"]
        pct = lambda k: f"{lat[k]['p50']} / {lat[k]['p95']}" if lat.get(k, {}).get("n") else "–"  # noqa: E731
        sec = lambda k: f"{t[k]:.2f}" if k in t else "–"  # noqa: E731  (a run read from a file has no stages)
        lines.append(
            f"| {_cell(s['task'])} | {s['n_docs']} | {sec('encode_corpus')} | {sec('encode_queries')} | "
            f"{sec('search')} | {sec('metrics')} | {s['corpus_cache']} | {pct('query_encoding')} | {pct('search')} |"
        )
    searched = [s for s in summaries if "recall_vs_exact" in s.get("index", {})]
    if searched:
        ks = [k for k in searched[0]["index"]["recall_vs_exact"] if k.startswith("Recall@")]
        lines += [
            "",
            "Approximate search (recall of exact search's top-k on the same queries):",
            "",
            "| task | index | factory | dim | parameters | rescore | "
            + " | ".join(f"{k} vs exact" for k in ks)
            + " | queries |",
            "|---|---|---|---:|---|---:|" + "---:|" * len(ks) + "---:|",
        ]
        for s in searched:
            ix, r = s["index"], s["index"]["recall_vs_exact"]
            params = ", ".join(f"{k} {v}" for k, v in ix.get("params", {}).items()) or "–"
            rescore = ix.get("rescore") or "–"
            lines.append(
                f"| {_cell(s['task'])} | {ix['index']} | {ix['factory']} | {ix['dim']} | {params} | {rescore} | "
                + " | ".join(fmt(r.get(k)) for k in ks)
                + f" | {r['n_queries']} |"
            )
    reranked = [s for s in summaries if "dense_metrics" in s.get("rerank", {})]
    if reranked:
        m = panel[0]
        lines += [
            "",
            f"Reranking (gold {m} before / after; cost per reranked query, and failed and repaired "
            "calls out of all calls):",
            "",
            f"| task | method | depth | dense {m} | reranked {m} | queries | reasoning | calls / query | "
            "tokens in / query | tokens out / query | seconds / query | failed / all calls | repaired / all calls |",
            "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for s in reranked:
            r, c, q = s["rerank"], s["rerank"]["cost"], s["rerank"]["cost"]["per_query"]
            thought = {True: f"on ({c['reasoning_unclosed']} unclosed)", False: "off"}.get(c.get("reasoning"), "–")
            lines.append(
                f"| {_cell(s['task'])} | {r['method']} | {r['depth']} | {fmt(r['dense_metrics'][m])} | "
                f"{fmt(s['metrics'][m])} | {c['queries']} | {thought} | {q['calls']:.1f} | {q['prompt_tokens']:.0f} | "
                f"{q['new_tokens']:.0f} | {q['seconds']:.2f} | {c['failed_calls']} / {c['calls']} | "
                f"{c['repaired_calls']} / {c['calls']} |"
            )
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


ISA_FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512 F",
    "avx512_vnni": "AVX-512 VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "avx_vnni": "AVX-VNNI",
    "amx_tile": "AMX",
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
}
"""The instruction sets whose kernels decide a CPU figure (``/proc/cpuinfo`` flag: name), in this order."""


def cpu_from_cpuinfo(text: str) -> dict:
    """``{"model", "isa"}`` of a Linux ``/proc/cpuinfo`` text (its first processor): the model name, and
    which of :data:`ISA_FLAGS` its flags hold; ``"unknown"`` for what the text does not say."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    flags = fields.get("flags")
    if flags is None and "features" in fields:  # an Arm CPU lists its own features: none of the x86 sets
        flags = ""
    return {
        "model": fields.get("model name") or fields.get("cpu model") or "unknown",
        "isa": [name for flag, name in ISA_FLAGS.items() if flag in flags.split()] if flags is not None else "unknown",
    }


def cpu() -> dict:
    """The CPU this process runs on: ``{"model", "isa"}``, ``isa`` the list of :data:`ISA_FLAGS` it has
    (``/proc/cpuinfo`` on Linux; ``sysctl`` on macOS; ``"unknown"`` where neither says, never a guess)."""
    import subprocess

    if Path("/proc/cpuinfo").is_file():
        try:
            return cpu_from_cpuinfo(Path("/proc/cpuinfo").read_text(errors="replace"))
        except OSError:
            pass
    if platform.system() == "Darwin":

        def sysctl(key: str) -> str:
            try:
                return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                return ""

        model = sysctl("machdep.cpu.brand_string").strip() or "unknown"
        if platform.machine() != "x86_64":  # Apple silicon: none of the x86 sets
            return {"model": model, "isa": []}
        flags = " ".join(sysctl(k) for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features")).lower().split()
        names = {"avx2": "avx2", "avx512f": "avx512f", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16"}
        return {"model": model, "isa": [ISA_FLAGS[names[f]] for f in names if f in flags] if flags else "unknown"}
    return {"model": platform.processor() or "unknown", "isa": "unknown"}


def llama_cpp_build() -> dict | None:
    """How the installed llama.cpp (``llama-cpp-python``) was built, or None when it is not installed:
    ``{"build", "features"}``. ``features`` is the CPU part of llama.cpp's own system info
    (``llama_print_system_info``: the instruction sets its kernels were compiled with); ``build`` is
    ``portable`` when its library folder holds several CPU variants chosen at run time (``GGML_BACKEND_DL``
    with ``GGML_CPU_ALL_VARIANTS``), otherwise ``native``: one CPU library, compiled for the CPU it was built
    on (llama.cpp's ``GGML_NATIVE`` default, which ``make install`` keeps): a copy carried to a CPU without those
    features can stop with an illegal instruction."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return None
    variants = sorted(p.name for p in (Path(spec.origin).parent / "lib").glob("libggml-cpu-*.so"))
    try:
        import llama_cpp

        info = llama_cpp.llama_print_system_info().decode(errors="replace")
    except Exception as err:  # a library that does not load on this CPU says so in the report
        return {"build": "portable" if variants else "native", "features": f"unknown ({type(err).__name__})"}
    features = [f.split("=")[0].rpartition(":")[2].strip() for f in info.split("|") if f.strip().endswith("= 1")]
    return {"build": "portable" if variants else "native", "features": features}


@functools.cache
def environment() -> dict:
    """What a figure was made with: ``{"python", "machine", "cpu", "llama_cpp", "obliq", "packages": {name:
    version}}``: the CPU's model and instruction sets (:func:`cpu`), how llama.cpp was built
    (:func:`llama_cpp_build`; None when not installed), and obliq's declared dependencies (extras included) as
    installed (``importlib.metadata``); ``make install`` installs the versions locked in ``constraints.txt``."""
    from importlib import metadata

    from packaging.requirements import Requirement

    names = sorted({Requirement(r).name for r in metadata.requires("obliq") or []}, key=str.lower)
    packages = {}
    for name in names:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # an extra not installed
            continue
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu(),
        "llama_cpp": llama_cpp_build(),
        "obliq": metadata.version("obliq"),
        "packages": packages,
    }


def environment_text(env: dict) -> str:
    """One line naming an :func:`environment`: ``Python 3.11.7 (x86_64); CPU AMD EPYC (AVX2, AVX-512 F, …);
    llama.cpp native build (AVX2, AVX512, …); obliq 0.1.0, torch 2.13.0, …`` (an older record without the CPU
    says ``CPU unknown``)."""
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
    info = env.get("cpu") or {"model": "unknown", "isa": "unknown"}
    isa = (", ".join(info["isa"]) or "no AVX2, AVX-512 or AMX") if isinstance(info["isa"], list) else info["isa"]
    line = f"Python {env.get('python')} ({env.get('machine')}); CPU {info['model']} ({isa})"
    if env.get("llama_cpp"):
        built = env["llama_cpp"]
        features = built["features"] if isinstance(built["features"], str) else ", ".join(built["features"])
        line += f"; llama.cpp {built['build']} build ({features})"
    return f"{line}; obliq {env.get('obliq')}, {packages}"


def made_with() -> str:
    """``Made with: Python …; CPU …; llama.cpp …; obliq …, torch …, …``: the line a benchmark prints with its
    figures."""
    return "Made with: " + environment_text(environment())


def evaluate_tasks(
    retrieve: Retriever,
    tasks: Sequence[Task],
    output: Path,
    model: str,
    measures: str | Sequence[str] = DEFAULT_MEASURES,
) -> list[dict]:
    """Retrieve and score every task, write each task's files and the report over all of them.

    Raises:
        ValueError: two tasks share a name (their files would collide); a bad measure name or cut-off
            (:func:`obliq.eval.metrics.parse_measures`): both before the first retrieval.
    """
    parse_measures(measures)
    folders = [safe_name(t.name, "task name") for t in tasks]
    if len(set(folders)) != len(folders):
        raise ValueError(f"task names must be unique as folder names, got {[t.name for t in tasks]}")
    summaries = [evaluate_task(t, retrieve(t), Path(output) / f, model, measures) for t, f in zip(tasks, folders)]
    write_report(summaries, output)
    return summaries
