"""Which process a record names, and whether it still runs: the identity output claims
(:mod:`obliq.claims`) and run folders (:mod:`obliq.runs`) write into their records.

A process is named by its host name, its machine's boot (``/proc/sys/kernel/random/boot_id``, a random
id the kernel draws at each boot), its PID namespace (``/proc/self/ns/pid``), its pid and its start time
(:func:`process_record`). A pid is looked up only in the namespace that gave it: containers started with
one ``--hostname``, or two hosts of one name, share the name but not the pids, so a record is judged by
its pid only when all three (name, boot, namespace) are this process's; any other record cannot be told
ended (:func:`holder_state`), unless it is an earlier launch of this process's own scheduler job.

A multi-process launch (torchrun, srun: ``WORLD_SIZE`` > 1) is one claimant: :func:`launch_rank` and
:func:`launch_id` tell its ranks, and the next launch, apart.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

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


def process_start(pid: int) -> str | None:
    """A process's start time (Linux ``/proc/<pid>/stat``, clock ticks since boot), which a reused pid does
    not share; None when no process of this pid is in this process's ``/proc``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def boot_id() -> str | None:
    """This machine's boot id (``/proc/sys/kernel/random/boot_id``: drawn anew at each boot, shared by every
    container of the machine), or None where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[<inode>]``, from ``/proc/self/ns/pid``), or None where it cannot
    be read; only when ``/proc`` is this namespace's (``/proc/self`` is this pid), since a pid is looked up there."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None  # a /proc mounted for another namespace: its pids are not this one's
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


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


def launch_id() -> str:
    """What the processes of one launch (of one job) share, and the next launch (a requeue, another
    torchrun) does not: its launcher's variables (job, step, restart count, run id, master address and
    port), ``;``-joined; empty outside a launcher."""
    return ";".join(f"{k}={os.environ[k]}" for k in _LAUNCH_KEYS if k in os.environ)


def launch_rank() -> int | None:
    """This process's global rank in a multi-process launch (``WORLD_SIZE`` > 1: ``RANK``, else
    ``SLURM_PROCID``, else ``LOCAL_RANK``, else 0), or None outside one.

    Raises:
        ValueError: ``WORLD_SIZE`` or the rank variable is not a whole number (the variable named).
    """
    world = _whole("WORLD_SIZE", "1")
    if world <= 1:
        return None
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(key, ""):
            return _whole(key, "0")
    return 0


def _whole(key: str, default: str) -> int:
    value = os.environ.get(key, default) or default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {key}={value!r}: not a whole number") from None


def process_record() -> dict:
    """This process as a record names it: ``{"host", "boot_id", "pid_namespace", "pid", "process_start",
    "job", "launch"}`` (:func:`holder_state` reads it)."""
    return {
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "pid_namespace": pid_namespace(),
        "pid": os.getpid(),
        "process_start": process_start(os.getpid()),
        "job": job_owner(),
        "launch": launch_id(),
    }


def _in_this_pid_space(record: dict) -> bool:
    """Whether the process ``record`` names had its pid from this process's PID namespace on this boot of
    this machine (host name, boot id and namespace all recorded and all this process's)."""
    here = (socket.gethostname(), boot_id(), pid_namespace())
    there = (record.get("host"), record.get("boot_id"), record.get("pid_namespace"))
    return None not in here and there == here


def holder_state(record: dict) -> str:
    """Whether the process a record names (:func:`process_record`) still runs, as far as this process can
    tell on a file system that several machines or containers share:

    - ``"running"`` / ``"ended"``: a process of this PID namespace on this boot of this machine, told by its
      pid and start time (a reused pid has another start); this very process counts as ended (it holds
      nothing against itself);
    - ``"ended"``: an earlier launch of this process's own scheduler job on any machine (a requeued job: the
      scheduler ended that attempt before starting this one);
    - ``"unknown"``: any other record: another host, another boot, another PID namespace of this host name
      (a container), or a record without these fields (written before obliq recorded them) whose pid does
      not run here. A pid means nothing outside its namespace, so obliq cannot tell whether the process
      runs, and a caller refuses rather than take over (C61; issue 49 §2).
    """
    pid = record.get("pid")
    if _in_this_pid_space(record):
        if not isinstance(pid, int) or pid == os.getpid():
            return "ended"
        start = process_start(pid)
        return "running" if start is not None and start == record.get("process_start") else "ended"
    legacy = "boot_id" not in record and "pid_namespace" not in record
    if legacy and record.get("host") == socket.gethostname() and isinstance(pid, int) and pid_namespace():
        start = process_start(pid)  # maybe this very process: it runs (elsewhere its pid tells nothing)
        if start is not None and start == record.get("process_start") and pid != os.getpid():
            return "running"
    job = record.get("job", record.get("owner"))
    if job is not None and job == job_owner() and record.get("launch") != launch_id():
        return "ended"
    return "unknown"


def holder_text(record: dict) -> str:
    """A record's holder in words, for refusals: ``'evaluate' in process 123 on host h``."""
    command = f"{record['command']!r} in " if record.get("command") else ""
    return f"{command}process {record.get('pid')} on host {record.get('host')}"
