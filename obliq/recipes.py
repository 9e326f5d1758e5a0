"""Recipes: the ``train.py`` config files, read as data, and the folders a recipe's ``work_dir`` holds.

A recipe names one folder, ``work_dir``, and derives the rest from it with OmegaConf interpolation: its
evaluation tasks (``${work_dir}/tasks``), its training rows (``${work_dir}/rows/…``) and its runs
(``run_dir: ${work_dir}/train``). The recipe files spell these paths for their users; Python code that
writes a recipe's inputs takes them from :class:`WorkDir`. Configs are read in jsonargparse's
``omegaconf+`` mode (:data:`PARSER_MODE`), and may name classes only under :data:`RECIPE_IMPORTS`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

PARSER_MODE = "omegaconf+"
"""jsonargparse's parser mode for training configs: ``${…}`` interpolation, resolved last."""


def add_recipe_arguments(parser) -> None:
    """The top-level settings a recipe has besides Lightning's: its ``work_dir`` and ``run_dir``."""
    parser.add_argument(
        "--work_dir",
        type=str | None,
        default=None,
        help="The recipe's one folder, from which it derives its inputs (rows, tasks) and its "
        "run_dir (${work_dir}); what the commands that build those inputs read.",
    )
    parser.add_argument(
        "--run_dir",
        type=str,
        default="runs/train",
        help="The recipe's runs; each run goes in a version of it, from which the recipe derives "
        "its checkpoint, log and W&B folders (${run_dir}).",
    )


RECIPE_IMPORTS = ("obliq", "lightning.pytorch", "lightning.fabric", "torch.optim")
"""The import paths a recipe's ``class_path`` (or any class a training command line names) may lie
under: obliq's own classes (the encoder, callbacks, W&B logger, strategies), Lightning's (callbacks,
loggers, strategies, plugins) and torch's optimisers and schedulers. ``$OBLIQ_RECIPE_IMPORTS`` adds
more (comma-separated dot paths, e.g. ``bench,mylab.callbacks``) for code you trust."""


def recipe_imports() -> list[str]:
    """:data:`RECIPE_IMPORTS` and those of ``$OBLIQ_RECIPE_IMPORTS``."""
    extra = [p.strip() for p in os.environ.get("OBLIQ_RECIPE_IMPORTS", "").split(",") if p.strip()]
    return [*RECIPE_IMPORTS, *extra]


