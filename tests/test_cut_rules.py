"""Issue 49 §4–5: what a measure's cut-off may be, how deep a ranking must be for it, and how many
resamples a comparison may take — one rule each, the same in ``obliq metrics``, ``obliq compare``,
``obliq evaluate`` and the training callback, refused before any work in one line (exit 2)."""

from __future__ import annotations

import json

import pytest
from support import make_task

from obliq.cli import main as obliq_main
from obliq.commands.compare import compare_files
from obliq.eval.metrics import MAX_CUTOFF, check_depth, parse_measures
from obliq.eval.significance import MAX_RESAMPLES, compare


def _refused(argv: list[str], capsys) -> str:
    """The one line an obliq command prints when it refuses ``argv`` (exit status 2)."""
    with pytest.raises(SystemExit) as stop:
        obliq_main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0].removeprefix("error: ")


def _not_a_rank(name: str, cut: str, head: str) -> str:
    return (
        f"measure {name!r}: the cut-off {cut!r} is not a rank (a whole number of documents from 1 to "
        f"{MAX_CUTOFF:,}, as trec_eval cuts a ranking); try {head}@10"
    )


# --- §4: a cut-off that is not a rank ------------------------------------------------------------

BAD_CUTS = [
    ("NDCG@0", "0", "NDCG"),
    ("NDCG@2.5", "2.5", "NDCG"),
    ("Recall@-1", "-1", "Recall"),
    ("P@0", "0", "P"),
    ("RR@0", "0", "RR"),
    ("NDCG@1e3", "1e3", "NDCG"),  # ir_measures reads 1000.0
    ("Recall@0x10", "0x10", "Recall"),  # ir_measures reads 16
    ("Recall@010", "010", "Recall"),  # ir_measures refuses it as an octal literal
    ("NDCG@99999999999999999999", "99999999999999999999", "NDCG"),  # pytrec_eval names it recall_9223…
]


@pytest.mark.parametrize("name, cut, head", BAD_CUTS)
def test_a_cutoff_that_is_not_a_rank_is_refused_where_the_measure_is_parsed(name, cut, head):
    with pytest.raises(ValueError) as err:
        parse_measures(f"NDCG@10,{name}")
    assert str(err.value) == _not_a_rank(name, cut, head)
    assert list(parse_measures("NDCG@ 10,Recall@100,AP")) == ["NDCG@ 10", "Recall@100", "AP"]


@pytest.mark.parametrize("name, cut, head", BAD_CUTS[:3])
def test_every_command_refuses_it_before_reading_a_file_or_retrieving(tmp_path, capsys, name, cut, head):
    """The files named do not exist: a refusal that came after any reading would name them instead."""
    nowhere = str(tmp_path / "absent")
    expected = _not_a_rank(name, cut, head)
    assert _refused(["metrics", "--qrels", nowhere, "--run", nowhere, "--measures", name], capsys) == expected
    assert _refused(["compare", nowhere, nowhere, "--qrels", nowhere, "--measure", name], capsys) == expected
    argv = ["evaluate", "--model", "bm25", "--tasks", nowhere, "--output", str(tmp_path / "out"), "--measures", name]
    assert _refused(argv, capsys) == expected
    assert not (tmp_path / "out").exists()


def test_the_training_callback_refuses_it_before_training(tasks_dir):
    from obliq.callbacks import RetrievalEvaluation

    callback = RetrievalEvaluation([str(tasks_dir / "math-theoremqa")], measures=["NDCG@10", "NDCG@0"])
    with pytest.raises(ValueError) as err:
        callback.setup(None, None, "fit")  # Lightning's setup, before the first step
    assert str(err.value) == _not_a_rank("NDCG@0", "0", "NDCG")


# --- §4: a cut-off deeper than the ranking: one rule, refused unless told -------------------------


def _depth_two(tmp_path):
    """Qrels q1..q3 (d1 relevant) and two runs that rank two documents per query."""
    (tmp_path / "q.tsv").write_text("".join(f"q{i}\t0\td1\t1\n" for i in (1, 2, 3)))
    for name, order in (("a", ("d2", "d1")), ("b", ("d1", "d2"))):
        lines = [f"q{i} Q0 {d} {r} {3 - r} {name}\n" for i in (1, 2, 3) for r, d in enumerate(order, 1)]
        (tmp_path / f"{name}.trec").write_text("".join(lines))
    return str(tmp_path / "q.tsv"), str(tmp_path / "a.trec"), str(tmp_path / "b.trec")


