"""Metrics: trec_eval conventions (C08, C09, ties, unjudged docs, recall denominators, query policy).

Every value is checked twice: against a number computed by hand here, and against pytrec_eval
called directly (trec_eval's own code, independent of obliq's ir_measures wiring and de-duplication).
"""

from __future__ import annotations

import json
import math

import pytest
import pytrec_eval

from obliq.cli import main as obliq_main
from obliq.eval.metrics import evaluate_run, parse_measures
from obliq.search.runs import read_run, write_run
from obliq.tasks import read_qrels

D2, D3, D4 = 1 / math.log2(3), 1 / math.log2(4), 1 / math.log2(5)  # discounts of ranks 2, 3, 4


def trec_eval(qrels, run, measure: str) -> dict[str, float]:
    """pytrec_eval directly: NDCG@k → ndcg_cut_k, Recall@k → recall_k (per query)."""
    name, k = measure.split("@")
    key = {"NDCG": "ndcg_cut", "Recall": "recall"}[name]
    out = pytrec_eval.RelevanceEvaluator(qrels, {f"{key}.{k}"}).evaluate(run)
    return {q: v[f"{key}_{k}"] for q, v in out.items()}


def check(qrels, run, measure, expected, query="q1"):
    ours = evaluate_run(qrels, run, [measure]).per_query[query][measure]
    assert ours == pytest.approx(expected, abs=1e-6)
    assert trec_eval(qrels, run, measure)[query] == pytest.approx(expected, abs=1e-6)


def test_c09_graded_relevance_linear_gain_log2_discount():
    qrels = {"q1": {"d1": 1, "d3": 2}}
    run = {"q1": {"d2": 3.0, "d1": 2.0, "d3": 1.0}}
    dcg, idcg = 0 + 1 * D2 + 2 * D3, 2 + 1 * D2
    assert dcg / idcg == pytest.approx(0.619906, abs=1e-6)  # the case's figure
    check(qrels, run, "NDCG@3", 0.619906)
    check(qrels, run, "NDCG@1", 0.0)
    # the wrong conventions give other values: exponential gain 0.586883
    assert (0 + 1 * D2 + 3 * D3) / (3 + 1 * D2) == pytest.approx(0.586883, abs=1e-6)


def test_ties_follow_trec_eval_doc_id_descending():
    # equal scores: trec_eval ranks the larger doc id (strcmp) first, whatever the insertion order
    qrels = {"q1": {"d1": 1}}
    run = {"q1": {"d1": 1.0, "d2": 1.0, "d3": 0.5}}
    check(qrels, run, "NDCG@1", 0.0)  # d2 first
    check(qrels, run, "NDCG@2", D2)
    # strcmp, not numeric: "d9" > "d10"
    qrels = {"q1": {"d10": 1}}
    run = {"q1": {"d10": 2.0, "d9": 2.0}}
    check(qrels, run, "NDCG@1", 0.0)


def test_unjudged_documents_are_non_relevant():
    qrels = {"q1": {"d1": 1, "d2": 0}}
    run = {"q1": {"u1": 3.0, "d1": 2.0, "d2": 1.0}}
    check(qrels, run, "NDCG@10", D2)
    check(qrels, run, "Recall@1", 0.0)
    check(qrels, run, "Recall@2", 1.0)


def test_recall_denominator_counts_every_relevant_judgement():
    # d4 is relevant but never retrieved (e.g. missing from the corpus); d3 is judged non-relevant
    qrels = {"q1": {"d1": 1, "d2": 2, "d3": 0, "d4": 1}}
    run = {"q1": {"d3": 3.0, "d1": 2.0, "d2": 1.0}}
    check(qrels, run, "Recall@2", 1 / 3)
    check(qrels, run, "Recall@10", 2 / 3)
    # ideal ranking from all judged relevant docs (d2, d1, d4), retrieved or not
    check(qrels, run, "NDCG@3", (1 * D2 + 2 * D3) / (2 + 1 * D2 + 1 * D3))
    assert (1 * D2 + 2 * D3) / (2 + D2 + D3) == pytest.approx(0.520909, abs=1e-6)


