"""``obliq synth …``: synthetic training queries (Stage A/B through a lens) and their audit.

A typical run (one config per task in ``configs/synth/``)::

    obliq synth generate --config configs/synth/math-theoremqa.yaml
    obliq synth audit --rows work/synth/math-theoremqa.jsonl --task ../shared/data/tasks/math-theoremqa
    obliq negatives mine --rows work/synth/math-theoremqa.jsonl --task ../shared/data/tasks/math-theoremqa \\
        --out work/train/math-theoremqa.jsonl
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from obliq.data.rows import parse_row, read_rows
from obliq.eval.bm25 import BM25
from obliq.files import atomic_write, claim_output, json_text, read_text, write_json
from obliq.llm.backends import BackendConfig
from obliq.shards import Shard, check_cover, check_same_run
from obliq.synth.audit import audit_pairs, format_audit
from obliq.synth.generate import GenerationConfig, read_done, sample_documents, synthesize
from obliq.synth.prompts import TaskSpec
from obliq.tasks import load_task

log = logging.getLogger(__name__)


def generate(
    task: Path,
    out: Path,
    spec: TaskSpec,
    n_docs: int | None = 100,
    seed: int = 13,
    backend: BackendConfig = BackendConfig(),
    generation: GenerationConfig = GenerationConfig(),
    prompt_dir: Path | None = None,
    shard: Shard = Shard(),
) -> dict:
    """Write synthetic training queries for a task (Stage A, then Stage B through the task's lens).

    Stage A describes each sampled document's latent attribute; Stage B writes one query through the
    task's lens (the OBLIQ-IR paper, §3.1). Rows are appended to ``out`` (one per document, docs/formats.md
    format, ``negatives`` empty); a rerun skips documents already there, so a killed run resumes.
    Rejected replies are retried, then the document is skipped; they are logged in
    ``<out>.rejects.jsonl``. The report is returned and saved
    with these arguments as ``<out>.report.json``.

    Args:
        task: the task folder (BEIR layout).
        out: output JSONL of training rows (appended).
        spec: the task's name, lens and attribute wording (configs/synth/<task>.yaml).
        n_docs: documents to sample (seeded), or null for all.
        seed: sampling and generation seed.
        backend: the generator: ``name`` ``transformers`` (CPU or GPU) or ``vllm`` (GPU; the ``gen``
            extra in its own env), ``model`` (an alias such as smollm2, a folder or a hub id), and its
            settings (:class:`obliq.llm.backends.BackendConfig`).
        generation: generation settings.
        prompt_dir: a folder of prompt files replacing the packaged ones (obliq/synth/prompts).
        shard: one shard of the sample (``--shard.index i --shard.count n``, or a SLURM array's), written
            to ``<out stem>.shard-<i>-of-<n>.jsonl`` and resumable on its own; ``obliq synth merge``
            joins the shards (:mod:`obliq.shards`).
    """
    shard = shard.resolved()
    out = shard.path(out)
    args = json.loads(json_text(locals()))
    for written in (
        Path(out),
        Path(out).with_name(Path(out).name + ".rejects.jsonl"),
        Path(out).with_name(Path(out).name + ".report.json"),
    ):  # appended to on a resume: its own files only (their rows are checked before any is touched)
        claim_output(written, what="synthetic rows", command="synth generate", inputs=[task, prompt_dir], append=True)
    data = load_task(task)
    args["corpus_sha256"] = data.corpus_sha256  # what a merge compares
    read_done(Path(out), spec.name)  # another command's file, or a bad row: refused before the model loads
    engine = backend.build()
    report = asdict(
        synthesize(
            data, spec, engine, out, n_docs=n_docs, seed=seed, generation=generation, prompt_dir=prompt_dir, shard=shard
        )
    )
    write_json(out.with_name(out.name + ".report.json"), {"args": args, "report": report})
    log.info(
        "%s: %d rows written (%d already done), skipped %s, %d retries, %.1f tokens/s",
        report["task"],
        report["generated"],
        report["already_done"],
        report["skipped"],
        report["retries"],
        report["tokens_per_s"],
    )
    return report


def merge(shards: list[Path], out: Path, overwrite: bool = False) -> dict:
    """Join the shards of one ``synth generate`` run into the file a single run would have written.

    Each shard's report (``<shard>.report.json``) names its task, sample (``n_docs``, ``seed``) and shard;
    the merge checks that the shards are those of one run, each index once, and that together they
    took every document of the sample exactly once (:func:`obliq.shards.check_cover`); then writes the
    rows in sample order.

    Args:
        shards: the shards' row files.
        out: the merged rows.
        overwrite: replace an existing ``out``.

    Returns:
        ``{"out", "rows", "documents", "shards"}``.

    Raises:
        ValueError: shards of different runs, a shard missing or given twice, a document in two shards
            or in none, a row of a document its shard did not take; ``out`` one of the shards.
        FileNotFoundError: a shard's report is missing.
    """
    claim_output(out, overwrite, "rows", command="synth merge", inputs=shards)
    reports = []
    for file in map(Path, shards):
        report_file = file.with_name(file.name + ".report.json")
        if not report_file.is_file():
            raise FileNotFoundError(f"{report_file}: the shard's report is missing (written by synth generate)")
        reports.append(json.loads(read_text(report_file)))
    check_same_run(
        [
            (f.with_name(f.name + ".report.json"), {**r["args"], "count": r["report"]["shard"]["count"]})
            for f, r in zip(map(Path, shards), reports)
        ],
        ignore=("shard", "out", "task"),
    )  # the same corpus, sample, prompts, generator and settings
    first = reports[0]["args"]
    task, n_docs, seed, count = first["task"], first["n_docs"], first["seed"], reports[0]["report"]["shard"]["count"]
    data = load_task(task)
    order, _ = sample_documents(data, n_docs, seed)
    sample = [data.doc_ids[i] for i in order]
    check_cover(sample, {r["report"]["shard"]["index"]: r["report"]["documents"] for r in reports}, count, "document")
    rows: dict[str, bytes] = {}
    for file, report in zip(map(Path, shards), reports):
        taken = set(report["report"]["documents"])
        for lineno, raw in enumerate(file.read_bytes().splitlines(), 1):
            if raw.strip():
                row = parse_row(raw, str(file), lineno)
                if row.positive.id not in taken:
                    raise ValueError(
                        f"{file}:{lineno}: a row for document {row.positive.id!r}, not one of this shard's"
                    )
                rows[row.positive.id] = raw
    with atomic_write(out, "wb") as f:
        for doc in sample:
            if doc in rows:
                f.write(rows[doc] + b"\n")
    return {"out": str(out), "rows": len(rows), "documents": len(sample), "shards": count}


def audit_queries(rows: Path, task: Path, split: str = "test", real: bool = True) -> dict:
    """Audit generated and real queries against their sources: entity leaks, overlap, BM25 rank.

    Generated queries are compared with their positives, the task's real queries with their
    relevant documents (the OBLIQ-IR paper, Appendix J): entity-leak rate (capitalised-token heuristic, see
    obliq.synth.audit), token Jaccard, and the source's BM25 rank. When the generation report
    (``<rows>.report.json``, written by ``synth generate``) is beside the rows, the share of replies
    rejected for each reason is reported too (``echo``: replies that repeated the prompt's instructions
    or talked about the task; ``unclosed-reasoning``). Prints a table; returns its rows.

    Args:
        rows: JSONL of training rows whose positives are documents of the task (e.g. from ``synth generate``).
        task: the task folder (BEIR layout); its corpus is the BM25 index.
        split: qrels split giving the real queries' sources (relevant documents, grade >= 1).
        real: also audit the task's real queries.
    """
    data = load_task(task)
    index = {d: i for i, d in enumerate(data.doc_ids)}
    items = read_rows(rows)
    missing = [r["positive"]["id"] for r in items if r["positive"]["id"] not in index]
    if missing:
        raise ValueError(f"{rows}: {len(missing)} positives are not documents of {task} (e.g. {missing[0]!r})")
    bm25 = BM25(data.doc_texts)
    table = [
        audit_pairs(
            "generated",
            [r["query"] for r in items],
            [[index[r["positive"]["id"]]] for r in items],
            data.doc_texts,
            bm25,
        )
    ]
    if real:
        if split not in data.qrels:
            raise ValueError(f"{task}: no qrels split {split!r} (have {', '.join(data.qrels)})")
        qrels = data.qrels[split]
        queries, sources = [], []
        for qid, text in zip(data.query_ids, data.query_texts):
            src = [index[d] for d, g in qrels.get(qid, {}).items() if g > 0 and d in index]
            if src:
                queries.append(text)
                sources.append(src)
        table.append(audit_pairs("real", queries, sources, data.doc_texts, bm25))
    print(format_audit(data.name, table))
    out = {"task": data.name, "rows": [asdict(r) for r in table]}
    report = Path(rows).with_name(Path(rows).name + ".report.json")
    if report.is_file():
        generated = json.loads(read_text(report)).get("report", {})
        replies = sum(generated.get("replies", {}).values())
        if replies:
            shares: dict[str, float] = {}
            for key, n in generated.get("rejected", {}).items():
                reason = key.split(":", 1)[-1]
                shares[reason] = shares.get(reason, 0.0) + n / replies
            out["rejected_share"] = dict(sorted(shares.items()))
            out["replies"] = replies
            print(
                f"replies rejected, share of {replies}: "
                + (", ".join(f"{k} {100 * v:.1f}%" for k, v in out["rejected_share"].items()) or "none")
            )
    return out