def recipe_config(recipe: str | os.PathLike, *more: str | os.PathLike, **overrides) -> dict:
    """A recipe's settings as plain data, its interpolations resolved (OmegaConf), without building
    anything: what ``obliq quickstart``, ``obliq dose-sweep`` and the examples read to find a recipe's
    folders and data sources.

    Args:
        recipe: a ``train.py`` config file.
        more: configs stacked on it, as ``train.py fit --config A --config B`` stacks them
            (:func:`_stack`: what a later file sets replaces the earlier's, except that mappings merge and
            a list of mappings as long as the earlier one is merged item by item, as jsonargparse does).
        overrides: top-level keys to set before resolving (``run_dir="runs/x"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a YAML mapping, or an interpolation that cannot be resolved (file named).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from obliq.files import read_text
    from obliq.yaml_checks import check_yaml

    try:
        parts = []
        for file in (recipe, *more):
            text = read_text(file)
            check_yaml(text, file)  # a key given twice, a nested-alias bomb: refused before loading
            config = OmegaConf.create(text)
            if not OmegaConf.is_dict(config):
                raise ValueError(f"{file}: expected a mapping of settings")
            parts.append(config)
        plain = OmegaConf.to_container(parts[0], resolve=False)
        for later in parts[1:]:
            plain = _stack(plain, OmegaConf.to_container(later, resolve=False))
        config = OmegaConf.create(plain)
        for key, value in overrides.items():
            OmegaConf.update(config, key, value)
        return OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as err:
        raise ValueError(f"{recipe}: {err}") from None


def recipe_spelling(argv: list[str]) -> list[str]:
    """``argv`` with every ``${key}`` in a ``--name=value`` (or ``--name value``) read as a recipe file
    reads it, from the top of the recipe: ``--run_dir='${work_dir}/sweep'`` means the recipe's
    ``work_dir``, as ``run_dir: ${work_dir}/sweep`` in the file does, and as :func:`recipe_config` reads it.

    jsonargparse rewrites a loaded file's ``${…}`` relative to where each value sits
    (``omegaconf_absolute_to_relative_paths``, so that a config under the ``fit`` subcommand resolves),
    but not a command-line value, which it then resolves from the top of *all* subcommands
    (``Interpolation key 'work_dir' not found``, jsonargparse #864; C51). This applies that same function
    to each command-line value at its own key, so one spelling means one thing in a file, on the command
    line, with or without the subcommand; resolution itself stays jsonargparse's, after the run's version
    folder is set (a value's ``${run_dir}`` lands in it). ``--config`` files are left to the loader.
    """
    from jsonargparse._optionals import omegaconf_absolute_to_relative_paths

    from obliq.yaml_checks import load_yaml

    out = list(argv)
    for i, token in enumerate(out):
        option, eq, value = token.partition("=")
        at = i if eq else i + 1
        if not eq and (at >= len(out) or out[at].startswith("--")):
            continue
        value = value if eq else out[at]
        if not option.startswith("--") or option == "--config" or "${" not in value:
            continue
        data = load_yaml(value, option) if value.lstrip()[:1] in ("{", "[") else value
        keys = option[2:].removesuffix("+").split(".")  # `--trainer.callbacks+=…` appends to a list
        data = [data] if option.endswith("+") else data
        for key in reversed(keys):
            data = {key: data}
        data = omegaconf_absolute_to_relative_paths(data)
        for key in keys:
            data = data[key]
        data = data[0] if option.endswith("+") else data
        value = data if isinstance(data, str) else json.dumps(data)
        out[at] = f"{option}={value}" if eq else value
    return out


def _stack(earlier, later):
    """``later`` stacked on ``earlier`` as jsonargparse stacks ``--config`` files (plain data, ``${…}``
    unresolved): mappings merge key by key; a list of mappings as long as the earlier one merges item by
    item (a stacked ``data.sources: [{path: x}]`` keeps the earlier file's ``count``), unless an item names
    another ``class_path`` (a short name is the full one's last part); anything else replaces what was
    there. :func:`recipe_config` must read what ``train.py`` trains (checked against train.py's parser, for
    every shipped recipe and ablation stack, in tests/test_train.py). Not followed: jsonargparse's carrying
    of a replaced class's init args that the new class also accepts (its #460)."""
    if isinstance(earlier, dict) and isinstance(later, dict):
        return earlier | {key: _stack(earlier[key], value) if key in earlier else value for key, value in later.items()}
    if isinstance(earlier, list) and isinstance(later, list) and len(earlier) == len(later):
        if all(isinstance(item, dict) for item in [*earlier, *later]):
            return [_stack(old, item) if _same_class(old, item) else item for old, item in zip(earlier, later)]
    return later


def _same_class(earlier: dict, later: dict) -> bool:
    """Whether two stacked items are settings of one class (either without ``class_path``: yes)."""
    a, b = earlier.get("class_path"), later.get("class_path")
    if not (isinstance(a, str) and isinstance(b, str)) or ("." in a and "." in b):
        return a is None or b is None or a == b
    return a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class WorkDir:
    """The layout of a recipe's ``work_dir``, the one folder its inputs and runs lie in.

    Attributes:
        path: the ``work_dir`` (a recipe's top-level ``work_dir`` setting).
    """

    path: Path

    @property
    def tasks(self) -> Path:
        """``<work_dir>/tasks``: the evaluation tasks, one task folder each (``obliq task split``'s
        output; what the recipe's ``RetrievalEvaluation`` reads)."""
        return Path(self.path) / "tasks"

    @property
    def rows(self) -> Path:
        """``<work_dir>/rows``: the training rows the recipe's data sources read."""
        return Path(self.path) / "rows"

    @property
    def train(self) -> Path:
        """``<work_dir>/train``: the runs (the recipe's ``run_dir``, or one ``run_dir`` per ablation below it)."""
        return Path(self.path) / "train"
