"""The training command behind ``train.py`` and ``obliq train``: a LightningCLI over
:class:`RetrieverModule` and :class:`~obliq.data.TrainingDataModule` (in the package, so ``obliq
quickstart`` and ``obliq dose-sweep`` call it too).

Configs are read in jsonargparse's ``omegaconf+`` mode: a recipe names its run folder once, as the
top-level ``run_dir``, and derives every output folder from it with OmegaConf interpolation
(``default_root_dir: ${run_dir}``, ``dirpath: ${run_dir}/checkpoints``). Interpolations are resolved
after the command line is read, so ``--run_dir=runs/other`` moves all of them.

**Every run its own folder.** ``run_dir`` names the recipe's folder; each ``fit`` runs in a version of
it (:func:`run_folder`): ``<run_dir>/version_<n>`` (the next free n), or ``<run_dir>/wandb-<id>`` when
a W&B sweep agent or a W&B run id is in the environment (``WANDB_RUN_ID``), so a second run or a sweep
trial never writes over the first one's checkpoints. ``--ckpt_path last`` resumes the newest version
that has a ``last.ckpt``, in its own folder; a checkpoint file inside a version folder resumes there.

**A resume never ignores the command line.** A checkpoint is data: its stored settings are compared
with the user's (:func:`resume_differences`), never merged over them (Lightning's own
``_parse_ckpt_path`` would). Training settings the user changed are applied, and said so: ``lr``,
``weight_decay``, ``warmup_ratio`` (the schedule continues from the checkpoint's step with the new
values), ``max_grad_norm``, ``max_bad_steps``, ``chunk_size``, ``temperature``, ``seed``,
``gather_across_devices``, ``symmetric``, and the encoder's lengths, dtype, attention kernel and gradient
checkpointing. What the trained weights depend on is refused with the list of differences: the
backbone, LoRA, bidirectionality, prefixes and instructions. A changed data mixture (other rows, even as
many), batch size, world size or seed is refused when the data position is restored
(:mod:`obliq.data.datamodule`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

log = logging.getLogger(__name__)

PARSER_MODE = "omegaconf+"
"""jsonargparse's parser mode for training configs: ``${…}`` interpolation, resolved last."""

APPLIED = (
    "lr",
    "weight_decay",
    "warmup_ratio",
    "max_grad_norm",
    "max_bad_steps",
    "chunk_size",
    "temperature",
    "seed",
    "gather_across_devices",
    "symmetric",
    "teacher_loss",
    "teacher_weight",
    "teacher_temperature",
)
"""Module settings a resume takes from the user even when the checkpoint was trained with others."""
ENCODER_IDENTITY = ("backbone", "bidirectional", "query_prefix", "passage_prefix", "use_instructions")
"""Encoder settings the trained weights depend on: a resume that changes one is refused."""
VERSION = re.compile(r"^(version_(\d+)|wandb-\w+)$")


def run_folder(run_dir: str | os.PathLike, ckpt_path: str | None) -> tuple[Path, str | None]:
    """The folder a ``fit`` runs in, and the checkpoint it resumes (see the module notes).

    Returns:
        ``(folder, ckpt_path)``: a version of ``run_dir``; ``ckpt_path`` with ``last`` resolved to the
        newest version's ``last.ckpt`` when there is one (else unchanged, for Lightning to resolve).
    """
    base = Path(run_dir)
    if ckpt_path == "last":
        newest = latest_run(base)
        if newest is not None and newest.last is not None:
            return newest.path, str(newest.last)
    elif ckpt_path and Path(ckpt_path).is_file():
        inside = next(
            (v.path for v in run_versions(base) if Path(ckpt_path).resolve().is_relative_to(v.path.resolve())), None
        )
        if inside is not None:
            return inside, ckpt_path
    wandb_id = os.environ.get("WANDB_RUN_ID")
    if wandb_id:
        return base / ("wandb-" + re.sub(r"\W", "_", wandb_id)), ckpt_path
    taken = [
        int(m.group(2)) for v in run_versions(base) if (m := VERSION.match(v.path.name)) and m.group(2) is not None
    ]
    return base / f"version_{max(taken, default=-1) + 1}", ckpt_path