def test_query_policy_excludes_no_relevant_and_zero_fills_missing():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 0}, "q3": {"d3": 1}}
    run = {"q1": {"d1": 1.0}, "q2": {"d2": 1.0}, "q_unjudged": {"d9": 1.0}}  # q3 retrieved nothing
    ev = evaluate_run(qrels, run, ["NDCG@10", "Recall@10"], query_ids=["q1", "q2", "q3", "q4"])
    assert (ev.n_queries, ev.n_excluded) == (2, 2)  # q2: only non-relevant judgements; q4: no qrels
    assert set(ev.per_query) == {"q1", "q3"}
    assert ev.per_query["q3"] == {"NDCG@10": 0.0, "Recall@10": 0.0}
    assert ev.aggregate["NDCG@10"] == pytest.approx(0.5)
    # plain pytrec_eval would average q2 in as a 0 and drop q3: (1 + 0) / 2 over other queries
    assert set(trec_eval(qrels, run, "NDCG@10")) == {"q1", "q2"}


def test_no_relevant_anywhere_never_crashes():
    ev = evaluate_run({"q1": {"d1": 0}}, {"q1": {"d1": 1.0}}, ["NDCG@10"])
    assert ev.n_queries == 0 and ev.n_excluded == 1 and math.isnan(ev.aggregate["NDCG@10"])
    ev = evaluate_run({"q1": {"d1": 1}}, {}, ["NDCG@10"])
    assert ev.aggregate["NDCG@10"] == 0.0


def _write(path, text):
    path.write_text(text)
    return path


def test_c08_duplicate_docs_in_run_keep_first(tmp_path, caplog):
    qrels = {"q1": {"A": 1}}
    run = read_run(_write(tmp_path / "r1.trec", "q1 Q0 A 1 2.0 t\nq1 Q0 A 2 1.0 t\n"))
    assert evaluate_run(qrels, run, ["NDCG@10"]).aggregate["NDCG@10"] == pytest.approx(1.0)
    run = read_run(_write(tmp_path / "r2.trec", "q1 Q0 A 1 0.9 t\nq1 Q0 B 2 0.8 t\nq1 Q0 A 3 0.1 t\n"))
    assert run == {"q1": {"A": 0.9, "B": 0.8}}
    assert evaluate_run(qrels, run, ["NDCG@10"]).aggregate["NDCG@10"] == pytest.approx(1.0)
    # the wrong answer of a {doc: score} map that keeps the last score
    assert trec_eval(qrels, {"q1": {"B": 0.8, "A": 0.1}}, "NDCG@10")["q1"] == pytest.approx(0.630930, abs=1e-6)
    assert "repeated (query, doc) lines" in caplog.text


def test_c08_duplicate_qrels_rows_counted_once(tmp_path, caplog):
    rows = "query-id\tcorpus-id\tscore\n" + "q1\td1\t1\nq1\td2\t1\n" * 2
    qrels = read_qrels(_write(tmp_path / "q.tsv", rows))
    assert qrels == {"q1": {"d1": 1, "d2": 1}}
    ev = evaluate_run(qrels, {"q1": {"d1": 2.0, "d2": 1.0}}, ["NDCG@10", "Recall@10"])
    assert ev.aggregate == pytest.approx({"NDCG@10": 1.0, "Recall@10": 1.0})
    assert "2 repeated qrels rows" in caplog.text
    # counting four relevant documents would give the case's wrong values
    assert (1 + D2) / (1 + D2 + D3 + D4) == pytest.approx(0.636682, abs=1e-6)


def test_qrels_errors_name_file_and_line(tmp_path):
    with pytest.raises(ValueError, match=r"q\.tsv:3: \(q1, d1\) judged 2 here and 1 on line 2"):
        read_qrels(_write(tmp_path / "q.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n"))
    with pytest.raises(ValueError, match=r"b\.tsv:2: field 'score' must be an integer"):
        read_qrels(_write(tmp_path / "b.tsv", "q1\td1\t1\nq1\td2\tyes\n"))
    # a headerless file whose first grade is no number: refused at line 1, not skipped as a header (issue 32 §3)
    with pytest.raises(ValueError, match=r"h\.tsv:1: field 'score' must be an integer, got 'yes'"):
        read_qrels(_write(tmp_path / "h.tsv", "q1\td1\tyes\nq1\td2\t1\n"))
    assert read_qrels(_write(tmp_path / "g.tsv", "qid\tdocid\tGrade\nq1\td2\t1\n")) == {"q1": {"d2": 1}}
    with pytest.raises(ValueError, match=r"c\.tsv:1: expected 3 \(BEIR\) or 4 \(TREC\) columns, got 2"):
        read_qrels(_write(tmp_path / "c.tsv", "q1\td1\n"))
    # TREC qrels format, as trec_eval reads it
    assert read_qrels(_write(tmp_path / "t.qrels", "q1 0 d1 2\nq1 0 d2 0\n")) == {"q1": {"d1": 2, "d2": 0}}


