"""A cached on-disk index of the valid rows of one JSONL file, so rows can be read by number.

One pass over the file parses and validates every line (:func:`obliq.data.rows.parse_row`) and
writes, for each valid row, its byte offset, byte length, line number, id hash, a hash of the row's
bytes (``content``: what a resume compares, since the same ids with other texts are other rows), task
(a code into the file's task names), number of positives and identity keys
(:meth:`obliq.data.rows.TrainingRow.keys`: the query's, each positive's and each negative's id and text
hashes, what a step plan needs to keep texts apart and to group steps by task) as flat binary arrays
in a cache folder keyed by the file's real path, size and modification time (and :data:`INDEX_VERSION`,
so a cache of another layout is rebuilt).
Training then memory-maps the arrays and reads any row with one ``pread``; nothing of the file is
held in memory, and the build itself writes its arrays in fixed-size chunks, so memory stays flat
with the number of rows (48 bytes per row plus 16 per text of the row, on disk, in the page cache).

Bad rows: with ``on_bad_row="fail"`` the first one raises :class:`~obliq.data.rows.RowError`; with
``"skip"`` every bad row is left out of the index, counted by kind (:data:`~obliq.data.rows.ERROR_KINDS`)
and its ``file:line:field`` message written to ``errors.txt`` in the index folder. Blank lines are
not rows and are passed over silently. Repairs (lone surrogates, NUL) are counted per character and
per row. A cache built in skip mode that holds skipped rows makes a later fail-mode run raise that
file's first error.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from obliq.data.rows import RowError, parse_row
from obliq.files import publish
from obliq.text import id_hash

INDEX_VERSION = 4
"""The layout of the arrays (part of the cache key): 3 = ``content`` (issue 24) with ``tasks`` and ``keys``
(issue 22); 4 = ``n_positives`` (issue 47: rows with several positives); a cache of an older version is
rebuilt."""
_ARRAYS = {
    "offsets": ("Q", np.uint64),
    "lengths": ("I", np.uint32),
    "lines": ("Q", np.uint64),
    "ids": ("q", np.int64),
    "content": ("q", np.int64),
    "tasks": ("i", np.int32),
    "n_keys": ("I", np.uint32),
    "n_positives": ("I", np.uint32),
}
"""Per-row arrays, shape ``(rows,)``; ``keys`` (int64, shape ``(total keys,)``) holds each row's
``n_keys`` keys, rows one after another."""
_CHUNK = 1 << 16


@dataclass
class FileIndex:
    """The valid rows of one file.

    Attributes:
        path: the file, as given (used in messages).
        folder: the cache folder holding ``meta.json`` and the arrays.
        rows: number of valid rows.
        skipped: bad rows left out, by kind (empty in fail mode).
        repaired_chars: characters replaced by :func:`~obliq.text.repair_text` in valid rows.
        repaired_rows: valid rows with at least one repair.
    """

    path: str
    folder: Path
    rows: int
    skipped: dict[str, int] = field(default_factory=dict)
    repaired_chars: int = 0
    repaired_rows: int = 0
    task_names: list[str] = field(default_factory=list)
    """The tasks of the file's rows; ``array("tasks")`` holds indexes into this list."""
    total_keys: int = 0

    def array(self, name: str) -> np.ndarray:
        """A read-only memory map of one array: ``offsets`` (uint64, bytes), ``lengths`` (uint32, bytes),
        ``lines`` (uint64, 1-based line numbers), ``ids`` (int64 id hashes), ``content`` (int64 hashes of
        each row's bytes), ``tasks`` (int32 codes into :attr:`task_names`), ``n_keys`` (uint32),
        ``n_positives`` (uint32), all of shape ``(rows,)``; or ``keys`` (int64, shape ``(total_keys,)``: each
        row's keys in turn)."""
        dtype, n = (np.int64, self.total_keys) if name == "keys" else (_ARRAYS[name][1], self.rows)
        if n == 0:
            return np.empty(0, dtype)
        return np.memmap(self.folder / f"{name}.bin", dtype=dtype, mode="r", shape=(n,))