@dataclass(frozen=True)
class RunFolder:
    """One run of a recipe: a version folder of its ``run_dir`` and the checkpoints in it.

    Attributes:
        path: ``<run_dir>/version_<n>`` or ``<run_dir>/wandb-<id>``.
    """

    path: Path

    @property
    def final(self) -> Path | None:
        """``final.ckpt``: the weights at the end of training (written by :func:`fit`), or None."""
        file = self.path / FINAL
        return file if file.is_file() else None

    @property
    def last(self) -> Path | None:
        """The newest ``last.ckpt`` below the folder (ModelCheckpoint's ``save_last``), or None."""
        found = [f for f in self.path.rglob("last.ckpt") if f.is_file()]
        return max(found, key=lambda f: f.stat().st_mtime) if found else None

    @property
    def newest(self) -> Path | None:
        """The checkpoint to read this run's weights from: ``final.ckpt``, else ``last.ckpt``, else None."""
        return self.final or self.last

    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, file)`` of every step checkpoint below the folder (not ``last``/``final``), by step;
        the step is read from each file (:func:`obliq.model.checkpoint.checkpoint_info`)."""
        from obliq.model.checkpoint import checkpoint_info

        files = [
            f for f in sorted(self.path.rglob("*.ckpt")) if f.name not in ("last.ckpt", FINAL) and not f.is_symlink()
        ]
        return sorted(((checkpoint_info(f).step, f) for f in files), key=lambda p: (p[0], str(p[1])))


FINAL = "final.ckpt"
"""The checkpoint :func:`fit` writes at the end of training, in the run's folder."""


def run_versions(run_dir: str | os.PathLike) -> list[RunFolder]:
    """Every run (version folder) of ``run_dir``, oldest first (by the folder's creation order: its
    version number, W&B runs by modification time after them)."""
    base = Path(run_dir)
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if p.is_dir() and VERSION.match(p.name)]
    key = lambda p: (
        (0, int(VERSION.match(p.name).group(2)), 0.0)
        if VERSION.match(p.name).group(2)
        else (  # noqa: E731
            1,
            0,
            p.stat().st_mtime,
        )
    )
    return [RunFolder(p) for p in sorted(found, key=key)]


def latest_run(run_dir: str | os.PathLike) -> RunFolder | None:
    """The run of ``run_dir`` whose checkpoint was written last (``final.ckpt`` or ``last.ckpt``), like
    litgpt's ``find_resume_path``: what ``--ckpt_path last`` resumes and what a caller reads a recipe's
    trained weights from. None when no run holds a checkpoint."""
    runs = [(r.newest.stat().st_mtime, i, r) for i, r in enumerate(run_versions(run_dir)) if r.newest is not None]
    return max(runs)[2] if runs else None


def resume_differences(ckpt: dict, model: dict, source: object) -> list[str]:
    """What the user asks that differs from the checkpoint's own settings.

    Args:
        ckpt: the checkpoint (read with ``weights_only=True``).
        model: the user's ``model`` config section (``encoder`` with its ``init_args``, and the module's
            settings).
        source: the checkpoint's path, for messages.

    Returns:
        One line per applied difference (``model.lr: 0.001 in the checkpoint, 0.0005 now: applied``).

    Raises:
        ValueError: a difference in what the trained weights depend on (:data:`ENCODER_IDENTITY`,
            LoRA), listing every such difference.
    """
    from obliq.aliases import portable_name

    applied, refused = [], []
    stored = ckpt.get("hyper_parameters") or {}
    for key in APPLIED:
        if key in stored and key in model and stored[key] != model[key]:
            applied.append(f"model.{key}: {stored[key]!r} in the checkpoint, {model[key]!r} now: applied")
    saved = (ckpt.get("obliq") or {}).get("encoder") or {}
    asked = dict((model.get("encoder") or {}).get("init_args") or {})
    for key, value in saved.items():
        if key not in asked or key == "trust_remote_code":
            continue
        same = portable_name(value) == portable_name(asked[key]) if key == "backbone" else value == asked[key]
        if not same:
            line = f"model.encoder.init_args.{key}: {value!r} in the checkpoint, {asked[key]!r} now"
            (refused if key in ENCODER_IDENTITY else applied).append(
                line + ("" if key in ENCODER_IDENTITY else ": applied")
            )
    lora, asked_lora = (ckpt.get("obliq") or {}).get("lora"), asked.get("lora")
    if isinstance(asked_lora, dict) and lora is not None:
        for key, value in lora.items():
            if key in asked_lora and asked_lora[key] != value:
                refused.append(
                    f"model.encoder.init_args.lora.{key}: {value!r} in the checkpoint, {asked_lora[key]!r} now"
                )
    if refused:
        raise ValueError(
            f"{source}: cannot resume with another model: "
            + "; ".join(refused)
            + " (start a new run, or resume with the checkpoint's settings)"
        )
    return applied


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


