"""mteb both ways, offline: mteb tasks converted to obliq task folders (through mteb's own loader, on
local datasets in hub layout: nothing is downloaded), and exported obliq models evaluated by mteb on
an obliq folder giving obliq's numbers (checked against mteb's own scores and scorer, and
sentence-transformers' embeddings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mteb
import numpy as np
import pytest

from obliq.commands.task import from_mteb
from obliq.search.runs import read_mteb_predictions
from obliq.tasks import load_task
from obliq.tasks.obliq_bench import OBLIQ_BENCH

K_VALUES = [1, 3, 5, 10, 20, 100, 1000]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """datasets caches what it loads (local folders too): keep it in the test's folder."""
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "datasets-cache")


def hub_folder(root: Path, subset: str | None, corpus, queries, qrels, top_ranked=None, instructions=None) -> Path:
    """A dataset folder in hub layout (README.md configs + JSONL files), as mteb's loader reads a hub
    repository: configs ``<subset>-corpus`` … (``corpus``, ``queries``, ``default`` without a subset)."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    files = {
        "qrels": [{"query-id": q, "corpus-id": d, "score": g} for q, d, g in qrels],
        "corpus": corpus,
        "queries": queries,
    }
    if top_ranked is not None:
        files["top_ranked"] = [{"query-id": q, "corpus-ids": ids} for q, ids in top_ranked.items()]
    if instructions is not None:
        files["instruction"] = [{"query-id": q, "instruction": t} for q, t in instructions.items()]
    configs = []
    for kind, rows in files.items():
        (data / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        name = f"{subset}-{kind}" if subset else ("default" if kind == "qrels" else kind)
        configs.append(f"- config_name: {name}\n  data_files:\n  - split: test\n    path: data/{kind}.jsonl\n")
    (root / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")
    return root


CORPUS = [
    {"_id": "m1", "title": "Pigeonhole", "text": "Show two of five points in a unit square are close. "},
    {"_id": "m2", "title": "", "text": "Prove some two people at a party have the same number of friends."},
    {"_id": "m3", "title": "", "text": "Integrate x times e to the x."},
    {"_id": "m4", "title": "", "text": "Find the derivative of sine squared."},
]
QUERIES = [{"_id": "qa", "text": "Among 13 people two share a birth month."}, {"_id": "qb", "text": "Integrate ln x."}]
QRELS = [("qa", "m1", 1), ("qa", "m2", 1), ("qb", "m3", 2), ("qb", "m4", 0)]
TOP_RANKED = {"qa": ["m2", "m3", "m4"], "qb": ["m1", "m2", "m3", "m4"]}


def test_obliq_bench_math_converts_with_candidates_pooled_judgements_and_the_b3_instruction(tmp_path):
    ds = hub_folder(tmp_path / "hub", "math", CORPUS, QUERIES, QRELS, TOP_RANKED)
    report = from_mteb("OBLIQBenchMathRetrieval", tmp_path / "math", dataset_path=ds)
    assert report["candidates"] == {"queries": 2, "total": 7, "min": 3, "max": 4} and report["judgements"] == "pooled"
    assert (report["docs"], report["queries"], report["qrels"], report["relevant"]) == (4, 2, 4, 3)
    task = load_task(tmp_path / "math")
    # the text mteb's encoders read: title + " " + text, stripped (mteb/_create_dataloaders.py)
    assert task.doc_texts[0] == "Pigeonhole Show two of five points in a unit square are close."
    assert task.qrels["test"] == {"qa": {"m1": 1, "m2": 1}, "qb": {"m3": 2, "m4": 0}}  # grade 0 kept, as mteb keeps it
    assert task.candidates == TOP_RANKED
    assert (task.name, task.mechanism, task.judgements) == ("OBLIQBenchMathRetrieval", "analogue", "pooled")
    assert task.prompt_name == "OBLIQBenchMathRetrieval"
    assert task.instruction == (
        "Given an example problem, retrieve other math problems whose solutions share the same abstract "
        "reasoning technique."
    )  # the OBLIQ-IR paper, Appendix B.3
    meta = json.loads((tmp_path / "math" / "task.json").read_text())["source"]
    # a 4-document copy is not the published dataset: the counts' disagreement is recorded
    assert meta["differs_from_published_statistics"]["num_samples"] == {"loaded": 6, "published": 3659}
    assert (
        meta["dataset"] == "mteb/OBLIQBenchRetrieval"
        and meta["revision"] == mteb.get_task("OBLIQBenchMathRetrieval").metadata.dataset["revision"]
    )
    assert (meta["subset"], meta["split"], meta["mteb_version"]) == ("math", "test", mteb.__version__)

    from obliq.commands.evaluate import evaluate

    (summary,) = evaluate("bm25", [str(tmp_path / "math")], tmp_path / "bm25", measures=["NDCG@10"])
    assert summary["judgements"] == "pooled" and summary["ranking"]["over"] == "candidates"
    assert "| OBLIQBenchMathRetrieval | analogue | pooled |" in (tmp_path / "bm25" / "results.md").read_text()
    rows = (tmp_path / "bm25" / "OBLIQBenchMathRetrieval" / "per_query.jsonl").read_text().splitlines()
    assert {json.loads(r)["qrels"] for r in rows} == {"pooled"}


def test_any_mteb_retrieval_task_converts_with_its_prompt_and_query_instructions(tmp_path):
    ds = hub_folder(
        tmp_path / "hub",
        None,
        CORPUS,
        [*QUERIES, {"_id": "unjudged", "text": "no qrels: mteb drops it"}],
        QRELS,
        instructions={"qa": "months only", "qb": "calculus", "unjudged": "x"},
    )
    report = from_mteb("SciFact", tmp_path / "scifact", dataset_path=ds, task_name="scifact-local")
    task = load_task(tmp_path / "scifact")
    assert report["candidates"] is None and task.candidates is None
    assert task.query_ids == ["qa", "qb"]  # as mteb's loader keeps them
    assert task.query_texts == ["Among 13 people two share a birth month. months only", "Integrate ln x. calculus"]
    assert (task.name, task.mechanism, task.prompt_name) == ("scifact-local", None, "SciFact")
    assert task.instruction == mteb.get_task("SciFact").metadata.prompt["query"]


def test_candidate_sets_lost_on_loading_are_refused(tmp_path):
    """mteb's statistics give OBLIQ-Bench Math candidate sets; data that loads without them (what the
    Arrow cache offline gives: the colleague's note §7) must not silently become full-corpus retrieval."""
    ds = hub_folder(tmp_path / "hub", "math", CORPUS, QUERIES, QRELS)  # no math-top_ranked config
    with pytest.raises(ValueError, match=r"statistics give its queries candidate sets \(top_ranked\), but none"):
        from_mteb("OBLIQBenchMathRetrieval", tmp_path / "math", dataset_path=ds)


