"""kNN graph against a brute-force numpy kNN: duplicates, k >= n, groups, ids (issue 5)."""

from __future__ import annotations

import numpy as np
import pytest

from obliq.distill.graph import KnnGraph, count_identical_twins, knn_graph, load_graph


def brute_force(x: np.ndarray, k: int, groups=None) -> list[np.ndarray]:
    """Reference: cosine in float64, self and same-group masked, top-k by stable sort (ties by index)."""
    x = x.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    if groups is not None:
        g = np.asarray(groups)
        sims[g[:, None] == g[None, :]] = -np.inf
    out = []
    for i in range(len(x)):
        order = np.argsort(-sims[i], kind="stable")
        order = order[np.isfinite(sims[i][order])]
        out.append(order[:k])
    return out


def cos(x: np.ndarray, i: int, j: int) -> float:
    a, b = x[i].astype(np.float64), x[j].astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture
def vectors_with_duplicates() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 12)).astype(np.float32)
    x[11] = x[10]  # a pair of identical documents
    x[21] = x[22] = x[20]  # three identical documents
    x[30] = 3.0 * x[31]  # the same direction at another length: cosine 1
    return x


@pytest.mark.parametrize("k", [1, 3, 5])
def test_graph_matches_brute_force(vectors_with_duplicates, k):
    x = vectors_with_duplicates
    ids = [f"d{i}" for i in range(len(x))]
    g = knn_graph(x, ids, k)
    ref = brute_force(x, k)
    for i, row in enumerate(g.neighbours):
        assert len(row) == k
        assert i not in row and all(j >= 0 for j in row)
        # same similarities as the reference, rank by rank (robust to ties at the boundary)
        np.testing.assert_allclose([cos(x, i, j) for j in row], [cos(x, i, j) for j in ref[i]], atol=1e-5)
    # where the k-th and (k+1)-th reference scores differ, the neighbour lists agree exactly
    full = brute_force(x, k + 1)
    for i, row in enumerate(g.neighbours):
        if cos(x, i, full[i][k - 1]) - cos(x, i, full[i][k]) > 1e-5:
            assert set(row) == set(ref[i].tolist()), i


def test_identical_twins_are_neighbours_never_self_loops(vectors_with_duplicates):
    """Self is excluded by id: for row 11 the search returns 10 and 11 tied at cosine 1, 10 first
    (lower position); dropping "column 0" would drop the twin and keep a self-loop."""
    x = vectors_with_duplicates
    g = knn_graph(x, [f"d{i}" for i in range(len(x))], 3)
    assert g.neighbours[10][0] == 11 and g.neighbours[11][0] == 10
    assert sorted(g.neighbours[20][:2]) == [21, 22]
    assert sorted(g.neighbours[21][:2]) == [20, 22]
    assert sorted(g.neighbours[22][:2]) == [20, 21]
    assert g.neighbours[30][0] == 31 and g.neighbours[31][0] == 30
    assert all(i not in row for i, row in enumerate(g.neighbours))
    # twins counted on the renormalised float32 vectors: 10, 11, 20, 21, 22 at least
    from obliq.search.exact import unit_float32

    u = unit_float32(x)
    expected = sum(any(np.array_equal(u[i], u[j]) for j in range(len(u)) if j != i) for i in range(len(u)))
    assert expected >= 5 and g.identical_twins == expected
    assert count_identical_twins(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])) == 2


def test_all_identical_vectors():
    x = np.ones((4, 3), dtype=np.float32)
    g = knn_graph(x, ["a", "b", "c", "d"], 3)
    for i, row in enumerate(g.neighbours):
        assert sorted(row) == sorted(set(range(4)) - {i})
    assert g.neighbours[0] == [3, 2, 1]  # ties by id, descending (trec_eval), decided before the cut
    assert knn_graph(x, ["a", "b", "c", "d"], 1).neighbours[0] == [3]  # the same at any k


@pytest.mark.parametrize("k", [4, 5, 50])
def test_k_at_or_above_corpus_size_gives_all_others_without_padding(k):
    x = np.random.default_rng(1).normal(size=(5, 4))
    g = knn_graph(x, list("abcde"), k)
    ref = brute_force(x, 4)
    for i, row in enumerate(g.neighbours):
        assert row == ref[i].tolist()  # the 4 others, nearest first, no -1
    assert g.n_edges == 20


