"""Output claims between real processes (issue 53 §1, C61, C62, the kept-back kind "one output reached by two
names"): a holder in another PID namespace of this host name (``unshare -r -p -f --mount-proc``), two torchrun
launches and the ranks of one, one folder reached by two names, two appending ``synth generate`` runs.

Every claimant here is a process of its own (:data:`CLAIMANT`, or the real ``obliq evaluate`` / ``obliq data
convert``), claiming as the commands do; the judge of "still running" is the operating system: the holder is
alive (it waits on a file) or killed."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CLAIMANT = r"""
import json, os, sys, time
from pathlib import Path

import obliq
from obliq.claims import claim_outputs

spec = json.loads(sys.argv[1])
control = Path(spec["control"])


def report(values):
    tmp = control / "report.json.tmp"
    tmp.write_text(json.dumps(values))
    os.replace(tmp, control / "report.json")


def wait(name):
    deadline = time.time() + 120
    while not (control / name).exists():
        if time.time() > deadline:
            sys.exit("the test never said " + name)
        time.sleep(0.02)


def write(paths, tag):
    if spec["kind"] == "evaluate":
        (paths["output"] / tag).write_text(tag)
    else:  # data convert writes its file; synth generate appends rows to its own
        with open(paths["out"], "a") as f:
            f.write(tag + "\n")


if spec.get("cwd"):
    os.chdir(spec["cwd"])
out, kind = spec["out"], spec["kind"]
if kind == "evaluate":  # as obliq/commands/evaluate.py claims --output
    claim = dict(outputs={"output": out}, command="evaluate", what="evaluation results", folders=["output"])
elif kind == "data convert":  # as obliq/data/convert.py claims --out
    claim = dict(outputs={"out": out}, command="data convert", what="rows")
else:  # as obliq/commands/synth.py claims generate's --out and the files beside it
    outputs = {"out": out, "rejects": out + ".rejects.jsonl", "report": out + ".report.json"}
    claim = dict(outputs=outputs, command="synth generate", what="synthetic rows", append=True)
try:
    overwrite = {} if kind == "synth generate" else {"overwrite": spec["overwrite"]}
    with claim_outputs(**claim, inputs=[], **overwrite) as paths:
        info = {"claimed": True, "pid": os.getpid(), "pid_namespace": os.readlink("/proc/self/ns/pid")}
        report({**info, "obliq": obliq.__file__, "at": time.time()})
        if spec["hold"]:
            wait("write")
        write(paths, spec["tag"])
        if spec["hold"]:
            (control / "written").write_text("")
            wait("release")
except (ValueError, FileExistsError, TimeoutError) as err:
    report({"refused": f"{type(err).__name__}: {err}"})
"""
"""One process claiming as a command does (``kind``: evaluate, data convert, synth generate), reporting into
``control/report.json``; a holder (``hold``) waits for ``control/write`` before writing its ``tag`` and for
``control/release`` before it finishes."""

LAUNCH_KEYS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID")
PID_NAMESPACE = ["unshare", "-r", "-p", "-f", "--mount-proc", "--kill-child"]
"""Another PID namespace (its own /proc), with this host name: a container started with ``--hostname``."""


def _env(launch: dict | None = None) -> dict:
    """This environment without any launcher's variables, plus ``launch``; this checkout's obliq first."""
    env = {
        k: v for k, v in os.environ.items() if k not in LAUNCH_KEYS and not k.startswith(("SLURM_", "TORCHELASTIC_"))
    }
    return {**env, **(launch or {}), "PYTHONPATH": str(REPO)}


class Claimant:
    """A process running :data:`CLAIMANT`."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        out,
        kind="evaluate",
        *,
        hold=False,
        overwrite=False,
        tag=None,
        launch=None,
        prefix=(),
        cwd=None,
    ):
        """``launch``: a launcher's variables; ``prefix``: what runs it (unshare); ``cwd``: where it runs."""
        self.control = tmp / f"control-{name}"
        self.control.mkdir()
        script = tmp / "claimant.py"
        script.write_text(CLAIMANT)
        spec = {"control": str(self.control), "out": str(out), "kind": kind, "hold": hold, "overwrite": overwrite}
        spec.update(tag=tag or f"{name}.txt", cwd=str(cwd) if cwd else None)
        argv = [*prefix, sys.executable, str(script), json.dumps(spec)]
        self.proc = subprocess.Popen(argv, env=_env(launch), stderr=subprocess.PIPE, text=True)

    def report(self, timeout: float = 60.0) -> dict:
        deadline = time.time() + timeout
        while not (self.control / "report.json").exists():
            if self.proc.poll() is not None and not (self.control / "report.json").exists():
                raise AssertionError(f"the claimant ended without a word: {self.proc.stderr.read()[-3000:]}")
            assert time.time() < deadline, "the claimant never reported"
            time.sleep(0.02)
        got = json.loads((self.control / "report.json").read_text())
        if got.get("claimed"):  # the claimant ran this checkout's obliq, not another one
            assert Path(got["obliq"]).resolve() == (REPO / "obliq" / "__init__.py").resolve()
        return got

    def reported(self) -> bool:
        return (self.control / "report.json").exists()

    def say(self, name: str, then: str | None = None) -> None:
        (self.control / name).write_text("")
        deadline = time.time() + 60
        while then and not (self.control / then).exists():
            assert self.proc.poll() is None and time.time() < deadline, "the holder did not do it"
            time.sleep(0.02)

    def finish(self) -> int:
        (self.control / "write").write_text("")
        (self.control / "release").write_text("")
        try:
            self.proc.wait(60)
        finally:
            self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # an unshare: its child is killed with it (--kill-child)
            self.proc.wait(60)


