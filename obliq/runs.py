"""Run folders: where each ``fit`` of a recipe writes, who owns it, and where ``--ckpt_path last`` resumes.

**Every run its own folder.** ``run_dir`` names the recipe's folder; each ``fit`` runs in a version of
it (:func:`run_folder`): ``<run_dir>/version_<n>`` (the next free n, claimed with ``os.mkdir``, so two
jobs started at once on one ``run_dir`` get two folders), or ``<run_dir>/wandb-<id>`` when a W&B sweep
agent or a W&B run id is in the environment (``WANDB_RUN_ID``), so a second run or a sweep trial never
writes over the first one's checkpoints. Each folder records its owner (``owner.json``: the scheduler
job, :func:`job_owner`). ``--ckpt_path last`` resumes the newest run this job may continue
(:func:`resumable_run`: under a scheduler its own runs only; without one, runs made without one whose
process has ended) from its newest resume point (``last.ckpt``, ``sigterm.ckpt``, Lightning's
``hpc_ckpt_<n>.ckpt``), in its own folder. A checkpoint file inside a version resumes there only when
it is that version's newest; an earlier one resumes in a new version, so no checkpoint is ever replaced.

**Preemption.** On SIGTERM (what a cluster sends before it preempts a job or at its time limit) a run
saves ``<run folder>/sigterm.ckpt`` (:data:`SIGTERM_CHECKPOINT`) and exits with status 143
(:class:`obliq.callbacks.CheckpointOnSigterm`), so the scheduler requeues it; the job's
``--ckpt_path last`` resumes it exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from obliq.process import holder_state, holder_text, job_owner, process_record
from obliq.process import launch_id as _launch

log = logging.getLogger(__name__)

VERSION = re.compile(r"^(version_(\d+)|wandb-\w+)$")
SIGTERM_CHECKPOINT = "sigterm.ckpt"
"""The file :class:`obliq.callbacks.CheckpointOnSigterm` writes in the run's folder."""
FINAL = "final.ckpt"
"""The checkpoint :func:`obliq.commands.train.fit` writes at the end of training, in the run's folder."""

OWNER_FILE = "owner.json"
"""The record a version folder holds of the job that runs it (:func:`job_owner`), its launch, host and process."""
RUN_FOLDER_ENV = "OBLIQ_RUN_FOLDER"
"""Where rank 0 publishes its run folder to the processes Lightning's launcher starts after it (DDP)."""
RESUME_POINTS = ("last.ckpt", SIGTERM_CHECKPOINT, "hpc_ckpt_*.ckpt")
"""Checkpoints ``--ckpt_path last`` resumes from: ModelCheckpoint's last, the SIGTERM one, Lightning's SLURM one."""


