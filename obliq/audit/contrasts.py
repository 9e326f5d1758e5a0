"""The two contrasts of the audit, from per-query values and the query-attributes file.

- **Paired** (the paper's HCMagic synth and translation settings, AllSides synth): the queries of the
  reference group and of the comparison group that share a pair-id are variants of one question.
  Per pair, each side's value is the mean over its variants there (the paper's Table 11 averages the
  three synthetic rewrites of a source); Δ = comparison − reference. A pair-id with no query on one
  side, or whose value is undefined on a side, is left out and counted.
- **Groups** (the natural-query settings): every query of the two groups, unpaired; the gap is
  mean(comparison) − mean(reference).

Statistics: :mod:`obliq.audit.stats`.
"""

from __future__ import annotations

import math

import numpy as np

from obliq.audit.inputs import QueryAttributes
from obliq.audit.stats import groups_summary, paired_summary


def _finite(x) -> bool:
    return x is not None and not math.isnan(x)


def paired_values(values: dict[str, float], attributes: QueryAttributes, reference: str, comparison: str) -> dict:
    """Align the two groups' values by pair-id.

    Args:
        values: query id → value (NaN or absent = undefined).
        attributes: the query-attributes file.
        reference / comparison: the two group names.

    Returns:
        ``{"reference": (n,) array, "comparison": (n,) array, "pair_ids", "clusters",
        "dropped": {"no_reference", "no_comparison", "undefined"}, "max_variants"}``.

    Raises:
        ValueError: a group name not in the file, or the two names are the same.
    """
    if reference == comparison:
        raise ValueError(f"a contrast needs two different groups, got {reference!r} twice")
    attributes.check_groups([reference, comparison])
    sides: dict[str, dict[str, list]] = {}
    for r in attributes.rows.values():
        if r.group in (reference, comparison):
            sides.setdefault(r.pair_id, {reference: [], comparison: [], "cluster": r.cluster_id})[r.group].append(
                r.query_id
            )
    ref, comp, pairs, clusters = [], [], [], []
    dropped = {"no_reference": 0, "no_comparison": 0, "undefined": 0}
    max_variants = 0
    for pair, side in sides.items():
        if not side[reference]:
            dropped["no_reference"] += 1
            continue
        if not side[comparison]:
            dropped["no_comparison"] += 1
            continue
        a = [values.get(q, math.nan) for q in side[reference]]
        b = [values.get(q, math.nan) for q in side[comparison]]
        if not all(map(_finite, a + b)):
            dropped["undefined"] += 1
            continue
        max_variants = max(max_variants, len(a), len(b))
        ref.append(float(np.mean(a)))
        comp.append(float(np.mean(b)))
        pairs.append(pair)
        clusters.append(side["cluster"])
    return {
        "reference": np.array(ref),
        "comparison": np.array(comp),
        "pair_ids": pairs,
        "clusters": clusters,
        "dropped": dropped,
        "max_variants": max_variants,
    }


def paired_contrast(
    values: dict[str, float],
    attributes: QueryAttributes,
    reference: str,
    comparison: str,
    **stats_kw,
) -> dict:
    """Paired contrast of one metric: :func:`paired_values` then :func:`obliq.audit.stats.paired_summary`.

    Clusters are passed to the statistics only when some cluster holds several pairs.

    Returns:
        The summary plus ``reference``, ``comparison``, ``dropped``, ``max_variants``; with no pair
        left, ``n_pairs`` = 0 and no statistics.
    """
    p = paired_values(values, attributes, reference, comparison)
    head = {
        "reference": reference,
        "comparison": comparison,
        "dropped": p["dropped"],
        "max_variants": p["max_variants"],
    }
    if len(p["pair_ids"]) == 0:
        return {**head, "n_pairs": 0}
    clusters = p["clusters"] if len(set(p["clusters"])) < len(p["clusters"]) else None
    return {**head, **paired_summary(p["reference"], p["comparison"], clusters, **stats_kw)}


def group_contrast(
    values: dict[str, float],
    attributes: QueryAttributes,
    reference: str,
    comparison: str,
    **stats_kw,
) -> dict:
    """Unpaired contrast of one metric between two groups (:func:`obliq.audit.stats.groups_summary`).

    Queries with an undefined value are left out and counted; clusters (the file's cluster-id) are
    used when some cluster of a group holds several queries.

    Returns:
        The summary plus ``reference``, ``comparison``, ``undefined`` ({group: count}); with an empty
        group, only the counts.

    Raises:
        ValueError: a group name not in the file, or the two names are the same.
    """
    if reference == comparison:
        raise ValueError(f"a contrast needs two different groups, got {reference!r} twice")
    attributes.check_groups([reference, comparison])
    arrays, clusters, undefined = {}, {}, {}
    for g in (reference, comparison):
        rows = attributes.members(g)
        kept = [r for r in rows if _finite(values.get(r.query_id))]
        undefined[g] = len(rows) - len(kept)
        arrays[g] = np.array([values[r.query_id] for r in kept])
        labels = [r.cluster_id for r in kept]
        clusters[g] = labels if len(set(labels)) < len(labels) else None
    head = {"reference": reference, "comparison": comparison, "undefined": undefined}
    if not len(arrays[reference]) or not len(arrays[comparison]):
        return {**head, "n_reference": len(arrays[reference]), "n_comparison": len(arrays[comparison])}
    return {
        **head,
        **groups_summary(arrays[reference], arrays[comparison], clusters[reference], clusters[comparison], **stats_kw),
    }