def _claim(tmp, name, out, kind="evaluate", **kw) -> dict:
    """One claim by a process of its own that writes its tag and finishes at once: its report."""
    claimant = Claimant(tmp, name, out, kind, **kw)
    try:
        got = claimant.report()
        assert claimant.proc.wait(60) == 0
        return got
    finally:
        claimant.kill()


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture(scope="module")
def pid_namespace_here():
    """``unshare -r -p -f --mount-proc`` works here (a user namespace, then a PID namespace)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare")
    probe = subprocess.run([*PID_NAMESPACE, "sh", "-c", "readlink /proc/self/ns/pid; echo $$"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -r -p -f --mount-proc refused here: {probe.stderr.decode().strip()}")
    inside, pid = probe.stdout.decode().split()
    assert inside != os.readlink("/proc/self/ns/pid") and pid == "1"


# --- C61: a holder in another PID namespace of this host name ------------------------------------


HOLDERS = {
    "pid 1 of another PID namespace": PID_NAMESPACE,  # pid 1 here is a live process: init
    "a child in another PID namespace": [*PID_NAMESPACE, "sh", "-c", '"$@"; exit $?', "sh"],  # pid 2 there
    "this PID namespace": [],  # the control: told by its pid
}


def test_a_holder_is_told_by_its_pid_only_in_its_own_pid_namespace(pid_namespace_here, tmp_path):
    """C61: the holder runs in its own PID namespace with this host name (as pid 1, a live process here too,
    or as the child of a shell there); it claimed the folder as evaluate does and wrote part-1.txt. Another
    process's --overwrite claim is refused, "cannot tell", while it runs, and after it was killed (a pid of
    another namespace tells nothing here); the folder keeps part-1.txt. A holder of this namespace is "writing
    it now" while it runs, and its claim is taken over once it was killed (its pid has ended here)."""
    here = os.readlink("/proc/self/ns/pid")
    for i, (where, prefix) in enumerate(HOLDERS.items()):
        out = tmp_path / f"out{i}"
        holder = Claimant(tmp_path, f"holder{i}", out, hold=True, tag="part-1.txt", prefix=prefix)
        try:
            held = holder.report()
            assert (held["pid_namespace"] == here) == (not prefix) and (held["pid"] == 1) == (i == 0), where
            holder.say("write", then="written")
            refused = _claim(tmp_path, f"second{i}", out, overwrite=True).get("refused", "")
            assert ("is writing it now" if not prefix else "cannot tell") in refused, (where, refused)
            assert f"process {held['pid']} on host {os.uname().nodename}" in refused, (where, refused)
            holder.kill()  # killed: only in this namespace can its pid tell so
            got = _claim(tmp_path, f"third{i}", out, overwrite=True)
            if prefix:
                assert "cannot tell" in got.get("refused", "") and "delete" in got["refused"], (where, got)
                assert _listing(out) == [".obliq-output", "part-1.txt"], where
            else:
                assert got.get("claimed") and _listing(out) == [".obliq-output", f"third{i}.txt"], (where, got)
        finally:
            holder.kill()


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "obliq.cli", *argv], env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("command", ["evaluate", "data convert"])
def test_the_commands_refuse_a_holder_in_another_pid_namespace(pid_namespace_here, tasks_dir, tmp_path, command):
    """§3's data loss through the commands themselves: the real ``obliq evaluate --overwrite true`` and ``obliq
    data convert --overwrite true`` into an output a holder in another PID namespace of this host name is
    writing exit with the refusal, and what the holder wrote stays."""
    from support import small_real_task

    if command == "evaluate":
        out = tmp_path / "out"
        task = small_real_task(tasks_dir, tmp_path / "slice", n_queries=5, n_distractors=10)
        argv = ["evaluate", "--model", "bm25", "--tasks", str(task), "--output", str(out), "--latency_queries", "0"]
    else:
        out = tmp_path / "rows.jsonl"
        source = tmp_path / "pairs.jsonl"
        source.write_text("".join(json.dumps({"anchor": f"q{i}", "positive": f"d{i}"}) + "\n" for i in range(3)))
        argv = ["data", "convert", "--input", str(source), "--out", str(out), "--task", "t"]
    holder = Claimant(tmp_path, "holder", out, command, hold=True, tag="part-1", prefix=PID_NAMESPACE)
    try:
        holder.report()
        holder.say("write", then="written")
        before = out.read_text() if out.is_file() else _listing(out)
        done = _cli(*argv, "--overwrite", "true")
        assert done.returncode != 0 and "cannot tell" in done.stderr, done.stderr[-3000:]
        assert (out.read_text() if out.is_file() else _listing(out)) == before
    finally:
        holder.kill()


