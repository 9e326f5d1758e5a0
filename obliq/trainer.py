"""The training command behind ``train.py``: a LightningCLI over :class:`RetrieverModule` and
:class:`~obliq.data.TrainingDataModule` (in the package, so ``obliq quickstart`` and
``obliq dose-sweep`` call it too)."""

from __future__ import annotations

import os

from lightning.pytorch.cli import LightningCLI


class TrainCLI(LightningCLI):
    """LightningCLI that checks the training files before the backbone loads (minutes for a 3B
    model): every source must match files, and every row must pass the schema (the row index this
    builds is cached, so ``prepare_data`` reuses it). Only on a node's first process."""

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
        args=args,
        run=run,
    )
