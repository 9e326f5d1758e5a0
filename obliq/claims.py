"""The claim of every command's outputs, as one transaction (:func:`claim_outputs`): never an input (nor
inside an input folder), never a pattern, never replaced without ``--overwrite``, never another command's
output (a record beside each output names the command that wrote it), never two running commands' at once;
all checked before any is claimed, all withdrawn when the command fails.

An output is the file or folder its path reaches: a symlink, a relative path, one through ``..`` and the
absolute path are one output, with one record (beside the resolved path) and one claim.

A claim's record names the claiming process (:func:`obliq.process.process_record`), so a claim held by a
running process is told from one a killed process left (:func:`obliq.process.holder_state`); a claim of a
process on another machine or in another PID namespace (a container of the same host name), which a pid
cannot tell, is never taken over. The ranks of one multi-process launch are one claimant: rank 0 claims as
a single process does, the other ranks wait for its claim and share it; a second launch is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from obliq.files import json_text, write_text
from obliq.process import holder_state, holder_text, launch_id, launch_rank, pid_namespace, process_record

OUTPUT_RECORD = ".{name}.obliq"
"""The record beside every output a command claims (``<folder>/.<name>.obliq``, JSON, beside the resolved
path): which command wrote it. What ``--overwrite`` may replace is decided from it."""
FOLDER_MARK = ".obliq-output"
"""The file inside an output folder that ``claim_output(folder=True)`` made, naming its command."""
RANK_ZERO_WAIT_S = 600.0
"""How long a rank other than 0 of a launch waits for its rank 0's claim (:func:`claim_outputs`), in seconds."""
_GLOB = re.compile(r"[*?\[]")


def resolved(path: str | os.PathLike) -> Path:
    """The one name of the file or folder ``path`` reaches: absolute, symlinks followed, ``.`` and ``..``
    taken as the file system takes them (``os.path.realpath``); a part that does not exist yet is kept."""
    return Path(os.path.realpath(path))


