"""Issue 47 §2, the data side: rows with several positives in a batch (the documents' layout, ``doc_positive``,
``max_positives``), a teacher's vectors from the one collator, and the step plan keeping every positive's texts
apart. Rows are real: math-theoremqa's queries with all their relevant problems as positives."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from support import task_rows, write_rows

from obliq.data import Collator, RowCaps, Source, TrainingDataModule, parse_row
from obliq.data.collisions import ROLE_PAIRS
from obliq.data.teacher_table import TeacherTable, write_teacher_table
from obliq.text import id_hash, normalise_text, text_hash


def query_rows(tasks_dir, task: str = "math-theoremqa", seed: int = 5) -> list[dict]:
    """One row per judged query of a real task: all its relevant documents as ``positives`` (``positive`` when it
    has one), in qrels order, and up to 3 random negatives that are none of them (by id or text)."""
    single = task_rows(tasks_dir, task)  # one row per (query, relevant document), qrels order
    by_query: dict[str, list[dict]] = {}
    for r in single:
        by_query.setdefault(r["id"].split("/")[1], []).append(r)
    corpus = {}
    with open(tasks_dir / task / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            corpus[doc["_id"]] = doc["text"]
    ids, rng, out = sorted(corpus), np.random.default_rng(seed), []
    for n, (qid, group) in enumerate(by_query.items()):
        positives = [r["positive"] for r in group]
        banned = {p["id"] for p in positives} | {normalise_text(p["text"]) for p in positives}
        negatives = []
        while len(negatives) < n % 4:
            d = ids[int(rng.integers(len(ids)))]
            if d in banned or normalise_text(corpus[d]) in banned:
                continue
            banned |= {d, normalise_text(corpus[d])}
            negatives.append({"id": d, "text": corpus[d]})
        row = {"id": f"{task}/{qid}", "task": task, "source": "public", "query": group[0]["query"]}
        row.update({"positive": positives[0]} if len(positives) == 1 else {"positives": positives})
        out.append(row | {"negatives": negatives})
    return out


def positives_of(row: dict) -> list[dict]:
    return row["positives"] if "positives" in row else [row["positive"]]


@pytest.fixture(scope="module")
def rows(tasks_dir) -> list[dict]:
    out = query_rows(tasks_dir)
    assert len(out) > 150 and sum("positives" in r for r in out) > 90 and max(map(len, map(positives_of, out))) >= 5
    return out


def expected_layout(rows: list[dict], max_negatives: int, max_positives: int | None):
    """The batch's documents written out by hand: the first positives, then row by row its further positives
    (first max_positives in all) and its first max_negatives negatives; with each one's row and positive flag."""
    docs = [(positives_of(r)[0], i, True) for i, r in enumerate(rows)]
    for i, r in enumerate(rows):
        docs += [(p, i, True) for p in positives_of(r)[1:max_positives]]
        docs += [(d, i, False) for d in r["negatives"][:max_negatives]]
    return [d for d, _, _ in docs], [i for _, i, _ in docs], [p for _, _, p in docs]


@pytest.mark.parametrize("max_positives", [None, 2, 1])
def test_the_batch_puts_first_positives_first_then_each_rows_further_positives_and_negatives(
    rows, tokenize, max_positives
):
    # single- and multi-positive rows, with 0 to 3 negatives, cut to 2 negatives
    batch_rows = [r for r in rows if "positive" in r][:3] + [r for r in rows if len(positives_of(r)) >= 3][:4]
    assert {len(r["negatives"]) for r in batch_rows} >= {0, 3}
    assert {len(positives_of(r)) for r in batch_rows} >= {1, 3, 4}
    parsed = [parse_row(json.dumps(r), "rows.jsonl", n) for n, r in enumerate(batch_rows, 1)]
    batch = Collator(tokenize, RowCaps(max_negatives=2, max_positives=max_positives))(parsed)
    docs, row_of, positive = expected_layout(batch_rows, 2, max_positives)
    n, m = len(batch_rows), len(docs)
    assert batch["doc_ids"] == [d["id"] for d in docs]
    assert batch["doc_row"].tolist() == row_of
    assert batch["doc_positive"].dtype == torch.bool and batch["doc_positive"].tolist() == positive
    assert batch["positive_index"].tolist() == list(range(n))
    assert batch["doc_keys"].tolist() == [[id_hash(d["id"]), text_hash(d["text"])] for d in docs]
    assert torch.equal(batch["docs"]["input_ids"], tokenize([d["text"] for d in docs], "passage")["input_ids"])
    assert batch["query"]["input_ids"].shape[0] == n and batch["query_keys"].shape == (n, 2)
    assert batch["teacher_scores"].shape == (n, 3) and torch.isnan(batch["teacher_scores"]).all()
    # each row's positives, read back from doc_row & doc_positive, are its first max_positives in file order
    for i, r in enumerate(batch_rows):
        mine = [batch["doc_ids"][j] for j in range(m) if row_of[j] == i and positive[j]]
        assert mine == [p["id"] for p in positives_of(r)[:max_positives]]
    kept = [len(positives_of(r)[:max_positives]) for r in batch_rows]
    assert sum(positive) == sum(kept) and (sum(kept) > n) == (max_positives != 1)
    assert "teacher_query_vectors" not in batch and "teacher_cosines" not in batch


