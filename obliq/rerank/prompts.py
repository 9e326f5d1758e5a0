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
checks are those of the synthetic-query prompts (:mod:`obliq.synth.prompts`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

from obliq.synth.generate import cut_words
from obliq.synth.prompts import Messages, check_prompt_file

log = logging.getLogger(__name__)

METHOD_FIELDS = {"tourrank": {"query", "documents", "n", "k"}, "listwise": {"query", "documents", "n"}}
"""The ``{fields}`` a prompt of each method may use; ``query`` and ``documents`` (and ``k`` for
TourRank) must appear."""


@dataclass(frozen=True)
class Prompt:
    """One prompt file: where it came from, its method and task, and its templates."""

    path: str
    method: str
    task: str | None
    system: str | None
    user: str


def _read(name: str, folder: str | Path | None) -> tuple[str, str] | None:
    """``(path label, text)`` of a prompt file in ``folder`` (None: the packaged folder), or None."""
    if folder is not None:
        file = Path(folder) / name
        return (str(file), file.read_text(encoding="utf-8")) if file.is_file() else None
    source = resources.files("obliq.rerank") / "prompts" / name
    return (f"obliq/rerank/prompts/{name}", source.read_text(encoding="utf-8")) if source.is_file() else None


def load_prompt(method: str, task: str | None = None, prompt_dir: str | Path | None = None) -> Prompt:
    """Read and check the prompt of a method (and, for listwise, of a task).

    Args:
        method: ``tourrank`` or ``listwise``.
        task: the task name (listwise: picks ``listwise_<task>.yaml``).
        prompt_dir: a folder searched, for every name, before the packaged prompts (the module notes
            give the order).

    Returns:
        The :class:`Prompt`.

    Raises:
        FileNotFoundError: no prompt file for the method (a packaged file was removed).
        ValueError: an unknown method; a file that is not a YAML mapping, lacks ``user``, has an
            unknown key or field, lacks a required field, or whose ``method`` disagrees (the
            message names the file and key).
    """
    if method not in METHOD_FIELDS:
        raise ValueError(f"no prompt for method {method!r} (one of {', '.join(METHOD_FIELDS)})")
    names = ["tourrank.yaml"] if method == "tourrank" else [f"listwise_{task}.yaml", "listwise_default.yaml"]
    folders = ([prompt_dir] if prompt_dir is not None else []) + [None]
    found = next((f for folder in folders for n in names if (f := _read(n, folder)) is not None), None)
    if found is None:
        raise FileNotFoundError(f"no prompt file {' or '.join(names)} in {prompt_dir or 'obliq/rerank/prompts'}")
    path, text = found
    if method == "listwise" and path.endswith("listwise_default.yaml"):
        log.warning("no listwise_%s.yaml prompt: task %s is reranked with the generic %s (not task-aware)",
                    task, task, path)
    data, system, user = check_prompt_file(path, text, ("method", "task", "system", "user"), METHOD_FIELDS[method],
                                           {"query", "documents"} | ({"k"} if method == "tourrank" else set()), method)
    if data.get("method") != method:
        raise ValueError(f"{path}: method: is {data.get('method')!r}, expected {method!r}")
    return Prompt(path, method, data.get("task"), system, user)


def render(prompt: Prompt, query: str, documents: Sequence[str], k: int | None = None,
           max_query_words: int = 200, max_doc_words: int = 100) -> Messages:
    """Fill a prompt for one group (TourRank) or window (listwise).

    Args:
        prompt: from :func:`load_prompt`.
        query: the query text, cut to ``max_query_words`` whitespace words.
        documents: the candidates' texts in the order shown; numbered ``[1]``…``[n]``, each cut to
            ``max_doc_words`` words and put on one line.
        k: how many to select (TourRank).

    Returns:
        Chat messages: an optional system message, then the user message.
    """
    lines = [f"[{i}] {' '.join(cut_words(text, max_doc_words)[0].split())}" for i, text in enumerate(documents, 1)]
    values = {"query": cut_words(query, max_query_words)[0], "documents": "\n".join(lines),
              "n": len(documents), "k": k if k is not None else ""}
    messages = []
    if prompt.system:
        messages.append({"role": "system", "content": prompt.system.format_map(values)})
    messages.append({"role": "user", "content": prompt.user.format_map(values)})
    return messages
