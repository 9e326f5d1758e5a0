"""The training command behind ``train.py``: a LightningCLI over :class:`RetrieverModule` and
:class:`~obliq.data.TrainingDataModule` (in the package, so ``obliq quickstart`` and
``obliq dose-sweep`` call it too)."""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI


def cli(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and by default run) ``train.py``'s CLI; ``args`` replaces ``sys.argv[1:]``.

    ``--print_config`` prints the resolved configuration, which is also saved next to the run and
    logged to every logger (W&B included).
    """
    import warnings

    # Our checkpoints are taken after the optimizer step by design (the step count is the state).
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
    from callbacks.logging import LoggedConfig
    from obliq.data import TrainingDataModule
    from obliq.model.module import RetrieverModule

    return LightningCLI(
        RetrieverModule,
        TrainingDataModule,
        save_config_callback=LoggedConfig,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )
