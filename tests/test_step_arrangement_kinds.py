"""Issue 49 §1 (a): the no-duplicates step arrangement puts a text that must repeat into the fewest steps possible
(exact layouts by hand, and a brute force over every layout of small cases), and the collision report counts a text
twice in a step in every role pair, by id or by normalised text (exact counts by hand, and an independent pairwise
count of random steps); the training log line and the data module's stats carry the full count."""

from __future__ import annotations

import itertools
import json
import logging
import random

import numpy as np
import pytest

from obliq.data import MixturePlan, Source, StepArrangement, TrainingDataModule
from obliq.data.collisions import ROLE_PAIRS
from obliq.data.mixture import _arrange
from obliq.data.rows import parse_row
from obliq.text import normalise_text


def row(rid, query, positive, negatives=(), anchor=None, source="public"):
    """A training row as a dict (docs/formats.md); ``positive`` and each negative are ``(id, text)``."""
    out = {
        "id": rid,
        "task": "t",
        "source": source,
        "query": query,
        "positive": {"id": positive[0], "text": positive[1]},
        "negatives": [{"id": i, "text": t} for i, t in negatives],
    }
    if anchor is not None:
        out["meta"] = {"anchor_id": anchor}
    return out


class Rows:
    """:class:`obliq.data.mixture.RowKeys` over rows held in memory (one source): the real keys of
    :meth:`obliq.data.rows.TrainingRow.keys`."""

    def __init__(self, rows: list[dict]):
        self.rows = [parse_row(json.dumps(r), "rows.jsonl", n + 1) for n, r in enumerate(rows)]

    def keys(self, source, rows):
        return [np.asarray(self.rows[r].keys(), dtype=np.int64) for r in rows.tolist()]

    def tasks(self, source, rows):
        return [self.rows[r].task for r in rows.tolist()]


def plan(rows: list[dict], batch_size: int, no_duplicates: bool = True) -> MixturePlan:
    """The file-order plan (no shuffle: the layout is the arrangement's alone) of ``rows`` on one rank."""
    return MixturePlan(
        [Source("rows.jsonl")],
        [len(rows)],
        batch_size,
        shuffle=False,
        arrangement=StepArrangement(no_duplicates=no_duplicates),
        rows=Rows(rows),
    )


def layout(p: MixturePlan, rows: list[dict]) -> list[list[str]]:
    return [[rows[r]["id"] for r in p.step_rows(0, s)[1].tolist()] for s in range(p.steps_per_epoch)]


def pairs_by_hand(step: list[dict]) -> dict[str, int]:
    """Independent count: every pair of occurrences in two rows of a step with equal ids or equal normalised texts
    (a kNN row's query by its anchor id, any other query by no id), by role pair."""
    occurrences = []
    for n, r in enumerate(step):
        anchor = (r.get("meta") or {}).get("anchor_id")
        occurrences.append((n, "query", anchor, normalise_text(r["query"])))
        occurrences.append((n, "positive", r["positive"]["id"], normalise_text(r["positive"]["text"])))
        occurrences += [(n, "negative", d["id"], normalise_text(d["text"])) for d in r["negatives"]]
    out = dict.fromkeys(ROLE_PAIRS, 0)
    order = {"query": 0, "positive": 1, "negative": 2}
    for a, b in itertools.combinations(occurrences, 2):
        if a[0] != b[0] and ((a[2] is not None and a[2] == b[2]) or a[3] == b[3]):
            x, y = sorted((a[1], b[1]), key=order.get)
            out[f"{x}-{y}"] += 1
    return out


def dirty_steps(order: list[int], keys: list[set], caps: list[int]) -> int:
    out, start = 0, 0
    for cap in caps:
        block = order[start : start + cap]
        start += cap
        out += sum(len(keys[i]) for i in block) != len(set().union(*(keys[i] for i in block)))
    return out


def fewest_dirty_steps(keys: list[set], caps: list[int]) -> int:
    """Brute force: the fewest steps holding a key twice over every assignment of the rows to steps of ``caps``."""
    best = len(caps)

    def place(i, room, held, dirty):
        nonlocal best
        if len(dirty) >= best:
            return
        if i == len(keys):
            best = len(dirty)
            return
        tried = set()
        for b in range(len(caps)):
            state = (room[b], frozenset(held[b]), b in dirty)
            if room[b] == 0 or state in tried:  # an equal step: the same subtree
                continue
            tried.add(state)
            room[b] -= 1
            before = held[b]
            held[b] = before | keys[i]
            place(i + 1, room, held, dirty | ({b} if before & keys[i] else set()))
            held[b] = before
            room[b] += 1

    place(0, list(caps), [set() for _ in caps], frozenset())
    return best


# --- the fewest steps ----------------------------------------------------------------------------------------------

QUERY = "Which theorem bounds the error of the trapezoid rule?"


