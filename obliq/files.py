"""Files at the bottom of every stage: how text files are opened, written atomically, and named.

- :func:`open_text` is how obliq opens every text input (JSONL, TSV, TREC, YAML): UTF-8 with a
  leading byte-order mark removed (spreadsheet tools and some editors write one, and it would
  otherwise become part of the first id); :func:`strip_bom` does the same for readers that work on
  bytes (the training-row index keeps byte offsets).
- :func:`publish` writes a file or folder through a temporary one beside it, renamed into place, so a
  killed process leaves the old one or the new one, never half of one; :func:`atomic_write` is the
  same for a file written through an open handle.
- :func:`read_id_table` reads the ``id<TAB>value`` tables tasks carry (attributes, sources).
- :func:`safe_name` turns a name found in a file (a task's name) into a folder name that cannot
  leave the output folder.
- :func:`claim_outputs`: the one claim of every command's outputs, as one transaction: never an input
  (nor inside an input folder), never a pattern, never replaced without ``--overwrite``, never another
  command's output (a record beside each output names the command that wrote it), never two running
  commands' at once; all checked before any is claimed, all withdrawn when the command fails.
- :func:`json_text` / :func:`write_json` are how obliq writes JSON: strict (a NaN or infinity
  becomes ``null``), so any JSON reader can read it back; paths and dataclasses become plain values.
- :func:`cache_dir` is where obliq caches what it computes (``$OBLIQ_CACHE``, default ``~/.cache/obliq``).
- :func:`check_yaml` / :func:`load_yaml`: every YAML obliq reads (configs, recipes, policies, prompt
  files) is refused when a key is given twice in one mapping (a plain loader keeps the last silently)
  or when its aliases expand past :data:`MAX_YAML_NODES` (a nested-alias "billion laughs" would run
  until killed); :func:`install_yaml_checks` puts the check in front of jsonargparse's loaders.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

BOM = codecs.BOM_UTF8
"""The UTF-8 byte-order mark (EF BB BF)."""


def cache_dir() -> Path:
    """The folder where obliq caches converted models, embeddings and row indexes
    (``$OBLIQ_CACHE`` or ``~/.cache/obliq``)."""
    return Path(os.environ.get("OBLIQ_CACHE", Path.home() / ".cache" / "obliq"))


def open_text(path: str | os.PathLike) -> IO[str]:
    """Open a text file for reading as UTF-8, dropping a leading byte-order mark (C28).

    Raises:
        FileNotFoundError: no such file.
    """
    return open(path, encoding="utf-8-sig")


def read_text(path: str | os.PathLike) -> str:
    """The whole of a text file, as :func:`open_text` reads it."""
    with open_text(path) as f:
        return f.read()


def strip_bom(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 byte-order mark (for readers of the first line of a file in bytes)."""
    return data[len(BOM) :] if data.startswith(BOM) else data


@contextmanager
def publish(path: str | os.PathLike, folder: bool = False) -> Iterator[Path]:
    """Publish ``path`` all at once: the block writes the temporary file (or, with ``folder``, the
    temporary folder) it is given, beside ``path`` (``.<name>.<random>.tmp``); it is renamed onto
    ``path`` when the block ends without an error and removed otherwise, so a killed process leaves the
    old ``path`` or the new one, never half of one (a killed process's temporary file may stay: it is
    named so that its writer can find it). A published file is readable by all (0644); ``path``'s
    folder is created.

    Raises:
        FileExistsError: (``folder``) ``path`` is a folder that is not empty, e.g. one another process
            published first: a folder is never replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    else:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if not folder:
            os.chmod(tmp, 0o644)
        try:
            os.replace(tmp, path)
        except OSError as err:
            if folder and path.is_dir():
                raise FileExistsError(f"{path}: a folder is there already (published by another process?)") from err
            raise
    finally:
        if folder:
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Write ``path`` all at once (:func:`publish`): the block writes an open temporary file beside it,
    renamed over ``path`` when the block ends without an error (the temporary file is removed otherwise).

    Args:
        path: the file to write; its folder is created.
        mode: ``"w"`` (UTF-8 text) or ``"wb"``.
    """
    with publish(path) as tmp, open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        yield f


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file atomically (:func:`atomic_write`)."""
    with atomic_write(path) as f:
        f.write(text)


def _plain(obj):
    """``obj`` with non-finite floats as None, dataclasses as dicts, paths and other objects as strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # a numpy or torch scalar
        return _plain(obj.item())
    return str(obj)


