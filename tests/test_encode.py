"""``obliq encode`` / ``obliq search`` as stages (issue 26), with MiniLM on a slice of a real task:
two processes write the embeddings one process writes (to 1e-6), a SIGKILLed shard resumes without
redoing the other, ``evaluate`` and ``obliq search`` read the store, and an incomplete store is named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from support import task_slice

from obliq.cli import main as obliq_main
from obliq.search.retrieval import make_retriever
from obliq.search.settings import RetrievalSettings
from obliq.search.store import IncompleteStore, Store
from obliq.tasks import load_task

pytestmark = pytest.mark.slow
LENGTH = 64  # passage tokens: short, to keep the CPU test quick


def _encode_cmd(task, cache, *extra):
    return [
        sys.executable,
        "-m",
        "obliq.cli",
        "encode",
        "--model",
        "minilm",
        "--tasks",
        str(task),
        "--retrieval.cache_dir",
        str(cache),
        "--retrieval.passage_max_length",
        str(LENGTH),
        "--retrieval.batch_size",
        "4",
        *extra,
    ]


def _run_here(capsys, cmd):
    """The command in this process (its arguments after ``-m obliq.cli``), its printed report: no start-up to pay."""
    capsys.readouterr()
    obliq_main(cmd[3:])
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])


def _settings(folder, **kw):
    return RetrievalSettings(cache_dir=folder, passage_max_length=LENGTH, top_k=50, **kw)


@pytest.fixture(scope="module")
def one_process(tasks_dir, tmp_path_factory):
    """A slice of writing-news (4 queries, their relevant documents and 30 others) and its store written by one
    process: this one (the command's arguments after ``-m obliq.cli``; no start-up to pay)."""
    root = tmp_path_factory.mktemp("encode")
    task_dir = task_slice(tasks_dir, "writing-news", root / "writing-news", 4, 30)
    obliq_main(_encode_cmd(task_dir, root / "one")[3:])
    task = load_task(task_dir)
    vectors = Store.of("minilm", _settings(root / "one"), task).read_vectors(task.doc_ids)
    return root, task_dir, task, vectors


def test_two_processes_write_the_embeddings_of_one(one_process, capsys):
    """Shard 0 in another process and, at the same time, shard 1 in this one (one start-up less to pay)."""
    root, task_dir, task, reference = one_process
    other = subprocess.Popen(
        _encode_cmd(task_dir, root / "two", "--shard.index", "0", "--shard.count", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        here = _run_here(capsys, _encode_cmd(task_dir, root / "two", "--shard.index", "1", "--shard.count", "2"))
    finally:
        _, err = other.communicate(timeout=600)
    assert other.returncode == 0, err.decode()[-3000:]
    assert here["tasks"][task.name]["status"] == "encoded"
    settings = _settings(root / "two")
    store = Store.of("minilm", settings, task).folder
    assert sorted(f.name for f in store.glob("shard-*.npy")) == ["shard-0-of-2.npy", "shard-1-of-2.npy"]
    two = Store.of("minilm", settings, task).read_vectors(task.doc_ids)
    assert two.shape == reference.shape == (len(task.doc_ids), 384)
    assert np.abs(two - reference).max() <= 1e-6


def test_a_killed_shard_resumes_without_redoing_the_other(one_process, capsys):
    """The victim is a real process, SIGKILLed; the runs around it go in this process."""
    root, task_dir, task, reference = one_process
    cache = root / "killed"
    settings = _settings(cache)
    store = Store.of("minilm", settings, task).folder
    _run_here(capsys, _encode_cmd(task_dir, cache, "--shard.index", "0", "--shard.count", "2"))
    first = (store / "shard-0-of-2.npy").stat()
    victim = subprocess.Popen(
        _encode_cmd(task_dir, cache, "--shard.index", "1", "--shard.count", "2", "--block_size", "2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.time() + 300
    while not list(store.glob(".shard-1-of-2.npy.*.tmp")) and victim.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the shard finished before it could be killed"
    assert list(store.glob(".shard-1-of-2.npy.*.tmp")) and not (store / "shard-1-of-2.json").exists()

    with pytest.raises(IncompleteStore, match="1 of 2 shards are not complete") as err:  # evaluate refuses it
        make_retriever("minilm", settings)(task)
    assert err.value.missing == [1]

    reports = [
        _run_here(capsys, _encode_cmd(task_dir, cache, "--shard.index", str(i), "--shard.count", "2")) for i in range(2)
    ]
    assert [r["tasks"][task.name]["status"] for r in reports] == ["done", "encoded"]
    assert reports[1]["tasks"][task.name]["complete"] is True
    again = (store / "shard-0-of-2.npy").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # shard 0 was not rewritten
    assert not list(store.glob(".shard-*.tmp"))
    resumed = Store.of("minilm", settings, task).read_vectors(task.doc_ids)
    assert np.abs(resumed - reference).max() <= 1e-6


def test_evaluate_and_search_read_the_store(one_process, tmp_path):
    root, task_dir, task, _ = one_process
    settings = _settings(root / "one")
    hit = make_retriever("minilm", settings)(task)
    fresh = make_retriever("minilm", _settings(root / "one", cache=False))(task)
    assert hit.corpus_cache == "hit" and fresh.corpus_cache == "off"
    for q in task.query_ids:
        assert list(hit.run[q]) == list(fresh.run[q]) and list(hit.run[q].values()) == pytest.approx(
            list(fresh.run[q].values()), abs=1e-5
        )
    out = tmp_path / "search"
    obliq_main(
        [
            "search",
            "--model",
            "minilm",
            "--tasks",
            str(task_dir),
            "--output",
            str(out),
            "--retrieval.cache_dir",
            str(root / "one"),
            "--retrieval.passage_max_length",
            str(LENGTH),
            "--retrieval.top_k",
            "50",
            "--retrieval.index",
            "int8",
            "--retrieval.rescore",
            "4",
            "--retrieval.dim",
            "192",
        ]
    )
    record = json.loads((out / task.name / "search.json").read_text())
    index = record["index"]
    assert record["corpus_cache"] == "hit" and index["factory"] == "SQ8" and index["dim"] == 192
    assert set(index["recall_vs_exact"]) == {"Recall@10", "Recall@50", "n_queries"}
    assert index["recall_vs_exact"]["n_queries"] == len(task.query_ids) and index["recall_vs_exact"]["Recall@10"] > 0.9
    assert (out / task.name / "run.trec").is_file() and list(
        Store.of("minilm", settings, task).folder.glob("index-SQ8-d192-*")
    )
