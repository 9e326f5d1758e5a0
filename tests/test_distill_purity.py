"""Purity diagnostic (paper §6.5) on tiny labelled sets, values computed by hand (issue 5)."""

from __future__ import annotations

import numpy as np
import pytest

from obliq.distill.graph import KnnGraph, knn_graph
from obliq.distill.purity import base_rate, format_purity, graph_purity, labels_for
from obliq.files import read_id_table

LABELS = ["A", "A", "A", "B", "B", "C"]
# k = 2 neighbours by hand; same-label edges marked *:
# 0:[1*,3] 1:[0*,2*] 2:[0*,4] 3:[4*,0] 4:[3*,5] 5:[4,0]  -> 6 of 12 edges
NEIGHBOURS = [[1, 3], [0, 2], [0, 4], [4, 0], [3, 5], [4, 0]]


def test_purity_by_hand():
    r = graph_purity(KnnGraph([str(i) for i in range(6)], NEIGHBOURS, 2), LABELS)
    assert r["edges"] == 12 and r["docs"] == 6
    assert r["same_attribute_rate"] == pytest.approx(6 / 12)
    # ordered pairs of distinct docs sharing a label: A 3*2 + B 2*1 + C 0 = 8 of 6*5 = 30
    assert r["base_rate"] == pytest.approx(8 / 30)
    assert r["lift"] == pytest.approx(0.5 / (8 / 30))  # 1.875


def test_base_rate_across_groups_by_hand():
    groups = ["g1", "g1", "g2", "g3", "g4", "g4"]
    # pairs across groups: 30 - (g1: 2 + g4: 2) = 26; same label across groups: 8 - (A in g1: 2) = 6
    assert base_rate(LABELS, groups) == pytest.approx(6 / 26)
    with pytest.raises(ValueError, match="same group"):
        base_rate(["A", "B"], ["g", "g"])


def test_purity_from_vectors_end_to_end():
    """Points on a circle; by hand each point's nearest neighbour is its angular neighbour."""
    angles = np.deg2rad([0, 10, 25, 90, 100, 180])
    x = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = ["A", "A", "B", "B", "B", "C"]
    g = knn_graph(x, list("abcdef"), 1)
    # nearest: 0->1 (10 deg, A=A), 1->0 (A=A), 2->1 (15 deg, B!=A), 3->4 (B=B), 4->3 (B=B), 5->4 (80 deg, C!=B)
    assert [row[0] for row in g.neighbours] == [1, 0, 1, 4, 3, 4]
    r = graph_purity(g, labels)
    assert r["same_attribute_rate"] == pytest.approx(4 / 6)
    assert r["base_rate"] == pytest.approx((2 + 6) / 30)
    assert r["lift"] == pytest.approx((4 / 6) / (8 / 30))
    table = format_purity([{**r, "task": "circle", "teacher": "hand"}])
    assert "66.7%" in table and "26.67%" in table and "2.5x" in table


def test_attribute_file_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "attributes.tsv"
    path.write_text("corpus-id\tattribute\nd1\tA\nd2\tB\tC\n")
    with pytest.raises(ValueError, match=r"attributes\.tsv:3: expected 2 tab-separated columns"):
        read_id_table(path)
    path.write_text("corpus-id\tattribute\nd1\tA\nd1\tB\n")
    with pytest.raises(ValueError, match=r"attributes\.tsv:3: corpus-id 'd1' already given on line 2"):
        read_id_table(path)
    path.write_text("corpus-id\tattribute\nd1\t \n")
    with pytest.raises(ValueError, match=r"attributes\.tsv:2: field 'attribute' is empty"):
        read_id_table(path)
    path.write_text("corpus-id\tattribute\nd1\tA\n")
    table = read_id_table(path)
    assert table == {"d1": "A"}
    with pytest.raises(ValueError, match=r"no attribute for 1 of 2 corpus documents \(e.g. 'd2'\)"):
        labels_for(["d1", "d2"], table, path)
