"""The claim of every command's outputs, as one transaction (:func:`claim_outputs`): never an input (nor
inside an input folder), never a pattern, never replaced without ``--overwrite``, never another command's
output (a record beside each output names the command that wrote it), never two running commands' at once;
all checked before any is claimed, all withdrawn when the command fails.

A claim's record names the claiming process (host, pid, start time, scheduler job: :func:`process_record`),
so a claim held by a running process is told from one a killed process left (:func:`holder_state`); a
claim of another machine's process, which a pid cannot tell, is never taken over.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from obliq.files import json_text, write_text

OUTPUT_RECORD = ".{name}.obliq"
"""The record beside every output a command claims (``<folder>/.<name>.obliq``, JSON): which command
wrote it. What ``--overwrite`` may replace is decided from it."""
FOLDER_MARK = ".obliq-output"
"""The file inside an output folder that ``claim_output(folder=True)`` made, naming its command."""
_GLOB = re.compile(r"[*?\[]")


def _record_file(path: Path) -> Path:
    return path.parent / OUTPUT_RECORD.format(name=path.name)


def process_start(pid: int) -> str | None:
    """A process's start time (Linux ``/proc``), which a reused pid does not share; None when it has ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


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


def launch_id() -> str:
    """What the processes of one launch (of one job) share, and the next launch (a requeue) does not."""
    return ";".join(f"{k}={os.environ[k]}" for k in _LAUNCH_KEYS if k in os.environ)


def process_record() -> dict:
    """This process as a record names it: ``{"host", "pid", "process_start", "job", "launch"}``
    (:func:`holder_state` reads it)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": process_start(os.getpid()),
        "job": job_owner(),
        "launch": launch_id(),
    }


def holder_state(record: dict) -> str:
    """Whether the process a record names (:func:`process_record`) still runs, as far as this process can
    tell on a file system that several machines share:

    - ``"running"`` / ``"ended"``: a process of this machine, told by its pid and start time (a reused pid
      has another start); this very process counts as ended (it holds nothing against itself);
    - ``"ended"``: an earlier launch of this process's own scheduler job on any machine (a requeued job: the
      scheduler ended that attempt before starting this one);
    - ``"unknown"``: any other machine's process — a pid means nothing on another host, so obliq cannot
      tell whether it runs, and a caller refuses rather than take over (issue 49 §2).
    """
    pid = record.get("pid")
    if record.get("host") == socket.gethostname():
        if not isinstance(pid, int) or pid == os.getpid():
            return "ended"
        start = process_start(pid)
        return "running" if start is not None and start == record.get("process_start") else "ended"
    job = record.get("job", record.get("owner"))
    if job is not None and job == job_owner() and record.get("launch") != launch_id():
        return "ended"
    return "unknown"


def holder_text(record: dict) -> str:
    """A record's holder in words, for refusals: ``'evaluate' in process 123 on host h``."""
    command = f"{record['command']!r} in " if record.get("command") else ""
    return f"{command}process {record.get('pid')} on host {record.get('host')}"


