"""Files obliq reads and writes: byte-order marks (C28), ids a TREC run cannot hold (C25), empty
qrels, metrics deeper than the ranking, strict JSON, and every run writer reading back to the same
numbers (issue 14)."""

from __future__ import annotations

import json
import math

import pytest
import pytrec_eval
from support import make_task

from obliq.cli import main as obliq_main
from obliq.eval.metrics import evaluate_run
from obliq.files import BOM, json_text, read_id_table, write_json
from obliq.search.runs import read_run, write_run
from obliq.tasks import load_task, read_qrels

# --- C28: a byte-order mark at the start of a file --------------------------------------------


def test_c28_a_bom_before_a_headerless_trec_qrels_changes_nothing(tmp_path, capsys):
    (tmp_path / "q.txt").write_bytes(BOM + b"q1 0 d1 1\nq2 0 d1 1\n")
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.0 r\nq2 Q0 d1 1 2.0 r\n")
    assert set(read_qrels(tmp_path / "q.txt")) == {"q1", "q2"}
    obliq_main(
        [
            "metrics",
            "--qrels",
            str(tmp_path / "q.txt"),
            "--run",
            str(tmp_path / "run.trec"),
            "--measures",
            "NDCG@10",
            "--per_query",
            "--whole_ranking",  # one document per query: the run is each query's whole ranking
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["NDCG@10"] == 1.0 and out["per_query"] == {"q1": {"NDCG@10": 1.0}, "q2": {"NDCG@10": 1.0}}


def test_a_bom_before_every_other_kind_of_text_input_is_ignored(tmp_path):
    """Run files, corpus/queries JSONL, BEIR qrels, id tables and training rows: one helper reads them all."""
    from obliq.data.index import index_file
    from obliq.data.rows import read_rows

    task = make_task(
        tmp_path / "t",
        [{"_id": "d1", "text": "apple"}, {"_id": "d2", "text": "sky"}],
        [{"_id": "q1", "text": "apple"}],
        [("q1", "d1", 1)],
    )
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        (task / name).write_bytes(BOM + (task / name).read_bytes())
    loaded = load_task(task)
    assert loaded.doc_ids == ["d1", "d2"] and loaded.query_ids == ["q1"] and loaded.qrels["test"] == {"q1": {"d1": 1}}
    (tmp_path / "r.trec").write_bytes(BOM + b"q1 Q0 d1 1 1.0 t\n")
    assert read_run(tmp_path / "r.trec") == {"q1": {"d1": 1.0}}
    (tmp_path / "a.tsv").write_bytes(BOM + b"corpus-id\tattribute\nd1\tA\n")
    assert read_id_table(tmp_path / "a.tsv") == {"d1": "A"}
    row = {
        "id": "r1",
        "task": "t",
        "source": "public",
        "query": "q",
        "positive": {"id": "d1", "text": "x"},
        "negatives": [],
    }
    (tmp_path / "rows.jsonl").write_bytes(BOM + json.dumps(row).encode() + b"\n")
    assert read_rows(tmp_path / "rows.jsonl") == [row]
    assert index_file(tmp_path / "rows.jsonl", tmp_path / "index").rows == 1


# --- C25: ids that a TREC run cannot hold -----------------------------------------------------


def test_c25_a_corpus_id_with_spaces_is_refused_at_load_with_file_line_and_id(tmp_path):
    docs = [{"_id": i, "text": f"text of {i}"} for i in ("IPCC report, 1992", "Global warming", "Ice age", "Volcano")]
    task = make_task(
        tmp_path / "t",
        docs,
        [{"_id": "c1", "text": "climate"}, {"_id": "c2", "text": "warming"}],
        [("c1", "IPCC report, 1992", 1), ("c2", "Global warming", 1)],
    )
    with pytest.raises(
        ValueError, match=r"corpus\.jsonl:1: field '_id': id 'IPCC report, 1992' cannot be written in a TREC run"
    ):
        load_task(task)


def test_a_qrels_id_with_a_space_and_a_run_id_with_a_tab_are_refused(tmp_path):
    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tIce age\t1\n")
    with pytest.raises(ValueError, match=r"q\.tsv:2: field 'corpus-id': id 'Ice age'"):
        read_qrels(tmp_path / "q.tsv")
    with pytest.raises(ValueError, match="holds whitespace"):
        write_run(tmp_path / "r.trec", {"q1": {"d\t1": 1.0}})
    assert not (tmp_path / "r.trec").exists()


def test_every_run_writer_reads_back_to_the_same_numbers(tmp_path, tasks_dir):
    """evaluate's run.trec, the audit's and the reranker's go through write_run: unusual but legal ids
    (unicode, quotes, slashes) and close scores read back through read_run to the same metrics."""
    from obliq.commands.evaluate import evaluate

    qrels = {"q/1": {'d"é': 1, "d·2": 2}, "q-2": {"d,3": 1}}
    run = {"q/1": {'d"é': 0.3000000000000001, "d·2": 0.3, "x": 0.1}, "q-2": {"d,3": 1e-12, "y": 2e-12}}
    write_run(tmp_path / "r.trec", run)
    back = read_run(tmp_path / "r.trec")
    assert back == run
    measures = ["NDCG@10", "Recall@10", "RR"]
    assert evaluate_run(qrels, back, measures).per_query == evaluate_run(qrels, run, measures).per_query
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(back)
    assert {q: v["ndcg_cut_10"] for q, v in ref.items()} == pytest.approx(
        {q: v["NDCG@10"] for q, v in evaluate_run(qrels, run, measures).per_query.items()}
    )
    # evaluate's own files: the written run scores to the written summary
    out = tmp_path / "eval"
    [summary] = evaluate(
        "bm25", [str(tasks_dir / "math-theoremqa")], out, measures=["NDCG@10", "Recall@100"], latency_queries=0
    )
    again = evaluate_run(
        load_task(tasks_dir / "math-theoremqa").qrels["test"],
        read_run(out / "math-theoremqa" / "run.trec"),
        ["NDCG@10", "Recall@100"],
    )
    assert again.aggregate == pytest.approx(summary["metrics"], abs=1e-12)


# --- empty inputs, strict JSON ---------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "query-id\tcorpus-id\tscore\n", "\n\n"])
def test_empty_or_header_only_qrels_are_a_clear_error_everywhere(tmp_path, content, capsys):
    task = make_task(
        tmp_path / "t", [{"_id": "d1", "text": "apple"}], [{"_id": "q1", "text": "apple"}], [("q1", "d1", 1)]
    )
    (task / "qrels" / "test.tsv").write_text(content)
    with pytest.raises(ValueError, match=r"test\.tsv: no judgement"):
        load_task(task)
    (tmp_path / "r.trec").write_text("q1 Q0 d1 1 1.0 t\n")
    with pytest.raises(SystemExit) as stop:
        obliq_main(["metrics", "--qrels", str(task / "qrels" / "test.tsv"), "--run", str(tmp_path / "r.trec")])
    assert stop.value.code == 2 and "no judgement" in capsys.readouterr().err


def test_json_obliq_writes_is_strict(tmp_path):
    from pathlib import Path

    write_json(tmp_path / "x.json", {"nan": math.nan, "inf": [math.inf, -math.inf], "path": Path("a/b"), "ok": 0.5})
    text = (tmp_path / "x.json").read_text()
    assert json.loads(text) == {"nan": None, "inf": [None, None], "path": "a/b", "ok": 0.5}
    assert "NaN" not in text and "Infinity" not in text
    assert json_text({"v": float("nan")}, indent=None) == '{"v": null}'


def test_a_summary_with_no_evaluable_query_is_strict_json(tmp_path):
    """Every query without a relevant document: the means are undefined, written as null (not NaN)."""
    from obliq.eval.results import evaluate_tasks
    from obliq.search.retrieval import retrieve_bm25
    from obliq.search.settings import RetrievalSettings

    task = load_task(
        make_task(
            tmp_path / "t",
            [{"_id": "d1", "text": "apple"}, {"_id": "d2", "text": "sky"}],
            [{"_id": "q1", "text": "apple"}],
            [("q1", "d1", 0)],
        )
    )
    evaluate_tasks(lambda t: retrieve_bm25(t, RetrievalSettings()), [task], tmp_path / "out", "bm25", ["NDCG@10"])
    summary = json.loads((tmp_path / "out" / "t" / "summary.json").read_text(), parse_constant=pytest.fail)
    assert summary["metrics"] == {"NDCG@10": None} and summary["n_excluded"] == 1


# --- a metric deeper than the ranking ---------------------------------------------------------


def test_evaluate_refuses_a_cutoff_deeper_than_top_k_and_the_curve_stops_at_the_depth(tmp_path, tasks_dir):
    from obliq.commands.evaluate import evaluate
    from obliq.search.settings import RetrievalSettings

    task = str(tasks_dir / "math-theoremqa")  # 620 documents
    with pytest.raises(ValueError, match=r"Recall@1000 cuts at 1000 but the ranking holds retrieval.top_k=100 of 620"):
        evaluate("bm25", [task], tmp_path / "a", RetrievalSettings(top_k=100), latency_queries=0)
    assert not (tmp_path / "a").exists()  # refused before anything was written
    [summary] = evaluate(
        "bm25", [task], tmp_path / "b", RetrievalSettings(top_k=100), ["NDCG@10", "Recall@100"], latency_queries=0
    )
    assert list(summary["recall_curve"]) == ["10", "20", "50", "100"]
    # a ranking that holds the whole corpus measures every cut-off: 620 < 1000
    [whole] = evaluate("bm25", [task], tmp_path / "c", RetrievalSettings(top_k=620), ["Recall@1000"], latency_queries=0)
    assert "1000" in whole["recall_curve"]


def test_obliq_metrics_refuses_measures_deeper_than_the_run_unless_it_is_the_whole_ranking(tmp_path, capsys):
    (tmp_path / "q.tsv").write_text("q1\td1\t1\n")
    (tmp_path / "r.trec").write_text("q1 Q0 d2 1 2.0 r\nq1 Q0 d1 2 1.0 r\n")
    argv = ["metrics", "--qrels", str(tmp_path / "q.tsv"), "--run", str(tmp_path / "r.trec")]
    with pytest.raises(SystemExit) as stop:
        obliq_main([*argv, "--measures", "Recall@1,Recall@1000"])
    assert stop.value.code == 2 and "measure Recall@1000 cuts at 1000" in capsys.readouterr().err
    obliq_main([*argv, "--measures", "Recall@1,Recall@1000", "--whole_ranking"])  # tests/test_cut_rules.py
    out = json.loads(capsys.readouterr().out)
    assert out["run_depth"] == 2 and out["deeper_than_run"] == ["Recall@1000"]


def test_the_obliq_console_script_exits_0_on_success_and_2_on_bad_input(tmp_path):
    """The installed ``obliq`` script (its return value is its exit status): a command that returns a
    result exits 0 with the result as JSON on stdout; a bad file exits 2 with one line naming it."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("obliq")
    (tmp_path / "q.tsv").write_text("q1\td1\t1\n")
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.0 r\n")
    ok = subprocess.run(
        [
            str(script),
            "metrics",
            "--qrels",
            str(tmp_path / "q.tsv"),
            "--run",
            str(tmp_path / "run.trec"),
            "--measures",
            "NDCG@10",
            "--whole_ranking",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["metrics"]["NDCG@10"] == 1.0
    (tmp_path / "bad.trec").write_text("q1 Q0 d1\n")
    bad = subprocess.run(
        [str(script), "metrics", "--qrels", str(tmp_path / "q.tsv"), "--run", str(tmp_path / "bad.trec")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "bad.trec" in bad.stderr


def test_per_query_values_read_back_equal_trec_evals_and_bad_lines_are_named(tmp_path):
    """read_per_query (the input of every paired comparison) against pytrec_eval on the written run."""
    from obliq.commands.evaluate import evaluate
    from obliq.eval.results import read_per_query

    docs = [{"_id": f"d{i}", "text": f"apple pie recipe number {i}" if i % 2 else f"pear tart {i}"} for i in range(12)]
    task = make_task(
        tmp_path / "t",
        docs,
        [{"_id": "q1", "text": "apple pie"}, {"_id": "q2", "text": "pear tart"}],
        [("q1", "d1", 1), ("q1", "d4", 2), ("q2", "d2", 1), ("q2", "d9", 1)],
    )
    evaluate("bm25", [str(task)], tmp_path / "o", measures=["NDCG@10"])
    got = read_per_query(tmp_path / "o" / "t" / "per_query.jsonl")
    run = read_run(tmp_path / "o" / "t" / "run.trec")  # {query: {doc: score}}
    qrels = {"q1": {"d1": 1, "d4": 2}, "q2": {"d2": 1, "d9": 1}}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    assert got.keys() == {"q1", "q2"}
    assert all(math.isclose(got[q], ref[q]["ndcg_cut_10"], abs_tol=1e-12) for q in got)
    (tmp_path / "bad.jsonl").write_text('{"query_id": "q1", "qrels": "gold", "NDCG@10": 0.5}\n{"query_id": "q2"\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a per-query line"):
        read_per_query(tmp_path / "bad.jsonl")
