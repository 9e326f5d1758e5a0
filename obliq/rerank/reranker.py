"""Apply a reranking policy to runs: each task's dense top-N goes through its reranker (identity,
TourRank or task-aware listwise), documents below N keep their dense order after the reranked ones.

Used by ``python evaluate.py --rerank FILE`` and the ``obliq rerank`` commands.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import replace

from obliq.llm.backends import Backend
from obliq.rerank.config import METHODS, RerankConfig
from obliq.rerank.judge import Judge, RerankStats
from obliq.rerank.listwise import listwise
from obliq.rerank.prompts import render_candidates
from obliq.rerank.tourrank import tourrank
from obliq.search.retrieval import Retrieval, Retriever
from obliq.search.runs import Run, top_k
from obliq.tasks import Task

log = logging.getLogger(__name__)


def query_seed(seed: int, query_id: str) -> int:
    """A query's generation/grouping seed: a stable hash of the policy seed and the query id."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{query_id}".encode(), digest_size=4).digest(), "little")


def queries_to_rerank(
    task: Task, run: Run, query_ids: Sequence[str] | None = None, source: object = "the run"
) -> list[str]:
    """The queries to rerank, checked against the task: the one check of a run (``obliq rerank run``,
    ``obliq rerank policy`` and :meth:`Reranker.rerank_run` use it).

    Args:
        task: the task.
        run: query id → document id → score.
        query_ids: the queries asked for; default the task's queries the run holds, in task order
            (queries of other tasks in the run are left out).
        source: names the run in messages (its file).

    Returns:
        The query ids.

    Raises:
        ValueError: ``<source>: …``: the run holds no query of the task (an empty run, or a run of
            another task); a query asked for that the task or the run lacks; a document of those
            queries that the task's corpus lacks.
    """
    if query_ids is None:
        query_ids = [q for q in task.query_ids if q in run]
        if not query_ids:
            seen = f"its ids look like {next(iter(run))!r}" if run else "it is empty"
            raise ValueError(f"{source}: no query of task {task.name} ({seen}; the task's like {task.query_ids[0]!r})")
    queries, docs = set(task.query_ids), set(task.doc_ids)
    for qid in query_ids:
        if qid not in queries:
            raise ValueError(f"{source}: query {qid!r} is not a query of task {task.name}")
        if qid not in run:
            raise ValueError(f"{source}: query {qid!r} of task {task.name} is not in the run")
        missing = next((d for d in run[qid] if d not in docs), None)
        if missing is not None:
            raise ValueError(
                f"{source}: document {missing!r} of query {qid!r} is not in the corpus of task {task.name}"
            )
    return list(query_ids)


class Reranker:
    """Reranks runs with the rerankers a :class:`obliq.rerank.config.RerankConfig` describes.

    Args:
        config: the policy and reranker settings.
        backend: a text generator to use; default ``config.backend.build()``, loaded when the first
            call is needed (so a policy that keeps every task at identity, a run whose lists have
            nothing to order, or a run that fails its check never loads a model).
    """

    def __init__(self, config: RerankConfig, backend: Backend | None = None):
        self.config, self._backend = config, backend

    @property
    def backend(self) -> Backend:
        """The text generator (built on first access)."""
        if self._backend is None:
            self._backend = self.config.backend.build()
        return self._backend

    def rerank_run(
        self, task: Task, run: Run, method: str | None = None, query_ids: Sequence[str] | None = None
    ) -> tuple[Run, RerankStats]:
        """Rerank the top ``config.depth`` documents of every query of a run.

        Args:
            task: the task (query and document texts).
            run: query id → document id → score (the dense run).
            method: ``identity``, ``tourrank`` or ``listwise``; default the policy's for this task.
            query_ids: rerank only these queries (the result holds only them); default the task's
                queries the run holds (:func:`queries_to_rerank`).

        Returns:
            The reranked run (scores ``len(list) − rank``: reranked top-N first, then the rest in
            dense order) and what it cost. ``identity`` returns the run's ranking unchanged at no cost.

        Raises:
            ValueError: an unknown method; a run that fails :func:`queries_to_rerank` (before any call);
                a bad prompt file.
        """
        cfg = self.config
        method = method or cfg.method(task.name)
        if method not in METHODS:
            raise ValueError(f"unknown rerank method {method!r} (one of {', '.join(METHODS)})")
        ids = queries_to_rerank(task, run, query_ids)
        stats = RerankStats()
        if method == "identity":
            return {q: dict(run[q]) for q in ids}, stats
        queries = dict(zip(task.query_ids, task.query_texts))
        texts = dict(zip(task.doc_ids, task.doc_texts))
        prompt = cfg.prompt(method, task.name)
        judge = Judge(lambda: self.backend, stats, cfg.temperature, cfg.tokens_per_id)
        out: Run = {}
        for n, qid in enumerate(ids, 1):
            ranked = top_k(run[qid], len(run[qid]))
            head = ranked[: cfg.depth]

            def prompt_for(positions: list[int], k: int | None, qid=qid, head=head):
                return render_candidates(
                    prompt, queries[qid], [texts[head[i]] for i in positions], k, cfg.max_query_words, cfg.max_doc_words
                )

            seed = query_seed(cfg.seed, qid)
            if method == "tourrank":
                order = tourrank(len(head), judge, prompt_for, cfg.tourrank, seed)
            else:
                order = listwise(len(head), judge, prompt_for, cfg.listwise, seed)
            final = [head[i] for i in order] + ranked[cfg.depth :]
            out[qid] = {d: float(len(final) - r) for r, d in enumerate(final)}
            stats.queries += 1
            if n % max(1, len(ids) // 10) == 0 or n == len(ids):
                log.info(
                    "%s on %s: %d/%d queries, %d calls (%d failed), %.1f s",
                    method,
                    task.name,
                    n,
                    len(ids),
                    stats.calls,
                    stats.failed_calls,
                    stats.seconds,
                )
        return out, stats

    def wrap(self, retrieve: Retriever) -> Retriever:
        """A retriever whose runs go through this policy's rerankers (``evaluate --rerank``).

        Args:
            retrieve: task → dense :class:`~obliq.search.retrieval.Retrieval`.

        Returns:
            task → :class:`~obliq.search.retrieval.Retrieval` whose ``run`` is reranked (``dense_run``
            keeps the dense one) for the tasks the policy names with a reranker; ``rerank`` records
            the method, the prompt file and the cost.
        """
        cfg = self.config

        def wrapped(task: Task) -> Retrieval:
            retrieval = retrieve(task)
            method = cfg.method(task.name)
            if method == "identity":
                return replace(retrieval, rerank={"method": "identity"})
            run, stats = self.rerank_run(task, retrieval.run, method)
            info = {
                "method": method,
                "depth": cfg.depth,
                "backend": f"{cfg.backend.name}:{cfg.backend.model}",
                "prompt": cfg.prompt(method, task.name).path,
                "cost": stats.as_dict(),
            }
            return replace(retrieval, run=run, dense_run=retrieval.run, rerank=info)

        return wrapped