def _in_launch() -> bool:
    """Whether this process is one rank of a multi-process launch (its ranks claim the same outputs)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def claimed_folder(folder: Path) -> bool:
    """Whether ``folder`` is one ``claim_output(folder=True)`` made: it holds :data:`FOLDER_MARK` naming
    the command its record beside it names (a record alone may be a failed command's, or the folder a
    user's new one of that name)."""
    owner = output_owner(folder)
    try:
        return owner is not None and (folder / FOLDER_MARK).read_text(encoding="utf-8").strip() == owner
    except OSError:
        return False


def output_owner(path: str | os.PathLike) -> str | None:
    """The command recorded as having written ``path`` (:func:`claim_output`), or None (no record: not
    written by an obliq command, or by a version before the records)."""
    try:
        record = json.loads(_record_file(Path(path)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record.get("command") if isinstance(record, dict) else None


def _overlap(output: Path, given: Path) -> str | None:
    """How ``output`` would write over the input ``given`` (the same file, inside it, or around it), or None."""
    out, source = os.path.realpath(output), os.path.realpath(given)
    if out == source or (output.exists() and given.exists() and os.path.samefile(output, given)):
        return "is"
    if out.startswith(source.rstrip(os.sep) + os.sep):
        return "is inside"
    if source.startswith(out.rstrip(os.sep) + os.sep):
        return "holds"
    return None


def check_output_name(path: str | os.PathLike) -> Path:
    """``path``, unless its name is a pattern (``*``, ``?``, ``[``: a glob data source), which no output can be.

    Raises:
        ValueError: naming the path.
    """
    path = Path(path)
    if _GLOB.search(path.name):
        raise ValueError(f"{path}: an output cannot be a pattern (it has * ? or [); name one file or folder")
    return path


@dataclasses.dataclass
class _Claim:
    """One output of a :func:`claim_outputs` transaction, and what undoing its claim needs."""

    path: Path
    command: str
    what: str
    folder: bool
    taken: bool  # it holds something (a file, or a folder with more than its mark)
    existed: bool
    had_mark: bool
    shared: bool  # the ranks of one launch, or the shards of an append output, share it: never undone
    record: dict | None = None  # what this claim wrote beside the path (None: nothing)
    before: str | None = None  # the record beside the path before this claim (restored on failure)
    recorded: bool = False  # ``record`` is written
    prepared: bool = False  # emptied, made and marked: what the path holds from here on is this call's


def _check(path, command, what, inputs, overwrite, append, folder) -> _Claim:
    """Check one output of :func:`claim_outputs` against every rule (its docstring), writing nothing."""
    path = check_output_name(path)
    for given in inputs:
        if given is None:
            continue
        how = _overlap(path, Path(given))
        if how is not None:
            raise ValueError(
                f"output {path} {how} the input {given}: writing it would destroy the input; choose another path"
            )
    owner = output_owner(path)
    if owner is not None and owner != command and path.exists():
        raise ValueError(f"{path} holds {owner!r} output, not {what} of {command!r}: choose another path")
    if folder and path.is_file():
        raise ValueError(f"{path} is a file, and {what} go in a folder: give a folder path")
    shared = _in_launch() or append
    if not shared:  # a running command's output: named as such, whatever its folder holds at this moment
        _refuse_live_claim(path)
    taken = path.is_file() or (path.is_dir() and any(c.name != FOLDER_MARK for c in path.iterdir()))
    if taken and not (overwrite or append):
        raise FileExistsError(
            f"{path} already holds {what}: pass --overwrite true to replace them, or give another path"
        )
    if taken and overwrite == "own" and (owner != command or (path.is_dir() and not claimed_folder(path))):
        raise ValueError(
            f"{path} holds something {command!r} did not write (no record of it there): move it, or give another path"
        )
    if taken and path.is_dir() and overwrite and (owner != command or not claimed_folder(path)):
        raise ValueError(
            f"{path} is a folder that obliq did not record as {what} of {command!r}: it is not emptied; "
            "give a new or empty folder"
        )
    claim = _Claim(path, command, what, folder, taken, path.exists(), (path / FOLDER_MARK).is_file(), shared)
    if not (append and taken and owner is None):  # a file of unknown origin appended to is not recorded
        claim.record = {"command": command, "what": what, **process_record()}
    return claim


def _take(claims: list[_Claim], overwrite) -> None:
    """Record every claim (exclusively, unless shared), then empty, make and mark the outputs; a claim
    refused undoes those taken before it."""
    try:
        for claim in claims:
            if claim.record is None:
                continue
            file = _record_file(claim.path)
            file.parent.mkdir(parents=True, exist_ok=True)
            if claim.shared:  # every rank of a launch, every shard of an append (encode), shares it
                claim.before = file.read_text(encoding="utf-8") if file.is_file() else None
                write_text(file, json_text(claim.record) + "\n")
            else:  # of two commands claiming one output, one wins before anything is emptied or written
                claim.before = _take_claim(claim.path, claim.record)
            claim.recorded = True
    except BaseException:
        _withdraw(claims)
        raise
    for claim in claims:
        claim.prepared = True
        path = claim.path
        if claim.taken and path.is_dir() and overwrite:
            _empty(path)  # ranks of one launch may clear at once
        if claim.record is not None and claim.folder:
            path.mkdir(parents=True, exist_ok=True)
            write_text(path / FOLDER_MARK, claim.command + "\n")


def _empty(folder: Path, keep: str | None = None) -> None:
    """Remove everything in ``folder`` but the entry named ``keep``."""
    for child in folder.iterdir():
        if child.name == keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _withdraw(claims: list[_Claim]) -> None:
    """Undo claims (not shared ones): what the call wrote goes (a folder it made stays, empty; a file
    that was there before stays), and each record is put back as it was."""
    for claim in reversed(claims):
        if claim.shared:
            continue
        path = claim.path
        if claim.prepared and claim.folder and path.is_dir():
            _empty(path, keep=FOLDER_MARK if claim.had_mark else None)
        elif claim.prepared and not claim.existed and path.is_file():
            path.unlink(missing_ok=True)
        if claim.recorded:
            if claim.before is None:
                _record_file(path).unlink(missing_ok=True)
            else:
                write_text(_record_file(path), claim.before)


def _claim_all(outputs, command, inputs, overwrite, what, folders, append) -> tuple[dict, list[_Claim]]:
    """The claim :func:`claim_outputs` takes at its start: ``(paths, claims)``."""
    paths = {name: None if path is None else Path(path) for name, path in outputs.items()}
    unknown = set(folders) - set(paths)
    if unknown:
        raise ValueError(f"folders names no output: {sorted(unknown)}")
    refuse_shared_outputs(paths.values())
    inputs = list(inputs)
    claims = [  # every output checked before any is claimed
        _check(
            path,
            command if isinstance(command, str) else command[name],
            what if isinstance(what, str) else what[name],
            inputs,
            overwrite,
            append,
            name in folders,
        )
        for name, path in paths.items()
        if path is not None
    ]
    _take(claims, overwrite)
    return paths, claims


@contextmanager
def claim_outputs(
    outputs: dict[str, str | os.PathLike | None],
    *,
    command: str | dict[str, str],
    inputs=(),
    overwrite: bool | str = False,
    what: str | dict[str, str] = "results",
    folders=(),
    append: bool = False,
) -> Iterator[dict[str, Path | None]]:
    """Claim every output of one command as one transaction: ``with claim_outputs({"out": out, …},
    command=…, inputs=…, overwrite=…) as paths:`` writes them in the block (``paths``: name → Path, None
    for an output not asked for).

    Every output is checked before any is claimed:

    - never an input: refused when it is one of ``inputs``, lies inside an input folder (a task's
      ``corpus.jsonl``) or holds an input (a run file inside an output folder);
    - never a pattern: a name with ``*``, ``?`` or ``[`` (a glob data source) is refused;
    - never two outputs of one call that are the same file (:func:`refuse_shared_outputs`);
    - never replaced without being asked: a file, or a folder that is not empty, is refused unless
      ``overwrite`` (or ``append``, for a command that resumes into its own output);
    - never another command's: a path recorded as written by another command is refused even with
      ``overwrite``; a folder is replaced only when it is the very folder this command made (it is
      emptied first, so no earlier result is left beside the new ones), never a folder of unknown
      origin: a record beside the path is not enough (a failed command leaves one, and a user may
      delete the folder and make another of that name), the folder must also hold the mark
      (:data:`FOLDER_MARK`) that only a claim writes, into the folder it makes.

    Then each is claimed, before anything is emptied or written:

    - never two commands' at once: the record beside each output (:data:`OUTPUT_RECORD`: the command,
      ``what``, and this process: host, pid, start time) is created exclusively (:func:`_take_claim`), so
      of two commands claiming one output at the same moment one wins and the other refuses, and the
      claim of a running process, or of one on another machine (which cannot be told ended), is not
      taken over; the ranks of one launch (``WORLD_SIZE`` > 1) and the shards of an ``append`` output
      (``obliq encode``'s store) share their output.
    - a refused claim undoes those taken before it: a refused call leaves nothing (no record, folder
      or mark, nothing emptied).

    While the block runs, the record is the claim: it names this process, so a second process is
    refused for as long as this one runs, and a process killed in the block leaves it naming the
    command, with the folder's mark: a rerun replaces that partial output with ``--overwrite``.
    On a clean exit each record is rewritten as the record of a finished output (``"complete":
    true``), which no longer excludes another process (this one may live on: a session, the
    quickstart). On an exception in the block (Ctrl-C included) the claims are withdrawn: a folder
    claimed is emptied of what the block wrote (a folder the claim made stays, empty; its mark goes),
    a file the block made is removed (a file that was there before stays, whether or not it was
    rewritten), and each record is put back as it was before the claim; shared outputs are left to
    the other ranks or shards.

    Args:
        outputs: name → the file or folder to write (None: not asked for, skipped).
        command: the command claiming them (``evaluate``, ``distill pairs``…), or name → command.
        inputs: every file and folder the command reads (None entries are skipped).
        overwrite: replace what is there (the command's ``--overwrite``); ``"own"``: replace only what
            is recorded as the command's output (a rerun of the quickstart), refusing anything else.
        what: what the outputs hold, for messages, or name → what.
        folders: the names of the outputs that are folders: each is made here, marked as this claim's.
        append: the command continues its own earlier outputs (``synth generate``): an existing file
            recorded as this command's, or without a record, is kept (the caller checks its content).

    Raises:
        FileExistsError: an output holds something and neither ``overwrite`` nor ``append`` allows it
            (the message says how to proceed).
        ValueError: an input, a pattern, two outputs that are one file, another command's output (both
            named), a file where the output is a folder, or an output a running command holds.
    """
    paths, claims = _claim_all(outputs, command, inputs, overwrite, what, folders, append)
    try:
        yield paths
    except BaseException:
        _withdraw(claims)
        raise
    for claim in claims:
        if claim.recorded:
            write_text(_record_file(claim.path), json_text({**claim.record, "complete": True}) + "\n")


def claim_output(
    path: str | os.PathLike,
    overwrite: bool | str = False,
    what: str = "results",
    *,
    command: str,
    inputs=(),
    append: bool = False,
    folder: bool = False,
) -> Path:
    """``path`` claimed as ``command``'s output for the rest of this process: the start of
    :func:`claim_outputs` alone (no record of a finished output is written, nothing is withdrawn), for
    a session or a test; commands claim their outputs through :func:`claim_outputs`."""
    paths, _ = _claim_all({"output": path}, command, inputs, overwrite, what, ["output"] if folder else [], append)
    return paths["output"]


def _refuse_live_claim(path: Path) -> None:
    """Refuse ``path`` while another process may hold its claim: a record not marked finished whose process
    runs, or whose process is on another machine and so cannot be told ended (:func:`holder_state`). A
    record is whole when linked, so an unreadable one is stale.

    Raises:
        ValueError: naming the holder's command and pid.
    """
    try:
        holder = json.loads(_record_file(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(holder, dict) or holder.get("complete"):
        return
    state = holder_state(holder)
    if state == "running":
        raise ValueError(f"{path}: {holder_text(holder)} is writing it now: wait for it, or give another path")
    if state == "unknown":
        raise ValueError(
            f"{path}: {holder_text(holder)} claimed it and has not finished; from host {socket.gethostname()} "
            f"obliq cannot tell whether it still runs: wait for it, or, if it has ended, delete "
            f"{_record_file(path)} (its claim) and rerun"
        )


def _take_claim(path: Path, record: dict) -> str | None:
    """Write ``path``'s claim record (:data:`OUTPUT_RECORD`) so that of two processes claiming it at once
    exactly one succeeds: the record is created with ``os.link`` (which fails when it exists); an earlier
    record is taken over only when it is no claim (its process has ended, :func:`running`, or it records
    a finished output), by renaming it away first, which one process alone can do.

    Returns:
        The text of the record taken over (None: there was none), which a withdrawn claim puts back.

    Raises:
        ValueError: a running process holds the claim (its command and pid named).
    """
    file = _record_file(path)
    before = None
    for _ in range(4):
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f"{file.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json_text(record) + "\n")
        try:
            os.link(tmp, file)
            return before
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: the claim is recorded, not exclusive
            before = file.read_text(encoding="utf-8") if file.is_file() else before
            os.replace(tmp, file)
            return before
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _refuse_live_claim(path)
        old = f"{file}.{os.getpid()}.old"
        try:  # no claim: taken over by whoever renames it away first
            os.rename(file, old)
        except FileNotFoundError:
            continue
        before = Path(old).read_text(encoding="utf-8")
        os.unlink(old)
    raise ValueError(f"{path}: claimed by other commands at the same moment: give another path")


def refuse_shared_outputs(outputs) -> None:
    """Refuse two outputs of one command that are the same file (after resolving links): one would
    overwrite the other.

    Raises:
        ValueError: naming both.
    """
    seen: dict[str, Path] = {}
    for given in outputs:
        if given is None:
            continue
        key = os.path.realpath(given)
        if key in seen:
            raise ValueError(f"outputs {seen[key]} and {given} are the same file: one would overwrite the other")
        seen[key] = Path(given)