def test_max_positives_is_checked_where_it_is_set(tmp_path, tokenize, rows):
    path = write_rows(tmp_path / "rows.jsonl", rows[:8])
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match=r"^data\.max_positives must be an integer >= 1 or null \(all positives\)"):
            RowCaps(max_positives=bad)
        with pytest.raises(ValueError, match="^data.max_positives must be an integer >= 1 or null"):
            TrainingDataModule([Source(str(path))], max_positives=bad, index_dir=str(tmp_path / "index"))
    with pytest.raises(ValueError, match="^data.max_negatives must be an integer >= 0, got -1"):
        RowCaps(max_negatives=-1)
    assert TrainingDataModule([Source(str(path))], max_positives=3, index_dir=str(tmp_path / "i")).caps == RowCaps(4, 3)


def test_the_collator_carries_the_teachers_vectors(tmp_path, tokenize, rows):
    """With a teacher table the one collator adds its vectors of the queries (kNN anchors: their document ids) and
    of every document, NaN rows where the table has none; the old in-batch cosines are gone."""
    batch_rows = [r for r in rows if "positives" in r][:3] + [r for r in rows if "positive" in r][:2]
    # two rows whose query is a corpus document: a kNN anchor (the first positive of another row)
    batch_rows[0] = batch_rows[0] | {"meta": {"anchor_id": "anchor-a"}}
    batch_rows[3] = batch_rows[3] | {"meta": {"anchor_id": "anchor-b"}}
    docs, _, _ = expected_layout(batch_rows, 4, None)
    known = sorted({d["id"] for d in docs})[1:]  # one document left out of the table: a NaN row
    ids = ["anchor-a", *known]  # anchor-b is not in the table either
    vectors = np.random.default_rng(0).normal(size=(len(ids), 6))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    write_teacher_table(tmp_path / "t.npz", ids, vectors)
    table = TeacherTable(tmp_path / "t.npz")
    parsed = [parse_row(json.dumps(r), "rows.jsonl", n) for n, r in enumerate(batch_rows, 1)]
    batch = Collator(tokenize, RowCaps(max_negatives=4), teacher=table)(parsed)
    tq, td = batch["teacher_query_vectors"], batch["teacher_doc_vectors"]
    assert tq.dtype == td.dtype == torch.float32 and tq.shape == (5, 6) and td.shape == (len(docs), 6)
    assert "teacher_cosines" not in batch
    where = {d: k for k, d in enumerate(ids)}
    expect_q = [vectors[where["anchor-a"]], *[None] * 4]
    for got, want in zip(tq, expect_q):
        assert torch.isnan(got).all() if want is None else np.allclose(got.numpy(), want, atol=1e-7)
    left_out = sorted({d["id"] for d in docs})[0]
    for got, d in zip(td, docs):
        if d["id"] == left_out:
            assert torch.isnan(got).all()
        else:
            assert np.allclose(got.numpy(), vectors[where[d["id"]]], atol=1e-7)


def occurrences(row: dict, max_positives: int | None, max_negatives: int) -> list[tuple[str, str | None, str]]:
    """A row's (role, id, normalised text) in a step, by the test's reading of the rows as written."""
    anchor = (row.get("meta") or {}).get("anchor_id")
    out = [("query", anchor, normalise_text(row["query"]))]
    out += [("positive", p["id"], normalise_text(p["text"])) for p in positives_of(row)[:max_positives]]
    return out + [("negative", d["id"], normalise_text(d["text"])) for d in row["negatives"][:max_negatives]]


def pairs_by_hand(step: list[dict], max_positives, max_negatives) -> dict[str, int]:
    """Every pair of occurrences in two rows of a step with equal ids or equal normalised texts, by role pair."""
    seen = [(n, *o) for n, r in enumerate(step) for o in occurrences(r, max_positives, max_negatives)]
    out = dict.fromkeys(ROLE_PAIRS, 0)
    order = {"query": 0, "positive": 1, "negative": 2}
    for a, b in itertools.combinations(seen, 2):
        if a[0] != b[0] and ((a[2] is not None and a[2] == b[2]) or a[3] == b[3]):
            x, y = sorted((a[1], b[1]), key=order.get)
            out[f"{x}-{y}"] += 1
    return out


def cut_by_hand(step: list[dict], max_positives, max_negatives) -> tuple[int, int]:
    """The (row, document) pairs of a step where another row brings a positive the row holds beyond max_positives
    (equal id or normalised text), and the rows in any (issue 53: the loss masks them for that row)."""
    pairs, rows = 0, 0
    for n, row in enumerate(step):
        held = [
            (p["id"], normalise_text(p["text"])) for p in positives_of(row)[max_positives or len(positives_of(row)) :]
        ]
        docs = [o for m, other in enumerate(step) if m != n for o in occurrences(other, max_positives, max_negatives)]
        hits = sum(role != "query" and any(i == d or t == x for d, x in held) for role, i, t in docs)
        pairs, rows = pairs + hits, rows + bool(hits)
    return pairs, rows


