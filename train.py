"""Train a retriever: ``python train.py fit --config configs/<recipe>.yaml [--key=value …] [--ckpt_path last]``.

A thin entry point; the CLI is :func:`obliq.trainer.cli` (LightningCLI over the RetrieverModule and
the TrainingDataModule). ``--print_config`` prints the resolved configuration.
"""

from obliq.trainer import cli

if __name__ == "__main__":
    cli()
