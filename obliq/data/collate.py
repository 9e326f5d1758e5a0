"""The collator: training rows into the batch dictionary of :mod:`obliq.data` (tokenized, with the keys the
loss masks by and a teacher's scores). Apart from the loader (:mod:`obliq.data.datamodule`), so that what
builds a batch alone (``bench/gradcache.py``) does not import Lightning."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from obliq.data.rows import TrainingRow
from obliq.data.teacher_table import TeacherTable, row_teacher_scores
from obliq.text import id_hash

Tokenize = Callable[[list[str], str, list[str | None]], dict[str, torch.Tensor]]
"""What the collator calls: ``tokenize(texts, kind, instructions) -> {"input_ids", "attention_mask"}``
(:class:`obliq.model.TextTokenizer` is the encoder's)."""


class Collator:
    """Tokenizes a list of rows into the batch dictionary of :mod:`obliq.data`.

    Args:
        tokenize: ``tokenize(texts, kind, instructions) -> {"input_ids": (B, L), "attention_mask":
            (B, L), ...}`` with ``kind`` ``"query"`` or ``"passage"`` and, for queries, each row's
            ``instruction`` (or None); it adds prefixes and truncates (``obliq.model.TextTokenizer``,
            the encoder's ``text``). Runs in the loader's worker processes.
        max_negatives: k, the most hard negatives kept per row (the first k in file order).
        teacher: a teacher's vectors by id; the batch then holds its cosines of queries with documents,
            ``teacher_cosines`` (B, M), NaN where it has no vector.

    Raises:
        ValueError: ``max_negatives < 0``.
    """

    def __init__(self, tokenize: Tokenize, max_negatives: int = 4, teacher: TeacherTable | None = None):
        if max_negatives < 0:
            raise ValueError(f"max_negatives must be >= 0, got {max_negatives}")
        self.tokenize, self.max_negatives, self.teacher = tokenize, max_negatives, teacher

    def __call__(self, rows: Sequence[TrainingRow]) -> dict[str, Any]:
        negatives = [(i, doc) for i, row in enumerate(rows) for doc in row.negatives[: self.max_negatives]]
        docs = [row.positive for row in rows] + [doc for _, doc in negatives]
        batch = {
            "query": self.tokenize([row.query for row in rows], "query", [row.instruction for row in rows]),
            "docs": self.tokenize([doc.text for doc in docs], "passage"),
            "positive_index": torch.arange(len(rows), dtype=torch.long),
            "doc_row": torch.tensor([*range(len(rows)), *(i for i, _ in negatives)], dtype=torch.long),
            "doc_ids": [doc.id for doc in docs],
            "doc_keys": torch.tensor([[id_hash(doc.id), doc.text_hash] for doc in docs], dtype=torch.long).reshape(
                -1, 2
            ),
            "query_keys": torch.tensor([row.query_key() for row in rows], dtype=torch.long).reshape(-1, 2),
            "teacher_scores": row_teacher_scores(rows, self.max_negatives),
            "row_ids": [row.id for row in rows],
        }
        if self.teacher is not None:
            batch["teacher_cosines"] = self.teacher.cosines([row.query_id for row in rows], batch["doc_ids"])
        return batch
