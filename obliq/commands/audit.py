"""``obliq audit``: identity-signal audit of retrievers (the identity-signals paper), as a plain function.

health-dialect, BM25 and MiniLM side by side (paired: each AAL question against its WME
translation; groups: natural AAL against natural WME questions)::

    obliq audit --task ../shared/data/tasks/health-dialect --output runs/audit/health-dialect \\
        --models '[bm25, minilm]' --paired '[[aal, wme-translated]]' --groups '[[aal, wme]]'

Political lean (a corpus with a lean per document; own-lean gap = right − left)::

    obliq audit --task T --document_attributes T/lean.tsv --lean_relevant_only true \\
        --paired '[[left, right]]' --groups '[[left, right]]' --output runs/audit/T
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from time import perf_counter

from obliq.audit.contrasts import group_contrast, paired_contrast
from obliq.audit.inputs import (
    load_query_sets,
    query_set_files,
    read_document_lean,
    read_query_attributes,
    restrict_queries,
)
from obliq.audit.report import figure, headline_p, markdown
from obliq.audit.runs import model_run, query_values
from obliq.audit.stats import BOOTSTRAP_RESAMPLES, CONFIDENCE, PERMUTATIONS
from obliq.claims import claim_outputs
from obliq.eval.metrics import check_depth, parse_measures
from obliq.files import json_text, safe_name, write_json
from obliq.search.encoders import saved_windows
from obliq.search.retrieval import check_index, is_run_file
from obliq.search.runs import write_run
from obliq.search.settings import RetrievalSettings

log = logging.getLogger(__name__)

AUDIT_MEASURES = ("RR@10", "RR", "Recall@1", "Recall@5", "Recall@10", "Recall@20", "Recall@50", "Recall@100")
"""ΔRR@10 (the issue), full-ranking RR (what the paper's code calls MRR), the paper's Recall@k sweep."""


_GENERIC = {"model", "merged", "adapter", "export", "final", "checkpoint"}


def _folder(model: str, taken: set[str]) -> str:
    """A short unique folder name for a model (``bm25``, ``minilm``, ``<parent>-adapter``, a run file's
    stem), made safe by :func:`obliq.files.safe_name`."""
    path = Path(model.rstrip("/"))
    if model.lower() == "bm25":
        name = "bm25"
    elif is_run_file(model):
        name = path.stem
    else:
        name = f"{path.parent.name}-{path.name}" if path.name in _GENERIC and path.parent.name else path.name or model
    try:
        name = safe_name(name, "model name")
    except ValueError:
        name = "model"
    slug, i = name, 2
    while slug in taken:
        slug, i = f"{name}-{i}", i + 1
    taken.add(slug)
    return slug


def audit(
    task: Path,
    output: Path,
    query_attributes: Path | None = None,
    models: list[str] = ["bm25"],
    paired: list[tuple[str, str]] = [],
    groups: list[tuple[str, str]] = [],
    document_attributes: Path | None = None,
    lean_k: list[int] = [10],
    lean_relevant_only: bool = False,
    measures: list[str] = list(AUDIT_MEASURES),
    query_sets: list[str] | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
    confidence: float = CONFIDENCE,
    retrieval: RetrievalSettings = RetrievalSettings(),
    overwrite: bool = False,
) -> dict:
    """Audit retrievers for identity-signal sensitivity: paired variants, unpaired groups, lean@k.

    Every model retrieves the audited queries (those listed in the query-attributes file); each
    query is scored per measure (trec_eval, obliq.eval.metrics) and, with document attributes, by
    lean@k. Each contrast ``[reference, comparison]`` is then tested per model and metric:
    ``paired`` aligns the two groups' queries by pair-id (Δ = comparison − reference; mean with a
    (cluster) bootstrap CI, two-sided Wilcoxon, sign-flip permutation test); ``groups`` compares all
    queries of the two groups (gap of means, two-group bootstrap CI, Mann–Whitney U). docs/audit.md
    lists the exact statistical choices.

    Writes under ``output``: ``audit.json`` (everything), ``audit.md`` (tables), ``audit.png``
    (per-group means with CIs for the first measure and the first lean@k), ``config.json``, and per
    model ``<model>/run.trec`` and ``<model>/per_query.jsonl``.

    Args:
        task: a task folder in BEIR layout.
        output: folder for the results.
        query_attributes: TSV ``query-id  group  pair-id  [cluster-id]`` (header optional); default
            ``<task>/query_attributes.tsv``. Only the queries it lists are audited.
        models: ``bm25``, any model evaluate.py accepts (alias such as ``minilm``, folder, adapter,
            hub id), or a TREC run file (``*.trec``); audited side by side.
        paired: contrasts ``[reference, comparison]`` of paired variants, e.g. ``[[aal, wme-translated]]``.
        groups: contrasts ``[reference, comparison]`` of unpaired groups, e.g. ``[[aal, wme]]``;
            for lean, ``[[left, right]]`` gives the own-lean gap right − left.
        document_attributes: TSV ``corpus-id  lean`` (a number per document, e.g. -1/0/+1); adds
            ``lean@k`` to the audited metrics.
        lean_k: cut-offs of lean@k (the paper: 10; its sweep 5, 10, 20, 50, 100).
        lean_relevant_only: lean@k over the top-k documents judged relevant only (the paper's gold
            filter); queries without one are left out.
        measures: trec_eval measures per query; the first is the headline of the figure.
        query_sets: queries files of the task, ``FILE`` or ``FILE:SPLIT``; default ``queries.jsonl``
            (qrels/test.tsv) plus every ``queries-<name>.jsonl`` with a ``qrels/<name>.tsv``.
        resamples: bootstrap draws per interval.
        permutations: sign-flip resamples B (p floor 1/(B + 1); the paper: 50,000).
        seed: seed of every resampling.
        confidence: level of the intervals.
        retrieval: how each model retrieves, as ``evaluate``'s ``--retrieval``
            (:class:`obliq.search.settings.RetrievalSettings`; RR and Recall@k are computed within
            its ``top_k``; the corpus-embedding cache is shared with ``evaluate``).
        overwrite: write into an ``output`` that already holds an audit (refused otherwise).

    Returns:
        ``{"output", "files", "headline"}``: the headline lists, per contrast, model and headline
        metric, the difference, its CI and p-values.

    Raises:
        ValueError: no contrast, an unknown group or measure, lean options without document
            attributes, or bad input files (file, line and field named).
        FileNotFoundError: a missing task folder or file.
        FileExistsError: ``output`` holds an earlier audit and ``overwrite`` is false.
    """
    config = json.loads(json_text(locals()))
    started = perf_counter()
    task, output = Path(task), Path(output)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    if not paired and not groups:
        raise ValueError("nothing to audit: give --paired and/or --groups contrasts, e.g. --groups '[[aal, wme]]'")
    if document_attributes is None and (lean_relevant_only or list(lean_k) != [10]):
        raise ValueError("lean_k and lean_relevant_only need --document_attributes (corpus-id<TAB>lean)")
    if any(k < 1 for k in lean_k):
        raise ValueError(f"lean_k values must be at least 1, got {lean_k}")
    measures = list(parse_measures(measures))  # fails before any retrieval
    contrasts = [("paired", tuple(c)) for c in paired] + [("groups", tuple(c)) for c in groups]
    for kind, c in contrasts:
        if len(c) != 2 or c[0] == c[1]:
            raise ValueError(f"{kind} contrast {list(c)}: give two different groups [reference, comparison]")

    attributes = read_query_attributes(query_attributes or task / "query_attributes.tsv")
    attributes.check_groups([g for _, c in contrasts for g in c])
    sets = query_set_files(task, query_sets)
    loaded = restrict_queries(load_query_sets(task, query_sets), attributes, ", ".join(f for f, _ in sets))
    lean = read_document_lean(document_attributes, loaded.doc_ids) if document_attributes is not None else None
    metrics = measures + ([f"lean@{k}" for k in lean_k] if lean is not None else [])
    if not all(is_run_file(m) for m in models):
        check_depth(measures, retrieval.top_k, len(loaded.doc_ids))
    for m in models:  # C42: an index faiss cannot train on this corpus; MaxSim it cannot search
        if not is_run_file(m) and m.lower() != "bm25":
            check_index(retrieval, loaded, retrieval.windows or saved_windows(m, retrieval.encoder))

    inputs = [task, query_attributes, document_attributes, *(m for m in models if is_run_file(m))]
    with claim_outputs(
        {"output": output}, command="audit", inputs=inputs, overwrite=overwrite, what="an audit", folders=["output"]
    ):
        output.mkdir(parents=True, exist_ok=True)
        stats_kw = dict(resamples=resamples, seed=seed, confidence=confidence)
        report = {
            "task": loaded.name,
            "task_path": str(task),
            "query_attributes": str(attributes.path),
            "attribute": attributes.attribute,
            "query_sets": [f"{f}:{s}" for f, s in sets],
            "n_queries": len(loaded.query_ids),
            "n_docs": len(loaded.doc_ids),
            "group_sizes": {g: len(attributes.members(g)) for g in attributes.groups()},
            "metrics": metrics,
            "config": config,
            "models": [],
            "paired": [{"reference": c[0], "comparison": c[1], "rows": []} for k, c in contrasts if k == "paired"],
            "groups": [{"reference": c[0], "comparison": c[1], "rows": []} for k, c in contrasts if k == "groups"],
        }

        taken: set[str] = set()
        for model in models:
            t0 = perf_counter()
            slug = _folder(model, taken)
            run = model_run(model, loaded, retrieval)
            retrieval_s = perf_counter() - t0
            values = query_values(run, loaded, measures, lean, lean_k, lean_relevant_only)
            folder = output / slug
            write_run(folder / "run.trec", {q: run.get(q, {}) for q in loaded.query_ids}, tag=slug, task=loaded)
            with (folder / "per_query.jsonl").open("w", encoding="utf-8") as f:
                for q, r in attributes.rows.items():
                    row = {
                        "query_id": q,
                        attributes.attribute: r.group,
                        "pair_id": r.pair_id,
                        "cluster_id": r.cluster_id,
                    }
                    f.write(json_text({**row, **{m: values[m][q] for m in metrics}}, indent=None) + "\n")
            t1 = perf_counter()
            for entry in report["paired"]:
                for m in metrics:
                    row = paired_contrast(
                        values[m],
                        attributes,
                        entry["reference"],
                        entry["comparison"],
                        permutations=permutations,
                        **stats_kw,
                    )
                    entry["rows"].append({"model": slug, "metric": m, **row})
            for entry in report["groups"]:
                for m in metrics:
                    row = group_contrast(values[m], attributes, entry["reference"], entry["comparison"], **stats_kw)
                    entry["rows"].append({"model": slug, "metric": m, **row})
            report["models"].append(
                {
                    "name": slug,
                    "model": model,
                    "retrieval_s": round(retrieval_s, 2),
                    "statistics_s": round(perf_counter() - t1, 2),
                }
            )
            log.info("audited %s: retrieval %.1fs, statistics %.1fs", model, retrieval_s, perf_counter() - t1)

        report["seconds"] = round(perf_counter() - started, 2)
        report = json.loads(json_text(report))
        write_json(output / "audit.json", report)
        write_json(output / "config.json", config)  # with the results: a refused audit leaves no file behind
        (output / "audit.md").write_text(markdown(report))
        headline = [measures[0]] + ([f"lean@{lean_k[0]}"] if lean is not None else [])
        figure(report, output / "audit.png", headline)

        summary = []
        for kind in ("paired", "groups"):
            for entry in report[kind]:
                for row in entry["rows"]:
                    if row["metric"] in headline:
                        diff = row.get("delta", row.get("gap"))
                        summary.append(
                            {
                                "kind": kind,
                                "contrast": f"{entry['comparison']} - {entry['reference']}",
                                "model": row["model"],
                                "metric": row["metric"],
                                "difference": diff,
                                "ci": row.get("ci"),
                                "p": headline_p(row),
                                **({"wilcoxon_p": row["wilcoxon"]["p_value"]} if "wilcoxon" in row else {}),
                            }
                        )
        files = [str(output / n) for n in ("audit.json", "audit.md", "audit.png", "config.json")]
        return {"output": str(output), "files": files, "headline": summary}
