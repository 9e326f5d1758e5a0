"""Issue 30 §2: every command's outputs are claimed as one transaction (obliq.claims.claim_outputs), and
every atomic write goes through one helper (obliq.files.publish)."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from obliq.claims import FOLDER_MARK, claim_outputs, output_owner
from obliq.files import publish


def _records(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".obliq"))


def test_one_refused_output_claims_none_and_writes_nothing(tmp_path):
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    outputs = {"a": tmp_path / "a", "b": tmp_path / "b.json", "taken": taken}
    with pytest.raises(FileExistsError, match="taken.json already holds"):
        with claim_outputs(outputs, command="evaluate", folders=["a"]):
            raise AssertionError("the block never runs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.json"] and taken.read_text() == "{}"
    with pytest.raises(ValueError, match="an output cannot be a pattern"):  # refused after a valid one
        with claim_outputs({"a": tmp_path / "a", "glob": tmp_path / "*.json"}, command="evaluate", folders=["a"]):
            pass
    with pytest.raises(ValueError, match="are the same file"):
        with claim_outputs({"a": tmp_path / "x.json", "b": tmp_path / "x.json"}, command="evaluate"):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.json"]


def test_a_claim_refused_after_others_were_taken_undoes_them(tmp_path):
    """The claims are taken in order: one refused (another running process holds it) withdraws the earlier
    ones, and the record the first one took over is put back."""
    import subprocess
    import sys
    import time

    from obliq.process import process_start

    first = tmp_path / "first.json"
    (tmp_path / ".first.json.obliq").write_text(json.dumps({"command": "distill pairs", "complete": True}) + "\n")
    first.write_text("old rows\n")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        held = {"command": "distill pairs", "host": os.uname().nodename, "pid": sleeper.pid}
        (tmp_path / ".second.json.obliq").write_text(json.dumps({**held, "process_start": process_start(sleeper.pid)}))
        before = {p.name: p.read_text() for p in tmp_path.iterdir()}
        with pytest.raises(ValueError, match=f"in process {sleeper.pid} on host \\S+ is writing it now"):
            with claim_outputs(
                {"first": first, "second": tmp_path / "second.json"}, command="distill pairs", overwrite=True
            ):
                pass
        assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_exception_in_the_block_records_nothing(tmp_path):
    out, rows = tmp_path / "out", tmp_path / "rows.jsonl"
    with pytest.raises(RuntimeError, match="midway"):
        with claim_outputs({"out": out, "rows": rows}, command="evaluate", folders=["out"]) as paths:
            assert paths == {"out": out, "rows": rows} and (out / FOLDER_MARK).is_file()
            assert json.loads((tmp_path / ".out.obliq").read_text())["pid"] == os.getpid()
            (out / "summary.json").write_text("{}")
            rows.write_text("a row\n")
            raise RuntimeError("midway")
    assert _records(tmp_path) == [] and output_owner(out) is None and output_owner(rows) is None
    assert list(out.iterdir()) == [] and not rows.exists()  # a folder the claim made stays, empty
    # a rerun needs no --overwrite, and a clean exit records finished outputs
    with claim_outputs({"out": out, "rows": rows}, command="evaluate", folders=["out"]):
        (out / "summary.json").write_text("{}")
        rows.write_text("a row\n")
    assert json.loads((tmp_path / ".out.obliq").read_text())["complete"] is True
    assert output_owner(out) == "evaluate" and output_owner(rows) == "evaluate"
    # an --overwrite that fails leaves the earlier records as they were, and the folder it emptied empty
    earlier = (tmp_path / ".out.obliq").read_text()
    with pytest.raises(RuntimeError):
        with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
            assert [p.name for p in out.iterdir()] == [FOLDER_MARK]
            (out / "partial.json").write_text("{}")
            raise RuntimeError("midway")
    assert (tmp_path / ".out.obliq").read_text() == earlier and [p.name for p in out.iterdir()] == [FOLDER_MARK]


def _hold(path, held, release, results):
    try:
        with claim_outputs({"out": path}, command="evaluate", folders=["out"]):
            held.set()
            release.wait(60)
        results.put("ok")
    except ValueError as err:
        results.put(str(err))


def test_a_second_process_is_refused_while_the_first_holds_the_claim(tmp_path):
    ctx = multiprocessing.get_context("fork")
    held, release, results = ctx.Event(), ctx.Event(), ctx.Queue()
    out = tmp_path / "out"
    first = ctx.Process(target=_hold, args=(out, held, release, results))
    first.start()
    try:
        assert held.wait(60)
        with pytest.raises(ValueError, match=f"'evaluate' in process {first.pid} on host \\S+ is writing it now"):
            with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
                pass
    finally:
        release.set()
        first.join(60)
    assert results.get(timeout=10) == "ok"
    # finished: its record no longer excludes anyone, and --overwrite replaces the output
    with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
        pass
    assert json.loads((tmp_path / ".out.obliq").read_text())["pid"] == os.getpid()


def test_publish_renames_on_success_and_leaves_nothing_on_failure(tmp_path):
    with publish(tmp_path / "a.txt") as tmp:
        tmp.write_text("new")
        assert not (tmp_path / "a.txt").exists()
    assert (tmp_path / "a.txt").read_text() == "new" and (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    with pytest.raises(RuntimeError):
        with publish(tmp_path / "a.txt") as tmp:
            tmp.write_text("half")
            raise RuntimeError
    with pytest.raises(RuntimeError):
        with publish(tmp_path / "d", folder=True) as tmp:
            (tmp / "x").write_text("half")
            raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"] and (tmp_path / "a.txt").read_text() == "new"
    with publish(tmp_path / "d", folder=True) as tmp:
        (tmp / "x").write_text("one")
    with pytest.raises(FileExistsError, match="a folder is there already"):
        with publish(tmp_path / "d", folder=True) as tmp:  # a folder is never replaced
            (tmp / "x").write_text("two")
    assert (tmp_path / "d" / "x").read_text() == "one" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "d"]


def test_a_pid_is_read_only_in_the_namespace_and_boot_that_gave_it(tmp_path, monkeypatch):
    """C61: a record is judged by its pid only when it was written on this boot of this machine
    (/proc/sys/kernel/random/boot_id) in this PID namespace (/proc/self/ns/pid) under this host name; any other
    unfinished record, and one written before obliq recorded boot and namespace, cannot be told ended and is
    refused, "cannot tell", even with --overwrite, though its pid has ended here. The controls: a record of this
    namespace whose process ended is taken over; a record of an earlier launch of this very scheduler job is."""
    import subprocess
    import sys

    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    ended = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = open(f"/proc/{ended.pid}/stat").read().rsplit(")", 1)[1].split()[19]  # its start, as /proc gives it
    ended.kill()
    ended.wait()
    here = {
        "command": "evaluate",
        "host": os.uname().nodename,
        "boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(),
        "pid_namespace": os.readlink("/proc/self/ns/pid"),
        "pid": ended.pid,
        "process_start": start,
        "job": None,
        "launch": "",
    }
    legacy = {k: v for k, v in here.items() if k not in ("boot_id", "pid_namespace")}
    cases = [  # (the record, whether a claim with --overwrite takes it over)
        ({**here, "boot_id": "another boot or another machine of this name"}, False),
        ({**here, "pid_namespace": "pid:[4026532999]"}, False),  # a container's namespace
        ({**here, "host": "another-host"}, False),
        (legacy, False),  # written before boot and namespace were recorded: this name alone tells nothing
        ({**here, "pid_namespace": None, "boot_id": None}, False),  # a process that could not read them
        (here, True),
        ({**legacy, "host": "node-7", "job": "slurm:41", "launch": "SLURM_JOB_ID=41;SLURM_RESTART_COUNT=0"}, True),
    ]
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # this process: the requeue of job 41 (the last case)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    for i, (record, taken_over) in enumerate(cases):
        out = tmp_path / f"out{i}"
        out.mkdir()
        (out / FOLDER_MARK).write_text("evaluate\n")
        (out / "part-1.txt").write_text("written by the holder")
        (tmp_path / f".out{i}.obliq").write_text(json.dumps(record))
        if taken_over:
            with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
                pass
            assert [p.name for p in out.iterdir()] == [FOLDER_MARK], record
        else:
            with pytest.raises(ValueError, match=f"process {ended.pid} on host .* cannot tell") as refused:
                with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
                    pass
            assert f"delete {tmp_path / f'.out{i}.obliq'}" in str(refused.value), record
            assert sorted(p.name for p in out.iterdir()) == [FOLDER_MARK, "part-1.txt"], record
