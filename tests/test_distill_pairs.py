"""Training rows from a kNN graph: dedup, negatives, random-neighbour control (issue 5)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from support import REPO

from obliq.distill.graph import KnnGraph, knn_graph
from obliq.distill.pairs import knn_pairs, pairs_summary, random_control
from obliq.distill.purity import base_rate


def validate_rows(rows: list[dict], path: str = "rows.jsonl") -> None:
    """Validate rows with obliq/data's row parser (docs/formats.md), plus unique ids."""
    from obliq.data.rows import parse_row

    ids = set()
    for line, row in enumerate(rows, 1):
        parsed = parse_row(json.dumps(row), path, line)
        assert parsed.id not in ids
        ids.add(parsed.id)


def triangle() -> tuple[KnnGraph, list[str]]:
    # a, b, c all neighbours of each other; d's text equals a's text up to case and punctuation
    g = KnnGraph(["a", "b", "c", "d"], [[1, 3], [0, 2], [0, 1], [0, 1]], 2)
    texts = ["The cat sat.", "A dog ran.", "Birds fly high.", "the cat sat"]
    return g, texts


def test_one_row_per_edge_dedup_and_identical_texts():
    g, texts = triangle()
    rows, counts = knn_pairs(g, texts, "toy")
    # directed edges: a-b a-d b-a b-c c-a c-b d-a d-b; a-d and d-a join identical texts;
    # b-a, c-a, c-b repeat a-b, a-c... (kept as first met): a-b, b-c, c-a, d-b
    assert [(r["meta"]["anchor_id"], r["positive"]["id"]) for r in rows] == [
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("d", "b"),
    ]
    assert counts == {
        "edges": 8,
        "identical_text_edges": 2,
        "not_mutual": 0,
        "duplicates_removed": 2,
        "distinct_edges": 4,
        "rows": 4,
    }
    row = rows[0]
    assert row == {
        "id": "knn:a:b",
        "task": "toy",
        "source": "knn",
        "query": "The cat sat.",
        "positive": {"id": "b", "text": "A dog ran."},
        "negatives": [],
        "meta": {"anchor_id": "a", "rank": 1, "k": 2},
    }
    validate_rows(rows)
    both, counts = knn_pairs(g, texts, "toy", both_directions=True)
    assert counts["duplicates_removed"] == 0 and len(both) == 6


def test_mutual_keeps_only_edges_drawn_both_ways():
    g = KnnGraph(["a", "b", "c", "d"], [[1, 2], [0, 2], [1, 3], [2, 0]], 2)
    texts = ["one", "two", "three", "four"]
    rows, counts = knn_pairs(g, texts, "t", mutual=True)
    # directed: a→b a→c b→a b→c c→b c→d d→c d→a; mutual pairs: a–b, b–c, c–d; a→c and d→a are one-way
    assert [(r["meta"]["anchor_id"], r["positive"]["id"]) for r in rows] == [("a", "b"), ("b", "c"), ("c", "d")]
    assert counts["not_mutual"] == 2 and counts["duplicates_removed"] == 3 and counts["rows"] == 3
    both, counts = knn_pairs(g, texts, "t", mutual=True, both_directions=True)
    assert len(both) == 6 and counts["not_mutual"] == 2
    # brute force on a random graph: a kept pair is in both neighbour lists, a dropped one is not
    g, texts = random_graph(n=80, k=5, seed=1)
    rows, counts = knn_pairs(g, texts, "t", mutual=True)
    pos = {d: i for i, d in enumerate(g.ids)}
    kept = {frozenset((pos[r["meta"]["anchor_id"]], pos[r["positive"]["id"]])) for r in rows}
    expected = {frozenset((i, j)) for i, row in enumerate(g.neighbours) for j in row if i in g.neighbours[j]}
    assert kept == expected and 0 < len(kept) < len(knn_pairs(g, texts, "t")[0])


def random_graph(n=60, k=3, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, 16))
    ids = [f"d{i:02d}" for i in range(n)]
    return knn_graph(x, ids, k), [f"text number {i}" for i in range(n)]