def json_text(obj, indent: int | None = 2) -> str:
    """Strict JSON for ``obj`` (see the module notes); one line when ``indent`` is None."""
    return json.dumps(_plain(obj), indent=indent, ensure_ascii=False, allow_nan=False)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (what a merge compares to know its shards read the same input)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as strict JSON (:func:`json_text`), atomically, with a final newline."""
    write_text(path, json_text(obj) + "\n")


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


def process_record() -> dict:
    """This process as a record names it: ``{"host", "pid", "process_start"}`` (:func:`running` reads it)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid())}


def running(record: dict) -> bool:
    """Whether another process a record names (:func:`process_record`) still runs on this machine (another
    machine's cannot be known: False)."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    start = process_start(pid)
    return start is not None and start == record.get("process_start")


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
    shared = _in_launch() or append
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
            what,
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
    what: str = "results",
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
      claim of a running process is not taken over; the ranks of one launch (``WORLD_SIZE`` > 1) and
      the shards of an ``append`` output (``obliq encode``'s store) share their output.
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
        what: what the outputs hold, for messages.
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
        try:
            holder = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            holder = None
        # a record is whole when linked: unreadable is stale
        if isinstance(holder, dict) and not holder.get("complete") and running(holder):
            raise ValueError(
                f"{path}: {holder.get('command')!r} in process {holder.get('pid')} is writing it now: "
                "wait for it, or give another path"
            )
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


MAX_YAML_NODES = 200_000
"""The most nodes a YAML document may hold once its aliases are expanded (a recipe holds a few hundred)."""


def check_yaml(text: str, source: object = "YAML") -> None:
    """Refuse a YAML document that a loader would read wrongly or forever, before it is loaded.

    Raises:
        ValueError: a key given twice in one mapping (file, line and key named); aliases that expand
            to more than :data:`MAX_YAML_NODES` nodes (refused in time linear in the document's size).
        yaml.YAMLError: not YAML at all.
    """
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return
    size: dict[int, int] = {}
    visiting: set[int] = set()
    stack = [(root, False)]
    while stack:  # expanded sizes bottom-up over the node graph (aliases are shared nodes)
        node, done = stack.pop()
        if id(node) in size:
            continue
        if not done and id(node) in visiting:
            raise ValueError(f"{source}: an alias refers to a node that holds it (a recursive YAML structure)")
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            size[id(node)] = 1
            continue
        if done:
            visiting.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            if size[id(node)] > MAX_YAML_NODES:
                raise ValueError(
                    f"{source}: its aliases expand to more than {MAX_YAML_NODES:,} nodes (a nested-alias bomb?); "
                    "refused before loading"
                )
            continue
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        raise ValueError(
                            f"{source}:{line}: key {key.value!r} given twice in one mapping (first on line "
                            f"{seen[key.value]}); a loader would keep the last silently: remove one"
                        )
                    seen[key.value] = line
        visiting.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    if isinstance(root, yaml.MappingNode):
        _check_dotted_keys(root, source)


def _check_dotted_keys(root, source: object) -> None:
    """Refuse a setting given twice through a dotted key and a nested one (``trainer.max_steps: 5`` beside
    ``trainer: {max_steps: 10}``): jsonargparse reads both as one key and keeps one silently."""
    import yaml

    seen: dict[tuple[str, ...], int] = {}  # leaf path → line
    below: set[tuple[str, ...]] = set()  # the proper prefixes of the leaf paths
    stack = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            path = prefix + tuple(str(key.value).split("."))
            line = key.start_mark.line + 1
            if isinstance(value, yaml.MappingNode) and value.value:
                stack.append((value, path))
                continue
            clash = [path] if path in seen or path in below else []
            clash += [path[:i] for i in range(1, len(path)) if path[:i] in seen]
            if clash:
                other = next((o for o in seen if o[: len(path)] == path or path[: len(o)] == o), clash[0])
                raise ValueError(
                    f"{source}:{line}: {'.'.join(path)!r} is also set on line {seen[other]} "
                    f"(as {'.'.join(other)!r}, dotted or nested): a loader would keep one silently: remove one"
                )
            seen[path] = line
            below.update(path[:i] for i in range(1, len(path)))


def load_yaml(text: str, source: object = "YAML"):
    """``yaml.safe_load`` of ``text`` after :func:`check_yaml`.

    Raises:
        ValueError: see :func:`check_yaml`, and a YAML syntax error (``source`` named).
    """
    import yaml

    try:
        check_yaml(text, source)
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not valid YAML ({str(err).splitlines()[0]})") from None


def install_yaml_checks() -> None:
    """Put :func:`check_yaml` in front of jsonargparse's YAML loaders (modes ``yaml`` and ``omegaconf+``),
    so ``obliq --config``, ``train.py --config`` and every YAML value on a command line are checked."""
    from jsonargparse import _loaders_dumpers as loaders

    for mode in ("yaml", "omegaconf+"):
        if mode not in loaders.loaders and mode.startswith("omegaconf"):
            loaders.set_omegaconf_loader(mode)
        base = loaders.loaders[mode]
        if getattr(base, "_obliq_checked", False):
            continue

        def checked(text, *args, _base=base, **kwargs):
            if isinstance(text, str):
                check_yaml(text, "config")
            return _base(text, *args, **kwargs)

        checked._obliq_checked = True
        loaders.loaders[mode] = checked


def read_id_table(path: str | os.PathLike, value: str = "attribute") -> dict[str, str]:
    """Read a two-column TSV with a header line: ``corpus-id<TAB><value>`` (a task's ``attributes.tsv``,
    ``sources.tsv``, a lean table).

    Returns:
        corpus id → value.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line without exactly two tab-separated columns, an empty field, or an id listed
            twice (file, line and field named).
    """
    path = Path(path)
    out: dict[str, str] = {}
    where: dict[str, int] = {}
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) != 2:
                raise ValueError(
                    f"{path}:{lineno}: expected 2 tab-separated columns (corpus-id, {value}), got {len(cols)}"
                )
            if lineno == 1 and cols[0].strip().lower() in ("corpus-id", "doc-id", "id", "_id"):
                continue
            doc, val = cols[0].strip(), cols[1].strip()
            if not doc:
                raise ValueError(f"{path}:{lineno}: field 'corpus-id' is empty")
            if not val:
                raise ValueError(f"{path}:{lineno}: field {value!r} is empty")
            if doc in out:
                raise ValueError(f"{path}:{lineno}: corpus-id {doc!r} already given on line {where[doc]}")
            out[doc], where[doc] = val, lineno
    return out


_UNSAFE = re.compile(r"[^\w.\-]+")
MAX_NAME_BYTES = 200
"""The longest folder name :func:`safe_name` makes, in UTF-8 bytes: a longer one is cut and ends in a
digest of the whole name, so two long names stay two folders."""


def safe_name(name: str, what: str = "name") -> str:
    """A folder name made from ``name``: runs of characters other than letters, digits, ``_``, ``.``
    and ``-`` (path separators among them) and runs of two or more dots become ``_``, and leading or
    trailing ``.``, ``_`` and ``-`` go, so the folder can never leave the folder it is made in
    (``../../x`` → ``x``, ``a/b`` → ``a_b``); a name over :data:`MAX_NAME_BYTES` is cut and given
    a digest of the whole name.

    Raises:
        ValueError: nothing usable is left (``..``, ``/``; the message names ``what``).
    """
    out = re.sub(r"_+", "_", re.sub(r"\.{2,}", "_", _UNSAFE.sub("_", str(name)))).strip("._-")
    if not out:
        raise ValueError(f"{what} {name!r} cannot be used as a folder name")
    if len(out.encode()) > MAX_NAME_BYTES:  # a file name holds 255 bytes ([Errno 36] beyond)
        digest = hashlib.sha256(str(name).encode()).hexdigest()[:12]
        cut = out.encode()[: MAX_NAME_BYTES - 13].decode(errors="ignore").rstrip("._-")
        out = f"{cut}-{digest}"
    return out
