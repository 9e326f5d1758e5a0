"""Hard negatives for training rows (the OBLIQ-IR paper, §3.1 and §4 "Training data").

- :mod:`obliq.negatives.mine`: the miner (exclusions by id, normalised text, same query, empty,
  duplicates, vetoes, positive-aware filtering, rank range, skipped ranks; a report of drops), its
  filter over existing rows, and the backends over obliq's one BM25 and over a dense model or teacher;
- :mod:`obliq.negatives.pyserini_backend`: a real Lucene index through Pyserini (optional extra);
- :mod:`obliq.commands.negatives`: the ``obliq negatives mine / filter / merge`` commands.
"""

from obliq.negatives.mine import (
    DROP_REASONS,
    AttributeVeto,
    Bm25sBackend,
    DenseBackend,
    MiningReport,
    TeacherVeto,
    filter_negatives,
    mine_negatives,
)

__all__ = [
    "DROP_REASONS",
    "AttributeVeto",
    "Bm25sBackend",
    "DenseBackend",
    "MiningReport",
    "TeacherVeto",
    "filter_negatives",
    "mine_negatives",
]
