"""Every bench script runs: each is started as a user would start it, on a few steps and small real data
(the benches print figures; these tests check that they run to the end and write what they say)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import task_slice

from obliq.model.checkpoint import read_checkpoint

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def bench(*args: str, env: dict | None = None, cwd: Path = REPO, timeout: int = 600) -> str:
    """Run ``python bench/<args>``; its standard output (fails the test with its log on a non-zero exit)."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


@pytest.fixture(scope="module")
def writing(tasks_dir, tmp_path_factory):
    """A small writing-news (8 queries of 4 authors, their passages and 10 others) as ``<data>/tasks/``,
    with a recipe (configs/writing-cpu.yaml at small sizes, its loader in the training process) whose kNN
    pairs ``obliq distill`` wrote."""
    from obliq.cli import main as obliq_main

    root = tmp_path_factory.mktemp("writing")
    task = task_slice(tasks_dir, "writing-news", root / "data" / "tasks" / "writing-news", 8, 10)
    work = root / "work"
    obliq_main(
        [
            "distill",
            "graph",
            "--task",
            str(task),
            "--teacher",
            "stylometric",
            "--k",
            "2",
            "--out",
            str(work / "graph.json"),
        ]
    )
    obliq_main(
        [
            "distill",
            "pairs",
            "--task",
            str(task),
            "--graph",
            str(work / "graph.json"),
            "--out",
            str(work / "rows" / "knn.jsonl"),
        ]
    )
    recipe = (
        (REPO / "configs" / "writing-cpu.yaml").read_text().replace("work_dir: runs/writing-cpu", f"work_dir: {work}")
    )
    for key, small in (
        ("max_steps: 50", "max_steps: 2"),
        ("batch_size: 32", "batch_size: 4"),
        ("query_max_length: 256", "query_max_length: 32"),
        ("passage_max_length: 256", "passage_max_length: 32"),
        ("chunk_size: 16", "chunk_size: 2"),
        ("num_workers: 1", "num_workers: 0"),  # a loader worker costs seconds to start and join per training
        ("every_n_train_steps: 10", "every_n_train_steps: 1"),  # a checkpoint at steps 1 and 2: a soup of two
    ):
        assert key in recipe
        recipe = recipe.replace(key, small)
    (root / "recipe.yaml").write_text(recipe)
    return root


