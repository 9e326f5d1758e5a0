"""``obliq search``: the search of a corpus's embeddings as a stage (Tevatron's ``search`` driver).

It reads the complete store that ``obliq encode`` wrote (:mod:`obliq.commands.encode`; memory-mapped),
encodes the queries, searches as the retrieval settings say (exact, or an index saved beside the
embeddings), and writes a TREC run and a record of the search (index, parameters, recall against exact
search, timings) per task. It is ``evaluate`` without the qrels' metrics.
"""

from __future__ import annotations

import logging
from pathlib import Path

from obliq.claims import claim_outputs
from obliq.eval.results import write_retrieval
from obliq.files import safe_name, write_json
from obliq.search.retrieval import check_index, make_retriever
from obliq.search.settings import RetrievalSettings
from obliq.tasks import find_tasks, load_task

log = logging.getLogger(__name__)


def search(
    model: str,
    tasks: list[str],
    output: Path,
    retrieval: RetrievalSettings = RetrievalSettings(),
    latency_queries: int = 0,
    overwrite: bool = False,
) -> dict:
    """Search each task's queries over its corpus embeddings and write the runs (one process).

    Per task, ``<output>/<task>/`` gets ``run.trec`` and ``search.json`` (``task``, ``model``,
    ``n_queries``, ``n_docs``, ``depth``, ``corpus_cache``, ``index``: the index, its parameters and,
    for an approximate one, ``recall_vs_exact``; ``timing_s``, ``latency_ms``, ``reads``); ``<output>/``
    gets ``config.json`` (these arguments).

    Args:
        model: the dense encoder whose store ``obliq encode`` wrote (a missing store is encoded first,
            into the cache, as ``evaluate`` does).
        tasks: task folders, or folders of task folders.
        output: folder for the runs.
        retrieval: top_k, the query length, ``dim``, the index (``--retrieval.index hnsw``…) and its
            parameters, the stores' ``cache_dir`` (:class:`~obliq.search.settings.RetrievalSettings`).
        latency_queries: queries timed one at a time (0: none).
        overwrite: write into an ``output`` that already holds runs.

    Returns:
        task → ``{"run", "index"}``.

    Raises:
        FileExistsError: ``output`` holds something and ``overwrite`` is false.
        ValueError: ``output`` is (or holds, or lies inside) an input, or another command's output.
        IncompleteStore: a store with shards still to encode.
    """
    config = dict(locals())
    model_file = Path(model) if Path(model).exists() else None  # a model folder inside the output is an input
    if model.lower() == "bm25" or model.endswith(".trec"):
        raise ValueError(f"obliq search searches dense embeddings; {model!r} is not a dense encoder (use evaluate)")
    loaded = [load_task(p) for p in find_tasks(tasks)]
    for task in loaded:  # C42: an index faiss cannot train on a corpus is refused before any encoding or claim
        check_index(retrieval, task)
    with claim_outputs(
        {"output": output},
        command="search",
        inputs=[*tasks, model_file],
        overwrite=overwrite,
        what="search results",
        folders=["output"],
    ) as claimed:
        output = claimed["output"]
        retrieve = make_retriever(model, retrieval, latency_queries)
        out = {}
        for task in loaded:
            folder = output / safe_name(task.name, "task name")
            done = retrieve(task)
            write_json(folder / "search.json", write_retrieval(task, done, folder, model))
            recall = done.index.get("recall_vs_exact")
            log.info("%s: %s%s", task.name, done.index.get("factory"), f", recall vs exact {recall}" if recall else "")
            out[task.name] = {"run": str(folder / "run.trec"), "index": done.index}
        write_json(output / "config.json", config)
        return out
