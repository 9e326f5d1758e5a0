"""The objective's settings as configs give them: a loss or term as ``{"class_path", "init_args"}``
(:func:`spec`; a wrapper's base loss nested in its ``init_args.loss``), what a resume changes in them
(:func:`objective_differences`, for :func:`obliq.model.resume.resume_differences`), and the spellings of before:
the flat settings of before this package and InfoNCE's flags of before its forms were losses of their own
(``symmetric``, ``multi_positive``, ``matryoshka_dims``, :data:`INFONCE_FLAGS`), read from old checkpoints as the
classes they are now (a command line or recipe that gives them is refused by the training command,
:func:`obliq.commands.train.check_flat_objective`)."""

from __future__ import annotations

import importlib

import torch


def spec(part: torch.nn.Module) -> dict:
    """A loss or term as a config names it: ``{"class_path": ..., "init_args": its settings()}``."""
    cls = type(part)
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": part.settings()}


def build(config):
    """A loss or term from its config (``class_path`` + ``init_args``, a wrapper's ``loss`` a config too).

    Raises:
        ImportError, AttributeError, ValueError, KeyError: no such class; TypeError, ValueError: its refusal.
    """
    module, _, name = str(config["class_path"]).rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    args = {
        k: build(v) if isinstance(v, dict) and "class_path" in v else v
        for k, v in (config.get("init_args") or {}).items()
    }
    return cls(**args)


def _spec(value, default: dict | None) -> dict | None:
    """A loss or term config (``class_path`` + ``init_args``, or None for ``default``) with every setting,
    as :func:`spec` records it; a config that cannot be built is returned as given; InfoNCE's flags of before
    read as the classes they are now (:func:`_infonce_flags`)."""
    from jsonargparse import Namespace

    if value is None:
        return default
    value = _infonce_flags(value.as_dict() if isinstance(value, Namespace) else dict(value))
    try:
        module, _, name = str(value["class_path"]).rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError, KeyError):
        return value  # compared as given; building it is the fit's business
    try:
        return spec(build(value))
    except (TypeError, ValueError):  # settings the fit will refuse: compared as given, under the class's own name
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": value.get("init_args") or {}}


INFONCE_FLAGS = {
    "symmetric": "model.loss: obliq.losses.Symmetric, its init_args.loss the loss it makes symmetric",
    "multi_positive": "model.loss: obliq.losses.MILNCE or obliq.losses.SupCon (losses of rows with several positives)",
    "matryoshka_dims": "model.loss: obliq.losses.Matryoshka, its dims (init_args.loss: the loss at each)",
    "matryoshka_weights": "model.loss: obliq.losses.Matryoshka, its weights (init_args.loss: the loss at each)",
}
"""InfoNCE's settings of before its forms were losses of their own (issue 56), and the class each is now."""


def _infonce_flags(config: dict) -> dict:
    """An ``obliq.losses.InfoNCE`` config of before issue 56 (``symmetric``, ``multi_positive``, ``matryoshka_*``
    among its settings, as every checkpoint of then records them) as the classes that compute the same loss now:
    ``MILNCE`` or ``SupCon`` (the form; ``mil-nce`` was the default, and equals InfoNCE on rows with one positive),
    wrapped in ``Symmetric`` and ``Matryoshka`` as asked. Any other config is returned as it is."""
    args = dict(config.get("init_args") or {})
    infonce = config.get("class_path") in ("obliq.losses.InfoNCE", "obliq.losses.infonce.InfoNCE")
    if not infonce or not args.keys() & INFONCE_FLAGS.keys():
        return config
    symmetric, form = args.pop("symmetric", False), args.pop("multi_positive", "mil-nce")
    dims, weights = args.pop("matryoshka_dims", None), args.pop("matryoshka_weights", None)
    name = {"mil-nce": "MILNCE", "supcon": "SupCon"}.get(form, form)
    out = {"class_path": f"obliq.losses.{name}", "init_args": args}
    if symmetric:
        out = {"class_path": "obliq.losses.Symmetric", "init_args": {"loss": out}}
    if dims:
        out = {"class_path": "obliq.losses.Matryoshka", "init_args": {"loss": out, "dims": dims, "weights": weights}}
    return out


def _flat_objective(hp: dict) -> tuple[dict | None, list | None]:
    """The loss and terms of a checkpoint written before obliq.losses (its module took ``temperature``,
    ``symmetric``, ``teacher_loss``, … as flat settings), as configs of now; (None, None) for a newer one."""
    if "loss" in hp or "temperature" not in hp:
        return None, None
    keys = ("temperature", "gather_across_devices", "symmetric", "matryoshka_dims", "matryoshka_weights")
    loss = _infonce_flags({"class_path": "obliq.losses.InfoNCE", "init_args": {k: hp[k] for k in keys if k in hp}})
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
        for k in sorted(args_a.keys() | args_b.keys()):
            x, y = args_a.get(k), args_b.get(k)
            if all(isinstance(v, dict) and "class_path" in v for v in (x, y)):  # a wrapper's loss: key by key
                out += _pairs([f"{name}.init_args.{k}"], [x], [y])
            else:
                out.append((f"{name}.init_args.{k}", x, y))
    return out
