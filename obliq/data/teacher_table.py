"""A teacher's signals in a batch: the scores single-positive rows carry for their own candidates
(:func:`row_teacher_scores`, for the teacher-score loss), and a frozen teacher's vectors of a corpus, looked up
by document id while batches are built (:meth:`TeacherTable.lookup`: ``teacher_query_vectors`` and
``teacher_doc_vectors``), for the in-batch terms (relational distillation, the guided mask).

The file is what ``obliq distill graph --vectors_out`` writes: a NumPy ``.npz`` archive (read with
``allow_pickle=False``: data only) of ``ids`` (n,) strings and ``vectors`` (n, d) float32 unit rows, the
teacher's encoding of the task's corpus in the graph's own pass, with what they were made from (issue 49 §3):
``text_hashes`` (n,) int64, :func:`obliq.text.text_hash` of each encoded text, and ``corpus_sha256`` (the
task's :attr:`obliq.tasks.Task.corpus_sha256`). A row whose document id is in the table but whose text is
not the one encoded (vectors of another version of the corpus: same ids, other texts) is refused
(:meth:`TeacherTable.check_covers`); an archive written before the record is read unchecked, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from obliq.data.rows import TrainingRow
from obliq.files import publish
from obliq.text import text_hash

log = logging.getLogger(__name__)


def row_teacher_scores(rows: Sequence[TrainingRow], max_negatives: int) -> torch.Tensor:
    """(n, 1 + max_negatives) float32: each row's ``meta.teacher_scores`` (the positive's, then each kept
    negative's), NaN where a row has none (``obliq distill pairs --teacher_scores``; a row with several
    positives never has them: :func:`obliq.data.rows.parse_row` refuses it)."""
    out = torch.full((len(rows), 1 + max_negatives), float("nan"))
    for i, row in enumerate(rows):
        scores = (row.meta or {}).get("teacher_scores")
        if isinstance(scores, list) and len(scores) == 1 + len(row.negatives):
            kept = scores[: 1 + min(len(row.negatives), max_negatives)]
            out[i, : len(kept)] = torch.tensor([float(x) for x in kept])
    return out


def check_archive(path: str | Path) -> Path:
    """``path`` as a Path when it is a file that starts as an ``.npz`` archive (a zip) does; read nothing else
    (what a recipe is checked with before a run folder is made).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not an ``.npz`` archive (a text file, say).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no teacher vectors (obliq distill graph --vectors_out writes them)")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise ValueError(
                f"{path}: not an .npz archive of teacher vectors (obliq distill graph --vectors_out writes them)"
            )
    return path