def test_single_document_has_no_neighbours():
    g = knn_graph(np.ones((1, 3)), ["only"], 3)
    assert g.neighbours == [[]] and g.n_edges == 0


def test_groups_exclude_same_group_neighbours():
    x = np.random.default_rng(2).normal(size=(40, 6))
    groups = [f"g{i // 4}" for i in range(40)]  # ten groups of four
    g = knn_graph(x, [str(i) for i in range(40)], 3, groups)
    ref = brute_force(x, 3, groups)
    for i, row in enumerate(g.neighbours):
        assert row == ref[i].tolist()
        assert all(groups[j] != groups[i] for j in row)


def test_bad_input_is_named():
    x = np.eye(3)
    with pytest.raises(ValueError, match="duplicate id 'a' at rows 0 and 2"):
        knn_graph(x, ["a", "b", "a"], 1)
    with pytest.raises(ValueError, match="k must be at least 1"):
        knn_graph(x, ["a", "b", "c"], 0)
    with pytest.raises(ValueError, match="2 ids for 3 vectors"):
        knn_graph(x, ["a", "b"], 1)
    with pytest.raises(ValueError, match="all zeros"):
        knn_graph(np.zeros((2, 3)), ["a", "b"], 1)


def test_graph_file_round_trip(tmp_path):
    g = KnnGraph(["a", "b", "c"], [[1, 2], [0], [1]], 2, 0, {"task": "t", "corpus_sha256": "x"})
    g.save(tmp_path / "g.json")
    back = load_graph(tmp_path / "g.json")
    assert back.ids == g.ids and back.neighbours == g.neighbours and back.k == 2
    assert back.meta["task"] == "t"
    (tmp_path / "bad.json").write_text('{"k": 1, "neighbours": {"a": ["zz"]}}')
    with pytest.raises(ValueError, match=r"bad\.json: neighbours\['a'\] holds 'zz'"):
        load_graph(tmp_path / "bad.json")


def test_an_existing_file_as_vectors_out_is_named_as_teacher_vectors(tmp_path, tasks_dir):
    """A user's file in the way of `--vectors_out` is refused, named for what would go there (not "a graph"),
    before any work, and kept."""
    from obliq.commands.distill import graph

    (tmp_path / "mine.npz").write_bytes(b"the user's own archive")
    with pytest.raises(FileExistsError, match=r"mine\.npz already holds teacher vectors: pass --overwrite true"):
        graph(tasks_dir / "writing-news", tmp_path / "g.json", vectors_out=tmp_path / "mine.npz")
    assert (tmp_path / "mine.npz").read_bytes() == b"the user's own archive" and not (tmp_path / "g.json").exists()


def rrf_reference(lists: list[list[int]], k: int, c: int = 60) -> list[int]:
    """Reference fusion, by hand: float64 sums of 1 / (c + rank), sorted by score then index descending."""
    score: dict[int, float] = {}
    for row in lists:
        for rank, j in enumerate(row, 1):
            score[j] = score.get(j, 0.0) + 1.0 / (c + rank)
    return sorted(score, key=lambda j: (round(score[j], 12), f"d{j}"), reverse=True)[:k]


def test_fused_graph_is_reciprocal_rank_fusion():
    """Worked by hand: b (ranks 1, 2) and d (3, 1) lead, then c (2, –) over e (–, 3); agreement below rank k counts."""
    from obliq.distill.graph import fuse_graphs

    ids = ["a", "b", "c", "d", "e"]
    g1 = KnnGraph(ids, [[1, 2, 3], [0], [0], [0], [0]], 3)
    g2 = KnnGraph(ids, [[3, 1, 4], [2], [0], [4], [0]], 3)
    fused = fuse_graphs([g1, g2], k=3)
    # 1/61 + 1/62 = .03252 (b) > 1/63 + 1/61 = .03227 (d) > 1/62 (c) > 1/63 (e)
    assert fused.neighbours[0] == [1, 3, 2]
    # a tie (each graph names one other) is ranked as trec_eval ranks it, whichever graph comes first
    assert fused.neighbours[1] == [2, 0] and fuse_graphs([g2, g1], k=1).neighbours[1] == [2]
    assert fused.neighbours[3] == [4, 0] and fused.ids == ids and fused.k == 3
    rng = np.random.default_rng(3)
    n = 40
    lists = [[rng.permutation([j for j in range(n) if j != i])[:8].tolist() for i in range(n)] for _ in range(3)]
    graphs = [KnnGraph([f"d{i}" for i in range(n)], rows, 8) for rows in lists]
    fused = fuse_graphs(graphs, k=5, rrf_k=10)
    for i in range(n):
        assert fused.neighbours[i] == rrf_reference([rows[i] for rows in lists], 5, 10), i