def test_a_task_refused_midway_leaves_nothing_that_evaluates(tmp_path):
    """Issue 32 §3: a from-mteb refused after writing corpus, queries and qrels (a candidate not in the corpus)
    left a folder without task.json or candidate sets, which evaluate scored over the whole corpus as gold.
    The task is written aside and moved in whole: the refused folder holds no task."""
    from obliq.commands.evaluate import evaluate

    ds = hub_folder(tmp_path / "hub", "math", CORPUS, QUERIES, QRELS, {**TOP_RANKED, "qb": ["m1", "m9"]})
    with pytest.raises(ValueError, match="candidate 'm9' of query 'qb' is not in the corpus"):
        from_mteb("OBLIQBenchMathRetrieval", tmp_path / "math", dataset_path=ds)
    assert {p.name for p in (tmp_path / "math").iterdir()} <= {".obliq-output"}
    with pytest.raises((FileNotFoundError, ValueError)):
        evaluate("bm25", [str(tmp_path / "math")], tmp_path / "bm25", measures=["NDCG@10"])


def test_unknown_or_non_retrieval_tasks_are_refused(tmp_path):
    with pytest.raises(ValueError, match="NoSuchTask: not an mteb task"):
        from_mteb("NoSuchTask", tmp_path / "x")
    with pytest.raises(ValueError, match="Banking77Classification: an mteb Classification task, not a retrieval"):
        from_mteb("Banking77Classification", tmp_path / "x")
    with pytest.raises(ValueError, match=r"give --split as one of \['test'\]"):
        from_mteb("OBLIQBenchMathRetrieval", tmp_path / "x", split="dev")


