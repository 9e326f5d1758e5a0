"""Runs that share a folder, preemption and sweep trials (issue 24): version folders claimed atomically,
no checkpoint ever replaced by a resume, ``--ckpt_path last`` finding only this job's run, DDP ranks in
rank 0's folder, SIGTERM saving a checkpoint and exiting 143, and a logger swapped on the command line
keeping only its folder (C31)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from support import REPO, lora_weights, start_training, write_config

SCHEDULER_VARS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "LOCAL_RANK",
    "SLURM_PROCID",
    "OBLIQ_RUN_FOLDER",
    "WANDB_RUN_ID",
)


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    for key in SCHEDULER_VARS:
        monkeypatch.delenv(key, raising=False)


# --- C31: a logger swapped on the command line ---------------------------------------------------


def _sweep_command(sweep_file: Path, work_dir: Path) -> list[str]:
    """The `train.py` arguments a `wandb agent` runs for the sweep's first grid point."""
    sweep = yaml.safe_load(sweep_file.read_text())
    args = [f"--{name}={spec['values'][0]}" for name, spec in sweep["parameters"].items()]
    command = [a for c in sweep["command"] for a in (args if c == "${args}" else [c])]
    argv = command[command.index("fit") :]
    return [a.replace("configs/", str(REPO / "configs") + "/") for a in argv] + [f"--work_dir={work_dir}"]


SWEEPS = sorted((REPO / "configs" / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("sweep_file", SWEEPS, ids=lambda p: p.name)
def test_each_shipped_sweep_trial_gets_a_logger_of_its_own_with_only_the_folder_carried(sweep_file, tmp_path):
    """C31: the W&B logger of a sweep trial has W&B's own default name (None: W&B names each trial), the
    recipe's save folder, and the sweep's project; the recipe's CSVLogger `name: logs` does not carry."""
    from test_train import _parser

    from obliq.commands.train import train_config

    argv = _sweep_command(sweep_file, tmp_path)
    recipe_logger = yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text())["trainer"]["logger"]
    assert recipe_logger["init_args"].get("name")  # the recipe's logger has a name that must not carry over
    config = train_config(argv)
    logger = config.trainer.logger
    swapped = [a.split("=", 1)[1] for a in argv if a.startswith("--trainer.logger=")]
    assert logger.class_path.endswith(swapped[-1].rsplit(".", 1)[-1])
    assert logger.init_args.name is None
    assert logger.init_args.save_dir == config.run_dir == str(tmp_path / "train" / "version_0")
    given = {
        a.split("=", 1)[0].rsplit(".", 1)[-1]: a.split("=", 1)[1] for a in argv if a.startswith("--trainer.logger.")
    }
    assert all(str(logger.init_args[k]) == v for k, v in given.items())
    assert not (tmp_path / "train").exists()  # parsing claimed nothing
    # the logger it builds (no W&B run is started before the first log)
    from jsonargparse import ArgumentParser
    from obliq.callbacks import WandbLogger

    parser = ArgumentParser()
    parser.add_argument("--logger", type=WandbLogger)
    built = parser.instantiate_classes(parser.parse_object({"logger": logger.as_dict()})).logger
    assert built._wandb_init.get("name") is None and built.save_dir == config.run_dir
    # the control: jsonargparse's own merge gives every trial the recipe's name
    plain = _parser().parse_args(argv[1:])
    assert plain.trainer.logger.init_args.name == recipe_logger["init_args"]["name"]


@pytest.mark.parametrize(
    "swap",
    [
        ["--trainer.logger=lightning.pytorch.loggers.WandbLogger"],
        ["--trainer.logger", "obliq.callbacks.WandbLogger"],
        ["--trainer.logger.class_path=obliq.callbacks.WandbLogger"],
        ['--trainer.logger={"class_path": "obliq.callbacks.WandbLogger"}'],
        ["--trainer.logger=obliq.callbacks.WandbLogger", "--trainer.logger.name=mine"],
        ["--config", "STACKED"],
    ],
    ids=["lightning-class", "space", "class_path", "json", "then-a-name", "stacked-config"],
)
def test_every_way_of_swapping_the_logger_class_carries_only_the_folder(swap, tmp_path):
    from obliq.commands.train import train_config

    stacked = tmp_path / "stacked.yaml"
    stacked.write_text(
        "trainer:\n  logger:\n    class_path: obliq.callbacks.WandbLogger\n    init_args: {project: p}\n"
    )
    swap = [str(stacked) if a == "STACKED" else a for a in swap]
    config = train_config(
        ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), *swap, f"--work_dir={tmp_path}"]
    )
    logger = config.trainer.logger
    assert logger.class_path.endswith("WandbLogger")
    assert logger.init_args.name == ("mine" if "--trainer.logger.name=mine" in swap else None)
    assert logger.init_args.save_dir == config.run_dir
    if "STACKED" in str(swap) or stacked.as_posix() in swap:
        assert logger.init_args.project == "p"
    same = train_config(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), f"--work_dir={tmp_path}"])
    assert same.trainer.logger.init_args.name == "logs"  # no swap: the recipe's logger as it is


