"""The training command behind ``train.py`` and ``obliq train``: a LightningCLI over
:class:`RetrieverModule` and :class:`~obliq.data.TrainingDataModule` (in the package, so ``obliq
quickstart`` and ``obliq dose-sweep`` call it too).

Configs are read in jsonargparse's ``omegaconf+`` mode: a recipe names its run folder once, as the
top-level ``run_dir``, and derives every output folder from it with OmegaConf interpolation
(``default_root_dir: ${run_dir}``, ``dirpath: ${run_dir}/checkpoints``). Interpolations are resolved
after the command line is read, so ``--run_dir=runs/other`` moves all of them; a command-line value may
use them too, spelled as in the recipe (``--run_dir='${work_dir}/sweep'``, :func:`~obliq.recipes.recipe_spelling`).

**Every run its own folder** (:mod:`obliq.runs`): each ``fit`` runs in a version folder of the recipe's
``run_dir`` (:func:`~obliq.runs.run_folder`), which records its owner; ``--ckpt_path last`` resumes the
newest run this job may continue; on SIGTERM a run saves ``sigterm.ckpt`` there and exits with status 143.
The recipe's files are read as :mod:`obliq.recipes` reads them.

**A resume never ignores the command line.** A checkpoint is data: its stored settings are compared
with the user's (:func:`resume_differences`), never merged over them (Lightning's own
``_parse_ckpt_path`` would). Every module setting and every encoder setting the checkpoint records that
the user changed is applied, and said so (``lr``, ``warmup_ratio``: the schedule continues from the
checkpoint's step with the new values; the loss's and each term's settings (``model.loss.init_args.temperature``,
``model.terms``, …): from the next step).
What the trained weights depend on (:data:`REFUSED`) is refused with the list of differences: the
backbone, LoRA, bidirectionality, prefixes and instructions. A changed data mixture (other rows, even as
many), batch size, world size or seed is refused when the data position is restored
(:mod:`obliq.data.datamodule`).

**A fit that trains nothing says so** (issue 49 §4): settings that train no batch (``max_steps``,
``max_epochs`` or ``limit_train_batches`` 0) are refused before a folder is claimed or a model loaded;
a fit that took no optimizer step all the same is an error after it (:meth:`TrainCLI.after_fit`),
except a resume already at its last step: ``already at step N of N: nothing to train``, exit 0.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

from obliq.callbacks.checkpoints import CheckpointOnSigterm
from obliq.callbacks.progress import StepProgressBar
from obliq.losses.settings import INFONCE_FLAGS
from obliq.model.resume import resume_differences
from obliq.recipes import PARSER_MODE, add_recipe_arguments, recipe_imports, recipe_spelling
from obliq.runs import FINAL, RUN_FOLDER_ENV, RunFolder, check_checkpoint_folders, drop_refused_folder, run_folder

log = logging.getLogger(__name__)

FLAT_OBJECTIVE = {
    **{k: f"model.loss.init_args.{k}" for k in ("temperature", "gather_across_devices")},
    **{k: INFONCE_FLAGS[k] for k in ("symmetric", "matryoshka_dims", "matryoshka_weights")},
    "teacher_loss": "model.terms: obliq.losses.TeacherScores (its kind)",
    "teacher_weight": "model.terms: obliq.losses.TeacherScores (its weight)",
    "teacher_temperature": "model.terms: obliq.losses.TeacherScores (its teacher_temperature)",
    "relational_weight": "model.terms: obliq.losses.Relational (its weight)",
    "relational_temperature": "model.terms: obliq.losses.Relational (its teacher_temperature)",
    "guided_margin": "model.terms: obliq.losses.GuidedMask (its margin)",
}
"""The module's settings of before obliq.losses (issue 47) and where each is now."""


def _old_flags(loss, path: str) -> list[tuple[str, str]]:
    """Every InfoNCE flag of before issue 56 (:data:`INFONCE_FLAGS`) in a config's ``model.loss`` (its
    ``init_args`` or the short form, a wrapper's ``loss`` within), with where it stands (``model.loss.init_args.
    symmetric``)."""
    if not isinstance(loss, dict):
        return []
    found = [(k, f"{path}.{k}") for k in loss if k in INFONCE_FLAGS]
    args = loss.get("init_args")
    if isinstance(args, dict):
        found += [(k, f"{path}.init_args.{k}") for k in args if k in INFONCE_FLAGS]
        found += _old_flags(args.get("loss"), f"{path}.init_args.loss")
    return found + _old_flags(loss.get("loss"), f"{path}.loss")