def test_run_errors_name_file_and_line(tmp_path):
    with pytest.raises(ValueError, match=r"r\.trec:2: expected 6 columns"):
        read_run(_write(tmp_path / "r.trec", "q1 Q0 d1 1 1.0 t\nq1 Q0 d2 2\n"))
    with pytest.raises(ValueError, match=r"s\.trec:1: field 'score' must be a number"):
        read_run(_write(tmp_path / "s.trec", "q1 Q0 d1 1 high t\n"))


def test_write_run_ranks_like_trec_eval_and_round_trips(tmp_path):
    run = {"q1": {"d1": 0.5, "d2": 0.5, "d3": 0.1234567890123, "d10": 0.9}}
    write_run(tmp_path / "r.trec", run, tag="my model")
    lines = (tmp_path / "r.trec").read_text().splitlines()
    assert [line.split()[2] for line in lines] == ["d10", "d2", "d1", "d3"]
    assert [line.split()[3] for line in lines] == ["1", "2", "3", "4"]
    assert lines[0].split()[5] == "my_model"
    assert read_run(tmp_path / "r.trec") == run  # exact floats


def test_unknown_measure_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown measure 'NCDG@10'"):
        parse_measures("NCDG@10")
    assert list(parse_measures("NDCG@10, Recall@100,nDCG@10")) == ["NDCG@10", "Recall@100"]


def test_obliq_metrics_command_matches_pytrec_eval(tmp_path, capsys):
    qrels_file = _write(tmp_path / "q.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td3\t2\nq2\td5\t1\n")
    run_file = _write(tmp_path / "r.trec", "q1 Q0 d2 1 3 x\nq1 Q0 d1 2 2 x\nq1 Q0 d3 3 1 x\nq2 Q0 d5 1 1 x\n")
    obliq_main(
        ["metrics", "--qrels", str(qrels_file), "--run", str(run_file), "--measures", "NDCG@3,Recall@1", "--per-query"]
    )
    out = json.loads(capsys.readouterr().out)
    assert out["n_queries"] == 2 and out["n_excluded"] == 0
    assert out["per_query"]["q1"]["NDCG@3"] == pytest.approx(0.619906, abs=1e-6)
    qrels, run = read_qrels(qrels_file), read_run(run_file)
    assert out["metrics"]["NDCG@3"] == pytest.approx((trec_eval(qrels, run, "NDCG@3")["q1"] + 1.0) / 2)
    assert out["metrics"]["Recall@1"] == pytest.approx((0 + 1) / 2)


def test_rr_at_k_is_cut_at_k():
    """ir_measures' pytrec_eval provider returns the uncut reciprocal rank for RR@10 (or 0 when RR is
    asked too); RR@k must be 1/rank when the first relevant document is within k, else 0."""
    import pytest

    from obliq.eval.metrics import evaluate_run, parse_measures

    run = {"q": {f"d{i}": 100.0 - i for i in range(1, 20)}, "p": {f"d{i}": 100.0 - i for i in range(1, 20)}}
    qrels = {"q": {"d12": 1}, "p": {"d3": 1}}  # gold at rank 12 and at rank 3
    ev = evaluate_run(qrels, run, ["RR@10", "RR", "RR@20"])
    assert ev.per_query["q"] == pytest.approx({"RR@10": 0.0, "RR": 1 / 12, "RR@20": 1 / 12})
    assert ev.per_query["p"] == pytest.approx({"RR@10": 1 / 3, "RR": 1 / 3, "RR@20": 1 / 3})
    with pytest.raises(ValueError, match="not computed by trec_eval"):
        parse_measures("NDCG@10,ERR@10")


def test_obliq_metrics_refuses_an_empty_run_or_one_of_another_task_and_counts_strays(tmp_path, caplog):
    from obliq.commands.metrics import score_files

    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    empty, other, partial = (tmp_path / n for n in ("empty.trec", "other.trec", "partial.trec"))
    empty.write_text("\n")
    other.write_text("x1 Q0 d1 1 2.0 r\n")
    partial.write_text("q1 Q0 d1 1 2.0 r\nzz Q0 d2 1 1.0 r\n")
    with pytest.raises(ValueError, match="the run is empty"):
        score_files(qrels, empty)
    with pytest.raises(ValueError, match="none of its 1 queries"):
        score_files(qrels, other)
    out = score_files(qrels, partial, "NDCG@10", whole_ranking=True)
    assert out["metrics"]["NDCG@10"] == pytest.approx(0.5)  # q1 = 1, q2 missing = 0
    assert out["run_queries_not_in_qrels"] == 1 and out["qrels_queries_not_in_run"] == 1
    assert "1 run queries not in qrels" in caplog.text