# --- version folders -----------------------------------------------------------------------------


CLAIM = """barrier.wait()
from obliq.runs import run_folder
queue.put(str(run_folder(run_dir, None)[0]))
"""
"""What each process started at once runs: it waits for the others, then claims a version folder. Run as
``exec(CLAIM, {...})``: a spawned process imports the module of its target, and this one imports torch."""


def test_trainings_started_at_once_on_one_run_dir_get_one_folder_each(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    n = 6
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    names = {"run_dir": tmp_path / "runs", "barrier": barrier, "queue": queue}
    procs = [ctx.Process(target=exec, args=(CLAIM, names)) for _ in range(n)]
    for p in procs:
        p.start()
    got = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got == sorted(str(tmp_path / "runs" / f"version_{i}") for i in range(n))
    owners = [json.loads((Path(g) / "owner.json").read_text()) for g in got]
    assert len({o["pid"] for o in owners}) == n and all(o["owner"] is None for o in owners)


def _version(base: Path, n: int, owner: str | None, steps=(1, 2, 3), pid: int | None = None, start=None) -> Path:
    folder = base / f"version_{n}"
    (folder / "ckpt").mkdir(parents=True)
    for s in steps:
        (folder / "ckpt" / f"step={s}.ckpt").write_text(str(s))
        time.sleep(0.01)
    (folder / "ckpt" / "last.ckpt").symlink_to(folder / "ckpt" / f"step={steps[-1]}.ckpt")
    from obliq.process import boot_id, pid_namespace  # a record of this PID namespace, whose pid tells

    record = {"owner": owner, "host": os.uname().nodename, "pid": pid or 1, "process_start": start}
    record.update(boot_id=boot_id(), pid_namespace=pid_namespace())
    (folder / "owner.json").write_text(json.dumps(record))
    return folder


def test_resuming_an_earlier_checkpoint_goes_to_a_new_version_and_the_newest_resumes_in_place(tmp_path):
    from obliq.runs import run_folder

    base = tmp_path / "runs"
    v0 = _version(base, 0, None)
    folder, ckpt = run_folder(base, str(v0 / "ckpt" / "step=1.ckpt"))
    assert folder == base / "version_1" and ckpt == str(v0 / "ckpt" / "step=1.ckpt")
    assert json.loads((folder / "owner.json").read_text())["resumed_from"] == ckpt
    assert sorted(p.name for p in (v0 / "ckpt").iterdir()) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt", "step=3.ckpt"]
    folder, _ = run_folder(base, str(v0 / "ckpt" / "last.ckpt"))  # the newest: continue in place
    assert folder == v0
    folder, _ = run_folder(base, str(v0 / "ckpt" / "step=3.ckpt"))  # the same file
    assert folder == v0


def test_last_resumes_only_this_jobs_run(tmp_path, monkeypatch):
    from obliq.runs import run_folder

    base = tmp_path / "runs"
    mine = _version(base, 0, "slurm:111_3")
    _version(base, 1, "slurm:222")  # another job's, written later
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "111")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "115")
    assert run_folder(base, "last") == (mine, str(mine / "ckpt" / "last.ckpt"))
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")  # another task of the array: a run of its own
    assert run_folder(base, "last") == (base / "version_2", "last")
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(key)
    assert run_folder(base, "last") == (base / "version_3", "last")  # no scheduler: no scheduler job's run
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from obliq.process import process_start as _process_start

        time.sleep(0.2)
        live = _version(base, 4, None, pid=sleeper.pid, start=_process_start(sleeper.pid))
        ended = _version(base, 5, None, pid=sleeper.pid, start="1")  # the same pid, another process: ended
        assert run_folder(base, "last") == (ended, str(ended / "ckpt" / "last.ckpt"))
        (ended / "ckpt" / "last.ckpt").unlink()
        for f in (ended / "ckpt").iterdir():
            f.unlink()
        # a run whose process still runs is never resumed, and never silently replaced by a run from step 0
        with pytest.raises(ValueError, match=f"{live}: still trained by process {sleeper.pid}"):
            run_folder(base, "last")
    finally:
        sleeper.kill()


