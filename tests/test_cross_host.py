"""Claims and run folders on a file system that several machines share (issue 49 §2): a pid means nothing on
another host, so a claim or a run of another machine that did not finish is never taken over; a requeued
scheduler job's own earlier attempt and a run that wrote its final checkpoint are known to have ended.

The second machine is real as far as obliq can see: a process in a UTS namespace of its own (``unshare -u``)
with another host name, on the same files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HOLDER = """import sys, time
from pathlib import Path
from obliq.claims import claim_outputs
out, ready, release = map(Path, sys.argv[1:4])
with claim_outputs({"out": out}, command="evaluate", folders=["out"], overwrite=True):
    ready.write_text("held")
    while not release.exists():
        time.sleep(0.05)
"""


def _other_host(*command: str) -> list[str]:
    return ["unshare", "-u", "sh", "-c", 'hostname otherhost && exec "$@"', "sh", *command]


@pytest.fixture(scope="module")
def unshare():
    if shutil.which("unshare") is None or subprocess.run(_other_host("true"), capture_output=True).returncode != 0:
        pytest.skip("needs unshare -u (a UTS namespace: root or user namespaces)")


def _hold(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    out, ready, release = tmp_path / "out", tmp_path / "ready", tmp_path / "release"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen(_other_host(sys.executable, str(script), str(out), str(ready), str(release)))
    deadline = time.time() + 120
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the other host's claim was not taken"
    return proc, out, release


def test_a_claim_held_on_another_host_is_refused_until_it_finishes(unshare, tmp_path):
    """Two commands into one folder from two hosts: the second refuses while the first holds its claim (before,
    both ran and one result was lost); once the first finishes, --overwrite replaces its output."""
    from obliq.claims import claim_outputs

    holder, out, release = _hold(tmp_path)
    try:
        record = json.loads((tmp_path / ".out.obliq").read_text())
        assert record["host"] == "otherhost" and record["pid"] == holder.pid
        with pytest.raises(ValueError, match="on host otherhost claimed it and has not finished.*cannot tell"):
            with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
                pass
    finally:
        release.write_text("go")
        holder.wait(60)
    assert json.loads((tmp_path / ".out.obliq").read_text())["complete"] is True
    with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
        pass


def test_a_claim_left_by_a_killed_process_of_another_host_is_refused_naming_its_record(unshare, tmp_path):
    from obliq.claims import claim_outputs

    holder, out, _ = _hold(tmp_path)
    holder.kill()
    holder.wait(60)
    record = tmp_path / ".out.obliq"
    with pytest.raises(ValueError, match=f"delete {record}"):
        with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
            pass
    record.unlink()  # what the message says to do once the user knows it has ended
    with claim_outputs({"out": out}, command="evaluate", overwrite=True, folders=["out"]):
        pass


def _run(base: Path, n: int, record: dict, final: bool = False) -> Path:
    folder = base / f"version_{n}"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "owner.json").write_text(json.dumps(record))
    time.sleep(0.01)
    (folder / "checkpoints" / "last.ckpt").write_text("x")
    if final:
        (folder / "final.ckpt").write_text("x")
    return folder


def test_last_never_resumes_an_unfinished_run_of_another_host(tmp_path, monkeypatch):
    """--ckpt_path last from a second host while the run trains wrote into the same version: refused, naming
    the host and the way out (its checkpoint passed explicitly resumes in a new version)."""
    from obliq.runs import run_folder

    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TORCHELASTIC_RUN_ID", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    base = tmp_path / "runs"
    other = {"owner": None, "host": "otherhost", "pid": os.getpid(), "process_start": "1", "launch": ""}
    v0 = _run(base, 0, other)
    with pytest.raises(ValueError, match="process .* on host otherhost, which did not finish.*cannot tell"):
        run_folder(base, "last")
    assert not (base / "version_1").exists()  # nothing claimed
    folder, ckpt = run_folder(base, str(v0 / "checkpoints" / "last.ckpt"))  # the way out the message names
    assert folder == base / "version_1" and ckpt == str(v0 / "checkpoints" / "last.ckpt")
    # a run of another host that wrote its final checkpoint has ended: resumed in place
    done = _run(base, 2, other, final=True)
    assert run_folder(base, "last")[0] == done


def test_a_requeued_scheduler_job_resumes_its_own_run_from_another_host(tmp_path, monkeypatch):
    """A SLURM job requeued onto another node resumes its run, even when its first attempt claimed the same
    resume point and died before a new checkpoint (the scheduler ended that attempt); while the claim is of
    this very launch on another node, which cannot be told ended, the second resume is refused."""
    from obliq.runs import run_folder

    base = tmp_path / "runs"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    v0 = _run(base, 0, {"owner": "slurm:77", "host": "node-a", "pid": 12, "process_start": "1"})
    last = str(v0 / "checkpoints" / "last.ckpt")
    assert run_folder(base, "last") == (v0, last)  # the first attempt claims the resume point …
    [lock] = [p for p in v0.iterdir() if p.name.startswith(".resume-")]
    record = json.loads((lock / "owner.json").read_text())
    (lock / "owner.json").write_text(json.dumps({**record, "host": "node-a"}))  # … on node a
    with pytest.raises(ValueError, match="on host node-a is resuming it from last.ckpt already"):
        run_folder(base, "last")  # the same launch, seen from another node
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeue, on this node
    assert run_folder(base, "last") == (v0, last)
    assert json.loads((lock / "owner.json").read_text())["host"] != "node-a"


def test_a_checkpoint_folder_outside_the_run_folder_is_never_written_over(tiny_llama_dir, tasks_dir, tmp_path):
    """A recipe whose ModelCheckpoint dirpath lies outside ${run_dir}: the second run would replace the first
    run's checkpoints (same names); refused before training, naming the folder; a resume from it continues."""
    from support import fit_here, task_rows, write_config, write_rows

    rows = write_rows(tmp_path / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=8))
    config = write_config(tmp_path / "recipe", rows, tiny_llama_dir, max_steps=1)  # dirpath: recipe/ckpt
    fit_here(config)
    first = (tmp_path / "recipe" / "ckpt" / "epoch=0-step=1.ckpt").read_bytes()
    with pytest.raises(ValueError, match=r"recipe/ckpt: this checkpoint folder .* lies outside the run's folder"):
        fit_here(config)
    assert (tmp_path / "recipe" / "ckpt" / "epoch=0-step=1.ckpt").read_bytes() == first
    fit_here(config, "--ckpt_path", str(tmp_path / "recipe" / "ckpt" / "last.ckpt"), "--trainer.max_steps=2")
    assert (tmp_path / "recipe" / "ckpt" / "epoch=0-step=2.ckpt").is_file()
