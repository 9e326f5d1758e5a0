"""The training command behind ``train.py`` and ``obliq train``: a LightningCLI over
:class:`RetrieverModule` and :class:`~obliq.data.TrainingDataModule` (in the package, so ``obliq
quickstart`` and ``obliq dose-sweep`` call it too).

Configs are read in jsonargparse's ``omegaconf+`` mode: a recipe names its run folder once, as the
top-level ``run_dir``, and derives every output folder from it with OmegaConf interpolation
(``default_root_dir: ${run_dir}``, ``dirpath: ${run_dir}/checkpoints``). Interpolations are resolved
after the command line is read, so ``--run_dir=runs/other`` moves all of them.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

PARSER_MODE = "omegaconf+"
"""jsonargparse's parser mode for training configs: ``${…}`` interpolation, resolved last."""


class TrainCLI(LightningCLI):
    """LightningCLI with a ``run_dir`` setting, that checks the training files before the backbone
    loads (minutes for a 3B model): every source must match files, and every row must pass the schema
    (the row index this builds is cached, so ``prepare_data`` reuses it). Only on a node's first process."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run_dir", type=str, default="runs/train",
                            help="The run's folder; a recipe derives its checkpoint, log and W&B folders from it "
                                 "(${run_dir}).")

    def before_instantiate_classes(self) -> None:
        from obliq.data import TrainingDataModule

        config = self.config.get(self.subcommand) if self.subcommand else self.config
        data = config.get("data") if config is not None else None
        if data is None or self.subcommand not in (None, "fit") or os.environ.get("LOCAL_RANK", "0") != "0":
            return
        settings = data.as_dict()
        settings["sources"] = [dict(s) for s in settings["sources"]]
        TrainingDataModule(**settings).prepare_data()


def cli(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and by default run) ``train.py``'s CLI; ``args`` replaces ``sys.argv[1:]``.

    ``--print_config`` prints the resolved configuration, which is also saved next to the run and
    logged to every logger (W&B included).

    Raises:
        FileNotFoundError, ValueError: a data source matches no file or holds a malformed row
            (``file:line:field``), before the model is built.
    """
    import warnings

    from jsonargparse import set_parsing_settings

    # A recipe's ${run_dir} is written as from the top of the config; under a subcommand (`fit`) the
    # config sits one level down, so jsonargparse turns such paths relative when it loads the file.
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    # Our checkpoints are taken after the optimizer step by design (the step count is the state).
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
    # Deprecation notices between pinned third-party releases (torchdata / Lightning vs torch 2.13).
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    # `obliq quickstart` / `dose-sweep` pass their own args while sys.argv holds theirs: intended.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    from callbacks.logging import LoggedConfig
    from obliq.data import TrainingDataModule
    from obliq.model.module import RetrieverModule

    return TrainCLI(
        RetrieverModule,
        TrainingDataModule,
        save_config_callback=LoggedConfig,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"parser_mode": PARSER_MODE},
        args=args,
        run=run,
    )


def recipe_config(recipe: str | os.PathLike, **overrides) -> dict:
    """A recipe's settings as plain data, its interpolations resolved (OmegaConf), without building
    anything: what ``obliq quickstart`` and ``obliq dose-sweep`` read to find a recipe's data sources.

    Args:
        recipe: a ``train.py`` config file.
        overrides: top-level keys to set before resolving (``run_dir="runs/x"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a YAML mapping, or an interpolation that cannot be resolved (file named).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from obliq.files import read_text

    try:
        config = OmegaConf.create(read_text(recipe))
        if not isinstance(config, dict) and not OmegaConf.is_dict(config):
            raise ValueError(f"{recipe}: expected a mapping of settings")
        for key, value in overrides.items():
            OmegaConf.update(config, key, value)
        return OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as err:
        raise ValueError(f"{recipe}: {err}") from None


def fit_and_export(args: list[str], out: str | os.PathLike) -> Path:
    """Run ``train.py`` with ``args`` (``fit --config …``), save the final weights as
    ``<run_dir>/final.ckpt`` and export its adapter to ``<out>/adapter`` (:func:`obliq.export.export`).

    Returns:
        The adapter folder (what ``evaluate`` loads).
    """
    from obliq.export import export

    run = cli(args)
    final = Path(run.trainer.default_root_dir) / "final.ckpt"
    run.trainer.save_checkpoint(final)
    return Path(export(final, out)["adapter"])