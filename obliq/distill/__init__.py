"""kNN-graph distillation from a frozen specialist (the OBLIQ-IR paper, §3.2 and §6.5).

The teachers themselves (texts → unit vectors: an encoder, or the offline stylometric teacher) are
encoders, in :mod:`obliq.search.teachers`, where the negatives miner and the quickstart's teacher row
use them too.

- :mod:`obliq.distill.graph`: the teacher's kNN graph through obliq's one exact search, and the fusion of graphs;
- :mod:`obliq.distill.pairs`: training rows from the graph (every distinct edge), the random-neighbour control;
- :mod:`obliq.distill.purity`: the purity diagnostic (same-attribute rate of the edges vs the base rate);
- :mod:`obliq.commands.distill`: the ``obliq distill …`` commands.
"""

from obliq.distill.graph import KnnGraph, fuse_graphs, knn_graph, load_graph, teacher_graph
from obliq.distill.pairs import knn_pairs, random_control
from obliq.distill.purity import base_rate, graph_purity

__all__ = [
    "KnnGraph",
    "base_rate",
    "fuse_graphs",
    "graph_purity",
    "knn_graph",
    "knn_pairs",
    "load_graph",
    "random_control",
    "teacher_graph",
]