def test_a_query_with_more_positives_than_steps_repeats_in_the_fewest_steps():
    """One query with 7 positives, 5 other rows, 3 steps of 4: the query is in 7 rows and 3 steps, so 4 rows must
    join a step that has it; 3 fit in one step (4 rows, the query once already), the 4th needs a second: 2 steps,
    the least possible (brute force). The step without it holds it once. (Before: every step held it, 3 of 3.)"""
    rows = [row(f"q{i}", QUERY, (f"p{i}", f"proof number {i}")) for i in range(7)]
    rows += [row(f"r{i}", f"other question {i}", (f"o{i}", f"other doc {i}")) for i in range(5)]
    p = plan(rows, 4)
    assert layout(p, rows) == [["q0", "r0", "r1", "r2"], ["q1", "r3", "r4", "q4"], ["q2", "q3", "q5", "q6"]]
    report = p.collisions()
    assert report["pairs"] == {**dict.fromkeys(ROLE_PAIRS, 0), "query-query": 1 + 6}
    assert (report["colliding_pairs"], report["rows_colliding"], report["steps_colliding"]) == (7, 6, 2)
    keys = [set(k.tolist()) for k in p.rows.keys(0, np.arange(12))]
    assert report["steps_colliding"] == fewest_dirty_steps(keys, [4, 4, 4]) == 2


def test_a_knn_passage_that_is_one_rows_anchor_and_five_rows_neighbour():
    """kNN rows: passage D is row a's anchor (its query, by id) and the neighbour (positive) of b1..b5; two other
    rows; 2 steps of 4. D is in 6 rows and 2 steps: 4 extra rows, 3 per step at most: 2 steps, the least (brute
    force): four of b1..b5 together (positive-positive 6) and the fifth with a (query-positive 1). (Before: the same
    2 steps, but the report saw 1: positive-positive pairs were not counted.)"""
    d = ("D", "the passage everyone neighbours")
    rows = [row("a", d[1], ("A1", "a's neighbour"), anchor="D", source="knn")]
    rows += [row(f"b{i}", f"anchor text {i}", d, anchor=f"B{i}", source="knn") for i in range(1, 6)]
    rows += [row(f"c{i}", f"lonely anchor {i}", (f"C{i}", f"lonely neighbour {i}"), anchor=f"X{i}") for i in (1, 2)]
    p = plan(rows, 4)
    assert layout(p, rows) == [["a", "c1", "c2", "b3"], ["b1", "b2", "b4", "b5"]]
    report = p.collisions()
    assert report["pairs"] == {**dict.fromkeys(ROLE_PAIRS, 0), "positive-positive": 6, "query-positive": 1}
    assert (report["colliding_pairs"], report["rows_colliding"], report["steps_colliding"]) == (7, 6, 2)
    assert (report["rows_own_text_as_document"], report["rows_sharing_a_query"], report["steps_affected"]) == (1, 0, 1)
    keys = [set(k.tolist()) for k in p.rows.keys(0, np.arange(8))]
    assert fewest_dirty_steps(keys, [4, 4]) == 2


def test_texts_that_need_not_repeat_do_not():
    """Queries in 4, 3 and 3 of 14 rows (file order: each query's rows together), 4 other rows, steps of 4, 4, 4
    and a last one of 2: the plain cut holds 6 + 3 + 1 query-query pairs, the arrangement none (as a brute force)."""
    queries = [0] * 4 + [1] * 3 + [2] * 3 + [None] * 4
    rows = [
        row(f"q{i}", f"shared query {k}" if k is not None else f"lone query {i}", (f"p{i}", f"positive {i}"))
        for i, k in enumerate(queries)
    ]
    p = plan(rows, 4)
    assert [len(s) for s in layout(p, rows)] == [4, 4, 4, 2]
    assert p.collisions()["colliding_pairs"] == 0
    assert plan(rows, 4, no_duplicates=False).collisions()["pairs"]["query-query"] == 6 + 3 + 1
    keys = [set(k.tolist()) for k in p.rows.keys(0, np.arange(14))]
    assert fewest_dirty_steps(keys, [4, 4, 4, 2]) == 0


