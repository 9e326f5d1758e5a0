"""BM25 hard negatives for training rows (the OBLIQ-IR paper, §3.1 and §4 "Training data").

- :mod:`obliq.negatives.mine`: the miner (exclusions by id, normalised text, same query, empty,
  duplicates, skipped ranks; a report of drops) and the default backend over obliq's one BM25;
- :mod:`obliq.negatives.pyserini_backend`: a real Lucene index through Pyserini (optional extra);
- :mod:`obliq.negatives.commands`: the ``obliq negatives mine`` command.
"""

from obliq.negatives.mine import DROP_REASONS, Bm25sBackend, MiningReport, mine_negatives

__all__ = ["DROP_REASONS", "Bm25sBackend", "MiningReport", "mine_negatives"]
