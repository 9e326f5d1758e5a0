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
- :func:`claim_output` and :func:`refuse_input_as_output`: no command overwrites earlier results unless
  asked, and no output path is one of the command's inputs.
- :func:`json_text` / :func:`write_json` are how obliq writes JSON: strict (a NaN or infinity
  becomes ``null``), so any JSON reader can read it back; paths and dataclasses become plain values.
- :func:`cache_dir` is where obliq caches what it computes (``$OBLIQ_CACHE``, default ``~/.cache/obliq``).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import math
import os
import re
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


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as strict JSON (:func:`json_text`), atomically, with a final newline."""
    write_text(path, json_text(obj) + "\n")


def claim_output(path: str | os.PathLike, overwrite: bool = False, what: str = "results") -> Path:
    """``path`` as an output a command may write: refused when it already holds something (a file, or
    a folder that is not empty) unless ``overwrite``.

    Raises:
        FileExistsError: it holds something and ``overwrite`` is false (the message says how to proceed).
    """
    path = Path(path)
    taken = path.is_file() or (path.is_dir() and any(path.iterdir()))
    if taken and not overwrite:
        raise FileExistsError(
            f"{path} already holds {what}: pass --overwrite true to replace them, or give another path"
        )
    return path


def refuse_input_as_output(output: str | os.PathLike, inputs, what: str = "output") -> None:
    """Refuse an output path that is one of the inputs (the same file after resolving links).

    Raises:
        ValueError: ``output`` is one of ``inputs`` (both named).
    """
    out = Path(output)
    for given in inputs:
        if given is None:
            continue
        source = Path(given)
        same = os.path.realpath(out) == os.path.realpath(source)
        if not same and out.exists() and source.exists():
            same = os.path.samefile(out, source)
        if same:
            raise ValueError(
                f"{what} {out} is the input {source}: writing it would destroy the input; choose another path"
            )


def files_in(folder: str | os.PathLike) -> list[Path]:
    """Every file under ``folder`` (none when it is not a folder): a task folder's files, which no
    output may be (:func:`refuse_input_as_output`)."""
    return [p for p in Path(folder).rglob("*") if p.is_file()] if Path(folder).is_dir() else []


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


def safe_name(name: str, what: str = "name") -> str:
    """A folder name made from ``name``: runs of characters other than letters, digits, ``_``, ``.``
    and ``-`` (path separators among them) and runs of two or more dots become ``_``, and leading or
    trailing ``.``, ``_`` and ``-`` go, so the folder can never leave the folder it is made in
    (``../../x`` → ``x``, ``a/b`` → ``a_b``).

    Raises:
        ValueError: nothing usable is left (``..``, ``/``; the message names ``what``).
    """
    out = re.sub(r"_+", "_", re.sub(r"\.{2,}", "_", _UNSAFE.sub("_", str(name)))).strip("._-")
    if not out:
        raise ValueError(f"{what} {name!r} cannot be used as a folder name")
    return out
