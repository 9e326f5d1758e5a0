"""Files at the bottom of every stage: how text files are opened, written atomically, and named.

- :func:`open_text` is how obliq opens every text input (JSONL, TSV, TREC, YAML): UTF-8 with a
  leading byte-order mark removed (spreadsheet tools and some editors write one, and it would
  otherwise become part of the first id); :func:`strip_bom` does the same for readers that work on
  bytes (the training-row index keeps byte offsets).
- :func:`atomic_write` writes a file through a temporary file in the same folder and renames it into
  place, so a killed process leaves the old file or the new one, never half of one.
- :func:`read_id_table` reads the ``id<TAB>value`` tables tasks carry (attributes, sources).
- :func:`safe_name` turns a name found in a file (a task's name) into a folder name that cannot
  leave the output folder.
- :func:`claim_output`: the one claim of every command's outputs: never an input (nor inside an input
  folder), never a pattern, never replaced without ``--overwrite``, never another command's output (a
  record beside each output names the command that wrote it).
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
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Write ``path`` all at once: the block writes a temporary file beside it, renamed over
    ``path`` when the block ends without an error (the temporary file is removed otherwise).

    Args:
        path: the file to write; its folder is created.
        mode: ``"w"`` (UTF-8 text) or ``"wb"``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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


def claim_output(
    path: str | os.PathLike,
    overwrite: bool = False,
    what: str = "results",
    *,
    command: str | None = None,
    inputs=(),
    append: bool = False,
    folder: bool = False,
) -> Path:
    """``path`` as an output of ``command``: the one claim every command's outputs go through.

    - never an input: refused when it is one of ``inputs``, lies inside an input folder (a task's
      ``corpus.jsonl``) or holds an input (a run file inside an output folder);
    - never a pattern: a name with ``*``, ``?`` or ``[`` (a glob data source) is refused;
    - never replaced without being asked: a file, or a folder that is not empty, is refused unless
      ``overwrite`` (or ``append``, for a command that resumes into its own output);
    - never another command's: a path recorded as written by another command is refused even with
      ``overwrite``; a folder is replaced only when it is the very folder this command made (it is
      emptied first, so no earlier result is left beside the new ones), never a folder of unknown
      origin: a record beside the path is not enough (a failed command leaves one, and a user may
      delete the folder and make another of that name), the folder must also hold the mark
      (:data:`FOLDER_MARK`) that only ``claim_output(folder=True)`` writes, into the folder it makes.

    - never two commands' at once: the claim record is created exclusively (:func:`_take_claim`), so
      of two commands claiming one output at the same moment one wins and the other refuses, and a
      claim held by a running process is not taken over; the ranks of one launch (``WORLD_SIZE`` > 1)
      and the shards of an ``append`` output (``obliq encode``'s store) share their output.

    The claim is recorded beside the path (:data:`OUTPUT_RECORD`) when ``command`` is given, with the
    claiming process (host, pid, start time).

    Args:
        path: the file or folder to write.
        overwrite: replace what is there (the command's ``--overwrite``).
        what: what the output holds, for messages.
        command: the command claiming it (``evaluate``, ``distill pairs``…).
        inputs: every file and folder the command reads (None entries are skipped).
        append: the command continues its own earlier output (``synth generate``): an existing file
            recorded as this command's, or without a record, is kept (the caller checks its content).
        folder: the output is a folder: it is made here, marked as this claim's.

    Raises:
        FileExistsError: it holds something and neither ``overwrite`` nor ``append`` allows it (the
            message says how to proceed).
        ValueError: an input, a pattern, another command's output (both named), a file where the
            output is a folder, or an output a running command holds.
    """
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
    if command is not None and owner is not None and owner != command and path.exists():
        raise ValueError(f"{path} holds {owner!r} output, not {what} of {command!r}: choose another path")
    if folder and path.is_file():
        raise ValueError(f"{path} is a file, and {what} go in a folder: give a folder path")
    taken = path.is_file() or (path.is_dir() and any(c.name != FOLDER_MARK for c in path.iterdir()))
    if taken and not (overwrite or append):
        raise FileExistsError(
            f"{path} already holds {what}: pass --overwrite true to replace them, or give another path"
        )
    if taken and path.is_dir() and overwrite and (command is None or owner != command or not claimed_folder(path)):
        raise ValueError(
            f"{path} is a folder that obliq did not record as {what} of {command!r}: it is not emptied; "
            "give a new or empty folder"
        )
    record = None
    if command is not None and not (append and taken and owner is None):  # a file of unknown origin is not
        record = {"command": command, "what": what, **process_record()}
        path.parent.mkdir(parents=True, exist_ok=True)
        if _in_launch() or append:  # every rank of a launch, every shard of an append (encode), shares it
            write_text(_record_file(path), json_text(record) + "\n")
        else:  # of two commands claiming one output, one wins before anything is emptied or written
            _take_claim(path, record)
    if taken and path.is_dir() and overwrite:
        for child in path.iterdir():  # ranks of one launch may clear at once
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    if record is not None and folder:
        path.mkdir(parents=True, exist_ok=True)
        write_text(path / FOLDER_MARK, command + "\n")
    return path  # made this command's by claiming it: its caller checks what it holds first


def _take_claim(path: Path, record: dict) -> None:
    """Write ``path``'s claim record (:data:`OUTPUT_RECORD`) so that of two processes claiming it at once
    exactly one succeeds: the record is created with ``os.link`` (which fails when it exists); an earlier
    claim is taken over only when its process has ended (:func:`running`), by renaming it away first,
    which one process alone can do.

    Raises:
        ValueError: a running process holds the claim (its command and pid named).
    """
    file = _record_file(path)
    for _ in range(4):
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f"{file.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json_text(record) + "\n")
        try:
            os.link(tmp, file)
            return
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: the claim is recorded, not exclusive
            os.replace(tmp, file)
            return
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        try:
            holder = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            holder = None
        if isinstance(holder, dict) and running(holder):  # a record is whole when linked: unreadable is stale
            raise ValueError(
                f"{path}: {holder.get('command')!r} in process {holder.get('pid')} is writing it now: "
                "wait for it, or give another path"
            )
        try:  # a finished claim: taken over by whoever renames it away first
            os.rename(file, f"{file}.{os.getpid()}.old")
            os.unlink(f"{file}.{os.getpid()}.old")
        except FileNotFoundError:
            continue
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