def _too_deep(name: str, k: int, run: str) -> str:
    return (
        f"measure {name} cuts at {k} but the ranking holds the depth of {run}=2 documents per query: rank deeper, "
        f"pass --whole_ranking true if {run} holds each query's whole ranking (every document its system returns, "
        f"or the whole corpus), or leave {name} out"
    )


def test_metrics_and_compare_refuse_a_cut_deeper_than_the_run_unless_it_is_the_whole_ranking(tmp_path, capsys):
    qrels, a, b = _depth_two(tmp_path)
    argv = ["metrics", "--qrels", qrels, "--run", a, "--measures", "Recall@1,Recall@1000"]
    assert _refused(argv, capsys) == _too_deep("Recall@1000", 1000, a)
    assert _refused(["compare", a, b, "--qrels", qrels, "--resamples", "100"], capsys) == _too_deep("NDCG@10", 10, a)
    obliq_main([*argv, "--whole_ranking", "true"])
    out = json.loads(capsys.readouterr().out)
    assert out["run_depth"] == 2 and out["deeper_than_run"] == ["Recall@1000"]
    assert out["metrics"] == {"Recall@1": 0.0, "Recall@1000": 1.0}  # trec_eval's value for the run as given
    obliq_main(["compare", a, b, "--qrels", qrels, "--resamples", "100", "--whole_ranking"])
    out = json.loads(capsys.readouterr().out)
    assert out["whole_ranking"] is True and out["diff"] == pytest.approx(1 - 0.630930, abs=1e-6)
    obliq_main(["compare", a, b, "--qrels", qrels, "--resamples", "100", "--measure", "NDCG@2"])  # within the run
    assert json.loads(capsys.readouterr().out)["measure"] == "NDCG@2"


def test_evaluate_applies_the_same_rule_to_a_run_file_before_writing_anything(tmp_path, capsys):
    """A task of 5 documents: NDCG@10 of a run needs min(10, 5) = 5 documents per query; the run has 2."""
    docs = [{"_id": f"d{i}", "text": f"text {i}"} for i in range(1, 6)]
    task = make_task(tmp_path / "t", docs, [{"_id": f"q{i}", "text": "text"} for i in (1, 2, 3)], [])
    qrels, a, _ = _depth_two(tmp_path)
    (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + open(qrels).read().replace("\t0\t", "\t"))
    out = tmp_path / "out"
    argv = ["evaluate", "--model", a, "--tasks", str(task), "--output", str(out), "--measures", "NDCG@10"]
    assert _refused(argv, capsys) == (
        f"measure NDCG@10 cuts at 10 but the ranking holds the depth of {a}=2 of 5 documents: "
        f"raise the depth of {a} to 5 or leave NDCG@10 out"
    )
    assert not out.exists()
    with pytest.raises(ValueError, match=r"^measure NDCG@10 cuts at 10 but the ranking holds retrieval.top_k=2 of 5"):
        check_depth(["NDCG@10"], 2, 5)  # evaluate's own ranking: the same function
    check_depth(["NDCG@10"], 5, 5)  # the whole corpus: every cut-off is measured


# --- §5: how many resamples a comparison may take --------------------------------------------------


@pytest.mark.parametrize("option", ["resamples", "permutations"])
def test_compare_bounds_its_resamples_before_reading_a_file(tmp_path, capsys, option):
    nowhere = str(tmp_path / "absent")
    too_many = str(MAX_RESAMPLES + 1)
    assert _refused(["compare", nowhere, nowhere, "--qrels", nowhere, f"--{option}", too_many], capsys) == (
        f"{option}: at most 1,000,000 (obliq.eval.significance.MAX_RESAMPLES; the paper's interval takes 10,000), "
        "got 1,000,001"
    )
    assert _refused(["compare", nowhere, nowhere, "--qrels", nowhere, f"--{option}", "0"], capsys) == (
        f"{option}: must be an integer >= 1, got 0"
    )
    with pytest.raises(ValueError, match=f"^{option}: at most 1,000,000"):
        compare({"q": 0.1}, {"q": 0.2}, **{option: MAX_RESAMPLES + 1})  # the quickstart's and the report's path too


def test_the_bound_itself_is_allowed(tmp_path):
    qrels, a, b = _depth_two(tmp_path)
    out = compare_files(a, b, qrels, "NDCG@2", permutations=MAX_RESAMPLES, resamples=1000)
    assert out["p_method"] == "exact" and out["resamples"] == 1000  # 3 queries: enumerated, B unused
