"""Evaluate a model (or BM25) on retrieval tasks: ``python evaluate.py --model M --tasks T… --output DIR``.

Thin wiring around :func:`obliq.eval.evaluate.evaluate`; every flag is one of its arguments
(``--help`` lists them; ``--config file.yaml`` works, ``--print_config`` writes one). Examples:

    python evaluate.py --model bm25 --tasks ../shared/data/tasks --output runs/bm25
    python evaluate.py --model minilm --tasks ../shared/data/tasks/math-theoremqa ../shared/data/tasks/writing-news \\
        --output runs/minilm
    python evaluate.py --model minilm --tasks ../shared/data/tasks --output runs/minilm+rerank \\
        --rerank configs/rerank/cpu-smollm2.yaml   # LLM-rerank the tasks the policy names (docs/rerank.md)
"""

from __future__ import annotations

import json
import logging
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _tasks_as_list(argv: list[str]) -> list[str]:
    """Let ``--tasks a b c`` mean ``--tasks '["a","b","c"]'`` (jsonargparse wants one list value)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i].startswith("--tasks=") and not argv[i][8:].startswith("["):
            out.append("--tasks=" + json.dumps([argv[i][8:]]))
            i += 1
        elif argv[i] == "--tasks":
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            values = argv[i + 1 : j]
            out += ["--tasks", values[0] if len(values) == 1 and values[0].startswith("[") else json.dumps(values)]
            i = j
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    from jsonargparse import auto_cli

    from obliq.errors import user_errors
    from obliq.eval.evaluate import evaluate

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("bm25s", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    argv = _tasks_as_list(sys.argv[1:] if argv is None else list(argv))
    with user_errors():
        return auto_cli(evaluate, args=argv, as_positional=False)


if __name__ == "__main__":
    main()
