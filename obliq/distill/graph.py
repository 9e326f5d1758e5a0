"""The teacher's k-nearest-neighbour graph over a corpus (the paper's style-space kNN graph, §3.2).

Neighbours come from obliq's one exact search (:class:`obliq.search.exact.ExactIndex`: faiss inner
products over unit float32 vectors, so similarity is the cosine). Only the topology is kept — which
documents are each document's k nearest — never the teacher's scores (§3.2, "Why graph and not scores").

Faults this module is built against (reported for faiss kNN graphs):

- self-loops when a document has an identical twin: the twin can come back ahead of the document
  itself, so dropping "column 0" drops the twin and keeps the self-loop. Here the document is
  removed by its id wherever it appears, and k + 1 candidates are fetched so k remain;
- ``-1`` ids when k ≥ corpus size: the shared search caps k at the corpus size, and a document
  simply gets the n − 1 others;
- ties (identical vectors) in an order that varies: candidates are ordered by (score descending,
  corpus position), so the graph is the same on every run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from obliq.files import read_json_object, write_json
from obliq.search.exact import ExactIndex, unit_float32
from obliq.search.runs import fuse_rrf, top_k


@dataclass
class KnnGraph:
    """A directed kNN graph over a corpus.

    Attributes:
        ids: corpus ids, in corpus order (unique).
        neighbours: for document i, the corpus positions of its nearest neighbours, nearest first:
            ``min(k, n − 1)`` of them (fewer only when ``groups`` exclude more).
        k: the k asked for.
        identical_twins: documents whose vector equals another document's vector exactly.
        meta: free-form provenance (task, teacher, timings) written with the graph.
        vectors: (n, d) the teacher's unit vectors, in corpus order, when the graph was just built from them
            (:func:`teacher_graph`); never saved with the graph.
    """

    ids: list[str]
    neighbours: list[list[int]]
    k: int
    identical_twins: int = 0
    meta: dict = field(default_factory=dict)
    vectors: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def n_edges(self) -> int:
        """Number of directed edges (anchor → neighbour)."""
        return sum(len(n) for n in self.neighbours)

    def edges(self) -> list[tuple[int, int, int]]:
        """``(anchor, neighbour, rank)`` triples, anchors in corpus order, rank 1 = nearest."""
        return [(i, j, r) for i, row in enumerate(self.neighbours) for r, j in enumerate(row, 1)]

    def to_json(self) -> dict:
        return {
            **self.meta,
            "k": self.k,
            "corpus_size": len(self.ids),
            "edges": self.n_edges,
            "identical_twins": self.identical_twins,
            "neighbours": {self.ids[i]: [self.ids[j] for j in row] for i, row in enumerate(self.neighbours)},
        }

    def save(self, path: str | Path) -> None:
        """Write the graph as one JSON object: provenance, ``k``, counts and ``neighbours`` (id → ids)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, self.to_json())


def load_graph(path: str | Path) -> KnnGraph:
    """Read a graph written by :meth:`KnnGraph.save`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, not an object, a missing field, ``k`` not an integer ≥ 1, or a neighbour list
            that holds an id that is not a document of the graph, its own anchor, or one id twice (the file
            and the field are named).
    """
    path = Path(path)
    obj = read_json_object(path, "a graph")
    for key in ("k", "neighbours"):
        if key not in obj:
            raise ValueError(f"{path}: missing field {key!r}")
    if not isinstance(obj["k"], int) or isinstance(obj["k"], bool) or obj["k"] < 1:
        raise ValueError(f"{path}: field 'k' must be an integer >= 1, got {obj['k']!r}")
    if not isinstance(obj["neighbours"], dict):
        raise ValueError(f"{path}: field 'neighbours' must be an object (id → list of ids)")
    ids = list(obj["neighbours"])
    pos = {d: i for i, d in enumerate(ids)}
    neighbours = []
    for d, row in obj["neighbours"].items():
        if not isinstance(row, list):
            raise ValueError(f"{path}: neighbours[{d!r}] must be a list of ids")
        missing = [n for n in row if not isinstance(n, str) or n not in pos]
        if missing:
            raise ValueError(f"{path}: neighbours[{d!r}] holds {missing[0]!r}, which is not a document of the graph")
        if d in row:
            raise ValueError(f"{path}: neighbours[{d!r}] lists its own anchor")
        if len(set(row)) < len(row):
            twice = next(n for i, n in enumerate(row) if n in row[:i])
            raise ValueError(f"{path}: neighbours[{d!r}] lists {twice!r} twice")
        neighbours.append([pos[n] for n in row])
    meta = {
        key: v for key, v in obj.items() if key not in ("k", "neighbours", "corpus_size", "edges", "identical_twins")
    }
    return KnnGraph(ids, neighbours, obj["k"], int(obj.get("identical_twins", 0)), meta)


def count_identical_twins(vectors: np.ndarray) -> int:
    """Number of rows of ``vectors`` (n, d) that are bitwise equal to at least one other row."""
    if len(vectors) < 2:
        return 0
    _, inverse, counts = np.unique(np.ascontiguousarray(vectors), axis=0, return_inverse=True, return_counts=True)
    return int((counts[np.asarray(inverse).reshape(-1)] > 1).sum())