def check_flat_objective(argv: list[str]) -> None:
    """Refuse a setting of the objective in a spelling of before: flat, before ``obliq.losses``
    (``--model.temperature``, a config file's ``model.relational_weight``, …), or one of InfoNCE's flags of before
    its forms were losses of their own (``symmetric``, ``multi_positive``, ``matryoshka_*``: no loss of now has
    them, so they are refused on any loss, a wrapper's inner one and the short ``--model.loss.symmetric`` form
    included), saying where it is now (:data:`FLAT_OBJECTIVE`, :data:`INFONCE_FLAGS`), instead of jsonargparse's
    bare "unrecognized arguments" or its list of union subtypes.

    Raises:
        ValueError: naming the setting, where it was given and its new place.
    """
    from obliq.yaml_checks import load_yaml

    found, flags = [], []
    for n, token in enumerate(argv):
        key = token.partition("=")[0]
        if key.startswith("--model.") and key[len("--model.") :] in FLAT_OBJECTIVE:
            found.append((key[len("--model.") :], "the command line"))
        if key.startswith("--model.loss.") and key.split(".")[-1] in INFONCE_FLAGS:
            flags.append((key.split(".")[-1], key[2:], "the command line"))
        config = token[len("--config=") :] if token.startswith("--config=") else None
        if token == "--config" and n + 1 < len(argv):
            config = argv[n + 1]
        if config and Path(config).is_file():
            try:
                model = (load_yaml(Path(config).read_text(encoding="utf-8"), config) or {}).get("model") or {}
            except Exception:  # noqa: BLE001 - a file jsonargparse will read and refuse itself
                continue
            if not isinstance(model, dict):
                continue
            found += [(k, config) for k in model if k in FLAT_OBJECTIVE]
            flags += [(k, where, config) for k, where in _old_flags(model.get("loss"), "model.loss")]
    if found:
        key, where = found[0]
        raise ValueError(
            f"{where}: model.{key} is now {FLAT_OBJECTIVE[key]} (the objective is model.loss and model.terms, "
            "obliq/losses; docs/training.md)"
        )
    if flags:
        key, name, where = flags[0]
        raise ValueError(
            f"{where}: {name}, InfoNCE's flag of before its forms were losses of their own, is no setting of any "
            f"loss now: {INFONCE_FLAGS[key]} (docs/training.md)"
        )


LOGGER = "--trainer.logger"
LOGGER_CARRIES = ("save_dir",)
"""A logger's settings that carry over when the command line swaps its class (C31): only the folder."""


def _logger_events(argv: list[str]) -> list[tuple]:
    """What each token of ``argv`` does to ``trainer.logger``, in order: ``("class", path, keys)`` sets
    its class (a config file's logger, ``--trainer.logger=X``, ``.class_path``, a JSON spec),
    ``("keys", keys)`` sets init args, ``("reset",)`` clears it (null, a bool, a list)."""
    from obliq.yaml_checks import load_yaml

    def spec_event(spec) -> tuple | None:
        if isinstance(spec, dict):
            init = spec.get("init_args") if "class_path" in spec else spec.get("init_args", spec)
            keys = set(init) if isinstance(init, dict) else set()
            return ("class", str(spec["class_path"]), keys) if "class_path" in spec else ("keys", keys)
        if spec is None or isinstance(spec, (bool, list)):
            return ("reset",)
        return ("class", str(spec), set())

    events = []
    for i, token in enumerate(argv):
        option, eq, value = token.partition("=")
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
        elif not eq:
            continue
        if option == "--config":
            try:
                data = load_yaml(Path(value).read_text(encoding="utf-8-sig"), value)
            except (OSError, ValueError):
                continue  # the parser reports it
            data = data.get("fit", data) if isinstance(data, dict) else {}
            trainer = data.get("trainer") if isinstance(data, dict) else None
            if isinstance(trainer, dict) and "logger" in trainer:
                events.append(spec_event(trainer["logger"]))
        elif option in (LOGGER, LOGGER + ".class_path"):
            try:
                spec = load_yaml(value, option) if value.lstrip().startswith("{") else value
            except ValueError:
                spec = value
            events.append(("reset",) if str(spec).lower() in ("null", "none", "true", "false") else spec_event(spec))
        elif option.startswith(LOGGER + "."):
            events.append(("keys", {option[len(LOGGER) + 1 :].removeprefix("init_args.").split(".")[0]}))
    return [e for e in events if e is not None]