def test_fusing_refuses_graphs_over_other_documents():
    from obliq.distill.graph import fuse_graphs

    g1 = KnnGraph(["a", "b"], [[1], [0]], 1)
    with pytest.raises(ValueError, match=r"graph 2 is over other documents .*'b' is only in graph 1"):
        fuse_graphs([g1, KnnGraph(["a", "c"], [[1], [0]], 1)], k=1)
    with pytest.raises(ValueError, match="at least two graphs"):
        fuse_graphs([g1], k=1)
    with pytest.raises(ValueError, match="k and rrf_k must be at least 1"):
        fuse_graphs([g1, g1], k=0)
    with pytest.raises(ValueError, match="rrf_k=0"):
        fuse_graphs([g1, g1], k=1, rrf_k=0)
    # the same documents in another order are the same graph: fused with itself, it keeps its own ranking
    g = KnnGraph(["a", "b", "c", "d"], [[1, 2, 3], [3, 0, 2], [0, 3, 1], [2, 1, 0]], 3)
    order = ["d", "c", "b", "a"]
    shuffled = KnnGraph(order, [[order.index(g.ids[j]) for j in g.neighbours[g.ids.index(d)]] for d in order], 3)
    assert fuse_graphs([g, shuffled], k=2).neighbours == [row[:2] for row in g.neighbours]


@pytest.mark.parametrize(
    "text, message",
    [
        ("3", "a graph is one JSON object, not int"),
        ('{"k": null, "neighbours": {}}', "field 'k' must be an integer >= 1, got None"),
        ('{"k": "thirty", "neighbours": {}}', "field 'k' must be an integer >= 1, got 'thirty'"),
        ('{"k": 2, "neighbours": {"a": ["b", "b"], "b": []}}', r"neighbours\['a'\] lists 'b' twice"),
        ('{"k": 2, "neighbours": {"a": ["a"], "b": []}}', r"neighbours\['a'\] lists its own anchor"),
        (
            '{"k": 2, "neighbours": {"a": [["b"]], "b": []}}',
            r"neighbours\['a'\] holds \['b'\], which is not a document",
        ),
    ],
)
def test_a_malformed_graph_file_is_refused_by_name(tmp_path, text, message):
    """A neighbour listed twice would be fused at its worse rank, a self-loop would take one of k places: refused."""
    (tmp_path / "g.json").write_text(text)
    with pytest.raises(ValueError, match=rf"g\.json: {message}"):
        load_graph(tmp_path / "g.json")


def test_fused_file_names_its_corpus_and_claims_by_source_only_when_every_input_does(tmp_path):
    from obliq.commands.distill import fuse

    KnnGraph(["a", "b", "c"], [[1, 2], [0, 2], [0, 1]], 2, 0, {"by_source": True}).save(tmp_path / "g1.json")
    meta = {"corpus_sha256": "f" * 64, "by_source": False, "task": "t"}
    KnnGraph(["a", "b", "c"], [[2, 1], [2, 0], [1, 0]], 2, 0, meta).save(tmp_path / "g2.json")
    out = fuse(graphs=[tmp_path / "g1.json", tmp_path / "g2.json"], out=tmp_path / "f.json", k=2)
    assert out["corpus_sha256"] == "f" * 64 and out["by_source"] is False
    assert [g["by_source"] for g in out["teacher"]["graphs"]] == [True, False]
    assert load_graph(tmp_path / "f.json").meta["corpus_sha256"] == "f" * 64