def _record_file(path: Path) -> Path:
    real = resolved(path)
    return real.parent / OUTPUT_RECORD.format(name=real.name)


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
    """The command recorded as having written ``path`` (:func:`claim_output`; any name of it, :func:`resolved`),
    or None (no record: not written by an obliq command, or by a version before the records; or a file of
    unknown origin an ``append`` claim only adopted while it ran)."""
    try:
        record = json.loads(_record_file(Path(path)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record.get("command") if isinstance(record, dict) and not record.get("adopted") else None


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
    shared: bool  # several processes write it at once by design (an encode store's shards): never undone
    record: dict | None = None  # what this claim writes beside the path (None: nothing: a rank > 0's claim)
    before: str | None = None  # the record beside the path before this claim (restored on failure)
    recorded: bool = False  # ``record`` is written
    prepared: bool = False  # emptied, made and marked: what the path holds from here on is this call's


def _check(path, command, what, inputs, overwrite, append, shared, folder) -> _Claim:
    """Check one output of :func:`claim_outputs` against every rule (its docstring), writing nothing: a
    rank other than 0 of a launch checks only what does not change while its rank 0 claims and writes."""
    given = check_output_name(path)
    for source in inputs:
        if source is None:
            continue
        how = _overlap(given, Path(source))
        if how is not None:
            raise ValueError(
                f"output {given} {how} the input {source}: writing it would destroy the input; choose another path"
            )
    path = resolved(given)  # one output, one record, whatever name reached it
    owner = output_owner(path)
    if owner is not None and owner != command and path.exists():
        raise ValueError(f"{path} holds {owner!r} output, not {what} of {command!r}: choose another path")
    if folder and path.is_file():
        raise ValueError(f"{path} is a file, and {what} go in a folder: give a folder path")
    existed, had_mark = path.exists(), (path / FOLDER_MARK).is_file()
    if not shared and (launch_rank() or 0) > 0:  # rank 0 of this launch claims it for every rank
        return _Claim(path, command, what, folder, False, existed, had_mark, shared=True)
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
    claim = _Claim(path, command, what, folder, taken, existed, had_mark, shared)
    claim.record = {"command": command, "what": what, **process_record()}
    if append and taken and owner is None:  # a file of unknown origin appended to: held, never recorded as ours
        claim.record["adopted"] = True
    return claim


def _await_rank_zero(claims: list[_Claim], timeout_s: float) -> None:
    """Wait until rank 0 of this launch holds every output, made and emptied as asked (its record beside
    each names this launch and the command, prepared or finished), for a process of another rank.

    Raises:
        TimeoutError: naming the first output rank 0 did not claim (it was refused: see its error).
    """
    launch, deadline = launch_id(), time.monotonic() + timeout_s
    for claim in claims:
        while True:
            try:
                record = json.loads(_record_file(claim.path).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                record = None
            ours = (
                isinstance(record, dict) and record.get("launch") == launch and record.get("command") == claim.command
            )
            if ours and (record.get("prepared") or record.get("complete")):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{claim.path}: rank 0 of this launch ({launch or 'no launcher variables'}) did not claim it "
                    f"in {timeout_s:.0f} s (refused? see rank 0's error)"
                )
            time.sleep(0.05)


def _take(claims: list[_Claim], overwrite) -> None:
    """Record every claim (exclusively, unless shared), then empty, make and mark the outputs; a claim
    refused undoes those taken before it. Rank 0 of a launch then marks its records ``"prepared"``: what
    its other ranks wait for (:func:`_await_rank_zero`)."""
    try:
        for claim in claims:
            if claim.record is None:
                continue
            file = _record_file(claim.path)
            file.parent.mkdir(parents=True, exist_ok=True)
            if claim.shared:  # every shard of an encode store shares it
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
            _empty(path)
        if claim.record is not None and claim.folder:
            path.mkdir(parents=True, exist_ok=True)
            write_text(path / FOLDER_MARK, claim.command + "\n")
    if launch_rank() == 0:
        for claim in claims:
            if claim.recorded and not claim.shared:
                claim.record = {**claim.record, "prepared": True}
                write_text(_record_file(claim.path), json_text(claim.record) + "\n")


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


def _claim_all(outputs, command, inputs, overwrite, what, folders, append, shared) -> tuple[dict, list[_Claim]]:
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
            shared,
            name in folders,
        )
        for name, path in paths.items()
        if path is not None
    ]
    if any(claim.shared and claim.record is None for claim in claims):  # a rank > 0: its rank 0 claims
        _await_rank_zero(claims, RANK_ZERO_WAIT_S)
        return paths, []
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
    shared: bool = False,
) -> Iterator[dict[str, Path | None]]:
    """Claim every output of one command as one transaction: ``with claim_outputs({"out": out, …},
    command=…, inputs=…, overwrite=…) as paths:`` writes them in the block (``paths``: name → Path, None
    for an output not asked for, each as given).

    An output is what its path reaches (:func:`resolved`): a symlink, a relative path or one through
    ``..`` is the same output as its absolute path, checked and claimed once, under one record.
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
      ``what``, and this process: host, boot, PID namespace, pid, start time, launch) is created
      exclusively (:func:`_take_claim`), so of two commands claiming one output at the same moment one
      wins and the other refuses, and the claim of a running process, or of one on another machine or
      in another PID namespace (which cannot be told ended, C61), is not taken over; an ``append``
      output (a resumed ``synth generate``) is claimed so too.
    - the ranks of one launch (``WORLD_SIZE`` > 1) are one claimant (C62): rank 0 claims as a single
      process does; every other rank checks only what does not change while rank 0 writes, then waits
      (up to :data:`RANK_ZERO_WAIT_S`) for rank 0's record naming its launch (:func:`obliq.process.launch_id`)
      and shares it: it records, empties, marks and withdraws nothing, and finds its rank 0's results
      however late it comes. Rank 0 of another launch is refused as any other process is.
    - ``shared`` outputs (``obliq encode``'s store, written by its shards at once) are recorded without
      exclusion and never withdrawn.
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
    rewritten), and each record is put back as it was before the claim; ``shared`` outputs are left to
    the other shards.

    Args:
        outputs: name → the file or folder to write (None: not asked for, skipped).
        command: the command claiming them (``evaluate``, ``distill pairs``…), or name → command.
        inputs: every file and folder the command reads (None entries are skipped).
        overwrite: replace what is there (the command's ``--overwrite``); ``"own"``: replace only what
            is recorded as the command's output (a rerun of the quickstart), refusing anything else.
        what: what the outputs hold, for messages, or name → what.
        folders: the names of the outputs that are folders: each is made here, marked as this claim's.
        append: the command continues its own earlier outputs (``synth generate``): an existing file
            recorded as this command's, or without a record, is kept (the caller checks its content; a
            file without a record is held while the command runs, never recorded as its output).
        shared: several processes write these outputs at once by design (the shards of one store).

    Raises:
        FileExistsError: an output holds something and neither ``overwrite`` nor ``append`` allows it
            (the message says how to proceed).
        ValueError: an input, a pattern, two outputs that are one file, another command's output (both
            named), a file where the output is a folder, or an output a running command holds (or one
            that obliq cannot tell ended: another machine's, another PID namespace's).
        TimeoutError: a rank other than 0 whose rank 0 claimed nothing in :data:`RANK_ZERO_WAIT_S`.
    """
    paths, claims = _claim_all(outputs, command, inputs, overwrite, what, folders, append, shared)
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
    shared: bool = False,
) -> Path:
    """``path`` claimed as ``command``'s output for the rest of this process: the start of
    :func:`claim_outputs` alone (no record of a finished output is written, nothing is withdrawn), for
    a session or a test; commands claim their outputs through :func:`claim_outputs`."""
    folders = ["output"] if folder else []
    paths, _ = _claim_all({"output": path}, command, inputs, overwrite, what, folders, append, shared)
    return paths["output"]


def _refuse_live_claim(path: Path) -> None:
    """Refuse ``path`` while another process may hold its claim: a record not marked finished whose process
    runs, or whose process is on another machine or in another PID namespace and so cannot be told ended
    (:func:`obliq.process.holder_state`). A record is whole when linked, so an unreadable one is stale.

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
            f"(pid {os.getpid()}, {pid_namespace() or 'PID namespace unknown'}) obliq cannot tell whether it "
            f"still runs, on another machine or in another PID namespace: wait for it, or, if it has ended, "
            f"delete {_record_file(path)} (its claim) and rerun"
        )


def _take_claim(path: Path, record: dict) -> str | None:
    """Write ``path``'s claim record (:data:`OUTPUT_RECORD`) so that of two processes claiming it at once
    exactly one succeeds: the record is created with ``os.link`` (which fails when it exists); an earlier
    record is taken over only when it is no claim (its process has ended, :func:`_refuse_live_claim`, or it records
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