def logger_swap(argv: list[str], config) -> list[str]:
    """The argument that makes a logger whose class the command line (or a stacked config) swapped keep
    only :data:`LOGGER_CARRIES` of the earlier logger's settings, plus what was given at or after the swap.

    jsonargparse merges ``--trainer.logger=<another class>`` over the config's logger and keeps every
    init arg the new class also accepts (jsonargparse #460, Lightning #15796): the quickstart's
    ``CSVLogger(name="logs")`` made every W&B sweep trial "logs" (C31). The fix sets every other init
    arg back to the new class's own default, in the final parse; what is kept is carried as written, so
    ``${run_dir}`` in it resolves to the run's folder.

    Args:
        argv: the command line.
        config: the parsed config (of the subcommand) whose ``trainer.logger`` was merged.

    Returns:
        Extra arguments to append (none when no class was swapped). A list of loggers is left as it is.
    """
    current, explicit, swapped = None, set(), False
    for event in _logger_events(argv):
        if event[0] == "reset":
            current, explicit, swapped = None, set(), False
        elif event[0] == "keys":
            explicit |= event[1]
        else:
            path = event[1]
            if current is None:
                same = True
            elif "." in path and "." in current:
                same = path == current
            else:  # a short name (WandbLogger) against a full one
                same = path.rsplit(".", 1)[-1] == current.rsplit(".", 1)[-1]
            if not same:
                swapped, explicit = True, set()
            explicit |= event[2]
            current = path
    logger = config.get("trainer", {}).get("logger") if config is not None else None
    if not swapped or not isinstance(logger, Namespace) or "class_path" not in logger:
        return []
    init = logger.get("init_args")
    init = init.as_dict() if isinstance(init, Namespace) else dict(init or {})
    module, _, name = logger.class_path.rpartition(".")
    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    reset = {
        k: params[k].default
        for k in init
        if k not in LOGGER_CARRIES and k not in explicit and k in params and params[k].default is not params[k].empty
    }
    return [f"{LOGGER}={json.dumps({'init_args': reset}, default=str)}"] if reset else []


