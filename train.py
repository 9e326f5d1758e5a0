"""Train a retriever: ``python train.py fit --config configs/<recipe>.yaml [--key=value …] [--ckpt_path last]``.

The same command as ``obliq train`` (LightningCLI over the RetrieverModule and the
TrainingDataModule, :func:`obliq.commands.train.cli`). ``--print_config`` prints the resolved configuration.
"""

import sys

from obliq.cli import main

if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