def _global_rank_zero() -> bool:
    """False in a process a launcher started as a rank other than 0 (torchrun, srun, Lightning's DDP children)."""
    return all(int(os.environ.get(key, "0") or 0) == 0 for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"))


def _record(folder: Path, resumed_from: str | None) -> None:
    from obliq.files import write_json

    write_json(
        folder / OWNER_FILE,
        {
            "owner": job_owner(),
            "launch": _launch(),
            **process_record(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "resumed_from": resumed_from,
        },
    )


def _claim_version(base: Path) -> Path:
    """A new ``version_<n>`` folder of ``base``, made with ``os.mkdir`` (atomic: of two processes
    claiming at once one gets ``n``, the other ``n + 1``)."""
    base.mkdir(parents=True, exist_ok=True)
    n = 1 + max((int(m.group(2)) for p in base.iterdir() if (m := VERSION.match(p.name)) and m.group(2)), default=-1)
    while True:
        try:
            os.mkdir(base / f"version_{n}")
            return base / f"version_{n}"
        except FileExistsError:
            n += 1


def _next_version(base: Path) -> Path:
    """The folder :func:`_claim_version` would claim now (``--print_config`` claims nothing)."""
    names = [p.name for p in base.iterdir()] if base.is_dir() else []
    taken = [int(m.group(2)) for name in names if (m := VERSION.match(name)) and m.group(2)]
    return base / f"version_{max(taken, default=-1) + 1}"


def _is_newest(run: RunFolder, ckpt: Path) -> bool:
    """Whether no checkpoint of ``run`` was written after ``ckpt`` (resuming it there destroys nothing)."""
    written = Path(ckpt).resolve().stat().st_mtime_ns
    return all(f.resolve().stat().st_mtime_ns <= written for f in run.path.rglob("*.ckpt") if f.exists())


def _rank_zero_folder(base: Path, ckpt_path: str | None, timeout_s: float = 600.0) -> tuple[Path, str | None]:
    """The run folder of this launch's rank 0, for a process of another rank."""
    published = os.environ.get(RUN_FOLDER_ENV)
    if published:  # Lightning's DDP launcher re-ran the command with rank 0's environment
        record = json.loads(published)
        if record["run_dir"] == str(base.resolve()):
            return Path(record["folder"]), record["ckpt_path"]
    launch, deadline = _launch(), time.monotonic() + timeout_s
    while True:  # started on its own (torchrun, srun): find the folder rank 0 claimed for this launch
        for run in reversed(run_versions(base)):
            if (run.record or {}).get("launch") == launch and launch:
                return run.path, (run.record or {}).get("resumed_from") or ckpt_path
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base}: rank 0 of this launch ({launch or 'no launcher variables'}) claimed no folder")
        time.sleep(1.0)


def run_folder(run_dir: str | os.PathLike, ckpt_path: str | None, claim: bool = True) -> tuple[Path, str | None]:
    """The folder a ``fit`` runs in, and the checkpoint it resumes (see the module notes).

    - ``ckpt_path="last"``: the newest run of ``run_dir`` that this job may resume (:func:`resumable_run`)
      and its newest resume point (``last.ckpt``, ``sigterm.ckpt`` or Lightning's ``hpc_ckpt_<n>.ckpt``),
      in its own folder; without one, a new version (``last`` left for Lightning, which starts fresh).
    - a checkpoint file inside a version: that version when the checkpoint is its newest and the run is
      this job's; otherwise a new version (resuming an earlier checkpoint in place would replace the
      later ones and ``last.ckpt``).
    - else a new version: ``<run_dir>/wandb-<id>`` under W&B (``WANDB_RUN_ID``), or the next
      ``version_<n>``, claimed atomically (:func:`_claim_version`).

    The folder records its owner (``owner.json``: :func:`job_owner`, the launch, host and process).
    Rank 0 publishes the folder in ``$OBLIQ_RUN_FOLDER`` for the DDP processes Lightning starts after it;
    a rank started on its own (torchrun, srun) waits for the folder rank 0 claimed for the same launch.

    Args:
        claim: make and record the folder (False: only name it, for ``--print_config``).

    Returns:
        ``(folder, ckpt_path)``, ``ckpt_path`` resolved when a run was found.
    """
    base = Path(run_dir)
    if not _global_rank_zero():
        return _rank_zero_folder(base, ckpt_path)
    folder, resume = None, ckpt_path
    if ckpt_path == "last":
        run = resumable_run(base)
        if run is not None and run.last is not None:
            if claim:
                _claim_resume(run.path, run.last)
            folder, resume = run.path, str(run.last)
        else:
            mine = [r for r in run_versions(base) if r.last and (r.record or {}).get("owner") == job_owner()]
            busy = next((r for r in mine if run_state(r) != "ended"), None)  # this job's, running or untold
            if busy is not None and run_state(busy) == "running":
                raise ValueError(
                    f"{busy.path}: still trained by process {busy.record.get('pid')} on this machine; "
                    "--ckpt_path last would start a new run from step 0: wait for it to end, or drop --ckpt_path"
                )
            if busy is not None:
                raise ValueError(
                    f"{busy.path}: trained by {holder_text(busy.record)}, which did not finish; from this host "
                    f"obliq cannot tell whether it still trains: resume it there, or, if it has ended, pass "
                    f"--ckpt_path {busy.last} (it resumes in a new version folder; nothing is overwritten)"
                )
    elif ckpt_path and Path(ckpt_path).is_file():
        inside = next(
            (v for v in run_versions(base) if Path(ckpt_path).resolve().is_relative_to(v.path.resolve())), None
        )
        if inside is not None and _may_resume(inside) and _is_newest(inside, Path(ckpt_path)):
            folder = inside.path
        elif inside is not None:
            log.warning(
                "%s is not the newest checkpoint of %s: resuming it in a new version folder", ckpt_path, inside.path
            )
    if folder is None:
        wandb_id = os.environ.get("WANDB_RUN_ID")
        if wandb_id:
            folder = base / ("wandb-" + re.sub(r"\W", "_", wandb_id))
            if claim:
                folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = _claim_version(base) if claim else _next_version(base)
    if claim:
        new = not (folder / OWNER_FILE).exists()
        _record(folder, resume if resume != "last" else None)
        os.environ[RUN_FOLDER_ENV] = json.dumps(
            {"run_dir": str(base.resolve()), "folder": str(folder), "ckpt_path": resume, "new": new}
        )
    return folder, resume


def check_checkpoint_folders(folder: Path, dirpaths, ckpt_path: str | None) -> None:
    """Refuse a checkpoint folder (a ``ModelCheckpoint``'s ``dirpath``) set outside the run's folder that
    already holds checkpoints: the run would write over an earlier run's (the same step names, ``last.ckpt``),
    against the promise that a second run never writes over the first one's. A resume from a checkpoint in
    that folder (or ``--ckpt_path last`` that Lightning resolves there) continues there: the same run.

    Raises:
        ValueError: naming the folder, what it holds and the run's folder.
    """
    for given in dirpaths:
        if not given:
            continue
        path = Path(given)
        if path.resolve().is_relative_to(Path(folder).resolve()):
            continue
        held = sorted(p.name for p in path.glob("*.ckpt")) if path.is_dir() else []
        resumed = ckpt_path == "last" or (ckpt_path and Path(ckpt_path).resolve().is_relative_to(path.resolve()))
        if held and not resumed:  # "last" left to Lightning: it resumes from that folder's own last.ckpt
            raise ValueError(
                f"{path}: this checkpoint folder (ModelCheckpoint dirpath) lies outside the run's folder {folder} "
                f"and holds {len(held)} checkpoints of an earlier run ({', '.join(held[:3])}): this run would write "
                "over them; set dirpath under ${run_dir} (e.g. ${run_dir}/checkpoints), or move those files"
            )


def drop_refused_folder(before: str | None) -> None:
    """After a ``fit`` that failed: remove the version folder it claimed, when this process made it and
    it holds nothing but its owner record and saved config (a refused run leaves no empty
    ``version_<n>``); a folder with a checkpoint, a log or anything else is kept."""
    claimed = os.environ.get(RUN_FOLDER_ENV)
    if not claimed or claimed == before or not _global_rank_zero():
        return
    info = json.loads(claimed)
    folder = Path(info["folder"])
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return
    files = {p.name for p in folder.rglob("*") if not p.is_dir()}
    if info.get("new") and owner.get("pid") == os.getpid() and files <= {OWNER_FILE, "config.yaml"}:
        shutil.rmtree(folder, ignore_errors=True)
        log.info("%s: removed (the run was refused before its first checkpoint)", folder)
        if before is None:  # this process is as before the refused call
            os.environ.pop(RUN_FOLDER_ENV, None)
        else:
            os.environ[RUN_FOLDER_ENV] = before


def _claim_resume(folder: Path, last: Path) -> None:
    """Claim the resume of ``folder`` from its resume point ``last`` for this process: one claim per
    resume point (a folder made with ``os.mkdir``, which one of two processes wins), taken over only
    from a process that has ended (:func:`obliq.process.holder_state`; another machine's cannot be told: refused).

    Raises:
        ValueError: another running process claimed this resume point first.
    """
    point = hashlib.sha256(f"{last.resolve()}:{last.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    lock = folder / f".resume-{point}"
    try:
        os.mkdir(lock)
    except FileExistsError:
        try:
            holder = json.loads((lock / OWNER_FILE).read_text())
        except (OSError, ValueError):
            holder = None  # being written by the winner: it runs
        if holder is None or holder_state(holder) != "ended":
            who = holder_text(holder) if holder else "another process"
            raise ValueError(
                f"{folder}: {who} is resuming it from {last.name} already; one resume at a time "
                f"(wait for it, or drop --ckpt_path to start a new run; a claim its process left unwritten: {lock})"
            ) from None
    _record(lock, str(last))


def run_state(run: RunFolder) -> str:
    """``"running"``, ``"ended"`` or ``"unknown"`` for the process that last ran ``run``
    (:func:`obliq.process.holder_state` of its owner record): a run whose ``final.ckpt`` was written after
    its record has ended, wherever it ran; one of another machine that did not finish cannot be told."""
    record = run.record or {}
    if run.final is not None and run.final.stat().st_mtime >= (run.path / OWNER_FILE).stat().st_mtime:
        return "ended"
    return holder_state(record)


def _may_resume(run: RunFolder) -> bool:
    """Whether this job may continue ``run`` in place: a scheduler job only its own runs; a process
    without a scheduler only runs made without one whose process has ended (never one still running
    here, nor one of another machine that did not finish: :func:`run_state`)."""
    record = run.record or {}
    return record.get("owner") == job_owner() and not (job_owner() is None and run_state(run) != "ended")


def resumable_run(run_dir: str | os.PathLike) -> RunFolder | None:
    """The run ``--ckpt_path last`` resumes: of the runs this job may continue (:func:`_may_resume`), the
    one whose resume point was written last; None when there is none."""
    runs = [(r.last.stat().st_mtime, i, r) for i, r in enumerate(run_versions(run_dir)) if r.last and _may_resume(r)]
    return max(runs)[2] if runs else None


@dataclass(frozen=True)
class RunFolder:
    """One run of a recipe: a version folder of its ``run_dir`` and the checkpoints in it.

    Attributes:
        path: ``<run_dir>/version_<n>`` or ``<run_dir>/wandb-<id>``.
    """

    path: Path

    @property
    def final(self) -> Path | None:
        """``final.ckpt``: the weights at the end of training (written by :func:`obliq.commands.train.fit`), or None."""
        file = self.path / FINAL
        return file if file.is_file() else None

    @property
    def last(self) -> Path | None:
        """The newest resume point below the folder (:data:`RESUME_POINTS`: ModelCheckpoint's
        ``last.ckpt``, the SIGTERM checkpoint, Lightning's SLURM ``hpc_ckpt_<n>.ckpt``), or None."""
        found = [f for pattern in RESUME_POINTS for f in self.path.rglob(pattern) if f.is_file()]
        return max(found, key=lambda f: f.stat().st_mtime) if found else None

    @property
    def record(self) -> dict | None:
        """The folder's ``owner.json`` (who runs it: :func:`run_folder`), or None (a folder made before
        obliq recorded owners, or one being claimed)."""
        try:
            record = json.loads((self.path / OWNER_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    @property
    def newest(self) -> Path | None:
        """The checkpoint to read this run's weights from: ``final.ckpt``, else ``last.ckpt``, else None."""
        return self.final or self.last


def run_versions(run_dir: str | os.PathLike) -> list[RunFolder]:
    """Every run (version folder) of ``run_dir``, oldest first (by the folder's creation order: its
    version number, W&B runs by modification time after them)."""
    base = Path(run_dir)
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if p.is_dir() and VERSION.match(p.name)]
    key = lambda p: (
        (0, int(VERSION.match(p.name).group(2)), 0.0)
        if VERSION.match(p.name).group(2)
        else (  # noqa: E731
            1,
            0,
            p.stat().st_mtime,
        )
    )
    return [RunFolder(p) for p in sorted(found, key=key)]


def latest_run(run_dir: str | os.PathLike) -> RunFolder | None:
    """The run of ``run_dir`` whose checkpoint was written last (``final.ckpt`` or ``last.ckpt``), like
    litgpt's ``find_resume_path``: what ``--ckpt_path last`` resumes and what a caller reads a recipe's
    trained weights from. None when no run holds a checkpoint."""
    runs = [(r.newest.stat().st_mtime, i, r) for i, r in enumerate(run_versions(run_dir)) if r.newest is not None]
    return max(runs)[2] if runs else None