def test_of_two_resumes_of_one_run_at_once_one_wins_and_the_other_refuses(tmp_path):
    """Issue 32 §3: of two simultaneous ``--ckpt_path last`` resumes the loser trained from step 0 in silence.
    Each resume point is claimed once (os.mkdir): a claim held by a running process refuses the other resume in
    one line; a claim left by a process that has ended is taken over."""
    from obliq.process import process_start as _process_start
    from obliq.runs import run_folder

    base = tmp_path / "runs"
    v0 = _version(base, 0, None, pid=1, start="1")  # its process has ended: resumable
    last = v0 / "ckpt" / "last.ckpt"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        assert run_folder(base, "last", claim=False) == (v0, str(last))  # named, nothing claimed
        assert not any(p.name.startswith(".resume-") for p in v0.iterdir())
        assert run_folder(base, "last") == (v0, str(last))  # this process wins the claim
        [lock] = [p for p in v0.iterdir() if p.name.startswith(".resume-")]
        record = json.loads((lock / "owner.json").read_text())
        record.update(pid=sleeper.pid, process_start=_process_start(sleeper.pid))  # as if the other one had won
        (lock / "owner.json").write_text(json.dumps(record))
        (v0 / "owner.json").write_text(json.dumps({**record, "pid": 1, "process_start": "1"}))
        with pytest.raises(
            ValueError, match=f"process {sleeper.pid} on host \\S+ is resuming it from last.ckpt already"
        ):
            run_folder(base, "last")
        sleeper.kill()
        sleeper.wait()
        assert run_folder(base, "last") == (v0, str(last))  # the claimer has ended: taken over
        assert json.loads((lock / "owner.json").read_text())["pid"] == os.getpid()
    finally:
        sleeper.kill()


