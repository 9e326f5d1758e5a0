"""Corpus embeddings on disk: the one format that ``obliq encode`` writes, the evaluation's
corpus-embedding cache is, and ``obliq search`` / ``evaluate`` read (docs/formats.md).

A store is a folder (Tevatron's ``(reps, lookup)`` shard contract, as files that memory-map):

- ``store.json``: ``{"format", "fingerprint", "shards", "model"}``, the fingerprint being how the vectors
  were made (model and its files, encoder kind, passage length, corpus digest and size: :func:`model_key`),
  ``model`` the name it was last written under (for ``obliq cache``); its mtime is when it was last used
  (written or opened);
- per shard ``i`` of ``n``: ``shard-<i>-of-<n>.npy`` ((rows, d) float32, unit rows, C order: what
  ``np.load(mmap_mode="r")`` maps without reading it), ``shard-<i>-of-<n>.ids`` (the rows' document
  ids, one a line), and ``shard-<i>-of-<n>.json`` (index, count, rows, dimension, bytes, the SHA-256 of
  its ids and rows, the files' state when written, seconds, the fingerprint), written last: a shard is
  complete when its ``.json`` is there. A shard whose files changed since is read once and checked
  against its checksum (and for finite unit rows) before it is searched; an index built over the store
  is keyed by those checksums, so it is never reused over other vectors.

Shard ``i`` of ``n`` holds documents ``i, i + n, i + 2n, …`` of the corpus (:meth:`obliq.shards.Shard.select`).
Its ``.npy`` is written through a temporary file renamed into place at the end, so a killed shard
leaves no shard behind, only its temporary file (removed by the next run of that shard); every other
shard is untouched, and a rerun encodes only the shards without a ``.json``.

:class:`Store` is one such folder with the fingerprint it must hold, made once per (model, reading
settings, task) by :meth:`Store.of`; everything that reads or writes a store goes through it. A store
of an obliq export is found by the weights digest the export records, so exporting the same weights
again finds the same store instead of adding one; ``obliq cache`` (:mod:`obliq.commands.cache`) lists and
prunes stores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from obliq.files import json_text, publish, read_text, safe_name, write_json, write_text
from obliq.search import encoders
from obliq.search.exact import Corpus, npy_header, unit_float32
from obliq.search.settings import RetrievalSettings
from obliq.shards import Shard, check_cover
from obliq.tasks import Task

log = logging.getLogger(__name__)

FORMAT = "obliq-embeddings/1"
STORE_FILE = "store.json"


class IncompleteStore(ValueError):
    """A store some of whose shards are not complete (not written yet, or damaged).

    Attributes:
        folder: the store; problems: shard index → why it is not complete; count: the store's shards.
    """

    def __init__(self, folder: Path, problems: dict[int, str], count: int):
        self.folder, self.problems, self.count = folder, problems, count
        shards = "; ".join(f"{i}: {why}" for i, why in list(problems.items())[:4]) + (" …" if len(problems) > 4 else "")
        super().__init__(
            f"{folder}: {len(problems)} of {count} shards are not complete ({shards}); run `obliq encode` "
            f"with --shard.count {count} for them (or delete the folder to start again)"
        )

    @property
    def missing(self) -> list[int]:
        """The shards to (re)encode."""
        return sorted(self.problems)


def plain(fingerprint: dict) -> dict:
    """``fingerprint`` as it reads back from JSON (what stores are compared on)."""
    return json.loads(json_text(fingerprint))


def _read_json(file: Path) -> dict:
    try:
        return json.loads(read_text(file))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{file}: not a JSON file ({err})") from None


EXPORT_SMALL = 4 * 2**20
"""An export's files up to this size are part of its store key by content (settings, prompts, tokenizer);
larger ones (weights) by name and size, the weights being the digest the export records."""


def model_key(model: str) -> str:
    """How a store's fingerprint names the model its vectors come from.

    An obliq export (a folder whose ``obliq_export.json`` records ``weights_sha256``,
    :data:`obliq.model.checkpoint.EXPORT_RECORD`) is named by that digest, the content of its files up to
    :data:`EXPORT_SMALL` and the names and sizes of the larger ones, and, for an adapter, its base model's
    fingerprint: exporting the same checkpoint again (new files, new times) finds the same store. An export
    with a file changed after its record was written (an edit in place), and any other model, is named by
    :func:`obliq.search.encoders.fingerprint` (its files' path, sizes and times).
    """
    from obliq.aliases import resolve_model

    path = Path(resolve_model(model))
    record = path / "obliq_export.json"  # obliq.model.checkpoint.EXPORT_RECORD (not imported: it loads torch)
    if not record.is_file():
        return encoders.fingerprint(model)
    try:
        digest = json.loads(read_text(record)).get("weights_sha256")
        written = record.stat().st_mtime_ns
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name not in (record.name, "README.md"))
        edited = any(f.stat().st_mtime_ns > written for f in files)
    except (OSError, ValueError, AttributeError):
        return encoders.fingerprint(model)
    if not isinstance(digest, str) or edited:
        return encoders.fingerprint(model)
    content = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        content.update(json.dumps([str(f.relative_to(path)), size]).encode())
        if size <= EXPORT_SMALL:
            content.update(f.read_bytes())
    base = encoders._adapter_base(path)
    return f"obliq export weights_sha256:{digest} files:{content.hexdigest()[:16]}" + (
        f" on {encoders.fingerprint(base)}" if base else ""
    )


def model_name(model: str) -> str:
    """The name a store records for the model it was written with: an alias's hub id, a path made absolute,
    anything else (a hub id) as given (what ``obliq cache prune --model`` matches)."""
    from obliq.aliases import portable_name

    name = portable_name(model)
    path = Path(os.path.expanduser(name))
    return str(path.resolve()) if path.exists() else name


@dataclass(frozen=True)
class Store:
    """One task corpus's embeddings on disk (see the module notes): a folder, and the fingerprint of how
    its vectors were made, which the folder's ``store.json`` and every shard record hold.

    Attributes:
        folder: the store's folder.
        fingerprint: how the vectors were made (:meth:`of`); a store made otherwise is refused or redone.
        model: the model's name as ``store.json`` records it (:func:`model_name`; not compared).
    """

    folder: Path
    fingerprint: dict
    model: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", Path(self.folder))

    @classmethod
    def of(cls, model: str, settings: RetrievalSettings, task: Task) -> Store:
        """The store of a named model's embeddings of a task's corpus: where ``obliq encode`` writes and
        ``evaluate`` / ``obliq search`` read, ``<store root>/<task>-<20 hex digits of the fingerprint>``
        under :meth:`~obliq.search.settings.RetrievalSettings.store_root`.

        The fingerprint: the model (:func:`model_key`: an export's recorded weights digest, else its files'
        path, sizes and times, :func:`obliq.search.encoders.fingerprint`), the encoder kind, the passage
        max length, the corpus file's SHA-256 and size, the
        task's ``prompt_name`` when it has one (a per-task document prompt changes the vectors), and the
        windows asked for (``retrieval.windows``; a model's own are in its files). ``dim``
        and the index settings are not part of it: one store serves every truncation and index.
        """
        made = {
            "model": model_key(model),
            "encoder": settings.encoder,
            "passage_max_length": settings.passage_max_length,
            "corpus_sha256": task.corpus_sha256,
            "n_docs": len(task.doc_ids),
            **({"prompt_name": task.prompt_name} if task.prompt_name else {}),
            **({"windows": settings.windows.settings()} if settings.windows else {}),
        }
        key = hashlib.sha256(json_text(made, indent=None).encode()).hexdigest()[:20]
        return cls(Path(settings.store_root()) / f"{safe_name(task.name, 'task name')}-{key}", made, model_name(model))

    def shard_files(self, shard: Shard) -> tuple[Path, Path, Path]:
        """``(.npy, .ids, .json)`` of one shard."""
        stem = f"shard-{shard.index}-of-{shard.count}"
        return self.folder / f"{stem}.npy", self.folder / f"{stem}.ids", self.folder / f"{stem}.json"

    def done(self, shard: Shard) -> dict | None:
        """The record of a shard when it is complete, or None (see :meth:`problem`)."""
        return None if self.problem(shard) else _read_json(self.shard_files(shard)[2])

    def problem(self, shard: Shard) -> str | None:
        """Why a shard is not complete (not written, written for another model, its ``.npy`` not the size
        it recorded, a file missing), or None when it is."""
        npy, ids, done = self.shard_files(shard)
        if not done.is_file():
            return "not written"
        try:
            record = _read_json(done)
        except ValueError as err:
            return str(err)
        if record.get("fingerprint") != plain(self.fingerprint):
            return f"{done.name}: written with other settings"
        for file in (npy, ids):
            if not file.is_file():
                return f"{file.name} missing"
        if record.get("bytes") != npy.stat().st_size:
            return f"{npy}: {npy.stat().st_size} bytes, its record says {record.get('bytes')} (changed or cut short)"
        return None

    def status(self) -> tuple[int, dict[int, str]]:
        """``(shard count, {shard not complete: why})``.

        Raises:
            FileNotFoundError: no ``store.json``.
            ValueError: ``store.json`` is unreadable, of another format or of other embeddings.
        """
        file = self.folder / STORE_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{self.folder}: no embeddings here ({STORE_FILE} missing)")
        head = _read_json(file)
        if head.get("format") != FORMAT or not isinstance(head.get("shards"), int) or head["shards"] < 1:
            raise ValueError(f"{file}: not an obliq embedding store of format {FORMAT}")
        if head.get("fingerprint") != plain(self.fingerprint):
            raise ValueError(
                f"{file}: embeddings made otherwise ({head.get('fingerprint')}, not {plain(self.fingerprint)})"
            )
        count = head["shards"]
        problems = {i: self.problem(Shard(i, count)) for i in range(count)}
        return count, {i: why for i, why in problems.items() if why}

    def recorded_shards(self) -> int:
        """The shard count ``store.json`` records (1 when it cannot be read)."""
        try:
            return int(json.loads((self.folder / STORE_FILE).read_text())["shards"])
        except (OSError, ValueError, KeyError, TypeError):
            return 1

    def _claim(self, count: int, overwrite: bool) -> None:
        """Write ``store.json``, or check the one there is of this fingerprint and shard count."""
        head = {"format": FORMAT, "fingerprint": plain(self.fingerprint), "shards": count}
        file = self.folder / STORE_FILE
        if file.is_file():
            try:
                old = _read_json(file)
            except ValueError:
                old = {}
            if {k: old.get(k) for k in head} == head:
                if self.model and old.get("model") != self.model:
                    write_json(file, {**head, "model": self.model})
                return
            if not overwrite and old.get("fingerprint") == head["fingerprint"]:
                raise ValueError(
                    f"{self.folder}: the corpus was split into {old.get('shards')} shards, not {count}; encode "
                    f"with --shard.count {old.get('shards')}, or pass --overwrite true to start again with {count}"
                )
            if not overwrite and old:
                raise ValueError(
                    f"{file}: a store of other embeddings ({old.get('fingerprint')}); pass --overwrite true"
                )
            self.clear()
        write_json(file, {**head, "model": self.model} if self.model else head)

    def clear(self) -> None:
        """Delete the store's files (its shards, saved indexes and ``store.json``), nothing else."""
        if not self.folder.is_dir():
            return
        for file in self.folder.iterdir():
            if file.is_file() and (file.name == STORE_FILE or file.name.startswith(("shard-", "index-", ".shard-"))):
                file.unlink()

    def write(self, shard: Shard, ids: Sequence[str], blocks: Iterable, overwrite: bool = False) -> dict:
        """Write one shard from its vectors, block by block (memory: one block).

        Args:
            shard: this shard (resolved).
            ids: the shard's document ids, in order.
            blocks: (b, d) vectors for consecutive ``ids``, any float dtype (renormalised, :func:`unit_float32`).
            overwrite: start the store again when it was split otherwise or made by other settings.

        Returns:
            The shard's record (its ``.json``).

        Raises:
            ValueError: the blocks do not hold one vector per id, bad vectors, or a store of another split
                or other embeddings without ``overwrite``.
        """
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True)
        self._claim(shard.count, overwrite)
        npy, ids_file, done = self.shard_files(shard)
        for old in (done, npy, ids_file, *folder.glob(f".{npy.name}.*.tmp")):
            old.unlink(missing_ok=True)  # this shard is redone: a killed run's leftovers go
        t0 = time.perf_counter()
        digest = _rows_digest(ids)
        with publish(npy) as tmp:
            out, at = None, 0
            for block in blocks:
                block = unit_float32(block, f"{folder}: shard {shard.index} embeddings")
                if out is None:
                    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(len(ids), block.shape[1]))
                if at + len(block) > len(ids):
                    raise ValueError(f"{folder}: shard {shard.index}: more vectors than its {len(ids)} documents")
                out[at : at + len(block)] = block
                digest.update(np.ascontiguousarray(block, dtype="<f4").tobytes())
                at += len(block)
            if at != len(ids):
                raise ValueError(f"{folder}: shard {shard.index}: {at} vectors for {len(ids)} documents")
            if out is None:  # a shard without documents (more shards than documents)
                with open(tmp, "wb") as f:  # np.save to a name would add ".npy" and leave tmp empty
                    np.save(f, np.zeros((0, 0), dtype=np.float32))
                dim = 0
            else:
                dim = out.shape[1]
                out.flush()
                del out
        write_text(ids_file, "".join(f"{i}\n" for i in ids))
        record = {
            "shard": {"index": shard.index, "count": shard.count},
            "rows": len(ids),
            "dim": dim,
            "bytes": npy.stat().st_size,
            "sha256": digest.hexdigest(),
            "written": _file_state(npy, ids_file),
            "seconds": round(time.perf_counter() - t0, 3),
            "fingerprint": plain(self.fingerprint),
        }
        write_json(done, record)
        return record

    def open(self, doc_ids: Sequence[str], dim: int | None = None) -> Corpus:
        """The complete store as a :class:`~obliq.search.exact.Corpus` over ``doc_ids`` (row ``r`` =
        ``doc_ids[r]``), its shards memory-mapped, nothing read into memory but the ids.

        Args:
            doc_ids: the corpus's document ids, in the task's order.
            dim: Matryoshka truncation (:class:`~obliq.search.exact.Corpus`).

        Raises:
            FileNotFoundError: no store there.
            IncompleteStore: shards not written.
            ValueError: another fingerprint, a shard file cut short or of the wrong shape, a shard whose rows
                or ids are not the ones written or hold a row that is no finite unit vector, ids that do not
                cover ``doc_ids`` once each (the file named).
        """
        folder = self.folder
        count, missing = self.status()
        if missing:
            raise IncompleteStore(folder, missing, count)
        try:
            os.utime(folder / STORE_FILE)  # last used: what `obliq cache prune --older_than` goes by
        except OSError:  # a store on a read-only disk is read all the same
            pass
        position = {d: r for r, d in enumerate(doc_ids)}
        taken, parts, records = {}, [], []
        for i in range(count):
            npy, ids_file, done = self.shard_files(Shard(i, count))
            ids = read_text(ids_file).splitlines()
            taken[i] = ids
            record = _read_json(done)
            shape, dtype = npy_header(npy)
            if dtype != np.float32 or shape[0] != len(ids) or shape[0] != record.get("rows"):
                raise ValueError(
                    f"{npy}: shape {shape} {dtype} for {len(ids)} ids (its record: {record.get('rows')} rows)"
                )
            _verify_shard(npy, ids, ids_file, record)
            records.append({k: v for k, v in record.items() if k not in ("seconds", "written")})
            if ids:
                rows = np.array([position.get(d, -1) for d in ids], dtype=np.int64)
                parts.append((npy, rows))
        check_cover(list(doc_ids), taken, count, "document")
        token = hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:16]
        corpus = Corpus(parts, dim, token=f"{folder.name}:{token}", ids=list(doc_ids))
        if corpus.n != len(doc_ids):
            raise ValueError(f"{folder}: {corpus.n} vectors for {len(doc_ids)} documents")
        return corpus

    def read_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        """The whole store as one (n, d) float32 array in ``doc_ids`` order (for small corpora and tests:
        this reads every vector into memory)."""
        corpus = self.open(doc_ids)
        return corpus.take(np.arange(corpus.n))


