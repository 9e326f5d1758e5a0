"""``obliq synth …``: synthetic training queries (Stage A/B through a lens) and their audit.

A typical run (one config per task in ``configs/synth/``)::

    obliq task split --task ../shared/data/tasks/math-theoremqa --out work/tasks/math-theoremqa
    obliq synth generate --config configs/synth/math-theoremqa.yaml --task work/tasks/math-theoremqa
    obliq synth audit --rows work/synth/math-theoremqa.jsonl --task work/tasks/math-theoremqa
    obliq synth filter --rows work/synth/math-theoremqa.jsonl --task work/tasks/math-theoremqa \\
        --out work/synth/math-theoremqa.kept.jsonl
    obliq negatives mine --rows work/synth/math-theoremqa.kept.jsonl --task work/tasks/math-theoremqa \\
        --out work/train/math-theoremqa.jsonl
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from obliq.claims import claim_outputs
from obliq.data.rows import parse_row, read_rows, row_positives
from obliq.eval.results import environment
from obliq.files import atomic_write, json_text, read_text, write_json
from obliq.llm.backends import backend_config
from obliq.search.bm25 import BM25
from obliq.search.settings import RetrievalSettings
from obliq.shards import Shard, check_cover, check_same_run
from obliq.synth.audit import audit_pairs, format_audit
from obliq.synth.fewshot import FewShotConfig
from obliq.synth.filter import DROP_REASONS, FilterConfig, audit_rows, filter_candidates
from obliq.synth.generate import GenerationConfig, read_done, sample_documents, synthesize
from obliq.synth.prompts import TaskSpec, load_stage_prompt
from obliq.tasks import load_task

log = logging.getLogger(__name__)

RESUME_SETTINGS = ("task", "spec", "seed", "generation", "prompt_dir", "fewshot")
"""What an output's rows were made with (``generate``'s arguments, plus the generator's model and the
prompts' text): a rerun into the same output must agree, since it keeps the rows there. ``n_docs`` and
``samples`` may grow (the sample and the candidates nest)."""


def prompts_digest(spec: TaskSpec, prompt_dir: Path | None = None) -> str:
    """SHA-256 of the two stages' prompt templates as loaded (system, user, few-shot keys): what a
    resumed output must have been generated with."""
    import hashlib

    prompts = [load_stage_prompt("A", prompt_dir=prompt_dir), load_stage_prompt("B", spec.lens, prompt_dir=prompt_dir)]
    text = json_text([[p.system, p.user, p.header] for p in prompts], indent=None)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_resume(out: Path, args: dict, digest: str) -> None:
    """Refuse to extend an output that another setting or prompt wrote (see :data:`RESUME_SETTINGS`)."""
    report_file = out.with_name(out.name + ".report.json")
    if not (out.is_file() and out.stat().st_size):
        return
    if not report_file.is_file():  # written before the first row (issue 53): rows without it are of unknown making
        raise ValueError(
            f"{out}: holds rows but no {report_file.name} saying what made them; a rerun would mix them with new "
            "ones: give another --out, or remove it with its .rejects.jsonl"
        )
    saved = json.loads(read_text(report_file))
    before = saved.get("args", {})
    differ = [k for k in RESUME_SETTINGS if before.get(k) != args.get(k)]
    if (before.get("backend") or {}).get("model") != args["backend"]["model"]:
        differ.append("backend.model")
    if saved.get("prompts") != digest:
        differ.append("prompts")
    if differ:
        raise ValueError(
            f"{out}: its rows were generated with other {', '.join(differ)} ({report_file}); a rerun would mix "
            "them with new ones: give another --out, or remove it with its .report.json and .rejects.jsonl"
        )


def generate(
    task: Path,
    out: Path,
    spec: TaskSpec,
    n_docs: int | None = 100,
    seed: int = 13,
    backend: dict[str, Any] | None = None,
    generation: GenerationConfig = GenerationConfig(),
    prompt_dir: Path | None = None,
    shard: Shard = Shard(),
    fewshot: FewShotConfig = FewShotConfig(),
    samples: int = 1,
) -> dict:
    """Write synthetic training queries for a task (Stage A, then Stage B through the task's lens).

    Stage A describes each sampled document's latent attribute; Stage B writes one query through the
    task's lens (the OBLIQ-IR paper, §3.1), optionally shown ``fewshot.k`` real (document, query) pairs
    of the task's development side (Promptagator; never a test query). Rows are appended to ``out``
    (``samples`` candidates per document, docs/formats.md format, ``negatives`` empty); a rerun skips
    candidates already there, so a killed run resumes (or a larger ``n_docs`` or ``samples`` extends it;
    an output written with other settings or prompts is refused). Rejected replies are retried, then the
    candidate is skipped; they are logged in ``<out>.rejects.jsonl``. The report (with the cost: tokens,
    seconds, per row) is returned and saved with these arguments and the prompts' digest as
    ``<out>.report.json``.

    Args:
        task: the task folder (BEIR layout).
        out: output JSONL of training rows (appended).
        spec: the task's name, lens and attribute wording (configs/synth/<task>.yaml).
        n_docs: documents to sample (seeded), or null for all.
        seed: sampling and generation seed.
        backend: the generator: ``name`` ``transformers`` (CPU or GPU), ``llamacpp`` (CPU, a GGUF file) or
            ``vllm`` (GPU, or its CPU build: ``make vllm``), ``model`` (an alias such as smollm2, a folder or a
            hub id), and that backend's settings (``--backend.<key>``): the fields of its settings class,
            obliq.llm.transformers.TransformersConfig, obliq.llm.llamacpp.LlamaCppConfig or
            obliq.llm.vllm.VLLMConfig (each documents its fields; docs/synthetic.md, "Backends").
        generation: generation settings.
        prompt_dir: a folder of prompt files replacing the packaged ones (obliq/synth/prompts).
        shard: one shard of the sample (``--shard.index i --shard.count n``, or a SLURM array's), written
            to ``<out stem>.shard-<i>-of-<n>.jsonl`` and resumable on its own; ``obliq synth merge``
            joins the shards (:mod:`obliq.shards`).
        fewshot: few-shot Stage B: ``k`` examples (0: none), from the development ``split`` (``dev``:
            ``queries-dev.jsonl`` + ``qrels/dev.tsv``, written by ``obliq task split``), each cut to
            ``max_doc_words`` words.
        samples: candidates per document (best-of-n: ``obliq synth filter`` keeps the best), each with
            its own seeds; row ids ``synth:<task>:<doc>`` (sample 0) and ``synth:<task>:<doc>:<i>``.
    """
    shard = shard.resolved()
    out = shard.path(out)
    try:
        backend = backend_config(**(backend or {}))
    except ValueError as err:
        raise ValueError(f"backend.{err}") from None
    args = json.loads(json_text(locals()))
    outputs = {
        "out": out,
        "rejects": Path(out).with_name(Path(out).name + ".rejects.jsonl"),
        "report": Path(out).with_name(Path(out).name + ".report.json"),
    }
    # appended to on a resume: its own files only (their rows are checked before any is touched)
    with claim_outputs(
        outputs, command="synth generate", inputs=[task, prompt_dir], what="synthetic rows", append=True
    ):
        digest = prompts_digest(spec, prompt_dir)
        read_done(Path(out), spec.name)  # another command's file, or a bad row: refused before the model loads
        _check_resume(Path(out), args, digest)
        data = load_task(task)
        args["corpus_sha256"] = data.corpus_sha256  # what a merge compares
        engine = backend.build()
        # what the rows are made with, before the first is written: a killed run's resume is checked against it
        write_json(outputs["report"], {"args": args, "prompts": digest, "report": None})
        report = asdict(
            synthesize(
                data,
                spec,
                engine,
                out,
                n_docs=n_docs,
                seed=seed,
                generation=generation,
                prompt_dir=prompt_dir,
                shard=shard,
                fewshot=fewshot,
                samples=samples,
            )
        )
        made_with = environment()  # the CPU and llama.cpp's build beside the versions (what the cost was measured on)
        write_json(outputs["report"], {"args": args, "prompts": digest, "report": report, "environment": made_with})
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
    rows in sample order (a document's candidates by sample number).

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
    with claim_outputs({"out": out}, command="synth merge", inputs=shards, overwrite=overwrite, what="rows"):
        reports = []
        for file in map(Path, shards):
            report_file = file.with_name(file.name + ".report.json")
            if not report_file.is_file():
                raise FileNotFoundError(f"{report_file}: the shard's report is missing (written by synth generate)")
            reports.append(json.loads(read_text(report_file)))
            if not isinstance(reports[-1].get("report"), dict):
                raise ValueError(f"{file}: its synth generate run did not finish ({report_file}): resume it first")
        check_same_run(
            [
                (
                    f.with_name(f.name + ".report.json"),
                    {**r["args"], "count": r["report"]["shard"]["count"], "prompts": r.get("prompts")},
                )
                for f, r in zip(map(Path, shards), reports)
            ],
            ignore=("shard", "out", "task"),
        )  # the same corpus, sample, prompts, generator and settings (samples, few-shot examples)
        first = reports[0]["args"]
        task, n_docs, seed, count = (
            first["task"],
            first["n_docs"],
            first["seed"],
            reports[0]["report"]["shard"]["count"],
        )
        data = load_task(task)
        order, _ = sample_documents(data, n_docs, seed)
        sample = [data.doc_ids[i] for i in order]
        check_cover(
            sample, {r["report"]["shard"]["index"]: r["report"]["documents"] for r in reports}, count, "document"
        )
        rows: dict[str, dict[int, bytes]] = {}
        for file, report in zip(map(Path, shards), reports):
            taken = set(report["report"]["documents"])
            for lineno, raw in enumerate(file.read_bytes().splitlines(), 1):
                if raw.strip():
                    row = parse_row(raw, str(file), lineno)
                    if row.positive.id not in taken:
                        raise ValueError(
                            f"{file}:{lineno}: a row for document {row.positive.id!r}, not one of this shard's"
                        )
                    number = (row.meta or {}).get("sample", 0)
                    rows.setdefault(row.positive.id, {})[number if isinstance(number, int) else 0] = raw
        with atomic_write(out, "wb") as f:
            for doc in sample:
                for _, raw in sorted(rows.get(doc, {}).items()):
                    f.write(raw + b"\n")
        n_rows = sum(len(r) for r in rows.values())
        return {"out": str(out), "rows": n_rows, "documents": len(sample), "shards": count}


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
    missing = [p["id"] for r in items for p in row_positives(r) if p["id"] not in index]
    if missing:
        raise ValueError(f"{rows}: {len(missing)} positives are not documents of {task} (e.g. {missing[0]!r})")
    bm25 = BM25(data.doc_texts)
    table = [
        audit_pairs(
            "generated",
            [r["query"] for r in items],
            [[index[p["id"]] for p in row_positives(r)] for r in items],  # every positive is a source
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
        generated = json.loads(read_text(report)).get("report") or {}
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


def filter_queries(
    rows: Path,
    task: Path,
    out: Path,
    split: str = "dev",
    lexical_quantile: float = 0.05,
    dense_quantile: float | None = 0.95,
    leaks: bool = True,
    pick: Literal["oblique", "dense", "least-lexical"] = "oblique",
    per_document: int = 1,
    model: str = "minilm",
    retrieval: RetrievalSettings = RetrievalSettings(),
    overwrite: bool = False,
) -> dict:
    """Keep the generated queries worth training on: the audit's measures turned into decisions, each
    threshold set from the task's real development queries (obliq.synth.filter).

    Drops, in this order: ``duplicate`` (an earlier candidate's or a development query's normalised
    text), ``too_lexical`` (BM25 ranks the source at or above the largest rank that at most
    ``lexical_quantile`` of the development (query, gold) pairs reach), ``unanswerable`` (the base
    dense retriever ``model`` ranks the source below the ``dense_quantile`` quantile of the
    development pairs' dense ranks: Promptagator's round-trip consistency), ``not_best`` (best-of-n:
    ``per_document`` candidates kept per document, by ``pick``) and ``entity_leak``
    (leaking rows beyond the development queries' entity-leak rate). Writes the kept rows to ``out``,
    ``<out>.decisions.jsonl`` (every candidate's measures and decision) and ``<out>.report.json``
    (thresholds, counts per reason, the audit); prints the audit table of all candidates, the kept
    rows and the development queries.

    Args:
        rows: candidate rows of one task (``obliq synth generate``, merged).
        task: the task folder with its development side (``obliq task split``).
        out: the kept rows (JSONL).
        split: the development side the thresholds come from (``queries-<split>.jsonl``,
            ``qrels/<split>.tsv``); never ``test``.
        lexical_quantile: at most this share of the development pairs reach the ranks called too lexical.
        dense_quantile: ``K`` is this quantile of the development pairs' dense ranks; null: no dense check.
        leaks: keep the kept rows' entity-leak rate at or below the development queries'.
        pick: which of a document's surviving candidates are kept, non-leaking ones first: ``oblique``
            (the source found by ``model`` much better than by BM25: least log dense rank − log BM25
            rank), ``dense`` (found best by ``model``) or ``least-lexical`` (ranked lowest by BM25).
        per_document: candidates kept per document.
        model: the base dense retriever (an alias, folder or hub id).
        retrieval: how it reads and caches (the embedding store ``evaluate`` shares).
        overwrite: replace an existing ``out``.
    """
    args = json.loads(json_text(locals()))
    decisions, report_file = (Path(out).with_name(Path(out).name + x) for x in (".decisions.jsonl", ".report.json"))
    outputs = {"out": out, "decisions": decisions, "report": report_file}
    with claim_outputs(outputs, command="synth filter", inputs=[rows, task], overwrite=overwrite, what="rows"):
        config = FilterConfig(split, lexical_quantile, dense_quantile, leaks, pick, per_document)
        data = load_task(task)
        candidates, report = filter_candidates(read_rows(rows), data, config, model, retrieval)
        with atomic_write(out) as f:
            for c in candidates:
                if c.decision == "kept":
                    meta = {
                        **(c.row.get("meta") or {}),
                        "filter": {"bm25_rank": c.bm25_rank, "dense_rank": c.dense_rank, "leaked": c.leaked},
                    }
                    f.write(json.dumps({**c.row, "meta": meta}, ensure_ascii=False) + "\n")
        with atomic_write(decisions) as f:
            for c in candidates:
                record = {
                    "id": c.row["id"],
                    "doc_id": c.row["positive"]["id"],
                    "sample": c.sample,
                    "bm25_rank": c.bm25_rank,
                    "dense_rank": c.dense_rank,
                    "leaked": c.leaked,
                    "decision": c.decision,
                }
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        write_json(report_file, {"args": args, "report": report})
        print(format_audit(data.name, audit_rows(report)))
        dropped = ", ".join(f"{r} {report['dropped'][r]}" for r in DROP_REASONS)
        th = report["thresholds"]
        print(
            f"{data.name}: kept {report['kept']} of {report['candidates']} candidates "
            f"({report['documents_kept']} of {report['documents']} documents); dropped: {dropped}\n"
            f"thresholds from {th['real_queries']} {th['split']} queries ({th['real_pairs']} pairs): "
            f"too lexical at BM25 rank <= {th['bm25_max_rank_dropped']} (q = {th['lexical_quantile']}; "
            f"real rank-1 {100 * th['real_bm25_rank1']:.1f}%), "
            + (
                f"unanswerable below {th['dense_model']} rank {th['dense_top_k']} (q = {th['dense_quantile']}), "
                if th["dense_top_k"] is not None
                else "no dense check, "
            )
            + (f"entity-leak rate <= {100 * th['leak_rate']:.1f}%" if th["leak_rate"] is not None else "no leak check")
        )
        return report