def knn_graph(
    vectors,
    ids: Sequence[str],
    k: int = 3,
    groups: Sequence[str] | None = None,
    use_gpu: bool | None = None,
) -> KnnGraph:
    """Each document's ``k`` nearest other documents by cosine, through the shared exact search.

    Args:
        vectors: (n, d) teacher vectors, any float dtype (renormalised in float32).
        ids: n unique document ids, row order.
        k: neighbours per document (the paper and the model card: 3); capped at n − 1.
        groups: optional n group labels (e.g. the source book of each passage); a neighbour must
            then come from another group than its anchor, which keeps same-book pairs out.
        use_gpu: passed to :class:`obliq.search.exact.ExactIndex`.

    Returns:
        The graph; document i's neighbours are ordered by cosine descending, ties by id descending
        (trec_eval's order, decided before the cut: :mod:`obliq.search.exact`).

    Raises:
        ValueError: ``k < 1``, lengths that disagree, a duplicate id (named), or bad vectors.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    ids = [str(d) for d in ids]
    x = unit_float32(vectors, "teacher vectors")
    n = len(x)
    if len(ids) != n:
        raise ValueError(f"{len(ids)} ids for {n} vectors")
    if groups is not None and len(groups) != n:
        raise ValueError(f"{len(groups)} groups for {n} vectors")
    seen: dict[str, int] = {}
    for i, d in enumerate(ids):
        if d in seen:
            raise ValueError(f"duplicate id {d!r} at rows {seen[d]} and {i}; ids must be unique")
        seen[d] = i
    if n == 0:
        raise ValueError("no vectors")
    # Fetch enough candidates that k remain after removing the anchor (and its own group).
    extra = 1 if groups is None else max(Counter(groups).values())
    want = min(k + extra, n)
    _, idx = ExactIndex(x, use_gpu=use_gpu, ids=ids).search(x, want)  # ties by id, before the cut
    neighbours: list[list[int]] = []
    for i in range(n):
        row = []
        for j in idx[i]:
            j = int(j)
            if ids[j] == ids[i] or (groups is not None and groups[j] == groups[i]):
                continue
            row.append(j)
            if len(row) == k:
                break
        neighbours.append(row)
    return KnnGraph(ids, neighbours, k, count_identical_twins(x))


def teacher_graph(
    teacher, ids: Sequence[str], texts: Sequence[str], k: int = 3, groups: Sequence[str] | None = None
) -> KnnGraph:
    """Encode ``texts`` with ``teacher`` (one pass) and build their kNN graph.

    Args:
        teacher: anything with ``encode(texts) -> (n, d)`` and ``describe()``
            (:mod:`obliq.search.teachers`).
        ids, texts: the corpus, in the same order.
        k, groups: see :func:`knn_graph`.

    Returns:
        The graph; ``meta`` holds the teacher's settings and the encode / search seconds.
    """
    from time import perf_counter

    t0 = perf_counter()
    vectors = teacher.encode(texts)
    t1 = perf_counter()
    graph = knn_graph(vectors, ids, k, groups)
    graph.vectors = unit_float32(vectors, "teacher vectors")
    graph.meta.update(
        {
            "teacher": teacher.describe(),
            "dim": int(vectors.shape[1]),
            "encode_seconds": round(t1 - t0, 3),
            "search_seconds": round(perf_counter() - t1, 3),
        }
    )
    return graph


def fuse_graphs(graphs: Sequence[KnnGraph], k: int, rrf_k: int = 60) -> KnnGraph:
    """Reciprocal-rank fusion of kNN graphs over one corpus: each document's fused neighbours.

    Each graph is read as a run (anchor → its neighbours, ranked nearest first) and fused by the project's
    one RRF, :func:`obliq.search.runs.fuse_rrf` (Cormack, Clarke & Büttcher, 2009: a neighbour scores the
    sum over graphs of ``1 / (rrf_k + rank)``; a graph that does not list it adds nothing); the ``k``
    best are kept, ties in trec_eval's order (:func:`obliq.search.runs.top_k`: then document id
    descending), so the fused graph is the same on every machine. Used for a second round of
    distillation: the teacher's graph fused with the graph of the round-one student (issue 31).

    Args:
        graphs: two or more graphs over the same documents, in any order (:func:`load_graph`); the fused
            graph keeps the first one's order.
        k: fused neighbours per document (fewer when the graphs list fewer distinct ones).
        rrf_k: the fusion's rank constant (Cormack et al.: 60).

    Returns:
        The fused graph; ``meta`` is empty (the caller records provenance); ``identical_twins`` is the
        largest count of the inputs.

    Raises:
        ValueError: fewer than two graphs, ``k`` or ``rrf_k`` < 1, or graphs over other documents (an id
            that only one holds is named).
    """
    if len(graphs) < 2:
        raise ValueError(f"fusing needs at least two graphs, got {len(graphs)}")
    if k < 1 or rrf_k < 1:
        raise ValueError(f"k and rrf_k must be at least 1, got k={k}, rrf_k={rrf_k}")
    ids = graphs[0].ids
    for n, g in enumerate(graphs[1:], 2):
        if set(g.ids) != set(ids):
            other = sorted(set(g.ids) ^ set(ids))[0]
            side = f"graph {n}" if other in g.ids else "graph 1"
            raise ValueError(
                f"graph {n} is over other documents than graph 1 ({len(g.ids)} against {len(ids)} ids; "
                f"{other!r} is only in {side})"
            )
    # a graph as a run: the nearest neighbour scores highest (-rank), so fuse_rrf reads the graph's ranks
    runs = [
        {g.ids[i]: {g.ids[j]: -float(r) for r, j in enumerate(row, 1)} for i, row in enumerate(g.neighbours)}
        for g in graphs
    ]
    fused = fuse_rrf(runs, rrf_k)
    position = {d: i for i, d in enumerate(ids)}
    neighbours = [[position[d] for d in top_k(fused[d], k)] for d in ids]
    return KnnGraph(list(ids), neighbours, k, max(g.identical_twins for g in graphs))