class TrainCLI(LightningCLI):
    """LightningCLI with a ``run_dir`` setting, that checks the training files before the backbone
    loads (minutes for a 3B model): every source must match files, and every row must pass the schema
    (the row index this builds is cached, so ``prepare_data`` reuses it). Only on a node's first process."""

    def add_arguments_to_parser(self, parser) -> None:
        add_recipe_arguments(parser)

    def parse_arguments(self, parser, args) -> None:
        """Parse, then once more with ``--run_dir`` set to this run's version folder (and ``last``
        resolved), so the recipe's ``${run_dir}`` interpolations land in it."""
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        if sub != "fit" or isinstance(args, dict):
            return
        config = self.config[sub]
        folder, ckpt_path = run_folder(config.run_dir, config.get("ckpt_path"))
        args = list(sys.argv[1:] if args is None else args) + [f"--run_dir={folder}"]
        if ckpt_path != config.get("ckpt_path"):
            args.append(f"--ckpt_path={ckpt_path}")
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Compare the checkpoint's settings with the user's, never merge them over the user's (Lightning's
        own method would, silently): applied differences are logged, refused ones raise."""
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if not path or not Path(path).is_file():
            return
        from obliq.model.checkpoint import read_checkpoint

        model = self.config[sub].get("model")
        ckpt = read_checkpoint(path)
        for line in resume_differences(ckpt, model.as_dict() if hasattr(model, "as_dict") else dict(model), path):
            log.warning("resume from %s: %s", path, line)

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
    from obliq.callbacks.logging import LoggedConfig
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


def recipe_config(recipe: str | os.PathLike, *more: str | os.PathLike, **overrides) -> dict:
    """A recipe's settings as plain data, its interpolations resolved (OmegaConf), without building
    anything: what ``obliq quickstart``, ``obliq dose-sweep`` and the examples read to find a recipe's
    folders and data sources.

    Args:
        recipe: a ``train.py`` config file.
        more: configs stacked on it, as ``train.py fit --config A --config B`` stacks them (what a later
            file sets replaces the earlier's; lists are replaced whole).
        overrides: top-level keys to set before resolving (``run_dir="runs/x"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a YAML mapping, or an interpolation that cannot be resolved (file named).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from obliq.files import read_text

    try:
        parts = []
        for file in (recipe, *more):
            config = OmegaConf.create(read_text(file))
            if not OmegaConf.is_dict(config):
                raise ValueError(f"{file}: expected a mapping of settings")
            parts.append(config)
        config = OmegaConf.merge(*parts)
        for key, value in overrides.items():
            OmegaConf.update(config, key, value)
        return OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as err:
        raise ValueError(f"{recipe}: {err}") from None


@dataclass(frozen=True)
class Fitted:
    """What :func:`fit` (and :func:`fit_and_export`) produced.

    Attributes:
        run: the run's folder (:class:`RunFolder`).
        checkpoint: its ``final.ckpt``.
        adapter: the exported adapter folder (:func:`fit_and_export` only).
    """

    run: RunFolder
    checkpoint: Path
    adapter: Path | None = None


def fit(args: list[str]) -> Fitted:
    """Run ``train.py`` with ``args`` (``fit --config …``) and save the final weights as
    ``<run folder>/final.ckpt``.

    Raises:
        ValueError: ``args`` is not a ``fit`` command line.
    """
    if not args or args[0] != "fit":
        raise ValueError(f"expected a fit command line (fit --config …), got {args[:2]}")
    run = cli(args)
    folder = RunFolder(Path(run.config.fit.run_dir))
    final = folder.path / FINAL
    run.trainer.save_checkpoint(final)
    return Fitted(folder, final)


def fit_and_export(args: list[str], out: str | os.PathLike, overwrite: bool = False) -> Fitted:
    """:func:`fit`, then export the final weights' adapter to ``<out>/adapter`` (:func:`obliq.export.export`).

    Args:
        args: the training command line.
        out: the export folder.
        overwrite: replace an earlier export there (refused otherwise, before training).

    Returns:
        The run, its final checkpoint and the adapter folder (what ``evaluate`` loads).
    """
    from obliq.export import export
    from obliq.files import claim_output

    claim_output(out, overwrite, "an export")
    fitted = fit(args)
    adapter = Path(export(fitted.checkpoint, out, overwrite=True)["adapter"])
    return Fitted(fitted.run, fitted.checkpoint, adapter)
