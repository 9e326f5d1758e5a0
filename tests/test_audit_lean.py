"""lean@k, pairing and the audit command on a small constructed task whose numbers are computed by hand.

The shared data has no corpus with lean labels, so lean is tested on inputs built here: six documents
with leans -1, -1, 0, 0, +1, +1 and a TREC run file standing in for a retriever.
"""

from __future__ import annotations

import json
import math

import pytest

from obliq.audit.contrasts import group_contrast, paired_contrast, paired_values
from obliq.audit.inputs import load_query_sets, read_document_lean, read_query_attributes, restrict_queries
from obliq.audit.lean import lean_at_k
from obliq.commands.audit import audit

LEAN = {"d1": -1.0, "d2": -1.0, "d3": 0.0, "d4": 0.0, "d5": 1.0, "d6": 1.0}
# L1's d3 and d6 tie at rank 3: trec_eval breaks ties by doc id descending, so d6 is third.
RUN = {
    "L1": {"d1": 3.0, "d2": 2.0, "d3": 1.0, "d6": 1.0, "d5": 0.5},
    "R1": {"d5": 3.0, "d3": 2.0, "d1": 1.0},
    "L2": {"d3": 3.0, "d1": 2.0, "d6": 1.0},
    "R2": {"d6": 3.0, "d5": 2.0, "d4": 1.0, "d1": 0.1},
}
QRELS = {"L1": {"d2": 1, "d4": 1}, "R1": {"d3": 1, "d5": 1}, "L2": {"d6": 1}, "R2": {"d1": 1}}
# lean@3 by hand: L1 (d1, d2, d6) = -1/3; R1 (d5, d3, d1) = 0; L2 (d3, d1, d6) = 0; R2 (d6, d5, d4) = 2/3.
LEAN3 = {"L1": -1 / 3, "R1": 0.0, "L2": 0.0, "R2": 2 / 3}
# relevant top-3 only: L1 {d2} = -1; R1 {d5, d3} = 1/2; L2 {d6} = 1; R2: d1 is rank 4, none → undefined.
LEAN3_GOLD = {"L1": -1.0, "R1": 0.5, "L2": 1.0, "R2": math.nan}


def write_task(
    folder, attributes="query-id\tlean_group\tpair-id\nL1\tleft\tp1\nR1\tright\tp1\nL2\tleft\tp2\nR2\tright\tp2\n"
):
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "title": "", "text": f"doc {d}"}) + "\n" for d in LEAN)
    )
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"query {q}"}) + "\n" for q in RUN))
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t{g}\n" for q, docs in QRELS.items() for d, g in docs.items())
    )
    (folder / "lean.tsv").write_text("corpus-id\tlean\n" + "".join(f"{d}\t{v:+g}\n" for d, v in LEAN.items()))
    (folder / "query_attributes.tsv").write_text(attributes)
    lines = [f"{q} Q0 {d} 0 {s} hand" for q, docs in RUN.items() for d, s in docs.items()]
    (folder / "hand.trec").write_text("\n".join(lines) + "\n")
    return folder


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(x) and math.isnan(b[k])) or x == pytest.approx(b[k]) for k, x in a.items()
    )


def test_lean_at_k_by_hand():
    assert same(lean_at_k(RUN, LEAN, 3), LEAN3)
    assert same(lean_at_k(RUN, LEAN, 3, qrels=QRELS), LEAN3_GOLD)
    assert lean_at_k(RUN, LEAN, 1) == {"L1": -1.0, "R1": 1.0, "L2": 0.0, "R2": 1.0}
    # unlabelled documents are skipped; a query absent from the run has no lean
    partial = lean_at_k(RUN, {"d1": -1.0, "d5": 1.0}, 3, query_ids=["R1", "missing"])
    assert partial["R1"] == 0.0 and math.isnan(partial["missing"])
    with pytest.raises(ValueError, match="k must be"):
        lean_at_k(RUN, LEAN, 0)


def test_own_lean_gap_by_hand(tmp_path):
    attrs = read_query_attributes(write_task(tmp_path / "t") / "query_attributes.tsv")
    assert attrs.attribute == "lean_group" and attrs.groups() == ["left", "right"]
    # paired by pair-id: Δ(p1) = 0 - (-1/3) = 1/3, Δ(p2) = 2/3 - 0 = 2/3 → mean 1/2
    p = paired_contrast(LEAN3, attrs, "left", "right", resamples=2000, permutations=2000)
    assert p["n_pairs"] == 2 and p["delta"] == pytest.approx(0.5)
    assert p["mean_reference"] == pytest.approx(-1 / 6) and p["mean_comparison"] == pytest.approx(1 / 3)
    assert p["ci"][0] == pytest.approx(1 / 3) and p["ci"][1] == pytest.approx(2 / 3)
    # unpaired: right mean 1/3 − left mean −1/6 = 1/2
    g = group_contrast(LEAN3, attrs, "left", "right", resamples=2000)
    assert g["gap"] == pytest.approx(0.5) and (g["n_reference"], g["n_comparison"]) == (2, 2)
    # gold filter: R2 has no relevant document in its top 3, so pair p2 drops out
    p = paired_contrast(LEAN3_GOLD, attrs, "left", "right", resamples=2000, permutations=2000)
    assert p["n_pairs"] == 1 and p["delta"] == pytest.approx(1.5) and p["dropped"]["undefined"] == 1
    assert math.isnan(p["ci"][0])  # one cluster: no interval
    g = group_contrast(LEAN3_GOLD, attrs, "left", "right", resamples=2000)
    assert g["undefined"] == {"left": 0, "right": 1} and g["gap"] == pytest.approx(0.5 - 0.0)


