"""The identity-signal audit's summaries of a contrast, from obliq's one statistics path.

The identity-signals paper (§2.3, §3.3, its Tables 7–8 and 11–13, "appendix H") reports, for paired
query variants, the mean per-pair difference with a 95% (cluster-)bootstrap interval, a two-sided
paired Wilcoxon test and a sign-flip permutation test; for unpaired groups, the difference of group
means with a two-group percentile bootstrap and a two-sided Mann–Whitney U test. Every statistic is
:mod:`obliq.eval.significance`'s (the intervals, the exact-or-Monte-Carlo sign-flip test, the scipy
rank tests); this module assembles them per contrast. docs/audit.md lists the exact choices.
"""

from __future__ import annotations

from dataclasses import asdict

from obliq.eval.significance import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    PERMUTATIONS,
    bootstrap_gap,
    bootstrap_mean,
    finite_values,
    mann_whitney_test,
    sign_flip_test,
    wilcoxon_test,
)


def paired_summary(
    reference,
    comparison,
    clusters=None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict:
    """Everything the paper reports for paired variants (its Tables 7, 11, 13), on aligned values.

    Args:
        reference: (n,) per-pair values of the reference variant (e.g. RR@10 of the AAL question).
        comparison: (n,) values of the other variant, aligned (e.g. RR@10 of its WME translation).
        clusters: (n,) cluster labels of the pairs, or None (each pair its own cluster).
        resamples: bootstrap draws; permutations: sign-flip resamples; seed; confidence.

    Returns:
        ``n_pairs``, ``n_clusters``, ``mean_reference`` / ``mean_comparison`` with their intervals,
        ``delta`` (mean of comparison − reference) with its interval, ``wilcoxon`` and ``sign_flip``.

    Raises:
        ValueError: arrays of different lengths, empty, or non-finite.
    """
    r, c = finite_values(reference, "reference"), finite_values(comparison, "comparison")
    if r.shape != c.shape:
        raise ValueError(f"reference and comparison must be aligned, got {r.shape} and {c.shape}")
    d = c - r
    kw = dict(clusters=clusters, resamples=resamples, seed=seed, confidence=confidence)
    mr, mc, md = bootstrap_mean(r, **kw), bootstrap_mean(c, **kw), bootstrap_mean(d, **kw)
    flip = sign_flip_test(d, clusters, permutations, seed)
    return {
        "n_pairs": len(d),
        "n_clusters": flip.n_units,
        "mean_reference": mr[0],
        "ci_reference": [mr[1], mr[2]],
        "mean_comparison": mc[0],
        "ci_comparison": [mc[1], mc[2]],
        "delta": md[0],
        "ci": [md[1], md[2]],
        "wilcoxon": wilcoxon_test(d),
        "sign_flip": asdict(flip),
    }


def groups_summary(
    reference,
    comparison,
    clusters_reference=None,
    clusters_comparison=None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict:
    """Everything the paper reports for unpaired groups (its Tables 8 and 12).

    Args:
        reference / comparison: per-query values of the two groups (e.g. RR@10 of AAL and of WME
            questions); lengths may differ.
        clusters_reference / clusters_comparison: cluster labels per query, or None.
        resamples, seed, confidence: as in :func:`bootstrap_mean`.

    Returns:
        ``n_reference``, ``n_comparison``, each group's mean with its interval, ``gap``
        (mean comparison − mean reference) with its two-group interval, ``mann_whitney``.

    Raises:
        ValueError: an empty group or non-finite values.
    """
    a, b = finite_values(reference, "reference group"), finite_values(comparison, "comparison group")
    ma = bootstrap_mean(a, clusters_reference, resamples, seed, confidence)
    mb = bootstrap_mean(b, clusters_comparison, resamples, seed, confidence)
    gap = bootstrap_gap(a, b, clusters_reference, clusters_comparison, resamples, seed, confidence)
    return {
        "n_reference": len(a),
        "n_comparison": len(b),
        "mean_reference": ma[0],
        "ci_reference": [ma[1], ma[2]],
        "mean_comparison": mb[0],
        "ci_comparison": [mb[1], mb[2]],
        "gap": gap[0],
        "ci": [gap[1], gap[2]],
        "mann_whitney": mann_whitney_test(a, b),
    }
