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

from obliq.data.rows import read_rows
from obliq.eval.bm25 import BM25
from obliq.eval.tasks import load_task
from obliq.files import read_text, refuse_input_as_output, write_json
from obliq.llm.backends import BackendConfig
from obliq.synth.audit import audit_pairs, format_audit
from obliq.synth.generate import GenerationConfig, synthesize
from obliq.synth.prompts import TaskSpec

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
) -> dict:
    """Write synthetic training queries for a task (Stage A, then Stage B through the task's lens).

    Stage A describes each sampled document's latent attribute; Stage B writes one query through the
    task's lens (the OBLIQ-IR paper, §3.1). Rows are appended to ``out`` (one per document, docs/formats.md format, ``negatives`` empty); a rerun
    skips documents already there, so a killed run resumes. Rejected replies are retried, then the
    document is skipped; they are logged in ``<out>.rejects.jsonl``. The report is returned and saved
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
    """
    args = {k: (str(v) if isinstance(v, Path) else asdict(v) if hasattr(v, "__dataclass_fields__") else v)
            for k, v in locals().items()}
    task_files = [p for p in Path(task).rglob("*") if p.is_file()]
    for written in (Path(out), Path(out).with_name(Path(out).name + ".rejects.jsonl"),
                    Path(out).with_name(Path(out).name + ".report.json")):
        refuse_input_as_output(written, task_files)
    data = load_task(task)
    engine = backend.build()
    report = asdict(synthesize(data, spec, engine, out, n_docs=n_docs, seed=seed, generation=generation,
                               prompt_dir=prompt_dir))
    out = Path(out)
    write_json(out.with_name(out.name + ".report.json"), {"args": args, "report": report})
    log.info("%s: %d rows written (%d already done), skipped %s, %d retries, %.1f tokens/s", report["task"],
             report["generated"], report["already_done"], report["skipped"], report["retries"], report["tokens_per_s"])
    return report


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
    table = [audit_pairs("generated", [r["query"] for r in items], [[index[r["positive"]["id"]]] for r in items],
                         data.doc_texts, bm25)]
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
            print(f"replies rejected, share of {replies}: " + (", ".join(f"{k} {100 * v:.1f}%" for k, v in
                                                                       out["rejected_share"].items()) or "none"))
    return out