def test_variants_are_averaged_within_a_pair(tmp_path):
    f = tmp_path / "qa.tsv"
    f.write_text("q1\twme\ts1\nq2\taal\ts1\nq3\taal\ts1\nq4\twme\ts2\nq5\taal\ts2\nq6\twme\ts3\n")
    attrs = read_query_attributes(f)
    assert attrs.attribute == "group"  # no header
    v = paired_values({"q1": 1.0, "q2": 0.5, "q3": 0.0, "q4": 0.5, "q5": 0.5, "q6": 1.0}, attrs, "aal", "wme")
    assert v["reference"].tolist() == [0.25, 0.5] and v["comparison"].tolist() == [1.0, 0.5]
    assert v["pair_ids"] == ["s1", "s2"] and v["max_variants"] == 2 and v["dropped"]["no_reference"] == 1


def test_clusters_reach_the_statistics(tmp_path):
    f = tmp_path / "qa.tsv"
    rows = [f"a{i}\tleft\tp{i}\tart{i // 2}\nb{i}\tright\tp{i}\tart{i // 2}\n" for i in range(8)]
    f.write_text("query-id\tside\tpair-id\tcluster-id\n" + "".join(rows))
    values = {**{f"a{i}": 0.0 for i in range(8)}, **{f"b{i}": float(i % 3) for i in range(8)}}
    out = paired_contrast(values, read_query_attributes(f), "left", "right", resamples=500, permutations=500)
    assert out["n_pairs"] == 8 and out["n_clusters"] == 4 and out["sign_flip"]["n_units"] == 4