def test_every_distinct_edge_once_and_reproducible():
    g, texts = random_graph()
    rows, counts = knn_pairs(g, texts, "t")
    assert len(rows) == counts["distinct_edges"] > 50
    assert rows == knn_pairs(g, texts, "t")[0]
    pairs = {frozenset((r["meta"]["anchor_id"], r["positive"]["id"])) for r in rows}
    assert len(pairs) == len(rows)  # a-b and b-a once
    validate_rows(rows)


def test_random_negatives_avoid_anchor_positive_neighbours_and_equal_texts():
    g, texts = random_graph()
    texts[5] = texts[7]  # make two documents the same text
    rows, _ = knn_pairs(g, texts, "t", negatives=4, seed=3)
    pos = {d: i for i, d in enumerate(g.ids)}
    for r in rows:
        a, p = pos[r["meta"]["anchor_id"]], pos[r["positive"]["id"]]
        negs = [pos[n["id"]] for n in r["negatives"]]
        assert len(negs) == len(set(negs)) == 4
        assert not {a, p, *g.neighbours[a]} & set(negs)
        assert all(texts[n] not in (texts[a], texts[p]) for n in negs)
    validate_rows(rows)


def test_bm25_negatives_are_the_top_lexical_hits_left_after_the_exclusions():
    from obliq.search.bm25 import BM25

    texts = ["apple banana cherry", "apple banana", "apple", "banana cherry date", "zebra", "apple cherry"]
    g = KnnGraph([f"d{i}" for i in range(6)], [[1], [0], [1], [0], [3], [0]], 1)
    rows, _ = knn_pairs(g, texts, "t", negatives=2, negative_source="bm25")
    first = rows[0]  # anchor d0, positive d1 (its only neighbour)
    _, hits = BM25(texts).search([texts[0]], 6)[0]
    expected = [f"d{h}" for h in hits if h not in (0, 1)][:2]
    assert [n["id"] for n in first["negatives"]] == expected


def test_control_keeps_anchors_and_negatives():
    g, texts = random_graph()
    rows, _ = knn_pairs(g, texts, "t", negatives=2, seed=4)
    control = random_control(rows, g.ids, texts, seed=4)
    assert len(control) == len(rows)
    for r, c in zip(rows, control):
        assert c["source"] == "random-control"
        assert c["query"] == r["query"] and c["meta"]["anchor_id"] == r["meta"]["anchor_id"]
        assert c["negatives"] == r["negatives"] and c["meta"]["control_of"] == r["id"]
        assert c["positive"]["id"] != c["meta"]["anchor_id"]
        assert c["positive"]["id"] not in {n["id"] for n in c["negatives"]}
    assert control == random_control(rows, g.ids, texts, seed=4)
    validate_rows(rows + control)


def test_control_neighbours_are_independent_of_the_teacher():
    """Two teachers whose pairs share anchors (and negatives) get the same control draw."""
    rng = np.random.default_rng(5)
    ids, texts = [f"d{i}" for i in range(50)], [f"t{i}" for i in range(50)]
    teacher_a = knn_graph(rng.normal(size=(50, 8)), ids, 2)
    teacher_b = knn_graph(rng.normal(size=(50, 8)), ids, 2)  # another teacher, other neighbours
    rows_a, _ = knn_pairs(teacher_a, texts, "t", both_directions=True)
    rows_b, _ = knn_pairs(teacher_b, texts, "t", both_directions=True)
    assert [r["meta"]["anchor_id"] for r in rows_a] == [r["meta"]["anchor_id"] for r in rows_b]
    assert [r["positive"]["id"] for r in rows_a] != [r["positive"]["id"] for r in rows_b]
    ctrl_a = random_control(rows_a, ids, texts, seed=9)
    ctrl_b = random_control(rows_b, ids, texts, seed=9)
    assert [c["positive"]["id"] for c in ctrl_a] == [c["positive"]["id"] for c in ctrl_b]