def test_offline_without_the_data_cached_refuses_in_one_line(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_DATASETS_CACHE", None)
    cmd = [
        sys.executable,
        "-m",
        "obliq.cli",
        "task",
        "from-mteb",
        "OBLIQBenchMathRetrieval",
        "--out",
        str(tmp_path / "m"),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    revision = mteb.get_task("OBLIQBenchMathRetrieval").metadata.dataset["revision"]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: mteb task OBLIQBenchMathRetrieval: dataset mteb/OBLIQBenchRetrieval at revision {revision} "
        "(subset math, split test) could not be loaded offline: it is not in the cache"
    )
    assert not (tmp_path / "m").exists()
    # the hub snapshot in the cache (but not datasets' own cache): named, and read with --dataset_path
    snapshot = tmp_path / "hf" / "hub" / "datasets--mteb--OBLIQBenchRetrieval" / "snapshots" / revision
    hub_folder(snapshot, "math", CORPUS, QUERIES, QRELS, TOP_RANKED)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and f"pass --dataset_path {snapshot} (its hub snapshot)" in done.stderr
    # the same command with --dataset_path, in this process (the launch is checked above): it writes the task
    from obliq.cli import main

    main([*cmd[3:], "--dataset_path", str(snapshot)])
    assert load_task(tmp_path / "m").candidates == TOP_RANKED


# --- obliq → mteb ---------------------------------------------------------------------------------


def small_math_task(tasks_dir: Path, root: Path, candidates: bool) -> Path:
    """A slice of math-theoremqa named as OBLIQ-Bench Math (its registered name, so mteb uses the model's
    per-task prompts), with the B.3 instruction: 8 queries with at least two relevant documents, those and
    the first 30 documents (54 in all); with candidates, each query loses its first relevant document and
    every seventh other one from its candidate set."""
    source = load_task(tasks_dir / "math-theoremqa")
    gold = source.qrels["test"]
    queries = [q for q in source.query_ids if sum(g > 0 for g in gold.get(q, {}).values()) >= 2][:8]
    keep = sorted({d for q in queries for d in gold[q]}) + [d for d in source.doc_ids[:30]]
    docs = list(dict.fromkeys(keep))
    text = dict(zip(source.doc_ids, source.doc_texts))
    qtext = dict(zip(source.query_ids, source.query_texts))
    root.mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": text[d]}) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": qtext[q]}) + "\n" for q in queries))
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text(
        "".join(f"{q}\t{d}\t{g}\n" for q in queries for d, g in gold[q].items() if d in set(docs))
    )
    bench = OBLIQ_BENCH["OBLIQBenchMathRetrieval"]
    meta = {"name": root.name, "prompt_name": "OBLIQBenchMathRetrieval", "instruction": bench.instruction}
    (root / "task.json").write_text(json.dumps(meta))
    if candidates:
        (root / "top_ranked").mkdir()
        rows = []
        for q in queries:
            drop = sorted(d for d, g in gold[q].items() if g > 0)[0]
            rows.append({"query-id": q, "corpus-ids": [d for i, d in enumerate(docs) if d != drop and i % 7 != 3]})
        (root / "top_ranked" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tasks_dir, minilm_path) -> Path:
    """MiniLM with LoRA, 2 steps with instructions on (use_instructions), exported with a merged folder."""
    import yaml
    from support import task_rows, write_config, write_rows

    from obliq.commands.export import export
    from obliq.commands.train import cli

    folder = tmp_path_factory.mktemp("mteb-export")
    rows = write_rows(folder / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=16))
    config = write_config(folder, rows, minilm_path, max_steps=2)
    cfg = yaml.safe_load(config.read_text())
    cfg["model"]["encoder"]["init_args"]["use_instructions"] = True
    config.write_text(yaml.safe_dump(cfg))
    cli(["fit", "--config", str(config)])
    export(folder / "ckpt" / "last.ckpt", folder / "export", merge=True)
    return folder / "export"


def per_query_file(path: Path) -> dict[str, dict]:
    return {json.loads(line)["query_id"]: json.loads(line) for line in path.read_text().splitlines()}


@pytest.mark.slow
@pytest.mark.parametrize("candidates", [False, True], ids=["corpus", "candidates"])
def test_mteb_on_an_obliq_folder_gives_obliq_evaluates_numbers(exported, tasks_dir, tmp_path, candidates):
    """The merged folder as a plain SentenceTransformer and the adapter through MtebEncoder, evaluated by
    mteb on the folder: NDCG@10, Recall@100 and every query's values equal `obliq evaluate`'s within
    1e-4 (mteb's means are rounded to 5 digits); per query from mteb's own scorer on its saved
    predictions, which `obliq compare` then reads as it reads TREC runs."""
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores
    from sentence_transformers import SentenceTransformer

    from obliq.commands.compare import compare_files
    from obliq.commands.evaluate import evaluate
    from obliq.eval.mteb_bridge import MtebEncoder, mteb_task
    from obliq.eval.significance import compare
    from obliq.search.settings import RetrievalSettings

    folder = small_math_task(tasks_dir, tmp_path / ("math-cand" if candidates else "math-full"), candidates)
    task = load_task(folder)
    assert (task.candidates is not None) == candidates
    systems = {
        "merged": SentenceTransformer(str(exported / "merged"), device="cpu"),
        "adapter": MtebEncoder(str(exported / "adapter")),
    }
    per_query = {}
    for name, model in systems.items():
        (summary,) = evaluate(
            str(exported / name),
            [str(folder)],
            tmp_path / f"obliq-{name}",
            retrieval=RetrievalSettings(cache=False),
            measures=["NDCG@10", "Recall@100"],
            latency_queries=0,
        )
        assert summary["ranking"]["over"] == ("candidates" if candidates else "corpus")
        preds = tmp_path / f"mteb-{name}"
        result = mteb.evaluate(
            model, mteb_task(folder), cache=None, prediction_folder=preds, encode_kwargs={"batch_size": 16}
        )
        scores = result.task_results[0].scores["test"][0]
        assert scores["ndcg_at_10"] == pytest.approx(summary["metrics"]["NDCG@10"], abs=1e-4)
        assert scores["recall_at_100"] == pytest.approx(summary["metrics"]["Recall@100"], abs=1e-4)
        run = read_mteb_predictions(preds)
        if candidates:
            assert all(set(docs) <= set(task.candidates[q]) for q, docs in run.items())
        theirs = calculate_retrieval_scores(run, task.qrels["test"], K_VALUES).all_scores
        ours = per_query_file(tmp_path / f"obliq-{name}" / folder.name / "per_query.jsonl")
        assert set(ours) == set(theirs) == set(task.query_ids)
        for q in task.query_ids:
            assert ours[q]["NDCG@10"] == pytest.approx(theirs[q]["ndcg_cut_10"], abs=1e-4)
            assert ours[q]["Recall@100"] == pytest.approx(theirs[q]["recall_100"], abs=1e-4)
        per_query[name] = {q: v["NDCG@10"] for q, v in ours.items()}
    got = compare_files(tmp_path / "mteb-merged", tmp_path / "mteb-adapter", folder / "qrels" / "test.tsv")
    want = compare(per_query["merged"], per_query["adapter"]).as_dict()
    assert got["n_queries"] == want["n_queries"] == len(task.query_ids)
    assert got["diff"] == pytest.approx(want["diff"], abs=1e-4) and got["p_method"] == want["p_method"]


