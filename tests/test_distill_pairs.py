"""Training rows from a kNN graph: dedup, negatives, random-neighbour control (issue 5)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from obliq.distill.graph import KnnGraph, knn_graph
from obliq.distill.pairs import knn_pairs, random_control
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
