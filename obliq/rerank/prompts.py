"""Reranking prompts, kept as data: TourRank's selection prompt and one listwise prompt per task.

Files live in ``obliq/rerank/prompts/`` (users may edit them, or put their own in a ``prompt_dir``,
which wins over every packaged file):

- ``tourrank.yaml``: the generic selection prompt of every TourRank group (fields ``{query}``,
  ``{documents}``, ``{n}``, ``{k}``);
- ``listwise_<task>.yaml``: the task-aware listwise prompt that names the task's latent attribute
  (the OBLIQ-IR paper, §5 "When language-model reranking helps": "rank by authorial style; ignore
  topic"); fields ``{query}``, ``{documents}``, ``{n}``. A task without its own file gets
  ``listwise_default.yaml`` (generic relevance), with a warning.

Search order: ``prompt_dir/tourrank.yaml``, then the packaged one; for listwise,
``prompt_dir/listwise_<task>.yaml``, ``prompt_dir/listwise_default.yaml``, then the packaged
``listwise_<task>.yaml`` and ``listwise_default.yaml``.

A prompt file has ``method``, optional ``task``, optional ``system`` and ``user``; the template
checks are the LLM layer's (:mod:`obliq.llm.prompts`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from obliq.llm.prompts import Messages, PromptTemplate, cut_words, find_prompt, read_prompt

log = logging.getLogger(__name__)

METHOD_FIELDS = {"tourrank": {"query", "documents", "n", "k"}, "listwise": {"query", "documents", "n"}}
"""The ``{fields}`` a prompt of each method may use; ``query`` and ``documents`` (and ``k`` for
TourRank) must appear."""


def load_rerank_prompt(method: str, task: str | None = None, prompt_dir: str | Path | None = None) -> PromptTemplate:
    """Read and check the prompt of a method (and, for listwise, of a task).

    Args:
        method: ``tourrank`` or ``listwise``.
        task: the task name (listwise: picks ``listwise_<task>.yaml``).
        prompt_dir: a folder searched, for every name, before the packaged prompts (the module notes
            give the order).

    Returns:
        The checked template; its ``header`` holds ``method`` and ``task``.

    Raises:
        FileNotFoundError: no prompt file for the method (a packaged file was removed).
        ValueError: an unknown method; a file that is not a YAML mapping, lacks ``user``, has an
            unknown key or field, lacks a required field, or whose ``method`` disagrees (the
            message names the file and key).
    """
    if method not in METHOD_FIELDS:
        raise ValueError(f"no prompt for method {method!r} (one of {', '.join(METHOD_FIELDS)})")
    names = ["tourrank.yaml"] if method == "tourrank" else [f"listwise_{task}.yaml", "listwise_default.yaml"]
    found = find_prompt(names, prompt_dir, "obliq.rerank")
    if found is None:
        raise FileNotFoundError(f"no prompt file {' or '.join(names)} in {prompt_dir or 'obliq/rerank/prompts'}")
    path, text = found
    if method == "listwise" and path.endswith("listwise_default.yaml"):
        log.warning(
            "no listwise_%s.yaml prompt: task %s is reranked with the generic %s (not task-aware)", task, task, path
        )
    prompt = read_prompt(
        path,
        text,
        ("method", "task"),
        METHOD_FIELDS[method],
        {"query", "documents"} | ({"k"} if method == "tourrank" else set()),
        method,
    )
    if prompt.header.get("method") != method:
        raise ValueError(f"{path}: method: is {prompt.header.get('method')!r}, expected {method!r}")
    return prompt


def render_candidates(
    prompt: PromptTemplate,
    query: str,
    documents: Sequence[str],
    k: int | None = None,
    max_query_words: int = 200,
    max_doc_words: int = 100,
) -> Messages:
    """Fill a prompt for one group (TourRank) or window (listwise).

    Args:
        prompt: from :func:`load_rerank_prompt`.
        query: the query text, cut to ``max_query_words`` whitespace words.
        documents: the candidates' texts in the order shown; numbered ``[1]``…``[n]``, each cut to
            ``max_doc_words`` words and put on one line.
        k: how many to select (TourRank).

    Returns:
        Chat messages: an optional system message, then the user message.
    """
    lines = [f"[{i}] {' '.join(cut_words(text, max_doc_words)[0].split())}" for i, text in enumerate(documents, 1)]
    return prompt.render(
        {
            "query": cut_words(query, max_query_words)[0],
            "documents": "\n".join(lines),
            "n": len(documents),
            "k": k if k is not None else "",
        }
    )