def test_control_purity_is_the_base_rate_while_knn_purity_is_high():
    """On clustered vectors with cluster labels, kNN pairs join same-label documents almost always;
    the control's random positives do so at the base rate (binomial tolerance, 5 sd)."""
    rng = np.random.default_rng(6)
    labels = [f"L{i % 10}" for i in range(400)]
    centres = rng.normal(size=(10, 16)) * 3
    x = np.stack([centres[int(lab[1:])] + rng.normal(size=16) for lab in labels])
    ids, texts = [f"d{i}" for i in range(400)], [f"text {i}" for i in range(400)]
    rows, _ = knn_pairs(knn_graph(x, ids, 3), texts, "t", both_directions=True)
    control = random_control(rows, ids, texts, seed=1)
    lab = dict(zip(ids, labels))
    same = lambda rs: np.mean([lab[r["meta"]["anchor_id"]] == lab[r["positive"]["id"]] for r in rs])  # noqa: E731
    p = base_rate(labels)  # 39 / 399
    assert same(rows) > 0.95
    sd = np.sqrt(p * (1 - p) / len(control))
    assert abs(same(control) - p) < 5 * sd
    # uniform: every document can be drawn; with 1,200 draws over 400 documents most are
    assert len(Counter(r["positive"]["id"] for r in control)) > 300


def test_control_errors_are_named():
    g, texts = triangle()
    rows, _ = knn_pairs(g, texts, "toy")
    rows[1]["meta"] = {}
    with pytest.raises(ValueError, match=r"row 1 \('knn:b:c'\): meta.anchor_id None is not a corpus id"):
        random_control(rows, g.ids, texts)


# --- one row per anchor (issue 47 §2) -----------------------------------------------------------------------------


def test_per_anchor_rows_hold_each_anchors_kept_neighbours_nearest_first():
    g, texts = triangle()
    rows, counts = knn_pairs(g, texts, "toy", both_directions=True, per_anchor=True)
    # kept directed edges: a→b, b→a, b→c, c→a, c→b, d→b (a–d and d–a join identical texts)
    assert [(r["id"], [p["id"] for p in (r.get("positives") or [r["positive"]])]) for r in rows] == [
        ("knn:a", ["b"]),
        ("knn:b", ["a", "c"]),
        ("knn:c", ["a", "b"]),
        ("knn:d", ["b"]),
    ]
    assert rows[1] == {
        "id": "knn:b",
        "task": "toy",
        "source": "knn",
        "query": "A dog ran.",
        "positives": [{"id": "a", "text": "The cat sat."}, {"id": "c", "text": "Birds fly high."}],
        "negatives": [],
        "meta": {"anchor_id": "b", "ranks": [1, 2], "k": 2},
    }
    assert rows[0]["positive"] == {"id": "b", "text": "A dog ran."} and "positives" not in rows[0]
    assert counts["distinct_edges"] == 6 and counts["rows"] == 4 and counts["same_text_positives"] == 0
    assert pairs_summary(rows, both_directions=True) == {
        "rows": 4,
        "positives_per_row": {"min": 1, "mean": 1.5, "max": 2},
        "edges_covered": 6,
    }
    validate_rows(rows)
    # the default (one row per edge) is unchanged: the summary of those rows covers the same edges
    per_edge, _ = knn_pairs(g, texts, "toy", both_directions=True)
    assert pairs_summary(per_edge, both_directions=True) == {
        "rows": 6,
        "positives_per_row": {"min": 1, "mean": 1.0, "max": 1},
        "edges_covered": 6,
    }


def test_per_anchor_leaves_out_a_neighbour_with_a_nearer_neighbours_text():
    """Two positives of a row never share a normalised text: the farther twin is left out and counted."""
    g = KnnGraph(["x", "y", "z", "w"], [[1, 2, 3], [0, 3, 2], [0, 3, 1], [0, 1, 2]], 3)
    texts = ["one", "two", "Two!", "three"]  # y and z: the same text
    rows, counts = knn_pairs(g, texts, "t", per_anchor=True)
    assert [(r["id"], [p["id"] for p in (r.get("positives") or [r["positive"]])]) for r in rows] == [
        ("knn:x", ["y", "w"]),
        ("knn:y", ["w"]),
        ("knn:z", ["w"]),
    ]
    assert counts["same_text_positives"] == 1 and counts["distinct_edges"] == 5
    assert pairs_summary(rows)["edges_covered"] == 4
    validate_rows(rows)