def test_audit_command_on_a_run_file(tmp_path):
    task = write_task(tmp_path / "t")
    out = tmp_path / "out"
    result = audit(
        task,
        out,
        models=[str(task / "hand.trec")],
        paired=[("left", "right")],
        groups=[("left", "right")],
        document_attributes=task / "lean.tsv",
        lean_k=[3, 1],
        measures=["RR@10", "Recall@5"],
        resamples=1000,
        permutations=1000,
    )
    report = json.loads((out / "audit.json").read_text())
    rows = {(r["model"], r["metric"]): r for r in report["paired"][0]["rows"]}
    assert rows["hand", "lean@3"]["delta"] == pytest.approx(0.5)
    assert rows["hand", "lean@1"]["delta"] == pytest.approx(((1 - -1) + (1 - 0)) / 2)
    # RR@10 by hand: L1 gold d2 at rank 2 (1/2); R1 d5 rank 1; L2 d6 rank 3; R2 d1 rank 4.
    assert rows["hand", "RR@10"]["mean_reference"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert rows["hand", "RR@10"]["mean_comparison"] == pytest.approx((1 + 1 / 4) / 2)
    groups = {r["metric"]: r for r in report["groups"][0]["rows"]}
    assert groups["lean@3"]["gap"] == pytest.approx(0.5)
    per_query = [json.loads(line) for line in (out / "hand" / "per_query.jsonl").read_text().splitlines()]
    assert [r["query_id"] for r in per_query] == ["L1", "R1", "L2", "R2"]
    assert per_query[0]["lean@3"] == pytest.approx(-1 / 3) and per_query[0]["lean_group"] == "left"
    for name in ("audit.md", "audit.png", "config.json", "hand/run.trec"):
        assert (out / name).stat().st_size > 0
    md = (out / "audit.md").read_text()
    assert "| hand | lean@3 | 2 |" in md and "## Groups: right − left" in md
    assert [h["metric"] for h in result["headline"]] == ["RR@10", "lean@3", "RR@10", "lean@3"]

    # gold-filtered lean
    audit(
        task,
        out,
        models=[str(task / "hand.trec")],
        paired=[("left", "right")],
        document_attributes=task / "lean.tsv",
        lean_k=[3],
        lean_relevant_only=True,
        measures=["RR@10"],
        resamples=500,
        permutations=500,
        overwrite=True,
    )
    text = (out / "audit.json").read_text()
    row = [r for r in json.loads(text)["paired"][0]["rows"] if r["metric"] == "lean@3"][0]
    assert row["n_pairs"] == 1 and row["delta"] == pytest.approx(1.5)
    assert row["ci"] == [None, None] and "NaN" not in text  # strict JSON: one pair has no interval
    assert json.loads((out / "hand" / "per_query.jsonl").read_text().splitlines()[3])["lean@3"] is None  # R2


# --- bad input: file, line and field named -------------------------------------------------------


def test_query_attribute_errors(tmp_path):
    task = write_task(tmp_path / "t", "query-id\tside\tpair-id\nL1\tleft\tp1\nX9\tright\tp1\n")
    attrs = read_query_attributes(task / "query_attributes.tsv")
    with pytest.raises(ValueError, match=r"query_attributes.tsv:3: field 'query-id': 'X9' is in none"):
        restrict_queries(load_query_sets(task), attrs)
    with pytest.raises(
        ValueError, match=r"query_attributes.tsv: no query has side 'centre'; the groups are \['left', 'right'\]"
    ):
        attrs.check_groups(["left", "centre"])
    cases = {
        "q1\tleft\tp1\nq1\tright\tp1\n": r":2: field 'query-id': 'q1' already given on line 1",
        "q1\tleft\tp1\nq2\t\tp1\n": r":2: field 'group' is empty",
        "q1\tleft\tp1\tc1\nq2\tright\tp1\tc2\n": (
            r":2: field 'cluster-id': pair 'p1' is in cluster 'c2' here and 'c1' on line 1"
        ),
        "q1\n": r":1: expected 2 to 4 tab-separated columns",
        "": r"no query attributes",
    }
    for i, (text, message) in enumerate(cases.items()):
        f = tmp_path / f"bad{i}.tsv"
        f.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_query_attributes(f)
    f = tmp_path / "two.tsv"
    f.write_text("q1\tleft\nq2\tright\n")
    assert read_query_attributes(f).rows["q2"].pair_id == "q2"


def test_document_lean_errors(tmp_path):
    f = tmp_path / "lean.tsv"
    f.write_text("corpus-id\tlean\nd1\t-1\nd2\tright\n")
    with pytest.raises(ValueError, match=r"lean.tsv:3: field 'lean' must be a finite number, got 'right'"):
        read_document_lean(f)
    f.write_text("d1\t-1\nd2\tnan\n")
    with pytest.raises(ValueError, match=r"lean.tsv:2: field 'lean'"):
        read_document_lean(f)
    f.write_text("d1\t-1\nd2\t0.5\n")
    assert read_document_lean(f, ["d1", "d2", "d3"]) == {"d1": -1.0, "d2": 0.5}


def test_audit_argument_errors(tmp_path):
    task = write_task(tmp_path / "t")
    with pytest.raises(ValueError, match="nothing to audit"):
        audit(task, tmp_path / "o", models=["bm25"])
    with pytest.raises(ValueError, match="need --document_attributes"):
        audit(task, tmp_path / "o", groups=[("left", "right")], lean_relevant_only=True)
    with pytest.raises(ValueError, match="two different groups"):
        audit(task, tmp_path / "o", groups=[("left", "left")])
    with pytest.raises(ValueError, match="the cut-off .ten. is not a rank"):
        audit(task, tmp_path / "o", groups=[("left", "right")], measures=["MRR@ten"])
    with pytest.raises(ValueError, match="no query has lean_group 'centre'"):
        audit(task, tmp_path / "o", paired=[("left", "centre")])


def test_query_sets_are_joined_and_checked(tmp_path):
    task = write_task(tmp_path / "t")
    (task / "queries-extra.jsonl").write_text(json.dumps({"_id": "E1", "text": "extra"}) + "\n")
    (task / "qrels" / "extra.tsv").write_text("query-id\tcorpus-id\tscore\nE1\td3\t1\n")
    joined = load_query_sets(task)
    assert joined.query_ids == ["L1", "R1", "L2", "R2", "E1"]
    assert joined.qrels["test"]["E1"] == {"d3": 1} and joined.qrels["test"]["L1"] == QRELS["L1"]
    assert set(joined.report) == {"queries.jsonl", "queries-extra.jsonl"}
    assert load_query_sets(task, ["queries.jsonl"]).query_ids == ["L1", "R1", "L2", "R2"]
    (task / "queries-dup.jsonl").write_text(json.dumps({"_id": "L1", "text": "again"}) + "\n")
    (task / "qrels" / "dup.tsv").write_text("query-id\tcorpus-id\tscore\nL1\td3\t1\n")
    with pytest.raises(ValueError, match=r"queries-dup.jsonl: query id 'L1' is also in queries.jsonl"):
        load_query_sets(task)
    with pytest.raises(ValueError, match="FILE:SPLIT"):
        load_query_sets(task, ["other.jsonl"])
    with pytest.raises(FileNotFoundError, match="gold qrels not found"):
        load_query_sets(task, ["queries.jsonl:nosuch"])