@pytest.mark.parametrize("max_positives", [None, 2])
def test_the_step_plan_counts_and_keeps_apart_every_kept_positive(tasks_dir, tmp_path, rows, max_positives):
    """Each query's multi-positive row and its single-positive rows (the same query, one relevant problem each) in
    one mixture: in plain order the collision report counts their further positives as positives, pair by pair as
    an independent count finds them; arranged with no duplicates, no step holds one text twice."""
    mixed = rows[:60] + [dict(r, id=r["id"] + "/single") for r in task_rows(tasks_dir, "math-theoremqa", 40)]
    path = write_rows(tmp_path / "rows.jsonl", mixed)
    by_id = {r["id"]: r for r in mixed}

    def module(no_duplicates):
        return TrainingDataModule(
            [Source(str(path))],
            batch_size=8,
            max_negatives=2,
            max_positives=max_positives,
            seed=1,
            num_workers=0,
            index_dir=str(tmp_path / "index"),
            tokenize=lambda texts, kind, instructions=None: {},
            no_duplicates=no_duplicates,
        )

    for no_duplicates in (False, True):
        dm = module(no_duplicates)
        batches = list(dm.make_dataloader())  # epoch 0
        steps = [[by_id[i] for i in batch["row_ids"]] for batch in batches]
        assert sorted(r["id"] for s in steps for r in s) == sorted(by_id)
        by_hand = [pairs_by_hand(s, max_positives, 2) for s in steps]
        report = dm.stats["collisions"]
        assert report["pairs"] == {k: sum(p[k] for p in by_hand) for k in ROLE_PAIRS}, no_duplicates
        cut = [cut_by_hand(s, max_positives, 2) for s in steps]
        assert report["cut_positives_in_step"] == sum(c for c, _ in cut)
        assert report["rows_with_cut_positive_in_step"] == sum(r for _, r in cut)
        if no_duplicates:
            assert report["colliding_pairs"] == 0
        else:  # a query's rows meet: shared queries and positives, further positives among them
            assert report["pairs"]["query-query"] > 0 and report["pairs"]["positive-positive"] > 0
            assert (report["cut_positives_in_step"] > 0) == (max_positives is not None)
        # the batches as the rows say: the kept positives of each row, then its negatives
        for batch, step in zip(batches, steps):
            docs, row_of, positive = expected_layout(step, 2, max_positives)
            assert batch["doc_ids"] == [d["id"] for d in docs] and batch["doc_positive"].tolist() == positive
            assert batch["doc_row"].tolist() == row_of


def test_mined_negatives_are_none_of_a_rows_positives(rows, tasks_dir):
    """``obliq negatives mine`` on rows with several positives: BM25 ranks a query's other relevant problems high,
    and none becomes a negative (by id or normalised text); the positive-aware threshold is the weakest positive's."""
    from obliq.negatives.mine import Bm25sBackend, filter_negatives, mine_negatives
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "math-theoremqa")
    backend = Bm25sBackend(task.doc_texts, ids=task.doc_ids)
    multi = [r for r in rows if len(positives_of(r)) >= 3][:30]
    mined, report = mine_negatives(multi, task.doc_ids, task.doc_texts, backend, k=4, max_score_ratio=0.95)
    assert report.dropped["positive_id"] > 0  # later positives were ranked, and refused
    where = {d: j for j, d in enumerate(task.doc_ids)}
    for src, r in zip(multi, mined):
        ps = positives_of(src)
        assert ("positives" in r) and r["positives"] == ps
        banned = {p["id"] for p in ps} | {normalise_text(p["text"]) for p in ps}
        taken = {n["id"] for n in r["negatives"]} | {normalise_text(n["text"]) for n in r["negatives"]}
        assert len(r["negatives"]) == 4 and not banned & taken
        lowest = min(backend.score([src["query"]] * len(ps), [where[p["id"]] for p in ps]))
        assert r["meta"]["mined_negatives"]["positive_score"] == round(lowest, 6)
        parse_row(json.dumps(r), "mined.jsonl", 1)
    # filtering existing negatives: the limit is the weakest positive's score too
    kept, counts = filter_negatives(mined, task.doc_ids, backend, max_score_ratio=0.5)
    for r, k in zip(mined, kept):
        ps = positives_of(r)
        lowest = min(backend.score([r["query"]] * len(ps), [where[p["id"]] for p in ps]))
        scores = backend.score([r["query"]] * len(r["negatives"]), [where[n["id"]] for n in r["negatives"]])
        limit = lowest - abs(lowest) * 0.5
        assert [n["id"] for n in k["negatives"]] == [n["id"] for n, s in zip(r["negatives"], scores) if s <= limit]
    assert counts["dropped"]["above_positive"] > 0
