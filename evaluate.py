"""Evaluate a model (or BM25, or a run file) on retrieval tasks:
``python evaluate.py --model M --tasks T… --output DIR``.

The same command as ``obliq evaluate`` (:func:`obliq.commands.evaluate.evaluate`; ``--help`` lists its
flags; ``--config file.yaml`` works, ``--print_config`` writes one). Examples:

    python evaluate.py --model bm25 --tasks ../shared/data/tasks --output runs/bm25
    python evaluate.py --model minilm --tasks ../shared/data/tasks/math-theoremqa ../shared/data/tasks/writing-news \\
        --output runs/minilm --retrieval.top_k 100
    python evaluate.py --model minilm --tasks ../shared/data/tasks --output runs/minilm+rerank \\
        --rerank configs/rerank/cpu-smollm2.yaml   # LLM-rerank the tasks the policy names (docs/rerank.md)
"""

import sys

from obliq.cli import main

if __name__ == "__main__":
    main(["evaluate", *sys.argv[1:]])
