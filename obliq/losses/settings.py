"""The objective's settings as configs give them: a loss or term as ``{"class_path", "init_args"}``
(:func:`spec`), what a resume changes in them (:func:`objective_differences`, for
:func:`obliq.trainer.resume_differences`), and the flat spelling of before this package, read from old
checkpoints and refused, with its new place, on a command line or in a recipe (:func:`check_flat_objective`)."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch


def spec(part: torch.nn.Module) -> dict:
    """A loss or term as a config names it: ``{"class_path": ..., "init_args": its settings()}``."""
    cls = type(part)
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": part.settings()}


def _spec(value, default: dict | None) -> dict | None:
    """A loss or term config (``class_path`` + ``init_args``, or None for ``default``) with every setting,
    as :func:`spec` records it; a config that cannot be built is returned as given."""
    from jsonargparse import Namespace

    if value is None:
        return default
    value = value.as_dict() if isinstance(value, Namespace) else dict(value)
    try:
        module, _, name = str(value["class_path"]).rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError, KeyError):
        return value  # compared as given; building it is the fit's business
    try:
        return spec(cls(**(value.get("init_args") or {})))
    except (TypeError, ValueError):  # settings the fit will refuse: compared as given, under the class's own name
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": value.get("init_args") or {}}


def _flat_objective(hp: dict) -> tuple[dict | None, list | None]:
    """The loss and terms of a checkpoint written before obliq.losses (its module took ``temperature``,
    ``symmetric``, ``teacher_loss``, … as flat settings), as configs; (None, None) for a newer one."""
    if "loss" in hp or "temperature" not in hp:
        return None, None
    keys = ("temperature", "gather_across_devices", "symmetric", "matryoshka_dims", "matryoshka_weights")
    loss = {"class_path": "obliq.losses.InfoNCE", "init_args": {k: hp[k] for k in keys if k in hp}}
    terms = []
    if hp.get("teacher_loss", "none") != "none":
        args = {"kind": hp["teacher_loss"], "weight": hp.get("teacher_weight", 1.0)}
        args["teacher_temperature"] = hp.get("teacher_temperature", 0.05)
        terms.append({"class_path": "obliq.losses.TeacherScores", "init_args": args})
    if hp.get("relational_weight"):
        args = {"weight": hp["relational_weight"], "teacher_temperature": hp.get("relational_temperature")}
        terms.append({"class_path": "obliq.losses.Relational", "init_args": args})
    if hp.get("guided_margin") is not None:
        terms.append({"class_path": "obliq.losses.GuidedMask", "init_args": {"margin": hp["guided_margin"]}})
    return loss, terms


def objective_differences(stored: dict, model: dict) -> list[tuple[str, object, object]]:
    """``(setting, in the checkpoint, now)`` for the objective's settings (``model.loss``, ``model.terms``):
    key by key within a loss or term of the same class, the whole entry otherwise (C58 for issue 47's
    loss package). Defaults filled on both sides; a checkpoint of the flat settings is read as its configs."""
    from obliq.losses.infonce import InfoNCE

    old_loss, old_terms = _flat_objective(stored)
    default = spec(InfoNCE())
    before = [_spec(old_loss or stored.get("loss"), default)]
    now = [_spec(model.get("loss"), default)]
    names = ["model.loss"]
    terms_before = [_spec(t, None) for t in (old_terms if old_terms is not None else stored.get("terms") or [])]
    terms_now = [_spec(t, None) for t in model.get("terms") or []]
    classes = lambda specs: [t.get("class_path") for t in specs]  # noqa: E731
    if classes(terms_before) != classes(terms_now):
        return _pairs(names, before, now) + [("model.terms", classes(terms_before), classes(terms_now))]
    names += [f"model.terms[{i}]" for i in range(len(terms_now))]
    return _pairs(names, before + terms_before, now + terms_now)


def _pairs(names, before, now) -> list[tuple[str, object, object]]:
    out = []
    for name, a, b in zip(names, before, now):
        if a.get("class_path") != b.get("class_path"):
            out.append((name, a.get("class_path"), b.get("class_path")))
            continue
        args_a, args_b = a.get("init_args") or {}, b.get("init_args") or {}
        out += [(f"{name}.init_args.{k}", args_a.get(k), args_b.get(k)) for k in sorted(args_a.keys() | args_b.keys())]
    return out


FLAT_OBJECTIVE = {
    **{k: f"model.loss.init_args.{k}" for k in ("temperature", "gather_across_devices", "symmetric")},
    **{k: f"model.loss.init_args.{k}" for k in ("matryoshka_dims", "matryoshka_weights")},
    "teacher_loss": "model.terms: obliq.losses.TeacherScores (its kind)",
    "teacher_weight": "model.terms: obliq.losses.TeacherScores (its weight)",
    "teacher_temperature": "model.terms: obliq.losses.TeacherScores (its teacher_temperature)",
    "relational_weight": "model.terms: obliq.losses.Relational (its weight)",
    "relational_temperature": "model.terms: obliq.losses.Relational (its teacher_temperature)",
    "guided_margin": "model.terms: obliq.losses.GuidedMask (its margin)",
}
"""The module's settings of before obliq.losses (issue 47) and where each is now."""


def check_flat_objective(argv: list[str]) -> None:
    """Refuse a setting of the objective in its flat spelling of before ``obliq.losses`` (``--model.temperature``,
    a config file's ``model.relational_weight``, …), saying where it is now (:data:`FLAT_OBJECTIVE`), instead
    of jsonargparse's bare "unrecognized arguments".

    Raises:
        ValueError: naming the setting, where it was given and its new place.
    """
    from obliq.yaml_checks import load_yaml

    found = []
    for n, token in enumerate(argv):
        key = token.split("=", 1)[0]
        if key.startswith("--model.") and key[len("--model.") :] in FLAT_OBJECTIVE:
            found.append((key[len("--model.") :], "the command line"))
        config = token[len("--config=") :] if token.startswith("--config=") else None
        if token == "--config" and n + 1 < len(argv):
            config = argv[n + 1]
        if config and Path(config).is_file():
            try:
                model = (load_yaml(Path(config).read_text(encoding="utf-8"), config) or {}).get("model") or {}
            except Exception:  # noqa: BLE001 - a file jsonargparse will read and refuse itself
                continue
            found += [(k, config) for k in model if isinstance(model, dict) and k in FLAT_OBJECTIVE]
    if found:
        key, where = found[0]
        raise ValueError(
            f"{where}: model.{key} is now {FLAT_OBJECTIVE[key]} (the objective is model.loss and model.terms, "
            "obliq/losses; docs/training.md)"
        )