def test_per_anchor_negatives_are_none_of_the_rows_positives_and_the_control_draws_as_many():
    g, texts = random_graph(n=80, k=5, seed=2)
    texts[11] = texts[17].upper() + "!"  # two documents with one normalised text
    rows, _ = knn_pairs(g, texts, "t", negatives=4, seed=3, per_anchor=True, both_directions=True)
    pos = {d: i for i, d in enumerate(g.ids)}
    norm = lambda t: " ".join("".join(c for c in t.lower() if c.isalnum() or c.isspace()).split())  # noqa: E731
    assert max(len(r.get("positives", [])) for r in rows) == 5
    for r in rows:
        a = pos[r["meta"]["anchor_id"]]
        ps = [pos[p["id"]] for p in (r.get("positives") or [r["positive"]])]
        negs = [pos[n["id"]] for n in r["negatives"]]
        assert len(set(negs)) == 4 and not {a, *ps, *g.neighbours[a]} & set(negs)
        assert not {norm(texts[n]) for n in negs} & {norm(texts[x]) for x in [a, *ps]}
        assert ps == [j for j in g.neighbours[a] if j in ps]  # nearest first
    control = random_control(rows, g.ids, texts, seed=4)
    for r, c in zip(rows, control):
        got = c.get("positives") or [c["positive"]]
        assert len(got) == len(r.get("positives") or [r["positive"]]) and c["meta"]["control_of"] == r["id"]
        assert c["id"] == (f"random-control:{r['meta']['anchor_id']}" + (f":{got[0]['id']}" if len(got) == 1 else ""))
        assert len({norm(p["text"]) for p in got}) == len(got) and c["negatives"] == r["negatives"]
    validate_rows(rows + control)


