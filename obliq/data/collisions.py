"""In-step collisions of a step plan (:class:`obliq.data.mixture.MixturePlan`): a text twice in one step, in any
roles of two rows, counted by role pair; the rows the loss's masks act on (``shared/cases/C34``); and the documents
of a step that are positives a row holds beyond ``data.max_positives`` (issue 53: masked for that row, never its
negatives)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

ROLES = ("query", "positive", "negative")
_PAIRS = [(a, b) for a in range(3) for b in range(a, 3)]
ROLE_PAIRS = tuple(f"{ROLES[a]}-{ROLES[b]}" for a, b in _PAIRS)
"""The role pairs :meth:`MixturePlan.collisions` counts: ``query-query`` … ``negative-negative``."""


def _collisions(keys: Sequence[np.ndarray], positives: Sequence[int] | None = None) -> tuple[dict, set, set, set]:
    """One step's pairs of occurrences of a text in two rows, by role pair; the rows in any pair; the rows whose
    query is another row's document; the rows whose query is another row's query.

    ``keys[r]``: row ``r``'s keys (:meth:`RowKeys.keys`: query id, query text, then id and text of each of its
    ``positives[r]`` positives (default 1), then of each negative). Two occurrences are the same text when their
    ids or their texts are: pairs by id + pairs by text − pairs by both (each pair once); in a group, all its
    pairs less those within a row.
    """
    groups: dict[tuple, list[tuple[int, int]]] = {}  # (kind, key...) → [(row, role)]
    for r, k in enumerate(keys):
        k, p = k.tolist(), 1 if positives is None else positives[r]
        for j in range(0, len(k) - 1, 2):
            role = 0 if j == 0 else 1 if j // 2 <= p else 2
            for g in (("id", k[j]), ("text", k[j + 1]), ("both", k[j], k[j + 1])):
                groups.setdefault(g, []).append((r, role))
    pairs, rows, own, shared = dict.fromkeys(ROLE_PAIRS, 0), set(), set(), set()
    for g, members in groups.items():
        per_row: dict[int, list[int]] = {}
        for r, role in members:
            per_row.setdefault(r, [0, 0, 0])[role] += 1
        if len(per_row) < 2:
            continue
        total = [sum(c[i] for c in per_row.values()) for i in range(3)]
        for name, (a, b) in zip(ROLE_PAIRS, _PAIRS):
            n = (total[a] * total[b] - sum(c[a] * c[b] for c in per_row.values())) // (1 + (a == b))
            pairs[name] += -n if g[0] == "both" else n
        if g[0] != "both":
            rows.update(per_row)
            own.update(r for r, c in per_row.items() if c[0] and total[1] + total[2] > c[1] + c[2])
            shared.update(r for r, c in per_row.items() if c[0] and total[0] > c[0])
    return pairs, rows, own, shared


def _cut_hits(keys: Sequence[np.ndarray], cut: Sequence[np.ndarray]) -> tuple[int, set]:
    """The (row, document) pairs of one step where a document another row brings (a positive or a negative) has
    the id or the text of a positive row ``r`` holds beyond the cap (``cut[r]``: id and text key of each), and the
    rows in any such pair."""
    pairs, rows = 0, set()
    for r, held in enumerate(cut):
        if not len(held):
            continue
        ids, texts = set(held[0::2].tolist()), set(held[1::2].tolist())
        for o, k in enumerate(keys):
            if o == r:
                continue
            docs = k.tolist()[2:]
            hits = sum(docs[j] in ids or docs[j + 1] in texts for j in range(0, len(docs) - 1, 2))
            pairs += hits
            if hits:
                rows.add(r)
    return pairs, rows


def plan_collisions(plan, epoch: int = 0, steps: int | None = None) -> dict:
    """In-step collisions of an epoch of ``plan`` (a :class:`~obliq.data.mixture.MixturePlan`): a text twice in
    one step, in any roles of two rows.

    Every row brings its texts in roles: its query, its kept positives, its kept negatives (the keys of
    :meth:`~obliq.data.mixture.RowKeys.keys`: an id key and a normalised-text key, :func:`obliq.text.text_hash`,
    each). Two occurrences in two rows of one step are the same text when their ids or their normalised texts are
    equal; every such pair counts once, under its role pair (``query-query``, ``query-positive``,
    ``query-negative``, ``positive-positive``, ``positive-negative``, ``negative-negative``). A row's own texts are
    not paired with each other (a row's query may be its anchor's text; its negatives never equal its positive,
    :func:`obliq.data.rows.parse_row`).

    Also, as ``shared/cases/C34`` counts them (the loss's masks, :func:`obliq.losses.infonce.info_nce`): rows whose
    query is another row's document in the step, rows that share their query with another row, and the steps
    holding either; and, where the reader knows the positives a cap leaves out (``cut_keys``), the documents of a
    step that are such a positive of another row (the loss masks them for that row, issue 53).

    Args:
        plan: the plan; its ``rows`` reader gives the keys (and ``positives``, ``cut_keys`` where it has them).
        epoch: the epoch.
        steps: count its first ``steps`` steps only (default: all).

    Returns:
        ``{"epoch", "steps", "rows", "pairs", "colliding_pairs", "rows_colliding", "steps_colliding",
        "rows_own_text_as_document", "rows_sharing_a_query", "steps_affected", "cut_positives_in_step",
        "rows_with_cut_positive_in_step"}``: ``rows`` in the counted steps; ``pairs`` by role pair and
        ``colliding_pairs`` their sum; ``rows_colliding`` and ``steps_colliding`` the rows and steps in at least
        one pair; then C34's three; then the (row, document) pairs where a document is a positive the row holds
        beyond the cap, and the rows in any.

    Raises:
        ValueError: the plan has no access to the rows' keys.
    """
    if plan.rows is None:
        raise ValueError("counting collisions needs the rows' keys (rows=...)")
    n: Counter = Counter()
    steps = plan.steps_per_epoch if steps is None else min(steps, plan.steps_per_epoch)
    counts, held = getattr(plan.rows, "positives", None), getattr(plan.rows, "cut_keys", None)
    for step in range(steps):
        source, row = plan.step_rows(epoch, step)
        parts = [(int(i), row[source == i]) for i in np.unique(source)]
        keys = [k for i, r in parts for k in plan.rows.keys(i, r)]
        kept = None if counts is None else [c for i, r in parts for c in counts(i, r)]
        found, rows, own, shared = _collisions(keys, kept)
        n.update(found)
        n.update(rows=len(row), rows_colliding=len(rows), steps_colliding=bool(rows), own=len(own))
        n.update(shared=len(shared), affected=bool(own | shared))
        if held is not None:
            cut_pairs, cut_rows = _cut_hits(keys, [k for i, r in parts for k in held(i, r)])
            n.update(cut=cut_pairs, cut_rows=len(cut_rows))
    pairs = {name: n[name] for name in ROLE_PAIRS}
    return {
        "epoch": epoch,
        "steps": steps,
        "rows": n["rows"],
        "pairs": pairs,
        "colliding_pairs": sum(pairs.values()),
        "rows_colliding": n["rows_colliding"],
        "steps_colliding": n["steps_colliding"],
        "rows_own_text_as_document": n["own"],
        "rows_sharing_a_query": n["shared"],
        "steps_affected": n["affected"],
        "cut_positives_in_step": n["cut"],
        "rows_with_cut_positive_in_step": n["cut_rows"],
    }
