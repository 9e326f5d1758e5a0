"""Training data: the row format, a streamed multi-source mixture, exact resume.

Usage::

    from obliq.data import Source, TrainingDataModule

    dm = TrainingDataModule(
        sources=[Source("rows/synthetic/*.jsonl"), Source("rows/knn-writing.jsonl", count=5000)],
        batch_size=32, max_negatives=4, seed=0, on_bad_row="fail", num_workers=2,
    )
    # the LightningModule's setup() sets: trainer.datamodule.tokenize = self.encoder.text
    trainer.fit(model, datamodule=dm)                     # resumes exactly with ckpt_path=...

Rows are the training-row format of docs/formats.md, validated when the file is first indexed
(:mod:`obliq.data.rows`, :mod:`obliq.data.index`); the mixture, order and rank sharding are
:mod:`obliq.data.mixture`; reading rows by reference is :mod:`obliq.data.reader`; the loader and resume are
:mod:`obliq.data.datamodule`.

Batch (one per rank per step; ``n`` anchors, ``n == batch_size`` except in an epoch's tail where it
may be smaller, and differ by at most one across ranks; ``M`` documents)::

    {
      "query":          tokenize(queries, "query", instructions),     # dict: input_ids, attention_mask (n, Lq), ...
      "docs":           tokenize(doc texts, "passage"), # dict: input_ids, attention_mask (M, Ld), ...
                        # docs[0:n] are the rows' first positives in row order; then, row after row, that
                        # row's further positives and its hard negatives (possibly none), as many as
                        # data.max_positives and data.max_negatives keep (obliq.data.rows.RowCaps)
      "positive_index": LongTensor (n,)   # docs index of each query's first positive: arange(n)
      "doc_row":        LongTensor (M,)   # the row (0..n-1) each document came with
      "doc_positive":   BoolTensor (M,)   # True where the document is a positive of its row (doc_row says
                        # which row; docs[0:n] are True); a row's positives are docs[i] and its
                        # doc_row == i & doc_positive columns
      "doc_ids":        list[str] (M)     # document ids
      "doc_keys":       LongTensor (M, 2) # identity keys: obliq.text.id_hash of the id, text_hash of the
                        # text (equal for equal normalised text); the loss masks equal keys
      "query_keys":     LongTensor (n, 2) # the queries' keys, the same way (TrainingRow.query_key: a
                        # query that is a corpus document, a kNN anchor, keys by its id too)
      "cut_positive_keys": LongTensor (C, 2) # keys of the positives rows hold beyond the cap (not in
                        # docs): never negatives of their row, masked as its positives' copies are
      "cut_positive_row": LongTensor (C,) # the row of each
      "teacher_scores": FloatTensor (n, 1 + k) # a teacher's scores of each row's positive, then of its
                        # kept negatives (meta.teacher_scores, single-positive rows only), NaN where absent
      "row_ids":        list[str] (n)     # training-row ids
      # with a teacher's vectors (data.teacher_vectors):
      "teacher_query_vectors": FloatTensor (n, d) # its vector of each query's document (kNN anchor)
      "teacher_doc_vectors":   FloatTensor (M, d) # its vector of each document; NaN rows where it has none
    }

In-batch false negatives: **the loss masks them by key** (``shared/cases/C05``, ``C34``). For query
``i`` every in-batch column other than ``positive_index[i]`` is dropped when its ``doc_keys`` (id or
normalised text) equal the query's own keys (a passage↔passage row's query is another row's document),
or those of the positive of any row with the same query (its own positive's copies included); a row's
further positives (``doc_positive``) are the loss's to use or mask (obliq's losses, issue 47). Within
one row a negative never equals a positive, nor two positives each other (by id or normalised text):
such rows are invalid (``shared/cases/C06``). The step plan can also keep such texts apart
(``no_duplicates``, the default for passage↔passage sources; every kept positive's texts count) and group
steps by source or task (:class:`~obliq.data.mixture.StepArrangement`).

Guarantees, per epoch: every row of the epoch's mixture (see :mod:`obliq.data.mixture` for counts
and weights) is in exactly one batch of one rank; all ranks run the same number of steps; a
checkpoint taken after any step resumes with the next batch, none repeated or skipped.
"""

from obliq.data.index import FileIndex, index_file
from obliq.data.mixture import MixturePlan, Source, StepArrangement, named_source, permute
from obliq.data.rows import (
    ERROR_KINDS,
    ROW_SOURCES,
    Doc,
    RowCaps,
    RowError,
    TrainingRow,
    parse_row,
)

__all__ = [
    "BatchRef",
    "Collator",
    "Doc",
    "ERROR_KINDS",
    "FileIndex",
    "MixturePlan",
    "PlanSampler",
    "ROW_SOURCES",
    "RowCaps",
    "RowError",
    "RowReader",
    "Source",
    "StepArrangement",
    "TrainingDataModule",
    "TrainingRow",
    "index_file",
    "named_source",
    "parse_row",
    "permute",
]

_LAZY = {
    "Collator": "collate",
    **{n: "reader" for n in ("BatchRef", "RowReader")},
    **{n: "datamodule" for n in ("PlanSampler", "TrainingDataModule")},
}
"""name → the module it is imported from on first use: the collator brings torch, the loader Lightning (~5 s)."""


def __getattr__(name: str):
    """Import the collator or the loader only when it is asked for: row validation, used by every stage that
    writes training rows, stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"obliq.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'obliq.data' has no attribute {name!r}")
