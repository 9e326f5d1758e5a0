"""The audit's markdown table and figure (per-group means with CIs, the paper's Figures 2–3 style)."""

from __future__ import annotations

import math
from pathlib import Path


def fmt_p(p: float | None, floor: float | None = None) -> str:
    """A p-value for a table (1.2e-05, 0.0049, 0.128); a permutation p at its floor is marked."""
    if not _finite(p):
        return "–"
    text = f"{p:.1e}" if p < 0.001 else f"{p:.2g}" if p < 0.01 else f"{p:.3f}"
    return f"{text} (floor)" if floor is not None and abs(p - floor) <= 1e-15 else text


def flip_p(flip: dict) -> str:
    """A sign-flip p-value with its method and n, for a table cell: ``0.250 (exact, n 3)``."""
    if flip["method"] == "untestable":
        return f"1 (untestable, n {flip['n_nonzero']})"
    method = "exact" if flip["method"] == "exact" else "MC"
    return f"{fmt_p(flip['p_value'], flip['p_floor'])} ({method}, n {flip['n_nonzero']})"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _num(x: float | None, signed: bool = False) -> str:
    if not _finite(x):
        return "–"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def _ci(ci: list | None) -> str:
    return "–" if not ci else f"[{_num(ci[0], True)}, {_num(ci[1], True)}]"


def stars(p: float | None) -> str:
    """The paper's stars: * p < 0.05, ** p < 0.01, *** p < 0.001."""
    if not _finite(p):
        return ""
    return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < 0.05 else ""


def headline_p(row: dict) -> float | None:
    """The p-value behind a contrast's stars: the sign-flip test (paired) or Mann–Whitney U (groups)."""
    if "sign_flip" in row:
        return row["sign_flip"]["p_value"]
    if "mann_whitney" in row:
        return row["mann_whitney"]["p_value"]
    return None


def markdown(report: dict) -> str:
    """The report as markdown: one table per contrast, a row per model and metric."""
    cfg = report["config"]
    lines = [
        f"# Identity-signal audit: {report['task']}",
        "",
        f"Query attributes: `{report['query_attributes']}` (column `{report['attribute']}`). "
        f"Models: {', '.join(m['name'] for m in report['models'])}.",
        "",
        f"{round(cfg['confidence'] * 100)}% percentile bootstrap CIs (B = {cfg['resamples']:,}, seed {cfg['seed']}; "
        "cluster bootstrap where clusters hold several units). Paired: two-sided Wilcoxon signed-rank "
        "(zero_method = wilcox) and two-sided sign-flip test over the non-zero differences (exact over all 2^n "
        f"sign patterns for n ≤ 20; otherwise Monte Carlo, B = {cfg['permutations']:,}, p floor "
        f"{1 / (cfg['permutations'] + 1):.1e}); each p is given with its method and n. Groups: two-sided "
        "Mann–Whitney U. Δ and gap are comparison − reference.",
    ]
    for kind, title in (("paired", "Paired"), ("groups", "Groups")):
        for contrast in report[kind]:
            ref, comp = contrast["reference"], contrast["comparison"]
            lines += ["", f"## {title}: {comp} − {ref}", ""]
            if kind == "paired":
                lines += [
                    f"| model | metric | pairs | {ref} | {comp} | Δ | 95% CI | Wilcoxon p | sign-flip p |",
                    "|---|---|---:|---:|---:|---:|---|---:|---:|",
                ]
            else:
                lines += [
                    f"| model | metric | n ({ref} / {comp}) | {ref} | {comp} | gap | 95% CI | Mann–Whitney p |",
                    "|---|---|---:|---:|---:|---:|---|---:|",
                ]
            for row in contrast["rows"]:
                head = f"| {row['model']} | {row['metric']} |"
                if kind == "paired":
                    if not row.get("n_pairs"):
                        lines.append(head + " 0 | – | – | – | – | – | – |")
                        continue
                    flip = row["sign_flip"]
                    lines.append(
                        f"{head} {row['n_pairs']} | {_num(row['mean_reference'])} | {_num(row['mean_comparison'])} | "
                        f"{_num(row['delta'], True)} | {_ci(row['ci'])} | {fmt_p(row['wilcoxon']['p_value'])} | "
                        f"{flip_p(flip)} |"
                    )
                else:
                    if "gap" not in row:
                        lines.append(f"{head} {row['n_reference']} / {row['n_comparison']} | – | – | – | – | – |")
                        continue
                    lines.append(
                        f"{head} {row['n_reference']} / {row['n_comparison']} | {_num(row['mean_reference'])} | "
                        f"{_num(row['mean_comparison'])} | {_num(row['gap'], True)} | {_ci(row['ci'])} | "
                        f"{fmt_p(row['mann_whitney']['p_value'])} |"
                    )
            notes = {
                r["model"]: r.get("dropped") or r.get("undefined")
                for r in contrast["rows"]
                if any((r.get("dropped") or r.get("undefined") or {}).values())
            }
            if notes:
                lines += ["", "Left out: " + "; ".join(f"{m}: {d}" for m, d in notes.items())]
    return "\n".join(lines) + "\n"


def figure(report: dict, path: Path, metrics: list[str]) -> None:
    """Per-group means with CIs, one panel per contrast and metric, one row per model.

    Each model gets a marker per group with its CI whisker; stars after the model name give the
    significance of the difference (sign-flip p for paired contrasts, Mann–Whitney p for groups);
    the right margin gives n (pairs, or reference / comparison queries).
    """
    from matplotlib.figure import Figure

    panels = [
        (kind, c, m)
        for kind in ("paired", "groups")
        for c in report[kind]
        for m in metrics
        if any(r["metric"] == m for r in c["rows"])
    ]
    if not panels:
        return
    n_models = len(report["models"])
    fig = Figure(figsize=(6.5, len(panels) * (1.5 + 0.45 * n_models) + 0.3))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (kind, contrast, metric) in zip(axes, panels):
        rows = [r for r in contrast["rows"] if r["metric"] == metric]
        labels, ns = [], []
        for y, row in enumerate(rows):
            for offset, side, colour, marker in (
                (-0.12, "reference", "tab:orange", "o"),
                (0.12, "comparison", "tab:blue", "s"),
            ):
                mean, ci = row.get(f"mean_{side}"), row.get(f"ci_{side}")
                if mean is None:
                    continue
                lo, hi = ci if ci and all(_finite(v) for v in ci) else (mean, mean)
                ax.errorbar(
                    [mean],
                    [y + offset],
                    xerr=[[mean - lo], [hi - mean]],
                    fmt=marker,
                    color=colour,
                    capsize=3,
                    label=contrast[side] if y == 0 else None,
                )
            labels.append(f"{row['model']} {stars(headline_p(row))}".strip())
            ns.append(
                f"n={row['n_pairs']}" if kind == "paired" else f"n={row.get('n_reference')}/{row.get('n_comparison')}"
            )
        ax.set_yticks(range(len(rows)), labels)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.invert_yaxis()
        for y, n in enumerate(ns):
            ax.annotate(n, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize="small")
        what = "paired by pair-id" if kind == "paired" else "unpaired groups"
        ax.set_title(f"{metric}: {contrast['comparison']} vs {contrast['reference']} ({what})", fontsize="medium")
        ax.set_xlabel(f"mean {metric}, {round(report['config']['confidence'] * 100)}% bootstrap CI")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
