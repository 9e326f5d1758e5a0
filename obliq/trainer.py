"""The training command behind ``train.py`` and ``obliq train``: a LightningCLI over
:class:`RetrieverModule` and :class:`~obliq.data.TrainingDataModule` (in the package, so ``obliq
quickstart`` and ``obliq dose-sweep`` call it too).

Configs are read in jsonargparse's ``omegaconf+`` mode: a recipe names its run folder once, as the
top-level ``run_dir``, and derives every output folder from it with OmegaConf interpolation
(``default_root_dir: ${run_dir}``, ``dirpath: ${run_dir}/checkpoints``). Interpolations are resolved
after the command line is read, so ``--run_dir=runs/other`` moves all of them.

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
saves ``<run folder>/sigterm.ckpt`` and exits with status 143 (:class:`obliq.callbacks.CheckpointOnSigterm`),
so the scheduler requeues it; the job's ``--ckpt_path last`` resumes it exactly.

**A resume never ignores the command line.** A checkpoint is data: its stored settings are compared
with the user's (:func:`resume_differences`), never merged over them (Lightning's own
``_parse_ckpt_path`` would). Training settings the user changed are applied, and said so: ``lr``,
``weight_decay``, ``warmup_ratio`` (the schedule continues from the checkpoint's step with the new
values), ``max_grad_norm``, ``max_bad_steps``, ``chunk_size``, ``temperature``, ``seed``,
``gather_across_devices``, ``symmetric``, and the encoder's lengths, dtype, attention kernel and gradient
checkpointing. What the trained weights depend on is refused with the list of differences: the
backbone, LoRA, bidirectionality, prefixes and instructions. A changed data mixture (other rows, even as
many), batch size, world size or seed is refused when the data position is restored
(:mod:`obliq.data.datamodule`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

from obliq.callbacks.checkpoints import SIGTERM_CHECKPOINT, CheckpointOnSigterm
from obliq.callbacks.progress import StepProgressBar
from obliq.claims import process_record, running

log = logging.getLogger(__name__)

PARSER_MODE = "omegaconf+"
"""jsonargparse's parser mode for training configs: ``${…}`` interpolation, resolved last."""

APPLIED = (
    "lr",
    "weight_decay",
    "warmup_ratio",
    "max_grad_norm",
    "max_bad_steps",
    "chunk_size",
    "temperature",
    "seed",
    "gather_across_devices",
    "symmetric",
    "teacher_loss",
    "teacher_weight",
    "teacher_temperature",
)
"""Module settings a resume takes from the user even when the checkpoint was trained with others."""
ENCODER_IDENTITY = ("backbone", "bidirectional", "query_prefix", "passage_prefix", "use_instructions")
"""Encoder settings the trained weights depend on: a resume that changes one is refused."""
VERSION = re.compile(r"^(version_(\d+)|wandb-\w+)$")


