"""``obliq negatives mine`` / ``filter`` / ``merge``: hard negatives for a file of training rows (the OBLIQ-IR
paper, §3.1: BM25), by a dense model or a teacher too, with positive-aware filtering and attribute
vetoes; ``filter`` applies the filters to rows that already have negatives.

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

from obliq.claims import claim_outputs
from obliq.data.rows import parse_row, read_rows, row_positives
from obliq.files import atomic_write, file_sha256, json_text, read_id_table, read_text, write_json
from obliq.negatives.mine import (
    AttributeVeto,
    Bm25sBackend,
    DenseBackend,
    MiningReport,
    TeacherVeto,
    filter_negatives,
    mine_negatives,
)
from obliq.search.bm25 import BM25_STEMMER, K1, B
from obliq.shards import Shard, check_cover, check_same_run
from obliq.tasks import load_task

log = logging.getLogger(__name__)


def _backend(
    kind: str,
    texts: list[str],
    model: str,
    k1: float,
    b: float,
    stemmer: str | None,
    threads: int,
    trust_remote_code: bool = False,
    ids: list[str] | None = None,
):
    """The search backend a command asked for (module docs of :mod:`obliq.negatives.mine`); ``ids``
    break ties (id descending, trec_eval's order)."""
    if kind == "bm25s":
        return Bm25sBackend(texts, k1=k1, b=b, stemmer=stemmer, ids=ids)
    if kind == "pyserini":
        from obliq.negatives.pyserini_backend import PyseriniBackend

        return PyseriniBackend(texts, k1=k1, b=b, stemmer=stemmer, threads=threads, ids=ids)
    if kind == "dense":
        return DenseBackend(texts, model, trust_remote_code=trust_remote_code, ids=ids)
    raise ValueError(f"unknown backend {kind!r} (bm25s, pyserini or dense)")


def _veto(kind: str, task: Path, data, teacher: str, teacher_k: int):
    """The veto a command asked for: none, the task's attribute table, or the teacher's neighbourhood."""
    if kind == "none":
        return None
    if kind == "attribute":
        table = task / "attributes.tsv"
        if not table.is_file():
            raise FileNotFoundError(f"{table}: --veto attribute needs the task's attributes.tsv (corpus-id, attribute)")
        return AttributeVeto(read_id_table(table, "attribute"), data.doc_ids)
    if kind == "teacher":
        return TeacherVeto(data.doc_texts, teacher, teacher_k, ids=data.doc_ids)
    raise ValueError(f"unknown veto {kind!r} (none, attribute or teacher)")


def mine(
    rows: Path,
    task: Path,
    out: Path,
    k: int = 4,
    skip: int = 0,
    backend: Literal["bm25s", "pyserini", "dense"] = "bm25s",
    model: str = "minilm",
    max_score_ratio: float | None = None,
    range_max: int | None = None,
    sampling: Literal["top", "random"] = "top",
    veto: Literal["none", "attribute", "teacher"] = "none",
    teacher: str = "stylometric",
    teacher_k: int = 10,
    seed: int = 0,
    k1: float = K1,
    b: float = B,
    stemmer: str | None = BM25_STEMMER,
    threads: int = 1,
    trust_remote_code: bool = False,
    overwrite: bool = False,
    shard: Shard = Shard(),
) -> dict:
    """Add hard negatives to training rows and write them (docs/formats.md row format).

    Each row's query is searched over the task corpus (BM25, or a dense model / the stylometric teacher);
    the best documents become its negatives, excluding its positive by id and by normalised text,
    positives of rows with the same query, empty documents, repeated texts, and, as asked, vetoed
    documents (the positive's attribute, or its teacher neighbourhood) and documents scoring above
    ``max_score_ratio`` × the positive's score (obliq.negatives.mine). Existing negatives are replaced.
    Every output row is checked with obliq.data.rows.parse_row before it is written. The report
    (returned, and saved as ``<out>.report.json`` with these arguments) counts what was dropped and why.

    Args:
        rows: input JSONL of training rows (e.g. from ``obliq synth generate``).
        task: the task folder (BEIR layout) whose corpus is searched.
        out: output JSONL.
        k: negatives per row (the paper: 4).
        skip: candidates to leave out at the top of each ranking, after the exclusions (false-negative guard).
        backend: ``bm25s`` (obliq's BM25), ``pyserini`` (a Lucene index; needs the ``pyserini`` extra) or
            ``dense`` (``model``).
        model: with ``dense``: an alias, folder, adapter or hub id, or ``stylometric`` (the teacher).
        max_score_ratio: positive-aware filtering: drop candidates scoring above this share of the
            positive's score (0.95 = NV-Retriever's TopK-PercPos, sentence-transformers' default).
        range_max: draw from the first ``range_max`` ranks only.
        sampling: ``top`` (best first) or ``random`` (``k`` drawn among the survivors within ``range_max``).
        veto: ``attribute`` (the positive's attribute in the task's ``attributes.tsv``) or ``teacher``
            (the positive's ``teacher_k`` nearest neighbours in the ``teacher``'s space) rule documents out.
        teacher, teacher_k: the teacher of the ``teacher`` veto and its neighbourhood size.
        seed: seed of random sampling.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.
        stemmer: PyStemmer language of the analyzer, or null for none.
        threads: search threads (pyserini only).
        trust_remote_code: let a hub model run its own code (dense; only for models you trust).
        overwrite: replace an existing output file (refused otherwise).
        shard: mine one shard of the rows (``--shard.index i --shard.count n``, or a SLURM array's),
            written to ``<out stem>.shard-<i>-of-<n>.jsonl``; ``obliq negatives merge`` joins them.
            A row's negatives do not depend on the sharding.

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        FileNotFoundError: ``--veto attribute`` on a task without ``attributes.tsv``.
        ValueError: ``out`` is one of the inputs; a row's positive is not a document of the task (rows
            of another task: the message names the file, line and id); positive-aware filtering with
            the pyserini backend (it gives no per-document score).
    """
    shard = shard.resolved()
    out = shard.path(out)
    args = json.loads(json_text(locals()))
    if max_score_ratio is not None and backend == "pyserini":
        raise ValueError("--max_score_ratio needs a backend that scores a given document: bm25s or dense")
    outputs = {"out": out, "report": Path(out).with_name(Path(out).name + ".report.json")}
    with claim_outputs(outputs, command="negatives mine", inputs=[rows, task], overwrite=overwrite, what="rows"):
        data = load_task(task)
        args.update(corpus_sha256=data.corpus_sha256, rows_sha256=file_sha256(rows))  # what a merge compares
        items = read_rows(rows)
        corpus = set(data.doc_ids)
        stray = [(n, p["id"]) for n, r in enumerate(items, 1) for p in row_positives(r) if p["id"] not in corpus]
        if stray:
            raise ValueError(
                f"{rows}: {len({n for n, _ in stray})} of {len(items)} rows have a positive that is not a document of "
                f"{data.name} (e.g. row {stray[0][0]}: {stray[0][1]!r}): rows of another task?"
            )
        ruled_out = _veto(veto, Path(task), data, teacher, teacher_k)
        report = MiningReport()
        start = time.perf_counter()
        engine = _backend(backend, data.doc_texts, model, k1, b, stemmer, threads, trust_remote_code, data.doc_ids)
        report.index_seconds = time.perf_counter() - start
        try:
            mined, report = mine_negatives(
                shard.select(items),
                data.doc_ids,
                data.doc_texts,
                engine,
                k=k,
                skip=skip,
                report=report,
                all_rows=items,
                max_score_ratio=max_score_ratio,
                range_max=range_max,
                sampling=sampling,
                veto=ruled_out,
                seed=seed,
            )
        finally:
            if hasattr(engine, "close"):
                engine.close()
        _write_rows(out, mined)
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


def _write_rows(out: Path, rows: list[dict]) -> None:
    """Write rows atomically, each checked with :func:`obliq.data.rows.parse_row` first."""
    out = Path(out)
    with atomic_write(out) as f:
        for lineno, row in enumerate(rows, 1):
            line = json.dumps(row, ensure_ascii=False)
            parse_row(line, str(out), lineno)
            f.write(line + "\n")


def filter_rows(
    rows: Path,
    task: Path,
    out: Path,
    max_score_ratio: float | None = 0.95,
    model: str = "minilm",
    veto: Literal["none", "attribute", "teacher"] = "none",
    teacher: str = "stylometric",
    teacher_k: int = 10,
    trust_remote_code: bool = False,
    overwrite: bool = False,
) -> dict:
    """Drop the negatives of existing training rows that are likely false negatives, without mining anew:
    those scoring above ``max_score_ratio`` × the row's positive under a dense ``model`` (positive-aware
    filtering, NV-Retriever's TopK-PercPos) and those a ``veto`` rules out (the positive's attribute or
    teacher neighbourhood). Counts are returned and saved as ``<out>.report.json``.

    Args:
        rows: training rows with negatives (e.g. written by ``obliq negatives mine`` with BM25).
        task: the task folder the rows' documents come from.
        out: the filtered rows.
        max_score_ratio: the positive-aware threshold; null: off.
        model: the dense model scoring the query against its positive and its negatives.
        veto, teacher, teacher_k: as in ``obliq negatives mine``.
        trust_remote_code: let a hub model run its own code (only for models you trust).
        overwrite: replace an existing output file (refused otherwise).

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        ValueError: ``out`` is an input; nothing to filter with (no ratio, no veto); a row's document
            that is not in the task's corpus.
    """
    args = json.loads(json_text(locals()))
    if max_score_ratio is None and veto == "none":
        raise ValueError("nothing to filter with: give --max_score_ratio or --veto")
    outputs = {"out": out, "report": Path(out).with_name(Path(out).name + ".report.json")}
    with claim_outputs(outputs, command="negatives filter", inputs=[rows, task], overwrite=overwrite, what="rows"):
        data = load_task(task)
        items = read_rows(rows)
        ruled_out = _veto(veto, Path(task), data, teacher, teacher_k)
        scorer = (
            DenseBackend(data.doc_texts, model, trust_remote_code=trust_remote_code, ids=data.doc_ids)
            if max_score_ratio
            else None
        )
        filtered, counts = filter_negatives(items, data.doc_ids, scorer, max_score_ratio, ruled_out)
        _write_rows(out, filtered)
        write_json(Path(out).with_name(Path(out).name + ".report.json"), {"args": args, "report": counts})
        log.info("%d of %d negatives kept; dropped %s", counts["kept"], counts["negatives"], counts["dropped"])
        return counts


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
    reports = [str(f) for f in shards if str(f).endswith(".report.json")]
    if reports:
        raise ValueError(
            f"--shards {reports[0]}: a shard's report; give the shard files themselves "
            "(their reports are read beside them)"
        )
    with claim_outputs(
        {"out": out}, command="negatives merge", inputs=[rows, *shards], overwrite=overwrite, what="rows"
    ):
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
        check_same_run(
            runs, ignore=("shard", "out", "overwrite", "threads", "rows", "task")
        )  # the same task and settings
        check_cover(order, taken, len(shards), "row")
        with atomic_write(out, "wb") as f:
            for row_id in order:
                f.write(mined[row_id] + b"\n")
        return {"out": str(out), "rows": len(order), "shards": len(shards)}
