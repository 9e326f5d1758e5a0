"""Experiment logging: a W&B logger that is offline unless W&B is configured and that continues a
resumed run, and a config callback that records the resolved config with every logger."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import yaml
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger as _WandbLogger

RUN_ID_FILE = "wandb-run-id"


def wandb_configured() -> bool:
    """True when W&B can sync: ``WANDB_MODE=online``, or an API key in the environment or ~/.netrc."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("offline", "disabled", "dryrun"):
        return False
    if mode == "online" or os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class WandbLogger(_WandbLogger):
    """Lightning's ``WandbLogger`` with obliq's defaults.

    - Offline (runs written under ``save_dir/wandb``, sync later with ``wandb sync``) unless W&B is
      configured (:func:`wandb_configured`) or ``offline`` is given.
    - The run id is kept in ``save_dir/wandb-run-id``: a run resumed from a checkpoint in the same
      folder continues the same W&B run (``resume="allow"``). Lightning logs every metric with
      ``trainer/global_step`` as its x-axis, so steps replayed after a resume are not dropped.

    Args: those of ``lightning.pytorch.loggers.WandbLogger``; ``offline=None`` means "decide".
    """

    def __init__(
        self,
        project: str = "obliq",
        name: str | None = None,
        save_dir: str = "runs",
        offline: bool | None = None,
        id: str | None = None,
        **kwargs,
    ):
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        id_file = Path(save_dir) / RUN_ID_FILE
        if id is None:
            if id_file.is_file():
                id = id_file.read_text().strip()
            else:
                id = uuid.uuid4().hex[:8]  # W&B's id format: 8 lowercase alphanumerics
                id_file.write_text(id + "\n")
        kwargs.setdefault("resume", "allow")
        super().__init__(
            project=project,
            name=name,
            save_dir=save_dir,
            id=id,
            offline=(not wandb_configured()) if offline is None else offline,
            **kwargs,
        )


class LoggedConfig(SaveConfigCallback):
    """Saves the resolved config next to the run (``config.yaml``) and logs it to every logger."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})
