"""``obliq negatives mine``: BM25 hard negatives for a file of training rows (the OBLIQ-IR paper, §3.1).

A typical run, after ``obliq synth generate``::

    obliq negatives mine --rows work/synth/math-theoremqa.jsonl \\
        --task ../shared/data/tasks/math-theoremqa --out work/train/math-theoremqa.jsonl
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from obliq.data.rows import parse_row, read_rows
from obliq.eval.bm25 import BM25_STEMMER, K1, B
from obliq.files import atomic_write, claim_output, file_sha256, json_text, read_text, write_json
from obliq.negatives.mine import Bm25sBackend, MiningReport, mine_negatives
from obliq.shards import Shard, check_cover, check_same_run
from obliq.tasks import load_task

log = logging.getLogger(__name__)


def mine(
    rows: Path,
    task: Path,
    out: Path,
    k: int = 4,
    skip: int = 0,
    backend: Literal["bm25s", "pyserini"] = "bm25s",
    k1: float = K1,
    b: float = B,
    stemmer: str | None = BM25_STEMMER,
    threads: int = 1,
    overwrite: bool = False,
    shard: Shard = Shard(),
) -> dict:
    """Add BM25 hard negatives to training rows and write them (docs/formats.md row format).

    Each row's query is searched over the task corpus; the top documents become its negatives,
    excluding its positive by id and by normalised text, positives of rows with the same query,
    empty documents and repeated texts (obliq.negatives.mine). Existing negatives are replaced.
    Every output row is checked with obliq.data.rows.parse_row before it is written. The report
    (returned, and saved as ``<out>.report.json`` with these arguments) counts what was dropped and why.

    Args:
        rows: input JSONL of training rows (e.g. from ``obliq synth generate``).
        task: the task folder (BEIR layout) whose corpus is searched.
        out: output JSONL.
        k: negatives per row (the paper: 4).
        skip: candidates to leave out at the top of each ranking, after the exclusions (false-negative guard).
        backend: ``bm25s`` (obliq's BM25) or ``pyserini`` (a Lucene index; needs the ``pyserini`` extra).
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.
        stemmer: PyStemmer language of the analyzer, or null for none.
        threads: search threads (pyserini only).
        overwrite: replace an existing output file (refused otherwise).
        shard: mine one shard of the rows (``--shard.index i --shard.count n``, or a SLURM array's),
            written to ``<out stem>.shard-<i>-of-<n>.jsonl``; ``obliq negatives merge`` joins them.
            A row's negatives do not depend on the sharding.

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        ValueError: ``out`` is one of the inputs; a row's positive is not a document of the task (rows
            of another task: the message names the file, line and id).
    """
    shard = shard.resolved()
    out = shard.path(out)
    args = json.loads(json_text(locals()))
    for written in (Path(out), Path(out).with_name(Path(out).name + ".report.json")):
        claim_output(written, overwrite, "rows", command="negatives mine", inputs=[rows, task])
    data = load_task(task)
    args.update(corpus_sha256=data.corpus_sha256, rows_sha256=file_sha256(rows))  # what a merge compares
    items = read_rows(rows)
    corpus = set(data.doc_ids)
    stray = [(n, r["positive"]["id"]) for n, r in enumerate(items, 1) if r["positive"]["id"] not in corpus]
    if stray:
        raise ValueError(
            f"{rows}: {len(stray)} of {len(items)} rows have a positive that is not a document of "
            f"{data.name} (e.g. row {stray[0][0]}: {stray[0][1]!r}): rows of another task?"
        )
    report = MiningReport()
    start = time.perf_counter()
    if backend == "bm25s":
        engine = Bm25sBackend(data.doc_texts, k1=k1, b=b, stemmer=stemmer, ids=data.doc_ids)
    elif backend == "pyserini":
        from obliq.negatives.pyserini_backend import PyseriniBackend

        engine = PyseriniBackend(data.doc_texts, k1=k1, b=b, stemmer=stemmer, threads=threads, ids=data.doc_ids)
    else:
        raise ValueError(f"unknown backend {backend!r} (bm25s or pyserini)")
    report.index_seconds = time.perf_counter() - start
    try:
        mined, report = mine_negatives(
            shard.select(items), data.doc_ids, data.doc_texts, engine, k=k, skip=skip, report=report, all_rows=items
        )
    finally:
        if hasattr(engine, "close"):
            engine.close()
    out = Path(out)
    with atomic_write(out) as f:
        for lineno, row in enumerate(mined, 1):
            line = json.dumps(row, ensure_ascii=False)
            parse_row(line, str(out), lineno)
            f.write(line + "\n")
    summary = asdict(report)
    write_json(out.with_name(out.name + ".report.json"), {"args": args, "report": summary})
    log.info(
        "%d rows, %d negatives, %d short rows; dropped %s; %.1f rows/s (%s)",
        report.rows,
        report.negatives,
        report.short_rows,
        summary["dropped"],
        report.rows_per_s,
        report.backend,
    )
    return summary


def merge(rows: Path, shards: list[Path], out: Path, overwrite: bool = False) -> dict:
    """Join the shards of one ``negatives mine`` run into the file a single run would have written: every
    row of ``rows`` (the mined input) in exactly one shard, written in the input's order.

    Returns:
        ``{"out", "rows", "shards"}``.

    Raises:
        ValueError: a shard missing or given twice, a row in two shards or in none, or a shard row
            that is not in ``rows``; shards mined with other settings, against another corpus or from
            other rows (their reports differ); ``out`` one of the inputs.
        FileNotFoundError: a shard's report is missing.
    """
    claim_output(out, overwrite, "rows", command="negatives merge", inputs=[rows, *shards])
    order = [r["id"] for r in read_rows(rows)]
    taken, mined, runs = {}, {}, []
    for file in map(Path, shards):
        report_file = file.with_name(file.name + ".report.json")
        if not report_file.is_file():
            raise FileNotFoundError(f"{report_file}: the shard's report is missing (written by negatives mine)")
        args = json.loads(read_text(report_file))["args"]
        runs.append((report_file, args))
        if "rows_sha256" in args and args["rows_sha256"] != file_sha256(rows):
            raise ValueError(f"{file}: mined from other rows than {rows} (its report's rows_sha256 differs)")
        shard = args["shard"]
        if shard["count"] != len(shards):
            raise ValueError(f"{file}: a shard of a run of {shard['count']} shards, but {len(shards)} given")
        lines = {
            parse_row(raw, str(file), n).id: raw  # a cut line: file:line named
            for n, raw in enumerate(file.read_bytes().splitlines(), 1)
            if raw.strip()
        }
        taken[shard["index"]] = list(lines)
        mined.update(lines)
    check_same_run(runs, ignore=("shard", "out", "overwrite", "threads", "rows", "task"))  # the same task and settings
    check_cover(order, taken, len(shards), "row")
    with atomic_write(out, "wb") as f:
        for row_id in order:
            f.write(mined[row_id] + b"\n")
    return {"out": str(out), "rows": len(order), "shards": len(shards)}