OWNER_FILE = "owner.json"
"""The record a version folder holds of the job that runs it (:func:`job_owner`), its launch, host and process."""
RUN_FOLDER_ENV = "OBLIQ_RUN_FOLDER"
"""Where rank 0 publishes its run folder to the processes Lightning's launcher starts after it (DDP)."""
RESUME_POINTS = ("last.ckpt", SIGTERM_CHECKPOINT, "hpc_ckpt_*.ckpt")
"""Checkpoints ``--ckpt_path last`` resumes from: ModelCheckpoint's last, the SIGTERM one, Lightning's SLURM one."""
_LAUNCH_KEYS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def job_owner() -> str | None:
    """The scheduler job this process belongs to: ``slurm:<array job>_<task>`` for a SLURM array task,
    ``slurm:<job id>``, ``torchelastic:<run id>`` (torchrun with a rendezvous id), or None (no scheduler).
    A requeued SLURM job keeps its id, so it finds its own run again."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm:{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}"
    if env.get("TORCHELASTIC_RUN_ID", "none") not in ("", "none"):
        return f"torchelastic:{env['TORCHELASTIC_RUN_ID']}"
    return None


def _launch() -> str:
    """What the processes of one launch (of one job) share, and the next launch does not."""
    return ";".join(f"{k}={os.environ[k]}" for k in _LAUNCH_KEYS if k in os.environ)


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
            busy = next((r for r in mine if running(r.record or {})), None)  # this job's, still running
            if busy is not None:
                raise ValueError(
                    f"{busy.path}: still trained by process {busy.record.get('pid')} on this machine; "
                    "--ckpt_path last would start a new run from step 0: wait for it to end, or drop --ckpt_path"
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


def _drop_refused_folder(before: str | None) -> None:
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
    from a process that no longer runs (:func:`obliq.claims.running`).

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
        if holder is None or running(holder):
            who = f"process {holder.get('pid')}" if holder else "another process"
            raise ValueError(
                f"{folder}: {who} is resuming it from {last.name} already; one resume at a time "
                f"(wait for it, or drop --ckpt_path to start a new run; a claim its process left unwritten: {lock})"
            ) from None
    _record(lock, str(last))


def _may_resume(run: RunFolder) -> bool:
    """Whether this job may continue ``run`` in place: a scheduler job only its own runs; a process
    without a scheduler only runs made without one, and none whose process still runs on this machine."""
    record = run.record or {}
    return record.get("owner") == job_owner() and not (job_owner() is None and running(record))


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
        """``final.ckpt``: the weights at the end of training (written by :func:`fit`), or None."""
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

    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, file)`` of every step checkpoint below the folder (not ``last``/``final``), by step;
        the step is read from each file (:func:`obliq.model.checkpoint.checkpoint_info`)."""
        from obliq.model.checkpoint import checkpoint_info

        files = [
            f for f in sorted(self.path.rglob("*.ckpt")) if f.name not in ("last.ckpt", FINAL) and not f.is_symlink()
        ]
        return sorted(((checkpoint_info(f).step, f) for f in files), key=lambda p: (p[0], str(p[1])))


FINAL = "final.ckpt"
"""The checkpoint :func:`fit` writes at the end of training, in the run's folder."""


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


def resume_differences(ckpt: dict, model: dict, source: object) -> list[str]:
    """What the user asks that differs from the checkpoint's own settings.

    Args:
        ckpt: the checkpoint (read with ``weights_only=True``).
        model: the user's ``model`` config section (``encoder`` with its ``init_args``, and the module's
            settings).
        source: the checkpoint's path, for messages.

    Returns:
        One line per applied difference (``model.lr: 0.001 in the checkpoint, 0.0005 now: applied``).

    Raises:
        ValueError: a difference in what the trained weights depend on (:data:`ENCODER_IDENTITY`,
            LoRA), listing every such difference.
    """
    from obliq.aliases import portable_name

    applied, refused = [], []
    stored = ckpt.get("hyper_parameters") or {}
    for key in APPLIED:
        if key in stored and key in model and stored[key] != model[key]:
            applied.append(f"model.{key}: {stored[key]!r} in the checkpoint, {model[key]!r} now: applied")
    saved = (ckpt.get("obliq") or {}).get("encoder") or {}
    asked = dict((model.get("encoder") or {}).get("init_args") or {})
    for key, value in saved.items():
        if key not in asked or key == "trust_remote_code":
            continue
        same = portable_name(value) == portable_name(asked[key]) if key == "backbone" else value == asked[key]
        if not same:
            line = f"model.encoder.init_args.{key}: {value!r} in the checkpoint, {asked[key]!r} now"
            (refused if key in ENCODER_IDENTITY else applied).append(
                line + ("" if key in ENCODER_IDENTITY else ": applied")
            )
    lora, asked_lora = (ckpt.get("obliq") or {}).get("lora"), asked.get("lora")
    if isinstance(asked_lora, dict) and lora is not None:
        for key, value in lora.items():
            if key in asked_lora and asked_lora[key] != value:
                refused.append(
                    f"model.encoder.init_args.lora.{key}: {value!r} in the checkpoint, {asked_lora[key]!r} now"
                )
    if refused:
        raise ValueError(
            f"{source}: cannot resume with another model: "
            + "; ".join(refused)
            + " (start a new run, or resume with the checkpoint's settings)"
        )
    return applied


