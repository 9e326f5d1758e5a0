"""Training rows from a teacher's kNN graph, and the random-neighbour control (the paper's §3.2, §6.5).

Each edge anchor → neighbour of the graph becomes one training row in the training-row format (docs/formats.md): the
anchor's text is the query side, the neighbour the positive, ``source`` = ``knn``; the teacher's
scores are not carried. The paper trains on these pairs with in-batch negatives, so mined negatives
are off by default (``negatives=0``); random or BM25 negatives can be added.

With ``per_anchor`` (issue 47 §2) the same kept edges are grouped by anchor instead: one row per anchor whose
``positives`` are all its kept neighbours, nearest first (the graph's order: the teacher's score, best first),
so that a loss can train an anchor on all of them at once; the rows cover exactly the per-edge file's distinct
edges (:func:`pairs_summary` counts them).

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

from obliq.data.rows import positive_fields, row_positives
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
    positives: list[dict],
    negatives: list[dict],
    meta: dict,
    instruction: str | None,
) -> dict:
    """One row as written: ``positive`` for one document, ``positives`` for several (docs/formats.md)."""
    row = {"id": row_id, "task": task, "source": source, "query": query, **positive_fields(positives)}
    row["negatives"] = negatives
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
    per_anchor: bool = False,
) -> tuple[list[dict], dict]:
    """One training row per sampled edge of ``graph`` (or, with ``per_anchor``, per anchor).

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
            :class:`obliq.search.bm25.BM25`). Never the anchor, a positive of the row, one of the anchor's graph
            neighbours, or a text equal to the anchor's or to a positive's.
        instruction: optional ``instruction`` field of every row.
        teacher: the teacher's name, written in each row's ``meta``.
        mutual: keep only mutual edges (a → b and b → a both in the graph).
        per_anchor: one row per anchor with a kept edge, id ``knn:<anchor>``, its kept neighbours as positives
            (nearest first; ``meta.ranks`` their graph ranks) and its negatives drawn once for the row, apart from
            every one of them; the kept edges are those of the per-edge rows.

    Returns:
        ``(rows, counts)``; rows are in edge order (anchors in corpus order); counts has ``edges`` (directed
        edges of the graph), ``identical_text_edges`` (dropped), ``not_mutual`` (one-way edges dropped by
        ``mutual``), ``duplicates_removed`` (b–a of an a–b kept), ``distinct_edges`` and ``rows``; with
        ``per_anchor`` also ``same_text_positives``: kept edges left out of their anchor's row because the
        neighbour's text equals a nearer neighbour's (two positives of a row never share a normalised text).

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
    identical = duplicates = one_way = twins = 0
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
    groups: list[list[tuple[int, int, int]]] = [[e] for e in edges]  # each row's edges, one anchor each
    if per_anchor:
        by_anchor: dict[int, list[tuple[int, int, int]]] = {}
        for e in edges:  # anchors in corpus order, each one's neighbours nearest first (graph.edges)
            kept = by_anchor.setdefault(e[0], [])
            if any(e[1] in same_text[j] for _, j, _ in kept):  # two positives of a row never share a text
                twins += 1
                continue
            kept.append(e)
        groups = list(by_anchor.values())

    negs: list[list[int]] = [[] for _ in groups]
    if negatives:
        bm25 = None
        if negative_source == "bm25":
            from obliq.search.bm25 import BM25

            bm25 = BM25(texts, ids=graph.ids)
        elif negative_source != "random":
            raise ValueError(f"negative_source must be 'random' or 'bm25', got {negative_source!r}")
        for e, group in enumerate(groups):
            i = group[0][0]
            banned = {i, *graph.neighbours[i], *same_text[i]}
            for _, j, _ in group:
                banned.update((j, *same_text[j]))
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
    for group, neg in zip(groups, negs):
        i, a = group[0][0], graph.ids[group[0][0]]
        meta = {"anchor_id": a}
        if per_anchor:
            row_id, meta["ranks"] = f"knn:{a}", [rank for _, _, rank in group]
        else:
            row_id, meta["rank"] = f"knn:{a}:{graph.ids[group[0][1]]}", group[0][2]
        meta.update(k=graph.k, **({"teacher": teacher} if teacher else {}))
        rows.append(
            _row(
                row_id,
                task,
                "knn",
                texts[i],
                [{"id": graph.ids[j], "text": texts[j]} for _, j, _ in group],
                [{"id": graph.ids[c], "text": texts[c]} for c in neg],
                meta,
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
    if per_anchor:
        counts["same_text_positives"] = twins
    return rows, counts


def pairs_summary(rows: Sequence[dict], both_directions: bool = False) -> dict:
    """What a file of kNN rows holds, so that a per-anchor file and a per-edge file are compared at the same
    distinct edges: ``rows``, ``positives_per_row`` (``min``, ``mean`` rounded to 4 places, ``max``) and
    ``edges_covered``, the distinct (anchor, positive) edges of the rows (a–b and b–a one edge unless
    ``both_directions``).

    Raises:
        KeyError: a row without ``meta.anchor_id`` or without a positive.
    """
    per_row = [len(row_positives(r)) for r in rows]
    edges = set()
    for r in rows:
        a = r["meta"]["anchor_id"]
        for p in row_positives(r):
            edges.add((a, p["id"]) if both_directions else tuple(sorted((a, p["id"]))))
    spread = {"min": min(per_row), "mean": round(sum(per_row) / len(per_row), 4), "max": max(per_row)} if rows else None
    return {"rows": len(rows), "positives_per_row": spread, "edges_covered": len(edges)}


def random_control(rows: Sequence[dict], ids: Sequence[str], texts: Sequence[str], seed: int = 13) -> list[dict]:
    """The random-neighbour control of ``rows`` (§6.5): same anchors, negatives and dose, random positives.

    Row by row, each positive is drawn uniformly from the corpus, leaving out the anchor, documents
    whose text equals the anchor's or a negative's, the row's negatives and the positives already drawn for the same
    anchor (so no row repeats, and a row's positives differ in text). A row with several positives
    (``per_anchor``) gets as many random ones, its id ``random-control:<anchor>``. Nothing of the teacher's graph
    is read — only each row's anchor id (``meta.anchor_id``), query and negatives — so the draw is independent of
    the teacher.

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
        drawn_here = []
        for _ in row_positives(row):
            if len(banned) >= len(ids):
                raise ValueError(f"no document left to draw a random positive for anchor {anchor!r}")
            while True:
                c = int(rng.integers(len(ids)))
                if c not in banned:
                    break
            drawn[i].add(c)
            banned.update((c, *same_text[c]))
            drawn_here.append(c)
        single = len(drawn_here) == 1
        out.append(
            _row(
                f"random-control:{anchor}:{ids[drawn_here[0]]}" if single else f"random-control:{anchor}",
                row["task"],
                "random-control",
                row["query"],
                [{"id": ids[c], "text": texts[c]} for c in drawn_here],
                [dict(neg) for neg in row["negatives"]],
                {"anchor_id": anchor, "control_of": row["id"]},
                row.get("instruction"),
            )
        )
    return out
