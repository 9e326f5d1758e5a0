"""Loading and validating BEIR tasks: real data, bad lines named, warnings counted, C17 repairs."""

from __future__ import annotations

import json

import pytest
from support import make_task

from obliq.tasks import load_task, read_jsonl
from obliq.text import repair_text


def test_real_task_loads_with_its_stats(tasks_dir):
    task = load_task(tasks_dir / "math-theoremqa")
    stats = json.loads((tasks_dir / "math-theoremqa" / "task.json").read_text())["stats"]
    assert (task.name, task.mechanism) == ("math-theoremqa", "analogue")
    assert len(task.doc_ids) == stats["docs"] and len(task.query_ids) == stats["queries"]
    assert sum(len(v) for v in task.qrels["test"].values()) == stats["qrels"]
    assert "pooled" not in task.qrels
    assert task.report["test"] == {
        "queries_not_in_queries_file": 0,
        "docs_not_in_corpus": 0,
        "queries_without_relevant_docs": 0,
    }
    assert task.report["empty_docs"] == 0 and task.report["duplicate_corpus_ids"] == 0


def test_malformed_lines_name_file_line_and_field(tmp_path):
    bad_json = make_task(tmp_path / "a", ['{"_id": "d1", "text": "x"}', '{"_id": "d2", "text": '], [], [])
    with pytest.raises(ValueError, match=r"a/corpus\.jsonl:2: invalid JSON"):
        load_task(bad_json)
    no_id = make_task(tmp_path / "b", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}, {"text": "z"}], [])
    with pytest.raises(ValueError, match=r"b/queries\.jsonl:2: missing field '_id'"):
        load_task(no_id)
    wrong_type = make_task(tmp_path / "c", [{"_id": "d1", "text": ["x"]}], [], [])
    with pytest.raises(ValueError, match=r"c/corpus\.jsonl:1: field 'text' must be a string"):
        load_task(wrong_type)
    not_object = make_task(tmp_path / "d", ["[1, 2]"], [], [])
    with pytest.raises(ValueError, match=r"d/corpus\.jsonl:1: expected a JSON object"):
        load_task(not_object)
    blank = make_task(
        tmp_path / "f",
        [{"_id": "d1", "text": " "}, {"_id": "d2", "title": "", "text": ""}],
        [{"_id": "q1", "text": "y"}],
        [("q1", "d1", 1)],
    )
    with pytest.raises(ValueError, match=r"f/corpus\.jsonl: every one of the 2 docs has an empty 'text'"):
        load_task(blank)
    with pytest.raises(FileNotFoundError, match="gold qrels not found"):
        load_task(make_task(tmp_path / "e", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}], None))


def test_validation_warnings_with_counts(tmp_path, caplog):
    corpus = [
        {"_id": "d1", "title": "T", "text": "one"},
        {"_id": "d2", "text": "two"},
        {"_id": "d1", "text": "dup"},
        {"_id": "d3", "text": "  "},
        {"_id": 7, "text": "int id"},
    ]
    queries = [{"_id": "q1", "text": "a"}, {"_id": "q2", "text": ""}, {"_id": "q3", "text": "c"}]
    qrels = [("q1", "d1", 1), ("q1", "gone1", 1), ("q2", "gone2", 1), ("q3", "d2", 0), ("q9", "d1", 1)]
    task = load_task(make_task(tmp_path / "t", corpus, queries, qrels, pooled=[("q1", "d2", 2)]))
    assert task.doc_ids == ["d1", "d2", "d3", "7"]
    assert task.doc_texts[0] == "T one"  # title + text, first occurrence kept
    assert task.report["duplicate_corpus_ids"] == 1
    assert task.report["empty_docs"] == 1 and task.report["empty_queries"] == 1
    assert task.report["test"] == {
        "queries_not_in_queries_file": 1,
        "docs_not_in_corpus": 2,
        "queries_without_relevant_docs": 1,
    }
    assert task.report["pooled"]["queries_without_relevant_docs"] == 2
    assert "q9" not in task.qrels["test"] and task.qrels["pooled"] == {"q1": {"d2": 2}}
    for text in (
        "1 duplicate corpus ids",
        "1 empty docs",
        "1 empty queries",
        "1 query ids not in queries.jsonl",
        "2 judged doc ids not in corpus.jsonl",
        "1 queries have no relevant document",
    ):
        assert text in caplog.text


def test_c17_bad_characters_are_repaired_and_counted(tmp_path, caplog):
    line = '{"_id":"d9","text":"caf\\u00e9 \\udcb2 end\\u0000tail"}'
    (tmp_path / "c.jsonl").write_text(line + "\n")
    [(lineno, obj)] = read_jsonl(tmp_path / "c.jsonl")
    assert lineno == 1 and obj["text"] == "café \ufffd end tail"
    assert obj["text"].encode("utf-8")  # writable as UTF-8 again
    assert "repaired 2 characters" in caplog.text
    assert repair_text("ok") == ("ok", 0)
    (tmp_path / "b.jsonl").write_bytes(b'{"_id": "d1", "text": "\xff bad byte"}\n')
    assert read_jsonl(tmp_path / "b.jsonl")[0][1]["text"] == "\ufffd bad byte"