def add_recipe_arguments(parser) -> None:
    """The top-level settings a recipe has besides Lightning's: its ``work_dir`` and ``run_dir``."""
    parser.add_argument(
        "--work_dir",
        type=str | None,
        default=None,
        help="The recipe's one folder, from which it derives its inputs (rows, tasks) and its "
        "run_dir (${work_dir}); what the commands that build those inputs read.",
    )
    parser.add_argument(
        "--run_dir",
        type=str,
        default="runs/train",
        help="The recipe's runs; each run goes in a version of it, from which the recipe derives "
        "its checkpoint, log and W&B folders (${run_dir}).",
    )


LOGGER = "--trainer.logger"
LOGGER_CARRIES = ("save_dir",)
"""A logger's settings that carry over when the command line swaps its class (C31): only the folder."""


def _logger_events(argv: list[str]) -> list[tuple]:
    """What each token of ``argv`` does to ``trainer.logger``, in order: ``("class", path, keys)`` sets
    its class (a config file's logger, ``--trainer.logger=X``, ``.class_path``, a JSON spec),
    ``("keys", keys)`` sets init args, ``("reset",)`` clears it (null, a bool, a list)."""
    from obliq.files import load_yaml

    def spec_event(spec) -> tuple | None:
        if isinstance(spec, dict):
            init = spec.get("init_args") if "class_path" in spec else spec.get("init_args", spec)
            keys = set(init) if isinstance(init, dict) else set()
            return ("class", str(spec["class_path"]), keys) if "class_path" in spec else ("keys", keys)
        if spec is None or isinstance(spec, (bool, list)):
            return ("reset",)
        return ("class", str(spec), set())

    events = []
    for i, token in enumerate(argv):
        option, eq, value = token.partition("=")
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
        elif not eq:
            continue
        if option == "--config":
            try:
                data = load_yaml(Path(value).read_text(encoding="utf-8-sig"), value)
            except (OSError, ValueError):
                continue  # the parser reports it
            data = data.get("fit", data) if isinstance(data, dict) else {}
            trainer = data.get("trainer") if isinstance(data, dict) else None
            if isinstance(trainer, dict) and "logger" in trainer:
                events.append(spec_event(trainer["logger"]))
        elif option in (LOGGER, LOGGER + ".class_path"):
            try:
                spec = load_yaml(value, option) if value.lstrip().startswith("{") else value
            except ValueError:
                spec = value
            events.append(("reset",) if str(spec).lower() in ("null", "none", "true", "false") else spec_event(spec))
        elif option.startswith(LOGGER + "."):
            events.append(("keys", {option[len(LOGGER) + 1 :].removeprefix("init_args.").split(".")[0]}))
    return [e for e in events if e is not None]


