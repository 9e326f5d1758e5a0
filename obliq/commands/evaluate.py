"""``obliq evaluate`` (and ``python evaluate.py``): a model, BM25 or a run file on tasks, optionally reranked.

Examples::

    obliq evaluate --model bm25 --tasks ../shared/data/tasks --output runs/bm25
    obliq evaluate --model minilm --tasks ../shared/data/tasks/math-theoremqa ../shared/data/tasks/writing-news \\
        --output runs/minilm --retrieval.top_k 100
    obliq evaluate --model minilm --tasks ../shared/data/tasks --output runs/minilm+rerank \\
        --rerank configs/rerank/cpu-smollm2.yaml   # LLM-rerank the tasks the policy names (docs/rerank.md)

It wires the layers together: tasks (:mod:`obliq.tasks`), the retriever
(:func:`obliq.search.retrieval.make_retriever` with a :class:`~obliq.search.settings.RetrievalSettings`),
the reranker of a policy (:mod:`obliq.rerank`), and the result files (:mod:`obliq.eval.results`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from obliq.claims import claim_outputs
from obliq.distributed import world
from obliq.eval.metrics import DEFAULT_MEASURES, check_depth, parse_measures
from obliq.eval.results import evaluate_tasks
from obliq.files import write_json
from obliq.search.encoders import saved_windows
from obliq.search.retrieval import check_index, is_run_file, make_retriever, retrieve_run_file
from obliq.search.settings import RetrievalSettings
from obliq.tasks import find_tasks, load_query_split, load_task

log = logging.getLogger(__name__)


def evaluate(
    model: str,
    tasks: list[str],
    output: Path,
    retrieval: RetrievalSettings = RetrievalSettings(),
    measures: str | list[str] = list(DEFAULT_MEASURES),
    latency_queries: int = 100,
    rerank: Path | None = None,
    split: str = "test",
    overwrite: bool = False,
) -> list[dict]:
    """Evaluate a model (or BM25, or a run file) on tasks and write runs, metrics, a table and a Recall@k plot.

    Per task, ``<output>/<task>/`` gets ``run.trec``, ``per_query.jsonl`` and ``summary.json``; over
    all tasks ``<output>/`` gets ``results.md``, ``recall_at_k.png`` and ``config.json`` (these
    arguments). See docs/formats.md.

    Args:
        model: ``bm25``; a TREC run file (``*.trec``); a folder saved by obliq (``obliq export``: a
            LoRA adapter or a full model); a peft adapter folder; a sentence-transformers or
            transformers folder; an alias (``minilm``); or a hub id (needs the hub cache offline).
        tasks: task folders in BEIR layout, or folders holding task folders. A task with candidate sets
            (``top_ranked/test.jsonl``) is ranked over each query's candidates only; the summary says so.
        output: folder for the results.
        retrieval: how to retrieve: encoder kind, top_k, batch size, query/passage max lengths,
            the corpus-embedding store (``obliq encode`` writes it), the index (``flat``, ``hnsw``,
            ``ivf-pq``, ``int8``, ``binary``…, its parameters and rescoring: an approximate one reports
            its recall against exact search), ``dim`` (a Matryoshka truncation), BM25's k1/b/stemmer,
            trust_remote_code (:class:`obliq.search.settings.RetrievalSettings`).
        measures: metrics reported (trec_eval names accepted), e.g. ``[NDCG@10,Recall@100]``. A cut-off
            that is not a rank (``NDCG@0``) is refused before anything is read; one deeper than the
            ranking (``retrieval.top_k``, or a run file's depth, against the task's corpus) before anything
            is retrieved (:func:`obliq.eval.metrics.check_depth`).
        latency_queries: queries timed one at a time for latency p50/p95 (0: none).
        rerank: a reranking policy file (configs/rerank/…, or one written by ``obliq rerank
            policy``): the tasks it names get their reranker over the dense top-N; the others keep
            the dense run. Cost (calls, tokens, seconds per query) is reported next to the metrics;
            ``run.dense.trec`` keeps the dense run and ``rerank_policy.yaml`` the policy as loaded.
        split: the queries scored: ``test`` (``queries.jsonl`` + ``qrels/test.tsv``), or another side of a
            split task, e.g. ``dev`` (``queries-dev.jsonl`` + ``qrels/dev.tsv``, written by ``obliq task split``;
            refused where one of its queries is also a test query), the side to choose settings on. Its
            tasks are named ``<task>-<split>``.
        overwrite: write into an ``output`` that already holds results (refused otherwise, before any work).

    Under ``torchrun`` (or any launcher that sets ``WORLD_SIZE``), the ranks share the encoding
    (:func:`obliq.search.retrieval.encode_texts`) and rank 0 writes the results; reranking needs one
    process.

    Returns:
        One summary per task (as written to ``summary.json``; ``results.md`` holds the table); an empty
        list on the other ranks of a process group.
    """
    config = {k: v for k, v in locals().items()}
    parse_measures(measures)  # a bad name or cut-off (NDCG@0): refused before any task is read
    rank = _join_process_group()
    model_file = Path(str(model)) if isinstance(model, (str, Path)) and Path(str(model)).exists() else None
    inputs = [*tasks, rerank, model_file]  # a run file or model folder inside the output would be rewritten
    loaded = [
        load_task(p) if split == "test" else load_query_split(p, split, apart_from=load_task(p))
        for p in find_tasks(tasks)
    ]
    windows = retrieval.windows or saved_windows(model, retrieval.encoder)  # a saved model's own, read once
    for task in loaded:  # fail before any encoding or claim
        if is_run_file(model):  # a run of another task, or one too shallow for a measure, is refused here
            check_depth(measures, retrieve_run_file(model, task).depth, task.max_ranked, f"the depth of {model}")
        else:
            check_depth(measures, retrieval.top_k, task.max_ranked)
            if str(model).lower() != "bm25":  # C42: an index faiss cannot train on this corpus; MaxSim it cannot search
                check_index(retrieval, task, windows)
    policy = None
    if rerank is not None:
        from obliq.rerank.config import dump_policy, load_policy

        if world()[1] > 1:
            raise ValueError("--rerank runs on one process; evaluate the dense run on several, then rerank")
        policy = load_policy(rerank)  # fail before any encoding (its prompt files are checked too)
        unknown = sorted(set(policy.tasks) - {t.name for t in loaded})
        if unknown:
            log.warning("%s names tasks not evaluated here: %s", rerank, ", ".join(unknown))
    # claimed (made and marked) only once the inputs were read and checked: a refused call leaves nothing
    with claim_outputs(
        {"output": output},
        command="evaluate",
        inputs=inputs,
        overwrite=overwrite,
        what="evaluation results",
        folders=["output"],
    ) as claimed:
        output = claimed["output"]
        retrieve = make_retriever(model, retrieval, latency_queries)
        if rank != 0:  # the same retrievals, in the same order: this rank's share of the encoding
            for task in loaded:
                retrieve(task)
            return []
        output.mkdir(parents=True, exist_ok=True)
        if policy is not None:
            from obliq.rerank.reranker import Reranker

            dump_policy(
                policy, output / "rerank_policy.yaml", f"The reranking policy {rerank}, as loaded by evaluate.py."
            )
            retrieve = Reranker(policy).wrap(retrieve)
        summaries = evaluate_tasks(retrieve, loaded, output, "bm25" if model.lower() == "bm25" else model, measures)
        write_json(output / "config.json", config)  # with the results: a refused run leaves no file behind
        return summaries


def _join_process_group() -> int:
    """Join the process group a launcher set up (``WORLD_SIZE`` > 1: gloo on CPUs, nccl on GPUs, each
    rank on its own GPU); returns this process's rank (0 alone)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torch imported only then: BM25 alone never needs it
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return world()[0]