@pytest.mark.parametrize("texts", [1, 2])
def test_the_fewest_steps_against_a_brute_force(texts):
    """Random small cases (2-4 steps of 2-4 rows, uneven last step or first): one text (or two, in disjoint rows)
    in any number of rows, every other key in one row: the steps holding a key twice are as few as any layout's."""
    rng = random.Random(49 + texts)
    for _ in range(80):
        steps, size = rng.randint(2, 4), rng.randint(2, 4)
        n = steps * size - rng.randint(0, size - 1)
        caps = [size] * (n // size) + [n % size] * (n % size > 0)
        caps = caps[::-1] if rng.random() < 0.3 else caps
        keys = [{1000 + i} for i in range(n)]
        rest = rng.sample(range(n), n)
        for text in range(1, texts + 1):
            m = rng.randint(1, len(rest)) if rest else 0
            for i in rest[:m]:
                keys[i].add(text)
            rest = rest[m:]
        order = _arrange(np.arange(n), keys, caps).tolist()
        assert sorted(order) == list(range(n))
        assert dirty_steps(order, keys, caps) == fewest_dirty_steps(keys, caps), (caps, keys)


# --- the count ------------------------------------------------------------------------------------------------------


def every_role_pair() -> list[dict]:
    """One step of 5 rows holding one collision of each kind (and two of some), with the expected count."""
    return [
        row("r0", "Alpha question?", ("p1", "First document."), [("n1", "Shared negative"), ("n2", "Second document")]),
        row("r1", "alpha QUESTION", ("p2", "first document"), [("n1", "Shared negative")]),  # qq; pp by text; nn
        row("r2", "second document", ("p1", "another text under p1"), [("n3", "Third doc")]),  # qn; pp by id
        row("r3", "Gamma", ("p4", "Fourth doc"), [("n4", "Third doc.")], anchor="p2"),  # qp by id; nn by text
        row("r4", "Delta", ("n2", "Delta doc"), [("n5", "delta")]),  # pn by id; its own query-negative not counted
    ]


EXPECTED = {
    "query-query": 1,
    "query-positive": 1,
    "query-negative": 1,
    "positive-positive": 2,
    "positive-negative": 1,
    "negative-negative": 2,
}


def test_every_role_pair_is_counted_by_id_or_normalised_text():
    """The hand-built step: each role pair as expected (a pair equal by both id and text counts once), all 5 rows
    collide. The C34 counts, all the report had before, see 2 + 2 rows (query-query and a query as a document)."""
    rows = every_role_pair()
    assert pairs_by_hand(rows) == EXPECTED
    report = plan(rows, 5, no_duplicates=False).collisions()
    assert report["pairs"] == EXPECTED
    assert (report["colliding_pairs"], report["rows_colliding"], report["steps_colliding"]) == (8, 5, 1)
    assert (report["rows_own_text_as_document"], report["rows_sharing_a_query"], report["steps_affected"]) == (2, 2, 1)


def test_the_count_equals_an_independent_pairwise_count_on_random_steps():
    """Random rows over a small vocabulary of ids and texts (case and punctuation varied): per step, per role pair,
    the report equals :func:`pairs_by_hand`."""
    rng = random.Random(7)
    text = lambda: rng.choice(["alpha", "Alpha!", "beta", "BETA.", "gamma", "delta", "eps"])  # noqa: E731
    rows = []
    for i in range(24):
        positive = (f"d{rng.randint(0, 6)}", text())
        negatives = []
        for _ in range(rng.randint(0, 3)):
            neg = (f"d{rng.randint(0, 6)}", text())
            if neg[0] != positive[0] and normalise_text(neg[1]) != normalise_text(positive[1]):
                negatives.append(neg)
        anchor = f"d{rng.randint(0, 6)}" if rng.random() < 0.5 else None
        rows.append(row(f"x{i}", text(), positive, negatives, anchor=anchor))
    p = plan(rows, 6, no_duplicates=False)
    total = dict.fromkeys(ROLE_PAIRS, 0)
    for s in range(p.steps_per_epoch):
        here = pairs_by_hand([rows[r] for r in p.step_rows(0, s)[1].tolist()])
        assert p.collisions(0, steps=s + 1)["pairs"] == {k: total[k] + here[k] for k in ROLE_PAIRS}
        total = {k: total[k] + here[k] for k in ROLE_PAIRS}
    assert sum(total.values()) > 20 and all(total.values())


def test_the_training_log_line_and_stats_carry_the_full_count(tmp_path, caplog):
    """Through the data module (rows from a file, as training reads them): ``stats["collisions"]`` is the plan's
    full report and the log line names every role pair's count."""
    rows = every_role_pair()
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = TrainingDataModule(
        [Source(str(path))],
        batch_size=5,
        shuffle=False,
        num_workers=0,
        index_dir=str(tmp_path / "index"),
        tokenize=lambda *a: {},
        no_duplicates=False,
    )
    with caplog.at_level(logging.INFO):
        dm.make_dataloader()
    assert dm.stats["collisions"]["pairs"] == EXPECTED and dm.stats["collisions"]["colliding_pairs"] == 8
    assert dm.stats["collisions"] == dm.plan.collisions(0)
    line = next(m for m in caplog.messages if "pairs of rows meet one text" in m)
    assert "8 pairs of rows meet one text in a step" in line and "5 rows in 1 steps" in line
    for name, n in EXPECTED.items():
        assert f"{name} {n}" in line