def logger_swap(argv: list[str], config) -> list[str]:
    """The arguments that make a logger whose class the command line (or a stacked config) swapped keep
    only :data:`LOGGER_CARRIES` of the earlier logger's settings, plus what was given at or after the swap.

    jsonargparse merges ``--trainer.logger=<another class>`` over the config's logger and keeps every
    init arg the new class also accepts (jsonargparse #460, Lightning #15796): the quickstart's
    ``CSVLogger(name="logs")`` made every W&B sweep trial "logs" (C31). The fix re-parses with
    ``--trainer.logger=null`` (nothing left to merge into) and the rebuilt logger.

    Args:
        argv: the command line.
        config: the parsed config (of the subcommand) whose ``trainer.logger`` is rebuilt.

    Returns:
        Extra arguments to append (none when no class was swapped). A list of loggers is left as it is.
    """
    current, explicit, swapped = None, set(), False
    for event in _logger_events(argv):
        if event[0] == "reset":
            current, explicit, swapped = None, set(), False
        elif event[0] == "keys":
            explicit |= event[1]
        else:
            path = event[1]
            if current is None:
                same = True
            elif "." in path and "." in current:
                same = path == current
            else:  # a short name (WandbLogger) against a full one
                same = path.rsplit(".", 1)[-1] == current.rsplit(".", 1)[-1]
            if not same:
                swapped, explicit = True, set()
            explicit |= event[2]
            current = path
    logger = config.get("trainer", {}).get("logger") if config is not None else None
    if not swapped or not isinstance(logger, Namespace) or "class_path" not in logger:
        return []
    init = logger.get("init_args")
    init = init.as_dict() if isinstance(init, Namespace) else dict(init or {})
    keep = {k: v for k, v in init.items() if k in LOGGER_CARRIES or k in explicit}
    spec = {"class_path": logger.class_path, "init_args": keep}
    return [f"{LOGGER}=null", f"{LOGGER}={json.dumps(spec, default=str)}"]


