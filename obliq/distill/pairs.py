"""Training rows from a teacher's kNN graph, and the random-neighbour control (the paper's §3.2, §6.5).

Each edge anchor → neighbour of the graph becomes one training row in the training-row format (docs/formats.md): the
anchor's text is the query side, the neighbour the positive, ``source`` = ``knn``; the teacher's
scores are not carried. The paper trains on these pairs with in-batch negatives, so mined negatives
are off by default (``negatives=0``); random or BM25 negatives can be added.

Every distinct edge becomes a row. The dose (how many kNN rows an epoch trains on, 5,000 in the
model card) is not drawn here: it is the ``count`` of the rows' source in the training mixture
(:mod:`obliq.data.mixture`), the first ``count`` rows of a seeded order, so doses nest and one file of
pairs serves every dose.

The control (§6.5, Appendix H) keeps everything but the graph: the same rows, so the same anchors
and negatives (and, given the same ``count`` in place of the kNN source, the same dose), with each
positive replaced by a document drawn uniformly from the corpus. It
collapses the student in the paper, which shows the graph's structure carries the signal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np

from obliq.distill.graph import KnnGraph
from obliq.text import normalise_text

NegativeSource = Literal["random", "bm25"]


def _same_text_groups(texts: Sequence[str]) -> list[list[int]]:
    """For each text, the positions of all texts equal to it under :func:`normalise_text`."""
    groups: dict[str, list[int]] = defaultdict(list)
    keys = [normalise_text(t) for t in texts]
    for i, key in enumerate(keys):
        groups[key].append(i)
    return [groups[key] for key in keys]


def _row(
    row_id: str,
    task: str,
    source: str,
    query: str,
    pos_id: str,
    pos_text: str,
    negatives: list[dict],
    meta: dict,
    instruction: str | None,
) -> dict:
    row = {
        "id": row_id,
        "task": task,
        "source": source,
        "query": query,
        "positive": {"id": pos_id, "text": pos_text},
        "negatives": negatives,
    }
    if instruction:
        row["instruction"] = instruction
    row["meta"] = meta
    return row


def knn_pairs(
    graph: KnnGraph,
    texts: Sequence[str],
    task: str,
    seed: int = 13,
    both_directions: bool = False,
    negatives: int = 0,
    negative_source: NegativeSource = "random",
    instruction: str | None = None,
    teacher: str | None = None,
    mutual: bool = False,
) -> tuple[list[dict], dict]:
    """One training row per sampled edge of ``graph``.

    Edges are taken anchors in corpus order, nearest neighbour first. An edge whose two texts are
    the same document (equal after :func:`obliq.text.normalise_text`: an exact or near-exact
    duplicate) is dropped — it teaches nothing and would be a positive equal to its query. Unless
    ``both_directions``, a–b and b–a are one pair, kept as the first one met. With ``mutual``, only
    edges the teacher draws both ways (b among a's k nearest and a among b's: mutual kNN, a standard
    way to keep the neighbourhoods a teacher is surest of) are kept.

    Args:
        graph: the teacher's kNN graph.
        texts: the document texts, in ``graph.ids`` order.
        task: the rows' ``task`` field.
        seed: seed of random negatives.
        both_directions: keep a–b and b–a as two rows.
        negatives: mined negatives per row (0: none; the paper uses in-batch negatives only).
        negative_source: ``random`` (uniform) or ``bm25`` (top BM25 hits of the anchor text,
            :class:`obliq.search.bm25.BM25`). Never the anchor, the positive, one of the anchor's graph
            neighbours, or a text equal to the anchor's or the positive's.
        instruction: optional ``instruction`` field of every row.
        teacher: the teacher's name, written in each row's ``meta``.
        mutual: keep only mutual edges (a → b and b → a both in the graph).

    Returns:
        ``(rows, counts)``; rows are in edge order; counts has ``edges`` (directed edges of the
        graph), ``identical_text_edges`` (dropped), ``not_mutual`` (one-way edges dropped by ``mutual``),
        ``duplicates_removed`` (b–a of an a–b kept), ``distinct_edges`` and ``rows``.

    Raises:
        ValueError: ``texts`` and the graph disagree in length, ``negatives`` < 0, or too few
            documents left to draw negatives from.
    """
    n = len(graph.ids)
    if len(texts) != n:
        raise ValueError(f"{len(texts)} texts for a graph over {n} documents")
    if negatives < 0:
        raise ValueError(f"negatives must be >= 0, got {negatives}")
    same_text = _same_text_groups(texts)
    nearest = [set(row) for row in graph.neighbours]
    edges, seen = [], set()
    identical = duplicates = one_way = 0
    for i, j, rank in graph.edges():
        if j in same_text[i]:
            identical += 1
            continue
        if mutual and i not in nearest[j]:
            one_way += 1
            continue
        key = (i, j) if both_directions else (min(i, j), max(i, j))
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        edges.append((i, j, rank))
    rng = np.random.default_rng(seed)

    negs: list[list[int]] = [[] for _ in edges]
    if negatives:
        bm25 = None
        if negative_source == "bm25":
            from obliq.search.bm25 import BM25

            bm25 = BM25(texts, ids=graph.ids)
        elif negative_source != "random":
            raise ValueError(f"negative_source must be 'random' or 'bm25', got {negative_source!r}")
        for e, (i, j, _) in enumerate(edges):
            banned = {i, j, *graph.neighbours[i], *same_text[i], *same_text[j]}
            if n - len(banned) < negatives:
                raise ValueError(
                    f"only {n - len(banned)} documents left to draw {negatives} negatives from "
                    f"for anchor {graph.ids[i]!r}"
                )
            if bm25 is not None:
                _, hits = bm25.search([texts[i]], negatives + len(banned))[0]
                negs[e] = [int(h) for h in hits if int(h) not in banned][:negatives]
            while len(negs[e]) < negatives:  # random, or BM25 found too few sharing a term
                c = int(rng.integers(n))
                if c not in banned:
                    banned.add(c)
                    negs[e].append(c)

    rows = []
    for (i, j, rank), neg in zip(edges, negs):
        a, b = graph.ids[i], graph.ids[j]
        rows.append(
            _row(
                f"knn:{a}:{b}",
                task,
                "knn",
                texts[i],
                b,
                texts[j],
                [{"id": graph.ids[c], "text": texts[c]} for c in neg],
                {"anchor_id": a, "rank": rank, "k": graph.k, **({"teacher": teacher} if teacher else {})},
                instruction,
            )
        )
    counts = {
        "edges": graph.n_edges,
        "identical_text_edges": identical,
        "not_mutual": one_way,
        "duplicates_removed": duplicates,
        "distinct_edges": len(seen),
        "rows": len(rows),
    }
    return rows, counts


def random_control(rows: Sequence[dict], ids: Sequence[str], texts: Sequence[str], seed: int = 13) -> list[dict]:
    """The random-neighbour control of ``rows`` (§6.5): same anchors, negatives and dose, random positives.

    Row by row, the positive is drawn uniformly from the corpus, leaving out the anchor, documents
    whose text equals the anchor's or a negative's, the row's negatives and the positives already drawn for the same
    anchor (so no row repeats). Nothing of the teacher's graph is read — only each row's anchor id
    (``meta.anchor_id``), query and negatives — so the draw is independent of the teacher.

    Args:
        rows: ``knn`` rows from :func:`knn_pairs`.
        ids, texts: the corpus, in any order.
        seed: seed of the draw.

    Returns:
        One ``random-control`` row per input row, in the same order.

    Raises:
        ValueError: a row without ``meta.anchor_id`` or with an anchor not in ``ids``, or an anchor
            with no document left to draw.
    """
    pos = {d: i for i, d in enumerate(ids)}
    same_text = _same_text_groups(texts)
    rng = np.random.default_rng(seed)
    drawn: dict[int, set[int]] = defaultdict(set)
    out = []
    for r, row in enumerate(rows):
        anchor = (row.get("meta") or {}).get("anchor_id")
        if anchor not in pos:
            raise ValueError(f"row {r} ({row.get('id')!r}): meta.anchor_id {anchor!r} is not a corpus id")
        i = pos[anchor]
        banned = {i, *same_text[i], *drawn[i]}
        for neg in row["negatives"]:
            if neg["id"] in pos:
                banned.update(same_text[pos[neg["id"]]])
        if len(banned) >= len(ids):
            raise ValueError(f"no document left to draw a random positive for anchor {anchor!r}")
        while True:
            c = int(rng.integers(len(ids)))
            if c not in banned:
                break
        drawn[i].add(c)
        out.append(
            _row(
                f"random-control:{anchor}:{ids[c]}",
                row["task"],
                "random-control",
                row["query"],
                ids[c],
                texts[c],
                [dict(neg) for neg in row["negatives"]],
                {"anchor_id": anchor, "control_of": row["id"]},
                row.get("instruction"),
            )
        )
    return out