def test_ddp_ranks_land_in_rank_zeros_folder(tmp_path, monkeypatch):
    from obliq.runs import run_folder

    base = tmp_path / "runs"
    folder, _ = run_folder(base, None)  # rank 0 publishes its folder for the processes it starts
    child = subprocess.run(
        [sys.executable, "-c", f"from obliq.runs import run_folder; print(run_folder({str(base)!r}, None)[0])"],
        env=dict(os.environ, LOCAL_RANK="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.stdout.strip() == str(folder), child.stderr
    assert sorted(p.name for p in base.iterdir()) == ["version_0"]
    # ranks started on their own (torchrun): rank 1 waits for the folder rank 0 claims for this launch
    monkeypatch.delenv("OBLIQ_RUN_FOLDER")
    launch = {"TORCHELASTIC_RUN_ID": "job7", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    started = "from obliq.runs import run_folder; print('started', flush=True)"
    rank1 = subprocess.Popen(
        [sys.executable, "-c", f"{started}; print(run_folder({str(base)!r}, None)[0])"],
        env={**{k: v for k, v in os.environ.items() if k != "OBLIQ_RUN_FOLDER"}, **launch, "RANK": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rank1.stdout.readline() == "started\n"  # obliq.runs imported: it is about to look for the folder
    time.sleep(1)  # ... and finds none: it waits
    for key, value in launch.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RANK", "0")
    folder, _ = run_folder(base, None)
    out, _ = rank1.communicate(timeout=120)
    assert folder == base / "version_1" and out.strip() == str(folder)


# --- SIGTERM -------------------------------------------------------------------------------------


def _recipe(folder: Path, rows: Path, backbone: str, steps: int) -> Path:
    """A recipe in the shipped form: one run_dir from which every output derives."""
    config = write_config(folder, rows, backbone, max_steps=steps)
    cfg = yaml.safe_load(config.read_text())
    cfg["run_dir"] = str(folder / "runs")
    cfg["trainer"]["default_root_dir"] = cfg["trainer"]["logger"]["init_args"]["save_dir"] = "${run_dir}"
    cfg["trainer"]["callbacks"][0]["init_args"]["dirpath"] = "${run_dir}/ckpt"
    cfg["trainer"]["callbacks"][0]["init_args"]["every_n_train_steps"] = 1000  # only SIGTERM saves mid-run
    config.write_text(yaml.safe_dump(cfg))
    return config


def _train(config: Path, *extra: str) -> subprocess.Popen:
    """A training in the recipe's folder, outside any scheduler."""
    return start_training(config, *extra, cwd=config.parent, drop_env=SCHEDULER_VARS)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_exits_143_and_last_resumes_it_exactly(tiny_llama_dir, tasks_dir, tmp_path):
    """A real SIGTERM to a training process: it saves `<run>/sigterm.ckpt` at the next step boundary and
    exits with 143 (before: exit 0, nothing saved); `--ckpt_path last` resumes that checkpoint in the
    same folder and ends bit-identical to an uninterrupted run. The signalled run is a process of its own; the
    resume and the uninterrupted run go in this one (support.fit_here)."""
    from support import fit_here, task_rows, write_rows

    from obliq.model.checkpoint import checkpoint_info

    rows = write_rows(tmp_path / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=40))
    steps = 12
    whole, broken = (_recipe(tmp_path / n, rows, tiny_llama_dir, steps) for n in ("whole", "broken"))
    run = _train(broken)
    metrics = tmp_path / "broken" / "runs" / "version_0"
    deadline = time.time() + 300
    while run.poll() is None and time.time() < deadline:  # wait until it has taken a few steps
        csv = list(metrics.rglob("metrics.csv"))
        if csv and csv[0].read_text().count("\n") >= 3:
            break
        time.sleep(0.1)
    assert run.poll() is None, run.stderr.read()
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=300) == 143, run.stderr.read()[-3000:]
    saved = metrics / "sigterm.ckpt"
    stopped = checkpoint_info(saved).step
    assert 0 < stopped < steps
    resumed = fit_here(broken, "--ckpt_path", "last")  # the resume: a new trainer and model, from the files alone
    assert Path(resumed.trainer.ckpt_path) == saved  # not a fresh start
    fit_here(whole)  # the uninterrupted run
    assert sorted(p.name for p in (tmp_path / "broken" / "runs").iterdir()) == ["version_0"]  # resumed in place
    record = json.loads((metrics / "owner.json").read_text())
    assert record["resumed_from"] == str(saved)
    a = lora_weights(tmp_path / "whole" / "runs" / "version_0" / "ckpt" / "last.ckpt")
    b = lora_weights(metrics / "ckpt" / "last.ckpt")
    assert checkpoint_info(metrics / "ckpt" / "last.ckpt").step == steps
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_ddp_run_on_two_processes_uses_one_version_folder(tiny_llama_dir, tasks_dir, tmp_path):
    """Lightning's DDP launcher re-runs the command in a child process: the child trains in rank 0's
    version folder (published through $OBLIQ_RUN_FOLDER), not in a second one."""
    from support import task_rows, write_rows

    rows = write_rows(tmp_path / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=16))
    config = _recipe(tmp_path / "ddp", rows, tiny_llama_dir, 2)
    cfg = yaml.safe_load(config.read_text())
    cfg["trainer"].update(devices=2, strategy="ddp")
    config.write_text(yaml.safe_dump(cfg))
    run = _train(config)
    assert run.wait(timeout=600) == 0, run.stderr.read()[-3000:]
    assert sorted(p.name for p in (tmp_path / "ddp" / "runs").iterdir()) == ["version_0"]
    assert (tmp_path / "ddp" / "runs" / "version_0" / "ckpt" / "last.ckpt").exists()