class TrainCLI(LightningCLI):
    """LightningCLI with a ``run_dir`` setting, that checks the training files before the backbone
    loads (minutes for a 3B model): every source must match files, and every row must pass the schema
    (the row index this builds is cached, so ``prepare_data`` reuses it). Only on a node's first process.

    Every ``fit`` gets :class:`~obliq.callbacks.CheckpointOnSigterm` (a checkpoint in its run folder and
    exit status 143 on SIGTERM), and a logger swapped on the command line keeps only its folder
    (:func:`logger_swap`)."""

    claim = True
    """Claim the run folder when parsing (False: name it only)."""

    def add_arguments_to_parser(self, parser) -> None:
        add_recipe_arguments(parser)

    def parse_arguments(self, parser, args) -> None:
        """Parse with ``--run_dir`` set to this run's version folder (and ``last`` resolved), so the
        recipe's ``${run_dir}`` interpolations land in it, and with a swapped logger rebuilt
        (:func:`logger_swap`). ``--print_config`` sees the final config and claims no folder.

        Two parses at most: the first finds the run folder (and whether the logger was swapped), the
        second, of the command line as given plus the folder, is the config the run uses. A ``${…}`` in a
        command-line value means what it means in the recipe file (:func:`~obliq.recipes.recipe_spelling`,
        jsonargparse #864), with or without the ``fit`` subcommand (:func:`train_config`)."""
        if isinstance(args, (dict, Namespace)):
            return super().parse_arguments(parser, args)
        argv = recipe_spelling(list(sys.argv[1:] if args is None else args))  # ${work_dir} as in the recipe
        check_flat_objective(argv)
        printing = [a for a in argv if a.startswith("--print_config")]
        quiet = [a for a in argv if a not in printing]
        config = parser.parse_args(quiet)
        sub = config.get("subcommand")
        section = config[sub] if sub else config
        extra = []
        if sub in ("fit", None):  # None: built with run=False, a fit's config without the subcommand
            _check_teacher_settings(section)  # before a run folder is claimed
            _check_trains(section)
            asked = section.get("ckpt_path")
            folder, ckpt_path = run_folder(section.run_dir, asked, claim=self.claim and not printing)
            extra = [f"--run_dir={folder}"] + ([f"--ckpt_path={ckpt_path}"] if ckpt_path != asked else [])
        extra += logger_swap(quiet, section)
        self.config = parser.parse_args(argv + extra) if extra or printing else config
        if sub in ("fit", None) and self.claim and not printing:
            final = self.config[sub] if sub else self.config
            callbacks = [c for c in final.trainer.get("callbacks") or [] if hasattr(c, "get")]
            dirpaths = [
                (c.get("init_args") or {}).get("dirpath")
                for c in callbacks
                if str(c.get("class_path", "")).endswith("ModelCheckpoint")
            ]
            check_checkpoint_folders(Path(final.run_dir), dirpaths, final.get("ckpt_path"))

    def instantiate_trainer(self, **kwargs):
        """The trainer, with :class:`~obliq.callbacks.CheckpointOnSigterm` in the run's folder."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if self.subcommand in ("fit", None):
            folder = config.get("run_dir") or config.trainer.get("default_root_dir") or "."
            defaults = [CheckpointOnSigterm(folder)]
            configured = [
                str(c.get("class_path", "")) for c in config.trainer.get("callbacks") or [] if hasattr(c, "get")
            ]
            if config.trainer.get("enable_progress_bar") is not False and not any(
                "ProgressBar" in c for c in configured
            ):
                defaults.append(StepProgressBar())  # step n/total, not Lightning's "Epoch 0/-2"
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": defaults}
        return super().instantiate_trainer(**kwargs)

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

    def after_fit(self) -> None:
        """A fit that took no optimizer step says so: a resume already at its last step is done (one line,
        exit 0, as a rerun of a finished job should be); any other is an error (exit 2), never a silent 0."""
        import torch

        trainer = self.trainer
        path = trainer.ckpt_path  # the checkpoint Lightning resumed from (``last`` resolved), or None
        # its step, as Lightning restored it (mapped, not read: the weights are not needed)
        start = int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"]) if path else 0
        if trainer.global_step > start:
            return
        total = self.model.total_steps() if hasattr(self.model, "total_steps") else trainer.max_steps
        if start and start == total:
            if trainer.is_global_zero:
                log.warning("already at step %d of %d: nothing to train", start, total)
            return
        if start > total > 0:
            knob = "trainer.max_steps" if trainer.max_steps and trainer.max_steps > 0 else "trainer.max_epochs"
            raise ValueError(
                f"the checkpoint is at step {start}, past the {total} steps of this run ({knob}): nothing to train; "
                f"raise {knob} to train on"
            )
        raise ValueError(
            f"the fit trained no batch: no optimizer step from step {start} of {total} (trainer.limit_train_batches "
            f"{trainer.limit_train_batches}; steps skipped as non-finite: {getattr(self.model, 'bad_steps', 0)})"
        )

    def before_instantiate_classes(self) -> None:
        from obliq.data import TrainingDataModule

        config = self.config.get(self.subcommand) if self.subcommand else self.config
        data = config.get("data") if config is not None else None
        if data is None or self.subcommand not in (None, "fit") or os.environ.get("LOCAL_RANK", "0") != "0":
            return
        settings = data.as_dict()
        settings["sources"] = [dict(s) for s in settings["sources"]]
        TrainingDataModule(**settings).prepare_data()


def _check_trains(config) -> None:
    """Refuse a ``fit`` whose trainer settings leave nothing to train (``trainer.max_steps``,
    ``max_epochs`` or ``limit_train_batches`` 0), before any folder is made or model loaded: Lightning
    would stop at once and exit 0 (issue 49 §4). Whatever else trains no batch is refused after the fit
    (:meth:`TrainCLI.after_fit`)."""
    trainer = config.get("trainer") or {}
    for key in ("max_steps", "max_epochs", "limit_train_batches"):
        value = trainer.get(key)
        if value is not None and not isinstance(value, bool) and value == 0:
            raise ValueError(f"trainer.{key} is {value}: the fit would train no batch (set it above 0)")


def _check_teacher_settings(config) -> None:
    """Refuse a ``model.terms`` entry that needs a batch key the data will not provide (a term of the
    teacher's vectors without ``data.teacher_vectors``: :func:`obliq.losses.check_terms`), and a
    ``data.teacher_vectors`` that is no ``.npz`` archive, before any folder is made or model loaded."""
    model, data = config.get("model"), config.get("data")
    if data is not None and data.get("teacher_vectors"):
        from obliq.data.teacher_table import check_archive

        check_archive(data.get("teacher_vectors"))  # a missing or text file: refused before the folder too
    if model is None or not model.get("terms"):
        return
    from obliq.losses import check_terms

    classes = []
    for i, term in enumerate(model.get("terms")):
        path = str(term.get("class_path", "")) if hasattr(term, "get") else ""
        module, _, name = path.rpartition(".")
        try:
            classes.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(f"model.terms[{i}]: no class {path!r} ({err})") from None
    check_terms(classes, data.as_dict() if hasattr(data, "as_dict") else dict(data or {}))


def cli(
    args: list[str] | None = None,
    run: bool = True,
    cli_class: type[LightningCLI] = TrainCLI,
    prog: str | None = None,
) -> LightningCLI:
    """Build (and by default run) ``train.py``'s CLI; ``args`` replaces ``sys.argv[1:]``.

    ``--print_config`` prints the resolved configuration, which is also saved next to the run and
    logged to every logger (W&B included).

    Raises:
        FileNotFoundError, ValueError: a data source matches no file or holds a malformed row
            (``file:line:field``), before the model is built.
    """
    import warnings

    from jsonargparse import set_parsing_settings

    from obliq.yaml_checks import install_yaml_checks

    # A recipe's ${run_dir} is written as from the top of the config; under a subcommand (`fit`) the
    # config sits one level down, so jsonargparse turns such paths relative when it loads the file.
    # A recipe names classes only under RECIPE_IMPORTS: jsonargparse imports a class_path's module (and
    # runs its top-level code) before it checks the class's type, so anything else is refused unread.
    set_parsing_settings(
        omegaconf_absolute_to_relative_paths=True,
        import_path_denylist=["*"],
        import_path_allowlist=recipe_imports(),
    )
    install_yaml_checks()
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

    before = os.environ.get(RUN_FOLDER_ENV)
    try:
        return cli_class(
            RetrieverModule,
            TrainingDataModule,
            save_config_callback=LoggedConfig,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"parser_mode": PARSER_MODE, **({"prog": prog} if prog else {})},
            args=args,
            run=run,
        )
    except (Exception, SystemExit):
        drop_refused_folder(before)
        raise


class _ParseOnly(TrainCLI):
    claim = False

    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


def train_config(args: list[str]) -> Namespace:
    """The configuration ``train.py`` would run ``args`` with, parsed as it parses them (the run folder
    named but not claimed, ``last`` resolved, a swapped logger rebuilt), with nothing built or read."""
    if args[:1] != ["fit"]:
        raise ValueError(f"expected a fit command line (fit --config …), got {args[:2]}")
    return cli(args[1:], run=False, cli_class=_ParseOnly).config


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
    """:func:`fit`, then export the final weights' adapter to ``<out>/adapter`` (:func:`obliq.commands.export.export`).

    Args:
        args: the training command line.
        out: the export folder.
        overwrite: replace an earlier export there (refused otherwise, before training).

    Returns:
        The run, its final checkpoint and the adapter folder (what ``evaluate`` loads).
    """
    from obliq.claims import claim_outputs
    from obliq.commands.export import export

    configs = [a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args) if a.startswith("--config")]
    with claim_outputs(
        {"out": out}, command="export", inputs=configs, overwrite=overwrite, what="an export", folders=["out"]
    ):
        fitted = fit(args)
        adapter = Path(export(fitted.checkpoint, out, overwrite=True)["adapter"])
    return Fitted(fitted.run, fitted.checkpoint, adapter)