def _key(path: str) -> str:
    st = os.stat(path)
    text = f"{INDEX_VERSION}\0{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _load(path: str, folder: Path, on_bad_row: str) -> FileIndex:
    meta = json.loads((folder / "meta.json").read_text())
    if on_bad_row == "fail" and meta["first_error"] is not None:
        e = meta["first_error"]
        raise RowError(path, e["line"], e["field"], e["kind"], e["reason"])
    return FileIndex(
        path,
        folder,
        meta["rows"],
        meta["skipped"],
        meta["repaired_chars"],
        meta["repaired_rows"],
        meta["task_names"],
        meta["total_keys"],
    )


def index_file(path: str | os.PathLike, index_dir: str | os.PathLike, on_bad_row: str = "fail") -> FileIndex:
    """Return the index of ``path``, building and caching it under ``index_dir`` on first use.

    Args:
        path: a JSONL file of training rows.
        index_dir: cache root; the index lives in ``index_dir/<key>/`` (key: real path, size, mtime).
        on_bad_row: ``"fail"`` or ``"skip"`` (see the module docstring).

    Raises:
        RowError: ``on_bad_row="fail"`` and the file has a bad row.
        ValueError: ``on_bad_row`` is neither ``"fail"`` nor ``"skip"``.
        OSError: the file cannot be read or the cache written.
    """
    if on_bad_row not in ("fail", "skip"):
        raise ValueError(f"on_bad_row must be 'fail' or 'skip', got {on_bad_row!r}")
    path = str(path)
    folder = Path(index_dir) / _key(path)
    if (folder / "meta.json").is_file():
        return _load(path, folder, on_bad_row)

    try:
        with publish(folder, folder=True) as tmp:
            with ExitStack() as stack:
                outs = {name: stack.enter_context(open(tmp / f"{name}.bin", "wb")) for name in (*_ARRAYS, "keys")}
                errors = stack.enter_context(open(tmp / "errors.txt", "w", encoding="utf-8", errors="backslashreplace"))
                f = stack.enter_context(open(path, "rb"))
                buffers = {name: array(code) for name, (code, _) in _ARRAYS.items()}
                buffers["keys"] = array("q")
                tasks: dict[str, int] = {}
                skipped: Counter[str] = Counter()
                rows = repaired_chars = repaired_rows = offset = 0
                first_error = None
                for line, raw in enumerate(f, start=1):
                    if raw.strip():
                        try:
                            row = parse_row(raw, path, line)
                        except RowError as err:
                            if on_bad_row == "fail":
                                raise
                            skipped[err.kind] += 1
                            errors.write(f"{err}\n")
                            if first_error is None:
                                first_error = {
                                    "line": err.line,
                                    "field": err.field,
                                    "kind": err.kind,
                                    "reason": err.reason,
                                }
                        else:
                            if len(raw) >= 1 << 32:
                                raise RowError(path, line, "(row)", "json", "line longer than 4 GiB")
                            keys = row.keys()
                            task = tasks.setdefault(row.task, len(tasks))
                            content = int.from_bytes(
                                hashlib.sha256(raw.rstrip(b"\r\n")).digest()[:8], "little", signed=True
                            )
                            n_pos = len(row.positives)
                            values = (offset, len(raw), line, id_hash(row.id), content, task, len(keys), n_pos)
                            for name, value in zip(_ARRAYS, values):
                                buffers[name].append(value)
                            buffers["keys"].extend(keys)
                            rows += 1
                            repaired_chars += row.repairs
                            repaired_rows += row.repairs > 0
                            if len(buffers["offsets"]) >= _CHUNK:  # flush: memory stays flat
                                for name, buf in buffers.items():
                                    buf.tofile(outs[name])
                                    del buf[:]
                    offset += len(raw)
                for name, buf in buffers.items():
                    buf.tofile(outs[name])
            meta = {
                "version": INDEX_VERSION,
                "path": os.path.realpath(path),
                "rows": rows,
                "skipped": dict(skipped),
                "repaired_chars": repaired_chars,
                "repaired_rows": repaired_rows,
                "first_error": first_error,
                "task_names": list(tasks),
                "total_keys": int(sum(np.fromfile(tmp / "n_keys.bin", dtype=np.uint32).astype(np.int64))),
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    except FileExistsError:
        if not (folder / "meta.json").is_file():  # a concurrent build did not win the race
            raise
    return _load(path, folder, on_bad_row)