def test_split_queries_keeps_groups_whole_and_is_seeded(tasks_dir):
    from obliq.tasks import split_queries

    task = load_task(tasks_dir / "writing-news")
    dev, test = split_queries(task, 0.5, seed=0)
    assert (dev.name, test.name) == ("writing-news-dev", "writing-news-test")
    assert sorted(dev.query_ids + test.query_ids) == sorted(task.query_ids) and len(dev.query_ids) == 60
    assert set(dev.qrels["test"]) == set(dev.query_ids) and dev.doc_ids is task.doc_ids
    # a group (same gold relevant set: one author on writing-news) never straddles the split
    relevant = lambda t: {frozenset(t.qrels["test"][q]) for q in t.query_ids}  # noqa: E731
    assert not relevant(dev) & relevant(test)
    assert split_queries(task, 0.5, seed=0)[0].query_ids == dev.query_ids
    assert split_queries(task, 0.5, seed=1)[0].query_ids != dev.query_ids


def test_subset_and_split_errors(tmp_path):
    from obliq.tasks import split_queries, subset_queries

    task = load_task(
        make_task(
            tmp_path / "t",
            [{"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"}],
            [{"_id": "q1", "text": "x"}, {"_id": "q2", "text": "y"}, {"_id": "q3", "text": "z"}],
            [("q1", "d1", 1), ("q2", "d1", 1), ("q3", "d2", 1)],
        )
    )
    dev, test = split_queries(task, 0.5, seed=0)
    assert {tuple(dev.query_ids), tuple(test.query_ids)} == {("q1", "q2"), ("q3",)}  # q1, q2 share d1
    assert subset_queries(task, ["q3"], "only").qrels["test"] == {"q3": {"d2": 1}}
    with pytest.raises(ValueError, match="not in task"):
        subset_queries(task, ["q9"], "x")
    with pytest.raises(ValueError, match="dev_fraction"):
        split_queries(task, 1.0)
    one = load_task(
        make_task(tmp_path / "one", [{"_id": "d1", "text": "a"}], [{"_id": "q1", "text": "x"}], [("q1", "d1", 1)])
    )
    with pytest.raises(ValueError, match="rounds to 0 development queries"):
        split_queries(one)


def test_evaluate_scores_the_development_side_when_asked(tasks_dir, tmp_path):
    """`obliq evaluate --split dev` (clean-clone finding: "choose α on dev" needs it) scores queries-dev.jsonl
    against qrels/dev.tsv, never a test query; NDCG@10 checked against pytrec_eval on its own run and the
    dev qrels."""
    import pytrec_eval
    from support import task_slice

    from obliq.commands.evaluate import evaluate
    from obliq.commands.task import split_task
    from obliq.search.runs import read_run
    from obliq.tasks import read_qrels

    task_slice(tasks_dir, "stance-tweets", tmp_path / "slice", n_queries=40, n_distractors=100)
    split_task(tmp_path / "slice", tmp_path / "split", dev_fraction=0.5, seed=0)
    dev = {o["_id"] for _, o in read_jsonl(tmp_path / "split" / "queries-dev.jsonl")}
    test = {o["_id"] for _, o in read_jsonl(tmp_path / "split" / "queries.jsonl")}
    assert dev and test and not dev & test
    (summary,) = evaluate("bm25", [str(tmp_path / "split")], tmp_path / "dev", latency_queries=0, split="dev")
    folder = tmp_path / "dev" / summary["task"]
    assert summary["task"].endswith("-dev") and summary["n_queries"] == len(dev)
    per_query = [json.loads(x) for x in (folder / "per_query.jsonl").read_text().splitlines()]
    assert {q["query_id"] for q in per_query} == dev
    run = {q: dict(docs) for q, docs in read_run(folder / "run.trec").items()}
    qrels = {q: dict(j) for q, j in read_qrels(tmp_path / "split" / "qrels" / "dev.tsv").items()}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    want = sum(r["ndcg_cut_10"] for r in ref.values()) / len(ref)
    assert summary["metrics"]["NDCG@10"] == pytest.approx(want, abs=1e-9)
    # a side the folder does not have is named, with the sides it has and the command that writes one
    with pytest.raises(
        FileNotFoundError, match=r"no 'valid' side \(queries-valid.jsonl is missing; the folder's sides: test, dev\)$"
    ):
        evaluate("bm25", [str(tmp_path / "split")], tmp_path / "valid", latency_queries=0, split="valid")
    with pytest.raises(FileNotFoundError, match=r"no 'dev' side .*sides: test\); `obliq task split"):
        evaluate("bm25", [str(tmp_path / "slice")], tmp_path / "none", latency_queries=0, split="dev")
    assert not (tmp_path / "valid").exists() and not (tmp_path / "none").exists()  # refused before any output
