"""The comparison report: systems × tasks, and paired comparisons between systems (one file format).

Every command or script that sets several systems side by side — the quickstart, the dose sweep,
the distillation benches, the obliq-ir-mini example — builds its table here, from the folders
``evaluate`` wrote (``<folder>/<task>/summary.json`` and ``per_query.jsonl``,
:mod:`obliq.eval.results`), so that every such table states the same things: each system's metrics
per task, how each system read the texts (``reads``), the number of queries per task, and for each
asked pair the paired difference of per-query values with its bootstrap interval and the sign-flip
test's p-value with its method and n (:func:`obliq.eval.significance.compare`).

Written as ``<name>.md`` (the table a user reads) and ``<name>.json`` (docs/formats.md, "Comparison
report"). A system that has not been evaluated on a task yet is listed as such, and the comparisons
that need it are left out (and named in ``skipped``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from obliq.eval.results import environment_text, read_per_query, reads_text
from obliq.eval.significance import compare
from obliq.files import read_text, write_json, write_text

Pair = tuple[str, str] | tuple[str, str, str]
"""``(system, baseline)`` or ``(system, baseline, label)``: differences are system − baseline."""


def _summaries(folder: Path) -> dict[str, tuple[dict, Path]]:
    """task name → (summary, per-query file) of an ``evaluate`` output folder."""
    out = {}
    for file in sorted(Path(folder).glob("*/summary.json")):
        summary = json.loads(read_text(file))
        out[summary["task"]] = (summary, file.parent / "per_query.jsonl")
    return out


def systems_report(
    systems: Mapping[str, str | Path],
    pairs: Sequence[Pair] = (),
    measures: Sequence[str] = ("NDCG@10", "Recall@100"),
    measure: str = "NDCG@10",
    title: str = "",
    tasks: Sequence[str] | None = None,
    same_reading: Sequence[str] = (),
    notes: Sequence[str] = (),
    seed: int = 0,
) -> dict:
    """Read the systems' evaluation folders and compare the asked pairs on every task.

    Args:
        systems: system name → its ``evaluate`` output folder, in table order (a folder not written yet:
            the system is listed as not evaluated).
        pairs: the comparisons, ``(system, baseline[, label])``; per-query ``measure`` on the gold
            qrels, paired over the task's queries.
        measures: the table's columns (each must be in every summary's metrics).
        measure: the per-query measure compared.
        title: the report's first line.
        tasks: the tasks, in order (default: every task some system was evaluated on, sorted).
        same_reading: systems that must read each task's texts the same way (prefixes, lengths), or
            the comparison would measure the reading, not the training.
        notes: lines printed under the title (what is held fixed, the dose, …).
        seed: seed of the bootstrap and the Monte Carlo test.

    Returns:
        The report (the JSON written by :func:`write_systems_report`).

    Raises:
        ValueError: a pair names an unknown system; systems in ``same_reading`` read a task
            differently; a measure missing from a summary; two systems evaluated on different
            queries of a task (:func:`obliq.eval.significance.compare`).
        FileNotFoundError: no system has been evaluated on any task.
    """
    found = {name: _summaries(Path(folder)) for name, folder in systems.items()}
    if not any(found.values()):
        raise FileNotFoundError(
            f"no evaluation (<task>/summary.json) in any of {', '.join(map(str, systems.values()))}"
        )
    names = list(tasks) if tasks is not None else sorted({t for s in found.values() for t in s})
    for pair in pairs:
        unknown = [p for p in pair[:2] if p not in systems]
        if unknown:
            raise ValueError(f"comparison {pair[:2]}: no system {unknown[0]!r} (systems: {', '.join(systems)})")
    report: dict = {
        "title": title,
        "notes": list(notes),
        "measure": measure,
        "measures": list(measures),
        "qrels": "gold",
        "tasks": {},
        "systems": {},
        "comparisons": [],
        "skipped": [],
    }
    for task in names:
        first = next((s[task][0] for s in found.values() if task in s), None)
        if first is not None:
            report["tasks"][task] = {
                "n_queries": first["n_queries"],
                "n_excluded": first.get("n_excluded", 0),
                "n_docs": first.get("n_docs"),
            }
    environments: dict[str, list[str]] = {}
    for name, by_task in found.items():
        entry = {"folder": str(systems[name]), "model": None, "metrics": {}, "reads": {}, "n_queries": {}}
        for task in names:
            if task not in by_task:
                continue
            summary = by_task[task][0]
            missing = [m for m in measures if m not in summary["metrics"]]
            if missing:
                raise ValueError(
                    f"{systems[name]}/{task}: no {missing[0]} in its summary (evaluated with other measures)"
                )
            entry["model"] = entry["model"] or summary.get("model")
            entry["metrics"][task] = {m: summary["metrics"][m] for m in measures}
            entry["reads"][task] = summary.get("reads")
            entry["n_queries"][task] = summary["n_queries"]
            if summary.get("environment"):
                environments.setdefault(json.dumps(summary["environment"], sort_keys=True), []).append(name)
        report["systems"][name] = entry
    # what the figures were made with: one environment, or each with the systems evaluated in it
    report["environment"] = [{"systems": sorted(set(n)), **json.loads(e)} for e, n in environments.items()]
    for task in names:
        readings = {n: found[n][task][0].get("reads") for n in same_reading if task in found[n]}
        if len({json.dumps(r, sort_keys=True) for r in readings.values()}) > 1:
            raise ValueError(
                f"{task}: "
                + "; ".join(f"{n} reads texts as {reads_text(r)}" for n, r in readings.items())
                + ": the comparison would measure the reading, not the training"
            )
    for pair in pairs:
        system, baseline = pair[0], pair[1]
        label = pair[2] if len(pair) > 2 else f"{system} − {baseline}"
        for task in names:
            if task not in found[system] or task not in found[baseline]:
                report["skipped"].append({"label": label, "task": task, "why": "not evaluated"})
                continue
            b = read_per_query(found[baseline][task][1], measure)
            s = read_per_query(found[system][task][1], measure)
            c = compare(b, s, measure, seed=seed)
            lacking = {n: found[n][task][0].get("n_without_results", 0) for n in (system, baseline)}
            said = [f"{n} has no results for {k} of {c.n_queries} queries (scored 0)" for n, k in lacking.items() if k]
            report["comparisons"].append(
                {
                    "system": system,
                    "baseline": baseline,
                    "label": label,
                    "task": task,
                    **c.as_dict(),
                    "without_results": lacking,
                    "text": c.text(label) + "".join(f"; {line}" for line in said),
                }
            )
    return report


def _fmt(value) -> str:
    return "–" if value is None or value != value else f"{value:.4f}"


def report_markdown(report: dict) -> str:
    """The report as markdown: the systems × tasks table (one task: a column per measure; several: a
    column per task, measures joined by " / "), how each system read the texts, and one line per
    comparison (difference, interval, p with its method and n, helped / hurt / tied)."""
    tasks, measures = list(report["tasks"]), report["measures"]
    lines = [report["title"]] if report["title"] else []
    lines += report["notes"]
    if lines:
        lines.append("")
    if len(tasks) == 1:
        t = tasks[0]
        info = report["tasks"][t]
        lines += [
            f"Task {t}: {info['n_queries']} queries ({info['n_excluded']} without a relevant document left "
            f"out), gold qrels.",
            "",
            "| system | " + " | ".join(measures) + " |",
            "|---|" + "---:|" * len(measures),
        ]
        for name, s in report["systems"].items():
            cells = [_fmt(s["metrics"][t][m]) if t in s["metrics"] else "not evaluated" for m in measures]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    else:
        lines += [
            f"{' / '.join(measures)} per task (gold qrels; n = queries with a relevant document).",
            "",
            "| system | "
            + " | ".join(f"{t} (n={report['tasks'][t]['n_queries'] - report['tasks'][t]['n_excluded']})" for t in tasks)
            + " |",
            "|---|" + "---:|" * len(tasks),
        ]
        for name, s in report["systems"].items():
            cells = [
                " / ".join(_fmt(s["metrics"][t][m]) for m in measures) if t in s["metrics"] else "not evaluated"
                for t in tasks
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    readings: dict[str, list[str]] = {}
    for name, s in report["systems"].items():
        texts = {reads_text(r) for r in s["reads"].values()}
        readings.setdefault(" | ".join(sorted(texts)) or "not evaluated", []).append(name)
    lines += ["", "Texts read as:"] + [f"- {', '.join(n)}: {r}" for r, n in readings.items()]
    if report["comparisons"]:
        lines += [
            "",
            f"Paired differences in {report['measure']} (95% paired-bootstrap interval; sign-flip test, "
            "its method and n):",
        ]
        for task in tasks:
            found = [c for c in report["comparisons"] if c["task"] == task]
            if found:
                lines += [""] + ([f"**{task}**"] if len(tasks) > 1 else []) + [f"- {c['text']}" for c in found]
    envs = report.get("environment") or []
    if envs:
        lines += ["", "Made with:"]
        lines += [f"- {environment_text(e)}" + (f" ({', '.join(e['systems'])})" if len(envs) > 1 else "") for e in envs]
    if report["skipped"]:
        lines += [
            "",
            "Not compared (a system not evaluated yet): "
            + "; ".join(f"{s['label']} on {s['task']}" for s in report["skipped"]),
        ]
    return "\n".join(lines) + "\n"


def write_systems_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    """Write ``<out>.md`` and ``<out>.json`` (``out`` without a suffix, e.g. ``runs/x/report``)."""
    out = Path(out)
    md, js = out.with_name(out.name + ".md"), out.with_name(out.name + ".json")
    write_text(md, report_markdown(report))
    write_json(js, report)
    return md, js


def comparison(report: dict, label: str, task: str) -> dict | None:
    """The comparison ``label`` on ``task`` in a report (its :class:`~obliq.eval.significance.Comparison`
    fields), or None when it was not made."""
    return next((c for c in report["comparisons"] if c["label"] == label and c["task"] == task), None)