class TeacherTable:
    """The teacher's unit vectors by document id.

    Args:
        path: an ``.npz`` file with ``ids`` (n,) and ``vectors`` (n, d) (module notes).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not such an archive; ids repeated; vectors (or text hashes) of another length than the
            ids, not 2-D, not finite, or not of unit norm (within 1e-3) where non-zero.
    """

    def __init__(self, path: str | Path):
        self.path = check_archive(path)
        try:
            with np.load(self.path, allow_pickle=False) as archive:
                ids, vectors = archive["ids"], archive["vectors"]
                hashes = archive["text_hashes"] if "text_hashes" in archive.files else None
                self.corpus_sha256 = str(archive["corpus_sha256"]) if "corpus_sha256" in archive.files else None
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{self.path}: not a teacher-vectors archive with 'ids' and 'vectors' ({err})") from None
        if vectors.ndim != 2 or ids.ndim != 1 or len(ids) != len(vectors):
            raise ValueError(f"{self.path}: {ids.shape} ids for vectors of shape {vectors.shape}")
        if hashes is not None and hashes.shape != ids.shape:
            raise ValueError(f"{self.path}: field text_hashes: {hashes.shape} hashes for {ids.shape} ids")
        self.text_hashes = None if hashes is None else hashes.astype(np.int64)
        vectors = np.asarray(vectors, dtype=np.float32)
        if not np.isfinite(vectors).all():
            raise ValueError(f"{self.path}: vectors hold NaN or infinity")
        norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
        if np.any((norms > 0) & (np.abs(norms - 1) > 1e-3)):
            raise ValueError(f"{self.path}: vectors are not unit rows (norms {norms.min():.4f} … {norms.max():.4f})")
        self.row = {str(i): n for n, i in enumerate(ids.tolist())}
        if len(self.row) != len(ids):
            raise ValueError(f"{self.path}: an id is given twice")
        self.vectors = vectors

    def check_covers(self, rows: Iterable) -> None:
        """Refuse a table that holds none of the ids of ``rows`` (training rows: their kNN anchors and positives):
        vectors of another corpus would leave every teacher cosine NaN, and so no teacher term at all; and
        refuse a table whose vector of a row's document encodes another text than the row's (its
        ``text_hashes``: vectors of another version of the corpus, same ids and other texts, would give a
        wrong teacher term; issue 49 §3).

        Raises:
            ValueError: no id of the rows is in the table (none to check: nothing refused); a task's rows whose ids
                the table holds only in part (vectors of a part of its corpus); a row's query
                (a kNN anchor), a positive or a negative has another text than the one the table's vector encodes.
        """
        rows = list(rows)
        ids = {i for row in rows for i in (row.query_id, *(p.id for p in row.positives)) if i is not None}
        if ids and not any(i in self.row for i in ids):
            raise ValueError(
                f"data.teacher_vectors {self.path} holds none of the {len(ids)} document ids of the rows it was "
                f"checked on (e.g. {sorted(ids)[0]!r}): vectors of another corpus?"
            )
        by_task: dict[str, set] = {}
        for row in rows:
            by_task.setdefault(row.task, set()).update(i for i in (row.query_id, *(p.id for p in row.positives)) if i)
        for task, task_ids in sorted(by_task.items()):
            lacking = sorted(i for i in task_ids if i not in self.row)
            if lacking and len(lacking) < len(task_ids):  # a part of one corpus: vectors of a part of it (issue 53)
                raise ValueError(
                    f"data.teacher_vectors {self.path} has no vector for {len(lacking)} of the {len(task_ids)} "
                    f"document ids of task {task!r}'s rows it was checked on (e.g. {lacking[0]!r}): vectors of a "
                    "part of its corpus; rebuild them over the whole corpus with obliq distill graph --vectors_out"
                )
        if self.text_hashes is None and rows:
            log.warning(
                "%s: no text_hashes (written before obliq recorded what it encoded): not checked against the "
                "rows' texts; rebuild it with obliq distill graph --vectors_out",
                self.path,
            )
        self.check_texts(rows)

    def check_texts(self, rows: Iterable) -> None:
        """Refuse the table when a row's query (a kNN anchor), a positive or a negative has an id in the table and
        another text than the one its vector encodes (``text_hashes``; an archive without them: nothing
        checked). Cheap enough for every batch.

        Raises:
            ValueError: such a row (the file, the field, the document and the row named).
        """
        if self.text_hashes is None:
            return
        for row in rows:  # the rows' own text_hash of each text (obliq.data.rows.Doc, TrainingRow.query_key)
            docs = ((d.id, d.text_hash) for d in (*row.positives, *row.negatives))
            for doc_id, hashed in ((row.query_id, row.query_key()[1]), *docs):
                n = self.row.get(doc_id) if doc_id is not None else None
                if n is not None and int(self.text_hashes[n]) != hashed:
                    raise ValueError(
                        f"data.teacher_vectors {self.path}: field text_hashes: document {doc_id!r} (row {row.id!r}) "
                        "has another text than the one the teacher encoded: vectors of another version of the "
                        "corpus; rebuild them with obliq distill graph --vectors_out on the rows' task"
                    )

    def __len__(self) -> int:
        return len(self.vectors)

    def lookup(self, ids: Sequence[str | None]) -> torch.Tensor:
        """(len(ids), d) float32: the teacher's vector of each id, a NaN row where the id is None or not in the
        table (a generated query, a document of another corpus)."""
        out = np.full((len(ids), self.vectors.shape[1]), np.nan, dtype=np.float32)
        for n, i in enumerate(ids):
            r = self.row.get(i) if i is not None else None
            if r is not None:
                out[n] = self.vectors[r]
        return torch.from_numpy(out)


def write_teacher_table(
    path: Path,
    ids: Sequence[str],
    vectors: np.ndarray,
    texts: Sequence[str] | None = None,
    corpus_sha256: str | None = None,
) -> None:
    """Write ``ids`` and their (n, d) unit ``vectors`` (float32) as a :class:`TeacherTable` archive at ``path``
    (:func:`obliq.files.publish`: all at once), with what they encode: the ``texts`` (as ``text_hashes``) and
    the corpus digest, when given."""
    if texts is not None and len(texts) != len(ids):
        raise ValueError(f"{path}: {len(texts)} texts for {len(ids)} ids")
    record = {} if texts is None else {"text_hashes": np.asarray([text_hash(t) for t in texts], dtype=np.int64)}
    if corpus_sha256 is not None:
        record["corpus_sha256"] = np.asarray(corpus_sha256)
    with publish(path) as tmp, open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a name
        np.savez(f, ids=np.asarray([str(i) for i in ids]), vectors=np.asarray(vectors, dtype=np.float32), **record)
