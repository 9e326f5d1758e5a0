"""Files at the bottom of every stage: how text files are opened, written atomically, and named.

- :func:`open_text` is how obliq opens every text input (JSONL, TSV, TREC, YAML): UTF-8 with a
  leading byte-order mark removed (spreadsheet tools and some editors write one, and it would
  otherwise become part of the first id); :func:`strip_bom` does the same for readers that work on
  bytes (the training-row index keeps byte offsets). Bytes that are not UTF-8 are refused with the
  file and line named (:func:`not_utf8`), and no line read by iterating it (or :func:`bounded_lines`)
  may exceed :data:`MAX_LINE` characters: a file of one endless line is refused, not read into memory.
- :func:`publish` writes a file or folder through a temporary one beside it, renamed into place, so a
  killed process leaves the old one or the new one, never half of one; :func:`atomic_write` is the
  same for a file written through an open handle. A write that fails (disk full, a read-only or
  forbidden folder, the process's file-size limit) is a :class:`~obliq.write_errors.WriteError` naming the
  file.
- :func:`read_id_table` reads the ``id<TAB>value`` tables tasks carry (attributes, sources).
- :func:`safe_name` turns a name found in a file (a task's name) into a folder name that cannot
  leave the output folder.
- the claim of every command's outputs (never an input, never another command's, one transaction) is
  :mod:`obliq.claims`.
- :func:`json_text` / :func:`write_json` are how obliq writes JSON: strict (a NaN or infinity
  becomes ``null``), so any JSON reader can read it back; paths and dataclasses become plain values.
- :func:`cache_dir` is where obliq caches what it computes (``$OBLIQ_CACHE``, default ``~/.cache/obliq``).
- every YAML obliq reads is checked before it is loaded: :mod:`obliq.yaml_checks`.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from obliq.write_errors import write_failed, writing

BOM = codecs.BOM_UTF8
"""The UTF-8 byte-order mark (EF BB BF)."""


def cache_dir() -> Path:
    """The folder where obliq caches converted models, embeddings and row indexes
    (``$OBLIQ_CACHE`` or ``~/.cache/obliq``)."""
    return Path(os.environ.get("OBLIQ_CACHE", Path.home() / ".cache" / "obliq"))


MAX_LINE = 16 * 2**20
"""The longest line obliq reads from a text input (qrels, runs, JSONL rows, TSV tables), in characters (bytes
for a reader of bytes): 16 MiB (16,777,216), far above any document, id list or run line, so a file of one
endless line (a binary file, a JSON array on one line) is refused before it fills the memory."""


def _too_long(source: object, lineno: int, limit: int = MAX_LINE) -> ValueError:
    """The one-line error for a line over ``limit`` characters (``source`` and line named)."""
    return ValueError(
        f"{source}:{lineno}: a line of more than {limit:,} characters (the most obliq reads in one line): "
        "not a text file of lines?"
    )


def bounded_lines(f: IO, source: object, limit: int = MAX_LINE) -> Iterator:
    """The lines of an open file (text or bytes), none read past ``limit`` characters (or bytes).

    Raises:
        ValueError: a line longer than ``limit`` (``source`` and line named).
    """
    lineno = 0
    while line := f.readline(limit + 1):
        lineno += 1
        if len(line) > limit and line[-1:] not in ("\n", b"\n"):
            raise _too_long(source, lineno, limit)
        yield line


def not_utf8(path: str | os.PathLike) -> ValueError:
    """The one-line error for a file that is not UTF-8 text: a binary file (a NUL byte in its first 8 KiB),
    or the line and byte of its first invalid byte (Latin-1 or Windows-1252 text, say)."""
    with open(path, "rb") as f:
        if b"\0" in f.read(8192):
            return ValueError(f"{path}: a binary file, not UTF-8 text")
        f.seek(0)
        try:
            for lineno, raw in enumerate(bounded_lines(f, path), 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    return ValueError(
                        f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte {err.start + 1} of "
                        "the line: Latin-1 or Windows-1252?); save the file as UTF-8"
                    )
        except ValueError as err:  # a line too long to look at: that is the error then
            return err
    return ValueError(f"{path}: not UTF-8 text")


class _TextFile(io.TextIOWrapper):
    """A UTF-8 text file whose lines (when iterated) are bounded (:data:`MAX_LINE`) and whose bytes that
    are not UTF-8 raise :func:`not_utf8`'s error (file and line named) instead of a bare codec error."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(open(path, "rb"), encoding="utf-8-sig")
        self.path, self.lineno = path, 0

    def __next__(self) -> str:
        try:
            line = self.readline(MAX_LINE + 1)
        except UnicodeDecodeError:
            raise not_utf8(self.path) from None
        if not line:
            raise StopIteration
        self.lineno += 1
        if len(line) > MAX_LINE and line[-1] != "\n":
            raise _too_long(self.path, self.lineno)
        return line

    def read(self, size: int | None = -1) -> str:
        try:
            return super().read(size)
        except UnicodeDecodeError:
            raise not_utf8(self.path) from None


def open_text(path: str | os.PathLike) -> IO[str]:
    """Open a text file for reading as UTF-8, dropping a leading byte-order mark (C28); iterating it
    yields lines of at most :data:`MAX_LINE` characters.

    Raises:
        FileNotFoundError: no such file.
        ValueError: (while reading) bytes that are not UTF-8, or a line over :data:`MAX_LINE` characters
            (file and line named).
    """
    return _TextFile(path)


def read_text(path: str | os.PathLike) -> str:
    """The whole of a text file, as :func:`open_text` reads it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: bytes that are not UTF-8 (file and line named: :func:`not_utf8`).
    """
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
        WriteError: ``path`` could not be written: its folder could not be made or written in (read-only,
            no permission), the disk is full (ENOSPC, EDQUOT, EFBIG or EROFS inside the block, also when a
            library reports it as an error of its own: :func:`obliq.write_errors.hidden_write_errno`), or the
            rename failed (``path`` named; :func:`write_failed`).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if folder:
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        else:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            tmp = Path(name)
    except OSError as err:
        raise write_failed(path, err) from None
    try:
        with writing(path, tmp):  # a full disk inside the block is this path's; other errors (a missing input) are not
            yield tmp
        try:
            if not folder:
                os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except OSError as err:
            if folder and path.is_dir():
                raise FileExistsError(f"{path}: a folder is there already (published by another process?)") from err
            raise write_failed(path, err) from None
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


def read_json_object(path: str | os.PathLike, what: str = "the file") -> dict:
    """A file that holds one JSON object (a model's config.json, task.json, a graph, a record), read as text.

    Raises:
        ValueError: not valid JSON (file and line named), or JSON of another type (``what`` is one JSON object).
    """
    try:
        obj = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: {what} is one JSON object, not {type(obj).__name__}")
    return obj


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as strict JSON (:func:`json_text`), atomically, with a final newline."""
    write_text(path, json_text(obj) + "\n")


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
