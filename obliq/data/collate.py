"""The collator: training rows into the batch dictionary of :mod:`obliq.data` (tokenized, with the keys the
loss masks by, which documents are positives, and a teacher's scores and vectors). Apart from the loader
(:mod:`obliq.data.datamodule`), so that what builds a batch alone (``bench/gradcache.py``) does not import
Lightning."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from obliq.data.rows import RowCaps, TrainingRow
from obliq.data.teacher_table import TeacherTable, row_teacher_scores
from obliq.text import id_hash

Tokenize = Callable[[list[str], str, list[str | None]], dict[str, torch.Tensor]]
"""What the collator calls: ``tokenize(texts, kind, instructions) -> {"input_ids", "attention_mask"}``
(:class:`obliq.model.TextTokenizer` is the encoder's)."""


class Collator:
    """Tokenizes a list of rows into the batch dictionary of :mod:`obliq.data` (its docstring has the layout).

    Documents: ``docs[0:n]`` the rows' first positives in row order, then row after row that row's further
    positives and its hard negatives, as many as ``caps`` keeps.

    Args:
        tokenize: ``tokenize(texts, kind, instructions) -> {"input_ids": (B, L), "attention_mask":
            (B, L), ...}`` with ``kind`` ``"query"`` or ``"passage"`` and, for queries, each row's
            ``instruction`` (or None); it adds prefixes and truncates (``obliq.model.TextTokenizer``,
            the encoder's ``text``). Runs in the loader's worker processes. When it reads long texts in
            windows (its ``windowing``, :class:`obliq.windows.Windows`), documents (and queries, with
            ``windowing.queries``) are tokenized into windows, and ``doc_window`` (``query_window``) gives the
            document (query) of each window row.
        caps: how many positives and negatives of a row a batch brings (:class:`~obliq.data.rows.RowCaps`).
        teacher: a teacher's vectors by id; the batch then holds its vectors of the queries (kNN anchors) and
            documents, ``teacher_query_vectors`` (n, d) and ``teacher_doc_vectors`` (M, d), float32, NaN rows
            where it has none (a generated query, a document of another corpus). From them the loss side takes
            the teacher's cosines between every rank's rows.
    """

    def __init__(self, tokenize: Tokenize, caps: RowCaps = RowCaps(), teacher: TeacherTable | None = None):
        self.tokenize, self.caps, self.teacher = tokenize, caps, teacher

    def __call__(self, rows: Sequence[TrainingRow]) -> dict[str, Any]:
        n, kept = len(rows), [self.caps.positives(len(row.positives)) for row in rows]
        rest = [  # (row, doc, is a positive), row after row: its further positives, then its negatives
            (i, doc, positive)
            for i, row in enumerate(rows)
            for docs, positive in (
                (row.positives[1 : kept[i]], True),
                (row.negatives[: self.caps.max_negatives], False),
            )
            for doc in docs
        ]
        docs = [row.positive for row in rows] + [doc for _, doc, _ in rest]
        cut = [(i, doc) for i, row in enumerate(rows) for doc in row.positives[kept[i] :]]
        queries, instructions = [row.query for row in rows], [row.instruction for row in rows]
        windows, windowed = getattr(self.tokenize, "windowing", None), {}
        if windows is None:
            query, doc_batch = (
                self.tokenize(queries, "query", instructions),
                self.tokenize([d.text for d in docs], "passage"),
            )
        else:
            doc_batch, windowed["doc_window"] = self.tokenize.windows([d.text for d in docs], "passage", windows)
            if windows.queries:
                query, windowed["query_window"] = self.tokenize.windows(queries, "query", windows, instructions)
            else:
                query = self.tokenize(queries, "query", instructions)
        batch = {
            "query": query,
            "docs": doc_batch,
            **windowed,
            "positive_index": torch.arange(n, dtype=torch.long),
            "doc_row": torch.tensor([*range(n), *(i for i, _, _ in rest)], dtype=torch.long),
            "doc_positive": torch.tensor([True] * n + [p for _, _, p in rest], dtype=torch.bool),
            "doc_ids": [doc.id for doc in docs],
            "doc_keys": torch.tensor([[id_hash(doc.id), doc.text_hash] for doc in docs], dtype=torch.long).reshape(
                -1, 2
            ),
            "query_keys": torch.tensor([row.query_key() for row in rows], dtype=torch.long).reshape(-1, 2),
            "cut_positive_keys": torch.tensor([[id_hash(d.id), d.text_hash] for _, d in cut], dtype=torch.long).reshape(
                -1, 2
            ),
            "cut_positive_row": torch.tensor([i for i, _ in cut], dtype=torch.long),
            "teacher_scores": row_teacher_scores(rows, self.caps.max_negatives),
            "row_ids": [row.id for row in rows],
        }
        if self.teacher is not None:
            batch["teacher_query_vectors"] = self.teacher.lookup([row.query_id for row in rows])
            batch["teacher_doc_vectors"] = self.teacher.lookup(batch["doc_ids"])
        return batch