# --- C62: two torchrun launches, and the ranks of one ---------------------------------------------


def _launch(rng: random.Random, rank: int, differ: tuple[str, ...] = (), like: dict | None = None) -> dict:
    """The variables torchrun (``--standalone``) or srun gives a rank: ``like``'s launch, with the ``differ``
    keys drawn anew (another launch)."""
    env = dict(like or {})
    if not env:
        env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(rng.randrange(20000, 40000))}
        env["TORCHELASTIC_RUN_ID"] = f"{rng.getrandbits(64):016x}"
    for key in differ:
        env[key] = str(int(env[key]) + 1) if key in ("MASTER_PORT", "SLURM_STEP_ID") else f"{rng.getrandbits(64):x}"
    return {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0"}


DIFFERENCES = [("TORCHELASTIC_RUN_ID",), ("MASTER_PORT",), ("TORCHELASTIC_RUN_ID", "MASTER_PORT")]


@pytest.mark.parametrize("differ", DIFFERENCES, ids="+".join)
def test_rank_zero_of_a_second_launch_is_refused_as_a_single_process_is(tmp_path, differ):
    """C62: launch A (WORLD_SIZE 2, rank 0) holds the folder; rank 0 of launch B (another run id, master port,
    or both) is refused (a) with --overwrite after A wrote part-1.txt (nothing emptied), (b) without it before A
    wrote (A's result alone in the end); so is B's rank 1, which waits for a rank 0 of its own launch."""
    rng = random.Random(f"C62 {differ}")
    a = _launch(rng, 0)
    out = tmp_path / "out"
    holder = Claimant(tmp_path, "A0", out, hold=True, tag="part-1.txt", launch=a)
    try:
        pid = holder.report()["pid"]
        refused = _claim(tmp_path, "B0-before", out, launch=_launch(rng, 0, differ, a))  # (b)
        assert f"process {pid} on host" in refused.get("refused", "") and "writing it now" in refused["refused"]
        holder.say("write", then="written")
        refused = _claim(tmp_path, "B0-after", out, overwrite=True, launch=_launch(rng, 0, differ, a))  # (a)
        assert "writing it now" in refused.get("refused", ""), refused
        assert _listing(out) == [".obliq-output", "part-1.txt"]
        assert holder.finish() == 0
    finally:
        holder.kill()
    assert _listing(out) == [".obliq-output", "part-1.txt"]
    record = json.loads((tmp_path / ".out.obliq").read_text())
    assert record["pid"] == pid and record["complete"] is True


def test_the_ranks_of_one_launch_share_its_claim_however_late_they_come(tmp_path):
    """Only the ranks of one launch share a claim. A rank 1 that comes before its rank 0 waits for rank 0's
    claim; one that comes after rank 0 wrote (issue 48's intermittent torchrun failure) or after rank 0 finished
    finds its own launch's results and neither refuses nor empties them (--overwrite or not); a rank 1 that
    finishes first does not end the claim: a second launch is still refused until rank 0 finishes."""
    rng = random.Random("C62 ranks")
    a = _launch(rng, 0)
    out = tmp_path / "out"
    early = Claimant(tmp_path, "A1-early", out, launch=_launch(rng, 1, like=a))
    time.sleep(1.0)
    assert not early.reported() and early.proc.poll() is None  # waiting for its rank 0
    holder = Claimant(tmp_path, "A0", out, hold=True, tag="part-1.txt", launch=a)
    try:
        claimed = holder.report()
        got = early.report()
        assert got.get("claimed") and got["at"] >= claimed["at"], got
        assert early.proc.wait(60) == 0
        holder.say("write", then="written")
        for overwrite in (False, True):
            late = _claim(tmp_path, f"A1-late-{overwrite}", out, overwrite=overwrite, launch=_launch(rng, 1, like=a))
            assert late.get("claimed"), late
        assert _listing(out) == [".obliq-output", "A1-early.txt", "A1-late-False.txt", "A1-late-True.txt", "part-1.txt"]
        refused = _claim(tmp_path, "B0", out, overwrite=True, launch=_launch(rng, 0, ("TORCHELASTIC_RUN_ID",), a))
        assert "writing it now" in refused.get("refused", ""), refused
        assert holder.finish() == 0
    finally:
        holder.kill()
    record = json.loads((tmp_path / ".out.obliq").read_text())
    assert record["pid"] == claimed["pid"] and record["complete"] is True
    finished = _claim(tmp_path, "A1-after-the-end", out, launch=_launch(rng, 1, like=a))
    assert finished.get("claimed") and "part-1.txt" in _listing(out), finished


# --- one output reached by two names ------------------------------------------------------------


def _names(root: Path) -> dict[str, tuple[str, Path | None]]:
    """Names of ``root/out`` (made or not): ``(the name, the folder it is read from)``."""
    (root / "sibling").mkdir(exist_ok=True)
    (root / "linked-parent").mkdir(exist_ok=True)
    (root / "link").symlink_to(root / "out", target_is_directory=True)
    (root / "linked-parent" / "up").symlink_to(root / "sibling", target_is_directory=True)
    return {
        "absolute": (str(root / "out"), None),
        "symlink": (str(root / "link"), None),
        "relative": ("out", root),
        "dot-dot": ("../out", root / "sibling"),
        "through a linked folder and ..": (str(root / "linked-parent" / "up" / ".." / "out"), None),
        "dot": (".", root / "out"),
        "trailing dot": ("out/.", root),
    }


@pytest.mark.parametrize("holder_name", ["absolute", "symlink", "relative", "dot-dot"])
def test_one_folder_reached_by_two_names_is_one_output(tmp_path, monkeypatch, holder_name):
    """The holder claims the folder by one name (a dangling symlink before the folder exists, too); a second
    process claiming it by any other name (a symlink, relative, through ``..``, ``.``) is refused while it runs
    (with --overwrite or not), and after it finished the folder has one record and one owner by every name."""
    root = tmp_path / "root"
    root.mkdir()
    names = _names(root)
    name, cwd = names[holder_name]
    holder = Claimant(tmp_path, "holder", name, hold=True, tag="part-1.txt", cwd=cwd)
    try:
        pid = holder.report()["pid"]
        holder.say("write", then="written")
        for i, (other, (given, where)) in enumerate(sorted(names.items())):
            if other == holder_name:
                continue
            for overwrite in (False, True):
                got = _claim(tmp_path, f"c{i}{overwrite}", given, overwrite=overwrite, cwd=where)
                assert f"process {pid} on host" in got.get("refused", ""), (other, got)
        assert _listing(root / "out") == [".obliq-output", "part-1.txt"]
        assert holder.finish() == 0
    finally:
        holder.kill()
    from obliq.claims import output_owner

    assert [p.name for p in root.iterdir() if p.name.endswith(".obliq")] == [".out.obliq"]
    for other, (given, where) in names.items():
        monkeypatch.chdir(where or tmp_path)
        assert output_owner(given) == "evaluate", other
    assert _claim(tmp_path, "last", "link", overwrite=True, cwd=root)["claimed"]  # replaced by another name
    assert _listing(root / "out") == [".obliq-output", "last.txt"] and (root / "link").is_symlink()


# --- an appending output: synth generate -----------------------------------------------------------


@pytest.mark.parametrize("existing", [None, "synth generate", "unrecorded"])
def test_two_synth_generate_runs_into_one_out_at_once_one_is_refused(tmp_path, existing):
    """§3: two ``synth generate`` runs into one --out at once both succeeded (an appending output skipped the
    live-claim check): every row twice. The second is refused while the first runs, whether the file is new,
    the command's own (a resume) or of unknown origin (appended to, never recorded as synth generate's)."""
    from obliq.claims import output_owner

    out = tmp_path / "rows.jsonl"
    if existing == "unrecorded":
        out.write_text("row 0\n")
    if existing == "synth generate":  # a run that finished: the file is its own
        assert _claim(tmp_path, "first", out, "synth generate", tag="row 1")["claimed"]
    before = out.read_text() if out.exists() else ""
    holder = Claimant(tmp_path, "holder", out, "synth generate", hold=True, tag="row 2")
    try:
        pid = holder.report()["pid"]
        refused = _claim(tmp_path, "second", out, "synth generate", tag="row 2")
        assert f"process {pid} on host" in refused.get("refused", ""), refused
        assert holder.finish() == 0
    finally:
        holder.kill()
    assert out.read_text() == before + "row 2\n"
    assert output_owner(out) == (None if existing == "unrecorded" else "synth generate")
    assert _claim(tmp_path, "after", out, "synth generate", tag="row 3")["claimed"]  # a resume after it ended
    assert out.read_text() == before + "row 2\nrow 3\n"
