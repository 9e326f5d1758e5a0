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
:mod:`obliq.data.mixture`; the loader and resume are :mod:`obliq.data.datamodule`.

Batch (one per rank per step; ``n`` anchors, ``n == batch_size`` except in an epoch's tail where it
may be smaller, and differ by at most one across ranks; ``M`` documents)::

    {
      "query":          tokenize(queries, "query", instructions),     # dict: input_ids, attention_mask (n, Lq), ...
      "docs":           tokenize(doc texts, "passage"), # dict: input_ids, attention_mask (M, Ld), ...
                        # docs[0:n] are the rows' positives in row order; then each row's hard
                        # negatives (its first k, possibly none), row after row
      "positive_index": LongTensor (n,)   # docs index of each query's positive: arange(n)
      "doc_row":        LongTensor (M,)   # the row (0..n-1) each document came with
      "doc_ids":        list[str] (M)     # document ids
      "doc_keys":       LongTensor (M, 2) # identity keys: obliq.text.id_hash of the id, text_hash of the
                        # text (equal for equal normalised text); the loss masks equal keys
      "query_keys":     LongTensor (n, 2) # the queries' keys, the same way (TrainingRow.query_key: a
                        # query that is a corpus document, a kNN anchor, keys by its id too)
      "teacher_scores": FloatTensor (n, 1 + k) # a teacher's scores of each row's positive, then of its
                        # kept negatives (meta.teacher_scores), NaN where absent
      "row_ids":        list[str] (n)     # training-row ids
    }

In-batch false negatives: **the loss masks them by key** (``shared/cases/C05``, ``C34``). For query
``i`` every in-batch column other than ``positive_index[i]`` is dropped when its ``doc_keys`` (id or
normalised text) equal the query's own keys (a passage↔passage row's query is another row's document),
or those of the positive of any row with the same query (its own positive's copies included). Within
one row a negative never equals the positive (by id or normalised text): such rows are invalid
(``shared/cases/C06``). The step plan can also keep such texts apart (``no_duplicates``, the default for
passage↔passage sources) and group steps by source or task (:class:`~obliq.data.mixture.StepArrangement`).

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
    **{n: "datamodule" for n in ("BatchRef", "PlanSampler", "RowReader", "TrainingDataModule")},
}
"""name → the module it is imported from on first use: the collator brings torch, the loader Lightning (~5 s)."""


def __getattr__(name: str):
    """Import the collator or the loader only when it is asked for: row validation, used by every stage that
    writes training rows, stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"obliq.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'obliq.data' has no attribute {name!r}")