def test_per_anchor_on_a_real_task_covers_the_per_edge_files_distinct_edges(tasks_dir, tmp_path, capsys):
    """math-slice (15 real queries' problems and 40 others), the stylometric teacher at k = 5: the per-anchor file
    holds, for every anchor, exactly the neighbours the per-edge file pairs it with, nearest first, and so the same
    distinct edges; its report says so. Sentence-transformers' reference reads it exploded into those very pairs."""
    import importlib.util

    from support import cli_fails, small_real_task

    from obliq.commands.distill import graph, pairs

    task = small_real_task(tasks_dir, tmp_path / "task")
    g = graph(task=task, out=tmp_path / "graph.json", k=5)
    edge = pairs(task=task, graph=tmp_path / "graph.json", out=tmp_path / "edge.jsonl", negatives=2)
    anchor = pairs(
        task=task,
        graph=tmp_path / "graph.json",
        out=tmp_path / "anchor.jsonl",
        negatives=2,
        per_anchor=True,
        control_out=tmp_path / "control.jsonl",
    )
    read = lambda name: [json.loads(ln) for ln in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    per_edge, per_anchor, control = read("edge.jsonl"), read("anchor.jsonl"), read("control.jsonl")
    neighbours = json.loads((tmp_path / "graph.json").read_text())["neighbours"]
    assert g["edges"] == 5 * len(neighbours) and edge["per_anchor"] is False and anchor["per_anchor"] is True

    expected: dict[str, list[tuple[int, str]]] = {}  # anchor → its per-edge neighbours, by rank
    for r in per_edge:
        expected.setdefault(r["meta"]["anchor_id"], []).append((r["meta"]["rank"], r["positive"]["id"]))
    assert anchor["same_text_positives"] == 0
    assert [r["meta"]["anchor_id"] for r in per_anchor] == [a for a in neighbours if a in expected]
    for r in per_anchor:
        a, got = r["meta"]["anchor_id"], [p["id"] for p in (r.get("positives") or [r["positive"]])]
        assert r["id"] == f"knn:{a}" and ("positives" in r) == (len(got) > 1)
        assert got == [d for _, d in sorted(expected[a])] and r["meta"]["ranks"] == sorted(k for k, _ in expected[a])
        assert got == [d for d in neighbours[a] if d in got]  # the teacher's order, best first
        negs = {n["id"] for n in r["negatives"]}
        assert len(negs) == 2 and not negs & {a, *got, *neighbours[a]}
    sizes = [len(r.get("positives") or [r["positive"]]) for r in per_anchor]
    assert max(sizes) >= 3 and len(per_anchor) < len(per_edge) == edge["distinct_edges"] == sum(sizes)
    assert anchor["positives_per_row"] == {
        "min": min(sizes),
        "mean": round(sum(sizes) / len(sizes), 4),
        "max": max(sizes),
    }
    assert anchor["rows"] == len(per_anchor) and anchor["distinct_edges"] == edge["distinct_edges"]
    assert anchor["edges_covered"] == edge["edges_covered"] == edge["distinct_edges"]
    assert edge["positives_per_row"] == {"min": 1, "mean": 1.0, "max": 1} and edge["rows"] == len(per_edge)
    saved = json.loads((tmp_path / "anchor.report.json").read_text())
    assert (
        saved["edges_covered"] == anchor["edges_covered"] and saved["positives_per_row"] == anchor["positives_per_row"]
    )
    assert [c["meta"]["control_of"] for c in control] == [r["id"] for r in per_anchor]
    validate_rows(per_anchor + control, str(tmp_path / "anchor.jsonl"))

    # sentence-transformers' trainer reads the per-anchor rows as the per-edge file's (anchor, positive) pairs
    spec = importlib.util.spec_from_file_location("distill_reference", REPO / "bench" / "distill_reference.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    exploded = bench.st_pairs(per_anchor)
    assert len(exploded["anchor"]) == len(per_edge)
    assert Counter(zip(exploded["anchor"], exploded["positive"])) == Counter(
        (r["query"], r["positive"]["text"]) for r in per_edge
    )
    first = per_anchor[sizes.index(max(sizes))]
    at = exploded["anchor"].index(first["query"])
    assert exploded["positive"][at : at + max(sizes)] == [p["text"] for p in first["positives"]]
    assert bench.st_pairs(per_edge) == {
        "anchor": [r["query"] for r in per_edge],
        "positive": [r["positive"]["text"] for r in per_edge],
    }
    # with data.max_positives 2, the pairs obliq reads (each row's first two) and the batch that reads as many a step
    two = bench.st_pairs(per_anchor, 2)
    assert len(two["anchor"]) == sum(min(2, n) for n in sizes)
    assert two["positive"][at : at + 2] == [p["text"] for p in first["positives"][:2]]
    config = {"data": {"batch_size": 8, "max_positives": 2}}
    assert bench.st_batch_size(config, per_anchor) == round(8 * len(two["anchor"]) / len(per_anchor))
    assert bench.st_batch_size({"data": {"batch_size": 8}}, per_edge) == 8

    # teacher scores are for single-positive rows: refused in one line, nothing written
    with pytest.raises(ValueError, match=r"^--teacher_scores is for single-positive rows: not with --per_anchor true$"):
        pairs(
            task=task,
            graph=tmp_path / "graph.json",
            out=tmp_path / "scored.jsonl",
            per_anchor=True,
            teacher_scores=True,
        )
    argv = ["distill", "pairs", "--task", str(task), "--graph", str(tmp_path / "graph.json")]
    argv += ["--out", str(tmp_path / "scored.jsonl"), "--per_anchor", "true", "--teacher_scores", "true"]
    cli_fails(argv, capsys, "--teacher_scores is for single-positive rows", "--per_anchor")
    assert not (tmp_path / "scored.jsonl").exists()
