"""Reading training rows by reference: :class:`BatchRef` (the rows of one step of one rank, what the step
plan's sampler yields) and :class:`RowReader`, a map-style dataset over the sources' file indexes
(:mod:`obliq.data.index`) that reads and re-validates a :class:`BatchRef`'s rows with one ``pread`` each, and
reads each row's keys, positives and task from the index alone (what a step plan arranges by). The loader
that drives it is :mod:`obliq.data.datamodule`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
from torch.utils.data import Dataset

from obliq.data.index import FileIndex
from obliq.data.rows import RowCaps, RowError, TrainingRow, parse_row
from obliq.text import id_hash


class BatchRef(NamedTuple):
    """The rows of one step of one rank: ``source[i]``, ``row[i]`` (int64 arrays, shape ``(n,)``)."""

    epoch: int
    step: int
    source: np.ndarray
    row: np.ndarray


class RowReader(Dataset):
    """Reads rows by (source, row number) from indexed files; ``reader[ref]`` gives a batch's rows.

    Row ``r`` of source ``s`` is the ``r``-th valid row of the source's files in sorted order,
    leaving out duplicate-id rows excluded in skip mode. Each row is read with ``os.pread`` at its
    indexed offset and parsed again with :func:`~obliq.data.rows.parse_row`, so it comes back
    repaired exactly as it was validated. Picklable (memory maps and file descriptors are reopened
    lazily in each process).

    Args:
        indexes: per source, the :class:`~obliq.data.index.FileIndex` of each file.
        excluded: ``{(source, file): sorted positions in that file's index}`` to leave out.
        caps: the positives and negatives a batch keeps per row (what :meth:`keys`, :meth:`cut_keys` and
            :meth:`positives` report; None: every one).

    Attributes:
        sizes: usable rows per source.
    """

    def __init__(
        self,
        indexes: Sequence[Sequence[FileIndex]],
        excluded: dict[tuple[int, int], np.ndarray] | None = None,
        caps: RowCaps | None = None,
    ):
        self.indexes = [list(files) for files in indexes]
        self.caps = caps
        self.excluded = {k: np.asarray(v, np.int64) for k, v in (excluded or {}).items()}
        usable = [
            [fi.rows - len(self.excluded.get((s, f), ())) for f, fi in enumerate(files)]
            for s, files in enumerate(self.indexes)
        ]
        self._cum = [np.cumsum([0, *u]) for u in usable]
        self.sizes = [int(c[-1]) for c in self._cum]
        self._maps: dict[tuple[int, int, str], np.ndarray] = {}
        self._fds: dict[str, int] = {}

    def __getstate__(self):
        return {**self.__dict__, "_maps": {}, "_fds": {}}

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __len__(self) -> int:
        return sum(self.sizes)

    def content(self) -> list[str]:
        """Per source, the sha256 of its usable rows' id hashes and content hashes in order (what a
        resumed position must find again: the same count of other rows is another mixture, and so are
        the same ids with other texts)."""
        out = []
        for s, files in enumerate(self.indexes):
            digest = hashlib.sha256()
            for f, fi in enumerate(files):
                for name in ("ids", "content"):
                    digest.update(np.delete(np.asarray(fi.array(name)), self.excluded.get((s, f), [])).tobytes())
            out.append(digest.hexdigest()[:16])
        return out

    def _array(self, s: int, f: int, name: str) -> np.ndarray:
        key = (s, f, name)
        if key not in self._maps:
            self._maps[key] = self.indexes[s][f].array(name)
        return self._maps[key]

    def locate(self, source: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File number and position in that file's index of rows of one source (int64 arrays)."""
        cum = self._cum[source]
        f = np.searchsorted(cum[1:], rows, side="right")
        pos = rows - cum[f]
        for k in np.unique(f):
            excl = self.excluded.get((source, int(k)))
            if excl is not None and len(excl):
                at = f == k
                pos[at] += np.searchsorted(excl - np.arange(len(excl)), pos[at], side="right")
        return f, pos

    def _key_starts(self, s: int, f: int) -> np.ndarray:
        key = (s, f, "key_starts")
        if key not in self._maps:
            self._maps[key] = np.concatenate([[0], np.cumsum(self._array(s, f, "n_keys"), dtype=np.int64)])
        return self._maps[key]

    def _indexed(self, source: int, rows: np.ndarray) -> Iterator[tuple[np.ndarray, int, int]]:
        """Each row's index keys (query, every positive, every negative: id and text key each), its number of
        positives and how many of them a batch keeps (:attr:`caps`)."""
        files, positions = self.locate(source, np.asarray(rows, dtype=np.int64))
        for f, p in zip(files.tolist(), positions.tolist()):
            starts, n_pos = self._key_starts(source, f), int(self._array(source, f, "n_positives")[p])
            row = np.asarray(self._array(source, f, "keys")[starts[p] : starts[p + 1]])
            yield row, n_pos, n_pos if self.caps is None else self.caps.positives(n_pos)

    def keys(self, source: int, rows: np.ndarray) -> list[np.ndarray]:
        """The identity keys of rows of one source, from the index (:meth:`obliq.data.rows.TrainingRow.keys`
        with :attr:`caps`): what a step plan keeps apart."""
        cut = None if self.caps is None else 2 * self.caps.max_negatives
        return [np.concatenate([r[: 2 + 2 * k], r[2 + 2 * n :][:cut]]) for r, n, k in self._indexed(source, rows)]

    def cut_keys(self, source: int, rows: np.ndarray) -> list[np.ndarray]:
        """The id and text keys of the positives each row holds beyond :attr:`caps` (empty arrays when it
        keeps all): documents the loss masks for the row though the batch does not bring them (issue 53)."""
        return [r[2 + 2 * k : 2 + 2 * n] for r, n, k in self._indexed(source, rows)]

    def positives(self, source: int, rows: np.ndarray) -> list[int]:
        """The positives each row of one source brings to a batch (:attr:`caps`), from the index."""
        return [k for _, _, k in self._indexed(source, rows)]

    def tasks(self, source: int, rows: np.ndarray) -> list[str]:
        """The ``task`` field of rows of one source, from the index."""
        files, positions = self.locate(source, np.asarray(rows, dtype=np.int64))
        return [
            self.indexes[source][f].task_names[int(self._array(source, f, "tasks")[p])]
            for f, p in zip(files.tolist(), positions.tolist())
        ]

    def read(self, source: int, file: int, pos: int) -> TrainingRow:
        """Read and parse the row at index position ``pos`` of one file.

        Raises:
            RuntimeError: the file no longer holds the indexed row (it changed after indexing).
        """
        fi = self.indexes[source][file]
        offset, length = int(self._array(source, file, "offsets")[pos]), int(self._array(source, file, "lengths")[pos])
        line = int(self._array(source, file, "lines")[pos])
        fd = self._fds.get(fi.path)
        if fd is None:
            fd = self._fds[fi.path] = os.open(fi.path, os.O_RDONLY)
        raw = os.pread(fd, length, offset)
        try:
            row = parse_row(raw, fi.path, line)
        except RowError as err:
            raise RuntimeError(f"{err} (the file changed after it was indexed; restart to index it again)") from None
        if id_hash(row.id) != int(self._array(source, file, "ids")[pos]):
            raise RuntimeError(
                f"{fi.path}:{line}: row differs from the indexed one: the file changed while keeping its "
                f"size and time; restart, or delete {fi.folder} if it changed before this run"
            )
        return row

    def __getitem__(self, ref: BatchRef) -> list[TrainingRow]:
        out: list[TrainingRow | None] = [None] * len(ref.row)
        for s in np.unique(ref.source):
            where = np.flatnonzero(ref.source == s)
            files, positions = self.locate(int(s), ref.row[where])
            for i, f, p in zip(where, files, positions):
                out[i] = self.read(int(s), int(f), int(p))
        return out  # type: ignore[return-value]
