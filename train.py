"""Train a retriever: ``python train.py fit --config configs/<recipe>.yaml [--key=value …] [--ckpt_path last]``.

A thin entry point; the CLI is :func:`obliq.trainer.cli` (LightningCLI over the RetrieverModule and
the TrainingDataModule). ``--print_config`` prints the resolved configuration.
"""

from obliq.errors import user_errors
from obliq.trainer import cli

if __name__ == "__main__":
    with user_errors():
        cli()
