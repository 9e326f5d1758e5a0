"""Train a retriever: ``python train.py fit --config configs/<recipe>.yaml [--key=value …] [--ckpt_path last]``.

A thin LightningCLI over :class:`obliq.model.RetrieverModule` and :class:`obliq.data.TrainingDataModule`;
``--print_config`` prints the resolved configuration, which is also saved next to the run.
"""

from lightning.pytorch.cli import LightningCLI

from obliq.data import TrainingDataModule
from obliq.model.module import RetrieverModule


def main(args=None, run: bool = True) -> LightningCLI:
    """Build (and by default run) the CLI; ``args`` replaces ``sys.argv[1:]`` (tests, sweeps)."""
    return LightningCLI(
        RetrieverModule,
        TrainingDataModule,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