@pytest.mark.slow
def test_mteb_picks_up_the_exported_per_task_prompts(exported, tasks_dir, tmp_path):
    """The merged folder's prompts carry OBLIQBenchMathRetrieval-query = the B.3 instruction in obliq's
    format (the model was trained with instructions), and mteb's scores are the cosines of
    sentence-transformers' embeddings with exactly those prompts — not with the plain prefix."""
    from sentence_transformers import SentenceTransformer

    from obliq.eval.mteb_bridge import mteb_task

    instruction = OBLIQ_BENCH["OBLIQBenchMathRetrieval"].instruction
    saved = json.loads((exported / "merged" / "config_sentence_transformers.json").read_text())["prompts"]
    assert saved["OBLIQBenchMathRetrieval-query"] == f"Instruct: {instruction}\nquery: "
    assert saved["OBLIQBenchMathRetrieval-document"] == saved["document"] == "passage: "
    assert saved["query"] == "query: "  # other tasks: the plain prefix
    folder = small_math_task(tasks_dir, tmp_path / "math", candidates=False)
    task = load_task(folder)
    st = SentenceTransformer(str(exported / "merged"), device="cpu")
    mteb.evaluate(st, mteb_task(folder), cache=None, prediction_folder=tmp_path / "p", encode_kwargs={"batch_size": 16})
    run = read_mteb_predictions(tmp_path / "p")
    q = np.asarray(st.encode_query(task.query_texts[:3], prompt=f"Instruct: {instruction}\nquery: "), np.float64)
    plain = np.asarray(st.encode_query(task.query_texts[:3], prompt="query: "), np.float64)
    d = np.asarray(st.encode_document(task.doc_texts, prompt="passage: "), np.float64)
    for m in (q, plain, d):
        m /= np.linalg.norm(m, axis=1, keepdims=True)
    gap = 0.0
    for i, qid in enumerate(task.query_ids[:3]):
        for doc, score in run[qid].items():
            j = task.doc_ids.index(doc)
            assert score == pytest.approx(float(q[i] @ d[j]), abs=1e-5)
            gap = max(gap, abs(score - float(plain[i] @ d[j])))
    assert gap > 1e-3  # the instruction changed what mteb encoded
    # the adapter reads the same instruction from the task (obliq evaluate, MtebEncoder): the same vectors
    from obliq.search.encoders import load_encoder

    adapter = load_encoder(str(exported / "adapter"))  # at its own lengths, which the merged folder carries (C68)
    with_task = adapter.encode(task.query_texts[:3], "query", task=task).double().numpy()
    np.testing.assert_allclose(with_task, q, atol=1e-5)
    assert np.abs(adapter.encode(task.query_texts[:3], "query").double().numpy() - plain).max() < 1e-5


def test_compare_reads_mteb_predictions_and_refuses_ambiguous_folders(tmp_path):
    folder = tmp_path / "preds"
    folder.mkdir()
    for task_name, scores in (("A", {"q1": {"d1": 0.9, "d2": 0.1}}), ("B", {"q1": {"d1": 0.2}})):
        payload = {"mteb_model_meta": {"model_name": "m"}, "default": {"test": scores}}
        (folder / f"{task_name}_predictions.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"predictions of several tasks \['A', 'B'\]: name one with --task"):
        read_mteb_predictions(folder)
    assert read_mteb_predictions(folder, task="A") == {"q1": {"d1": 0.9, "d2": 0.1}}
    with pytest.raises(FileNotFoundError, match="no C_predictions.json"):
        read_mteb_predictions(folder, task="C")
    bad = tmp_path / "bad_predictions.json"
    bad.write_text(json.dumps({"default": {"test": {"q1": {"d1": "high"}}}}))
    with pytest.raises(ValueError, match=r"query 'q1', document 'd1': score 'high' is not a finite number"):
        read_mteb_predictions(bad)
    two = tmp_path / "two_predictions.json"
    two.write_text(json.dumps({"default": {"dev": {}, "test": {}}}))
    with pytest.raises(ValueError, match=r"holds the splits \['dev', 'test'\]: choose one with --split"):
        read_mteb_predictions(two)


def test_the_cli_lists_from_mteb(capsys):
    """`obliq task from-mteb --help` in this process (`python -m obliq.cli task from-mteb` is launched as a
    process above, in the offline test)."""
    from obliq.cli import main

    with pytest.raises(SystemExit) as done:
        main(["task", "from-mteb", "--help"])
    assert done.value.code == 0 and "--dataset_path" in capsys.readouterr().out