class TrainCLI(LightningCLI):
    """LightningCLI with a ``run_dir`` setting, that checks the training files before the backbone
    loads (minutes for a 3B model): every source must match files, and every row must pass the schema
    (the row index this builds is cached, so ``prepare_data`` reuses it). Only on a node's first process.

    Every ``fit`` gets :class:`~obliq.callbacks.CheckpointOnSigterm` (a checkpoint in its run folder and
    exit status 143 on SIGTERM), and a logger swapped on the command line keeps only its folder
    (:func:`logger_swap`)."""

    claim = True
    """Claim the run folder when parsing (False: name it only)."""

    def add_arguments_to_parser(self, parser) -> None:
        add_recipe_arguments(parser)

    def parse_arguments(self, parser, args) -> None:
        """Parse with ``--run_dir`` set to this run's version folder (and ``last`` resolved), so the
        recipe's ``${run_dir}`` interpolations land in it, and with a swapped logger rebuilt
        (:func:`logger_swap`). ``--print_config`` sees the final config and claims no folder."""
        if isinstance(args, (dict, Namespace)):
            return super().parse_arguments(parser, args)
        argv = list(sys.argv[1:] if args is None else args)
        printing = [a for a in argv if a.startswith("--print_config")]
        quiet = [a for a in argv if a not in printing]
        config = parser.parse_args(quiet)
        sub = config.get("subcommand")
        extra = []
        if sub in ("fit", None):  # None: built with run=False, a fit's config without the subcommand
            section = config[sub] if sub else config
            asked = section.get("ckpt_path")
            folder, ckpt_path = run_folder(section.run_dir, asked, claim=self.claim and not printing)
            extra = [f"--run_dir={folder}"] + ([f"--ckpt_path={ckpt_path}"] if ckpt_path != asked else [])
            config = parser.parse_args(quiet + extra)
        extra += logger_swap(argv, config[sub] if sub else config)
        self.config = parser.parse_args(argv + extra) if extra or printing else config

    def instantiate_trainer(self, **kwargs):
        """The trainer, with :class:`~obliq.callbacks.CheckpointOnSigterm` in the run's folder."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if self.subcommand in ("fit", None):
            folder = config.get("run_dir") or config.trainer.get("default_root_dir") or "."
            defaults = [CheckpointOnSigterm(folder)]
            configured = [
                str(c.get("class_path", "")) for c in config.trainer.get("callbacks") or [] if hasattr(c, "get")
            ]
            if config.trainer.get("enable_progress_bar") is not False and not any(
                "ProgressBar" in c for c in configured
            ):
                defaults.append(StepProgressBar())  # step n/total, not Lightning's "Epoch 0/-2"
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": defaults}
        return super().instantiate_trainer(**kwargs)

    def _parse_ckpt_path(self) -> None:
        """Compare the checkpoint's settings with the user's, never merge them over the user's (Lightning's
        own method would, silently): applied differences are logged, refused ones raise."""
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if not path or not Path(path).is_file():
            return
        from obliq.model.checkpoint import read_checkpoint

        model = self.config[sub].get("model")
        ckpt = read_checkpoint(path)
        for line in resume_differences(ckpt, model.as_dict() if hasattr(model, "as_dict") else dict(model), path):
            log.warning("resume from %s: %s", path, line)

    def before_instantiate_classes(self) -> None:
        from obliq.data import TrainingDataModule

        config = self.config.get(self.subcommand) if self.subcommand else self.config
        data = config.get("data") if config is not None else None
        if data is None or self.subcommand not in (None, "fit") or os.environ.get("LOCAL_RANK", "0") != "0":
            return
        settings = data.as_dict()
        settings["sources"] = [dict(s) for s in settings["sources"]]
        TrainingDataModule(**settings).prepare_data()


RECIPE_IMPORTS = ("obliq", "lightning.pytorch", "lightning.fabric", "torch.optim")
"""The import paths a recipe's ``class_path`` (or any class a training command line names) may lie
under: obliq's own classes (the encoder, callbacks, W&B logger, strategies), Lightning's (callbacks,
loggers, strategies, plugins) and torch's optimisers and schedulers. ``$OBLIQ_RECIPE_IMPORTS`` adds
more (comma-separated dot paths, e.g. ``bench,mylab.callbacks``) for code you trust."""


def recipe_imports() -> list[str]:
    """:data:`RECIPE_IMPORTS` and those of ``$OBLIQ_RECIPE_IMPORTS``."""
    extra = [p.strip() for p in os.environ.get("OBLIQ_RECIPE_IMPORTS", "").split(",") if p.strip()]
    return [*RECIPE_IMPORTS, *extra]


def cli(
    args: list[str] | None = None,
    run: bool = True,
    cli_class: type[LightningCLI] = TrainCLI,
    prog: str | None = None,
) -> LightningCLI:
    """Build (and by default run) ``train.py``'s CLI; ``args`` replaces ``sys.argv[1:]``.

    ``--print_config`` prints the resolved configuration, which is also saved next to the run and
    logged to every logger (W&B included).

    Raises:
        FileNotFoundError, ValueError: a data source matches no file or holds a malformed row
            (``file:line:field``), before the model is built.
    """
    import warnings

    from jsonargparse import set_parsing_settings

    from obliq.files import install_yaml_checks

    # A recipe's ${run_dir} is written as from the top of the config; under a subcommand (`fit`) the
    # config sits one level down, so jsonargparse turns such paths relative when it loads the file.
    # A recipe names classes only under RECIPE_IMPORTS: jsonargparse imports a class_path's module (and
    # runs its top-level code) before it checks the class's type, so anything else is refused unread.
    set_parsing_settings(
        omegaconf_absolute_to_relative_paths=True,
        import_path_denylist=["*"],
        import_path_allowlist=recipe_imports(),
    )
    install_yaml_checks()
    # Our checkpoints are taken after the optimizer step by design (the step count is the state).
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
    # Deprecation notices between pinned third-party releases (torchdata / Lightning vs torch 2.13).
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    # `obliq quickstart` / `dose-sweep` pass their own args while sys.argv holds theirs: intended.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    from obliq.callbacks.logging import LoggedConfig
    from obliq.data import TrainingDataModule
    from obliq.model.module import RetrieverModule

    before = os.environ.get(RUN_FOLDER_ENV)
    try:
        return cli_class(
            RetrieverModule,
            TrainingDataModule,
            save_config_callback=LoggedConfig,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"parser_mode": PARSER_MODE, **({"prog": prog} if prog else {})},
            args=args,
            run=run,
        )
    except (Exception, SystemExit):
        _drop_refused_folder(before)
        raise


class _ParseOnly(TrainCLI):
    claim = False

    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


def train_config(args: list[str]) -> Namespace:
    """The configuration ``train.py`` would run ``args`` with, parsed as it parses them (the run folder
    named but not claimed, ``last`` resolved, a swapped logger rebuilt), with nothing built or read."""
    if args[:1] != ["fit"]:
        raise ValueError(f"expected a fit command line (fit --config …), got {args[:2]}")
    return cli(args[1:], run=False, cli_class=_ParseOnly).config


def recipe_config(recipe: str | os.PathLike, *more: str | os.PathLike, **overrides) -> dict:
    """A recipe's settings as plain data, its interpolations resolved (OmegaConf), without building
    anything: what ``obliq quickstart``, ``obliq dose-sweep`` and the examples read to find a recipe's
    folders and data sources.

    Args:
        recipe: a ``train.py`` config file.
        more: configs stacked on it, as ``train.py fit --config A --config B`` stacks them (what a later
            file sets replaces the earlier's; lists are replaced whole).
        overrides: top-level keys to set before resolving (``run_dir="runs/x"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a YAML mapping, or an interpolation that cannot be resolved (file named).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from obliq.files import check_yaml, read_text

    try:
        parts = []
        for file in (recipe, *more):
            text = read_text(file)
            check_yaml(text, file)  # a key given twice, a nested-alias bomb: refused before loading
            config = OmegaConf.create(text)
            if not OmegaConf.is_dict(config):
                raise ValueError(f"{file}: expected a mapping of settings")
            parts.append(config)
        config = OmegaConf.merge(*parts)
        for key, value in overrides.items():
            OmegaConf.update(config, key, value)
        return OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as err:
        raise ValueError(f"{recipe}: {err}") from None


@dataclass(frozen=True)
class Fitted:
    """What :func:`fit` (and :func:`fit_and_export`) produced.

    Attributes:
        run: the run's folder (:class:`RunFolder`).
        checkpoint: its ``final.ckpt``.
        adapter: the exported adapter folder (:func:`fit_and_export` only).
    """

    run: RunFolder
    checkpoint: Path
    adapter: Path | None = None


def fit(args: list[str]) -> Fitted:
    """Run ``train.py`` with ``args`` (``fit --config …``) and save the final weights as
    ``<run folder>/final.ckpt``.

    Raises:
        ValueError: ``args`` is not a ``fit`` command line.
    """
    if not args or args[0] != "fit":
        raise ValueError(f"expected a fit command line (fit --config …), got {args[:2]}")
    run = cli(args)
    folder = RunFolder(Path(run.config.fit.run_dir))
    final = folder.path / FINAL
    run.trainer.save_checkpoint(final)
    return Fitted(folder, final)


def fit_and_export(args: list[str], out: str | os.PathLike, overwrite: bool = False) -> Fitted:
    """:func:`fit`, then export the final weights' adapter to ``<out>/adapter`` (:func:`obliq.export.export`).

    Args:
        args: the training command line.
        out: the export folder.
        overwrite: replace an earlier export there (refused otherwise, before training).

    Returns:
        The run, its final checkpoint and the adapter folder (what ``evaluate`` loads).
    """
    from obliq.claims import claim_outputs
    from obliq.export import export

    configs = [a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args) if a.startswith("--config")]
    with claim_outputs(
        {"out": out}, command="export", inputs=configs, overwrite=overwrite, what="an export", folders=["out"]
    ):
        fitted = fit(args)
        adapter = Path(export(fitted.checkpoint, out, overwrite=True)["adapter"])
    return Fitted(fitted.run, fitted.checkpoint, adapter)