def _rows_digest(ids: Sequence[str]):
    """A SHA-256 over a shard's ids (in order), to be updated with its rows as little-endian float32."""
    digest = hashlib.sha256()
    digest.update("".join(f"{i}\n" for i in ids).encode())
    return digest


def _file_state(*files: Path) -> list:
    """What changes when a file is rewritten, copied or moved: size, mtime, ctime and inode of each."""
    return [[f.stat().st_size, f.stat().st_mtime_ns, f.stat().st_ctime_ns, f.stat().st_ino] for f in files]


def _verify_shard(npy: Path, ids: list[str], ids_file: Path, record: dict) -> None:
    """Check a shard's rows against its record before they are searched: unchanged files since they were
    written (size, times, inode), else a full read whose checksum of ids and rows must equal the record's
    and whose rows must be finite unit vectors (a copied store is read once, an edited one refused).

    Raises:
        ValueError: no checksum in the record (a store of an older format), another checksum, or a row
            that is not a finite unit vector (the file and row named).
    """
    if "sha256" not in record:
        raise ValueError(f"{npy}: its record has no checksum of the rows (an older store format)")
    if record.get("written") == _file_state(npy, ids_file):
        return
    digest = _rows_digest(ids)
    x = np.load(npy, mmap_mode="r")
    for start in range(0, len(x), 4096):
        block = np.asarray(x[start : start + 4096], dtype="<f4")
        norms = np.sqrt(np.einsum("ij,ij->i", block.astype(np.float64), block.astype(np.float64)))
        bad = np.flatnonzero(~np.isfinite(norms) | (np.abs(norms - 1) > 1e-3))
        if len(bad):
            raise ValueError(f"{npy}: row {start + int(bad[0])} is not a finite unit vector (norm {norms[bad[0]]})")
        digest.update(block.tobytes())
    del x
    if digest.hexdigest() != record["sha256"]:
        raise ValueError(f"{npy}: its rows or ids are not the ones written (checksum differs from its record)")