@pytest.mark.heavy
def test_distill_ablation_trains_evaluates_and_compares_a_run(writing):
    env = {"OBLIQ_DATA": str(writing / "data"), "OBLIQ_ABL_ROOT": str(writing / "abl")}
    out = bench(
        "bench/distill_ablation.py",
        "run",
        "--name",
        "smoke",
        "--task",
        "writing-news",
        "--split",
        "dev",
        "--recipe",
        str(writing / "recipe.yaml"),
        "--checkpoints",
        "last",
        "--eval_tokens",
        "32",
        env=env,
    )
    [line] = [json.loads(x) for x in (writing / "abl" / "log.jsonl").read_text().splitlines() if '"step"' in x]
    assert line["step"] == 2 and line["name"] == "smoke" and 0 <= line["NDCG@10"] <= 1 and line["eval_tokens"] == 32
    assert "n = " in line["vs teacher"]["p_text"] and "smoke step 2" in out
    report = json.loads((writing / "abl" / "smoke" / "dev" / "step-2" / "comparison.json").read_text())
    assert set(report["systems"]) == {"smoke@2", "BM25", "MiniLM (base)", "stylometric teacher"}
    soup = ["bench/distill_ablation.py", "soup", "--name", "smoke", "--task", "writing-news", "--eval_tokens", "32"]
    printed = bench(*soup, "--steps", "2,1", env=env)
    line = json.loads((writing / "abl" / "log.jsonl").read_text().splitlines()[-1])
    assert line["soup_steps"] == [1, 2] and line["step"] == 2 and "smoke step 2 soup of steps 1,2" in printed
    made = json.loads((writing / "abl" / "smoke" / "dev" / "soup-1-2" / "comparison.json").read_text())
    assert "smoke@soup-1-2" in made["systems"]
    # the soup is the mean of the two step checkpoints' weights (recomputed here in float64), and says so
    ckpts = sorted((writing / "abl" / "smoke" / "train").rglob("*step=*.ckpt"))
    one, two, mean = (read_checkpoint(p) for p in (*ckpts, writing / "abl" / "smoke" / "soup" / "soup-1-2.ckpt"))
    assert [(s["step"], s["weight"]) for s in mean["obliq"]["interpolation"]["sources"]] == [(1, 0.5), (2, 0.5)]
    changed = [k for k in one["state_dict"] if not torch.equal(one["state_dict"][k], two["state_dict"][k])]
    assert changed
    for k in changed:
        want = (one["state_dict"][k].double() + two["state_dict"][k].double()) / 2
        torch.testing.assert_close(mean["state_dict"][k].double(), want, rtol=0, atol=1e-6)
    for steps, message in (("2,7", "no checkpoint at steps [7] (the run has [1, 2])"), ("2,2", "two or more")):
        with pytest.raises(AssertionError, match=re.escape(message)):
            bench(*soup, "--steps", steps, env=env)
    bench(
        "bench/distill_ablation.py",
        "plot",
        "--task",
        "writing-news",
        "--split",
        "dev",
        "--out",
        str(writing / "curve.png"),
        "--eval_tokens",
        "32",
        env=env,
    )
    assert (writing / "curve.png").stat().st_size > 0

    # distill_reference --reuse refuses a run trained on other pairs than the recipe's (here one row fewer), before
    # training anything
    other = writing / "work" / "rows" / "knn-other.jsonl"
    other.write_text("".join((writing / "work" / "rows" / "knn.jsonl").read_text().splitlines(True)[:-1]))
    recipe = writing / "recipe-other.yaml"
    recipe.write_text((writing / "recipe.yaml").read_text().replace("/rows/knn.jsonl", "/rows/knn-other.jsonl"))
    args = ["bench/distill_reference.py", "--task", "writing-news", "--recipe", str(recipe), "--reuse", "smoke"]
    done = subprocess.run(
        [sys.executable, *args, "--out", str(writing / "ref-other")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert done.returncode != 0 and "the ablation 'smoke' trained on" in done.stderr
    assert "knn-other.jsonl" in done.stderr and not (writing / "ref-other" / "st").exists()


@pytest.mark.heavy
def test_distill_reference_trains_both_students_on_the_same_pairs(writing):
    env = {"OBLIQ_DATA": str(writing / "data"), "OBLIQ_ABL_ROOT": str(writing / "abl-ref")}
    out = bench(
        "bench/distill_reference.py",
        "--task",
        "writing-news",
        "--split",
        "test",
        "--recipe",
        str(writing / "recipe.yaml"),
        "--budget",
        "cpu",
        "--out",
        str(writing / "ref"),
        "--eval_tokens",
        "32",
        env=env,
    )
    result = json.loads((writing / "ref" / "results.json").read_text())
    assert result["train"]["obliq student"]["steps"] == 2
    assert {"obliq student", "sentence-transformers trainer", "student ⊕ teacher (RRF)"} <= set(
        result["report"]["systems"]
    )
    assert "obliq − sentence-transformers" in out and "student ⊕ teacher (RRF) − teacher" in out

    # the fused run against Σ 1 / (60 + rank) recomputed here from the two run files (ranked lines, in order)
    def ranked(path):
        runs = {}
        for line in path.read_text().splitlines():
            qid, _, doc, *_ = line.split()
            runs.setdefault(qid, []).append(doc)
        return runs

    student = ranked(next((writing / "ref" / "eval" / "obliq").glob("*/run.trec")))
    teacher = ranked(next((writing / "abl-ref" / "writing-news" / "test-32-tokens" / "teacher").glob("*/run.trec")))
    fused = ranked(writing / "ref" / "fused.trec")
    for qid, docs in fused.items():
        score = {d: sum(1 / (60 + r.index(d) + 1) for r in (student[qid], teacher[qid]) if d in r) for d in docs}
        assert [score[d] for d in docs] == sorted(score.values(), reverse=True)
        assert set(docs) == set(student[qid]) | set(teacher[qid])


def test_eval_baselines_and_negatives_throughput(tasks_dir, tmp_path):
    small = task_slice(tasks_dir, "math-theoremqa", tmp_path / "tasks" / "math-theoremqa", 6, 20)
    out = bench(
        "bench/eval_baselines.py", "--output", str(tmp_path / "baselines"), "--tasks", str(small), "--models", "bm25"
    )
    assert "math-theoremqa" in out and (tmp_path / "baselines" / "bm25" / "results.md").is_file()
    out = bench("bench/negatives_throughput.py", "--data", str(tmp_path / "tasks"), "--tasks", "math-theoremqa")
    assert "rows/s" in out


@pytest.mark.heavy
def test_data_throughput(tmp_path):
    out = json.loads(
        bench(
            "bench/data_throughput.py",
            "--rows",
            "300",
            "--small",
            "40",
            "--batches",
            "3",
            "--num-workers",
            "0",
            "--workdir",
            str(tmp_path),
        )
    )
    assert len(out["runs"]) == 4


@pytest.mark.heavy
def test_gradcache_bench(tmp_path):
    out = bench(
        "bench/gradcache.py",
        "--modes",
        "fixed",
        "--batches",
        "4",
        "--chunk",
        "2",
        "--steps",
        "1",
        "--fixed-length",
        "32",
        "--out",
        str(tmp_path / "g.json"),
    )
    assert {r["method"] for r in json.loads((tmp_path / "g.json").read_text())} >= {"plain", "obliq", "st"}
    assert "| 4 |" in out


@pytest.mark.heavy
def test_kill_resume_bench(tmp_path):
    # 6 steps of 4 rows over 8 rows: three epochs, so the resume crosses an epoch boundary as in the bench's 40 steps
    out = bench("bench/kill_resume.py", "--kills", "1", "--steps", "6", "--rows", "8", "--out", str(tmp_path / "kr"))
    assert "bit-identical to the uninterrupted run: True" in out


def test_false_negatives_bench(tasks_dir, tmp_path):
    task_slice(tasks_dir, "writing-news", tmp_path / "tasks" / "writing-news", 8, 10)
    (tmp_path / "tasks" / "writing-news" / "attributes.tsv").write_text(
        (tasks_dir / "writing-news" / "attributes.tsv").read_text()
    )
    out = bench(
        "bench/false_negatives.py",
        "--data",
        str(tmp_path / "tasks"),
        "--tasks",
        "writing-news",
        "--max_length",
        "32",
        "--out",
        str(tmp_path / "fn.json"),
    )
    [result] = json.loads((tmp_path / "fn.json").read_text())
    assert result["rows"] == 4 and "dense + 95% + attribute veto" in out
    assert result["methods"]["dense + 95% + attribute veto"]["false_negatives"] == 0  # author = relevance here


@pytest.mark.heavy
def test_vector_search_bench(tasks_dir, tmp_path):
    # the real vectors: MiniLM reads 40 documents and the 10 queries used (not all 179 of math-theoremqa)
    real = task_slice(tasks_dir, "math-theoremqa", tmp_path / "real" / "math-theoremqa", 10, 40)
    out = bench(
        "bench/vector_search.py",
        "--n", "1500",
        "--dims", "512",
        "--queries", "10",
        "--k", "20",
        "--single", "2",
        "--real_docs", "40",
        "--tasks", str(real),
        "--configs", "flat", "hnsw", "int8:rescore=4", "ivf-pq:nprobe=8,rescore=10", "binary:rescore=10",
        "--evaluate", "int8",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text())
    for dim in ("512",):  # lifted from MiniLM's 384: the lifting and every index type in one dimension
        rows = {r["config"]: r for r in results["dims"][dim]["indexes"]}
        assert not [r for r in rows.values() if "error" in r], rows
        assert rows["flat"]["Recall@10"] == 1.0 and 0 <= rows["binary:rescore=10"]["Recall@10"] <= 1
        assert rows["hnsw"]["index_mb"] > 0 and rows["int8:rescore=4"]["factory"] == "SQ8"
        [ev] = results["dims"][dim]["evaluate"]
        assert ev["corpus_cache"] == "hit" and ev["factory"] == "SQ8" and ev["peak_rss_gb"] > 0
    assert "| hnsw | HNSW32,Flat |" in out and "1,500 vectors (40 real MiniLM document vectors, lifted" in out


@pytest.mark.heavy
def test_encode_shards_bench(tasks_dir, tmp_path):
    out = bench(
        "bench/encode_shards.py",
        "--task", str(tasks_dir / "writing-news"),
        "--docs", "40",
        "--length", "32",
        "--batch_size", "4",
        "--block_size", "2",
        "--kill_delay", "0",
        "--encoder", "obliq",  # MiniLM through obliq's BiEncoder: 7 processes, none imports sentence-transformers
        "--out", str(tmp_path / "es"),
    )  # fmt: skip
    assert "| ≤ 1e-6 |" in out and "statuses ['done', 'encoded']" in out and "| resumed |" in out


@pytest.mark.heavy
def test_matryoshka_bench(writing, tmp_path):
    out = bench(
        "bench/matryoshka.py",
        "--recipe", str(writing / "recipe.yaml"),
        "--tasks", str(writing / "data" / "tasks" / "writing-news"),
        "--tokens", "32",
        "--out", str(tmp_path / "m"),
    )  # fmt: skip
    result = json.loads((tmp_path / "m" / "results.json").read_text())
    assert result["dims"] == [384, 192, 96, 48]
    assert {"MiniLM (base) @48", "plain @384", "Matryoshka @96"} <= set(result["report"]["systems"])
    labels = {c["label"] for c in result["report"]["comparisons"]}
    assert "Matryoshka − plain @384" in labels and "Matryoshka @96 − @384" in labels
    assert "keeps ≥ 97 % of its full-dimension NDCG@10 on" in out
    card = (tmp_path / "m" / "matryoshka" / "export" / "adapter" / "README.md").read_text()
    assert "matryoshka dims: [384, 192, 96, 48]" in card and "Kusupati et al. 2022 (Matryoshka)" in card
