"""OBLIQ-Bench (Tchuindjo et al., 2026) as mteb ships it, and the OBLIQ-IR paper's reading of it.

mteb 2.26.24 (PR #4710, ``mteb/tasks/retrieval/eng/obliq_bench_retrieval.py``) defines the five tasks
over one dataset, ``mteb/OBLIQBenchRetrieval`` at a pinned revision, one subset per task, split
``test``. What each task's mteb description says, recorded here once:

- Twitter, WildChat and Math are judged against **pooled** judgements; Writing uses gold authorship
  labels; Congress has exactly one gold passage per query. mteb carries one qrels set per task, so
  the gold judgements of the paper's Twitter and Math tables (Tables 1, 2: Gold / Pooled) are not in
  it: a number from these tasks compares with the paper's Pooled column.
- Math and Writing give every query a **candidate set** (mteb's ``top_ranked``): the corpus minus
  the query's same-source documents (1–3 of them), the only documents it is ranked over.

The instructions are the OBLIQ-IR paper's per-task prefixes (Appendix B.3), which the paper prepends
to queries at training and inference; the paper gives none for WildChat (it does not claim that
task). The model card trains and evaluates without them (``use_instructions`` off): an encoder reads
an instruction only when it was trained with instructions (:class:`obliq.model.BiEncoder`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchTask:
    """One OBLIQ-Bench task in mteb."""

    paper_name: str
    """The name the papers use."""
    subset: str
    """mteb's subset (the dataset's config prefix)."""
    mechanism: str
    """The query mechanism (descriptive | analogue | tip-of-the-tongue), from mteb's description."""
    judgements: str
    """What mteb's qrels are: ``pooled`` or ``gold``."""
    candidates: bool
    """Whether every query has a candidate set (``top_ranked``)."""
    instruction: str | None
    """The OBLIQ-IR paper's B.3 prefix (None: the paper gives none)."""


OBLIQ_BENCH = {
    "OBLIQBenchTwitterRetrieval": BenchTask(
        "Twitter-Conflict",
        "twitter",
        "descriptive",
        "pooled",
        False,
        "Retrieve tweets that implicitly express the latent stance described in the query, without surface "
        "mention of the topic.",
    ),
    "OBLIQBenchWildChatRetrieval": BenchTask("WildChat-Errors", "wildchat", "descriptive", "pooled", False, None),
    "OBLIQBenchMathRetrieval": BenchTask(
        "Math Meta-Program",
        "math",
        "analogue",
        "pooled",
        True,
        "Given an example problem, retrieve other math problems whose solutions share the same abstract "
        "reasoning technique.",
    ),
    "OBLIQBenchWritingRetrieval": BenchTask(
        "Writing-Style",
        "writing",
        "analogue",
        "gold",
        True,
        "Given a prose snippet, retrieve other snippets by the same author across different topics, based on "
        "stylistic fingerprint.",
    ),
    "OBLIQBenchCongressRetrieval": BenchTask(
        "Congress Hearings",
        "congress",
        "tip-of-the-tongue",
        "gold",
        False,
        "Retrieve the specific Congressional hearing passage matching the user\u2019s lossy recollection of the "
        "exchange.",
    ),
}
"""mteb task name → :class:`BenchTask`."""
