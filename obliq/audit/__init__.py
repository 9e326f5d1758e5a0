"""Identity-signal audit: does a retriever treat queries differently by dialect or political lean?

The identity-signals paper's evaluation (``reference/002_*.txt``) as a pipeline stage: paired query
variants (ΔRR@10, Recall@k differences; bootstrap CI, Wilcoxon, sign-flip permutation test),
unpaired groups (MRR gap; bootstrap CI, Mann–Whitney U) and lean@k (own-lean gap), for any model
``evaluate.py`` accepts, several side by side. ``obliq audit`` is :func:`obliq.commands.audit.audit`;
docs/audit.md has the method and the exact statistical choices.
"""

from obliq.audit.contrasts import group_contrast, paired_contrast, paired_values
from obliq.audit.inputs import (
    QueryAttributes,
    load_query_sets,
    read_document_lean,
    read_query_attributes,
    restrict_queries,
)
from obliq.audit.lean import lean_at_k
from obliq.audit.stats import (
    bootstrap_gap,
    bootstrap_mean,
    groups_summary,
    mann_whitney_test,
    paired_summary,
    sign_flip_test,
    wilcoxon_test,
)

__all__ = [
    "QueryAttributes",
    "bootstrap_gap",
    "bootstrap_mean",
    "group_contrast",
    "groups_summary",
    "lean_at_k",
    "load_query_sets",
    "mann_whitney_test",
    "paired_contrast",
    "paired_summary",
    "paired_values",
    "read_document_lean",
    "read_query_attributes",
    "restrict_queries",
    "sign_flip_test",
    "wilcoxon_test",
]
