"""Generation and mining across processes (issue 17): two shards, each resumable on its own, merge into
the rows of one run; the merge checks every item was covered exactly once."""

from __future__ import annotations

import json

import pytest
from support import task_rows, write_rows

from obliq.shards import Shard, check_cover


def test_a_shard_comes_from_its_arguments_or_from_a_slurm_array(monkeypatch, tmp_path):
    assert Shard().resolved() == Shard(0, 1) and Shard(1, 3).select(list(range(8))) == [1, 4, 7]
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "10")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    assert Shard().resolved() == Shard(2, 4)
    assert Shard(2, 4).path(tmp_path / "rows.jsonl") == tmp_path / "rows.shard-2-of-4.jsonl"
    with pytest.raises(ValueError, match="need 0 <= index < count"):
        Shard(4, 4).resolved()
    with pytest.raises(ValueError, match="in shards 0 and 1"):
        check_cover(["a", "b"], {0: ["a"], 1: ["a", "b"]}, 2, "row")
    with pytest.raises(ValueError, match="1 missing"):
        check_cover(["a", "b", "c"], {0: ["a"], 1: ["b"]}, 2, "row")


def test_a_shard_comes_from_torchrun_ranks_when_there_is_no_slurm_array(monkeypatch):
    for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert Shard().resolved() == Shard(1, 2) and Shard(0, 3).resolved() == Shard(0, 3)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    assert Shard().resolved() == Shard(0, 4)  # a SLURM array wins


def test_covering_a_large_list_is_linear():
    """500,000 ids (a WildChat-size corpus) are checked in seconds (a set built per item made it quadratic: hours)."""
    import time

    ids = [f"d{i}" for i in range(500_000)]
    t0 = time.perf_counter()
    check_cover(ids, {0: ids[0::2], 1: ids[1::2]}, 2, "document")
    assert time.perf_counter() - t0 < 5


def test_two_generation_shards_merge_into_one_runs_rows(tasks_dir, tmp_path, monkeypatch):
    """The generator is a test double answering by document (the per-document seeds make a real model
    do the same with vLLM); the 2-shard merge is the single run's file, byte for byte."""
    from test_synth_generate import SPEC, ScriptedBackend

    from obliq.commands.synth import generate, merge
    from obliq.llm.backends import BackendConfig
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "math-theoremqa")
    monkeypatch.setattr(BackendConfig, "build", lambda self: ScriptedBackend(task))
    common = dict(task=tasks_dir / "math-theoremqa", spec=SPEC, n_docs=7, seed=13)
    generate(out=tmp_path / "one.jsonl", **common)
    for index in (0, 1):
        generate(out=tmp_path / "sharded.jsonl", shard=Shard(index, 2), **common)
    shards = [tmp_path / f"sharded.shard-{i}-of-2.jsonl" for i in (0, 1)]
    assert [len(s.read_text().splitlines()) for s in shards] == [4, 3]
    report = merge(shards, tmp_path / "merged.jsonl")
    assert report == {"out": str(tmp_path / "merged.jsonl"), "rows": 7, "documents": 7, "shards": 2}
    assert (tmp_path / "merged.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    with pytest.raises(ValueError, match=r"shards \[0\] given, a run of 2 shards"):
        merge(shards[:1], tmp_path / "half.jsonl")
    generate(out=tmp_path / "other.jsonl", shard=Shard(1, 2), **dict(common, seed=14))
    with pytest.raises(ValueError, match="the shards are not one run: seed is 13"):
        merge([shards[0], tmp_path / "other.shard-1-of-2.jsonl"], tmp_path / "mixed.jsonl")


def test_two_mining_shards_merge_into_one_runs_rows(tasks_dir, tmp_path):
    """Rows sharing a query exclude each other's positives across shards too."""
    from obliq.commands.negatives import merge, mine

    rows = task_rows(tasks_dir, "math-theoremqa", limit=30)
    rows += [
        dict(r, id=r["id"] + "-again", positive=rows[(n + 1) % len(rows)]["positive"]) for n, r in enumerate(rows[:6])
    ]  # the same queries again, with other positives
    source = write_rows(tmp_path / "rows.jsonl", rows)
    task = tasks_dir / "math-theoremqa"
    mine(source, task, tmp_path / "one.jsonl")
    for index in range(3):
        mine(source, task, tmp_path / "mined.jsonl", shard=Shard(index, 3))
    shards = [tmp_path / f"mined.shard-{i}-of-3.jsonl" for i in range(3)]
    merge(source, shards, tmp_path / "merged.jsonl")
    one = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    merged = [json.loads(line) for line in (tmp_path / "merged.jsonl").read_text().splitlines()]
    assert merged == one
    with pytest.raises(ValueError, match="1 missing"):
        (tmp_path / "short.jsonl").write_text("\n".join(shards[2].read_text().splitlines()[1:]) + "\n")
        (tmp_path / "short.jsonl.report.json").write_text(
            shards[2].with_name(shards[2].name + ".report.json").read_text()
        )
        merge(source, [*shards[:2], tmp_path / "short.jsonl"], tmp_path / "bad.jsonl")
    cut = shards[2].read_text()
    (tmp_path / "cut.jsonl").write_text(cut[: len(cut) // 2])  # a shard killed mid-line
    (tmp_path / "cut.jsonl.report.json").write_text(shards[2].with_name(shards[2].name + ".report.json").read_text())
    with pytest.raises(ValueError, match=r"cut\.jsonl:\d+"):  # the file and line named
        merge(source, [*shards[:2], tmp_path / "cut.jsonl"], tmp_path / "bad.jsonl")
    reports = [s.with_name(s.name + ".report.json") for s in shards]  # issue 32 §3: the reports given as shards
    with pytest.raises(ValueError, match="a shard's report; give the shard files themselves"):
        merge(source, reports, tmp_path / "bad.jsonl")
