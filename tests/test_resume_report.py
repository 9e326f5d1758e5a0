"""C58: a resume with changed settings reports every change (applied) or refuses it, for every setting,
derived from the settings themselves (Lightning #20801, PR #21455) — not from a list new settings forget."""

from __future__ import annotations

import inspect
import logging
import re
import typing
from dataclasses import fields
from pathlib import Path

import pytest
from support import REPO, fit_here, task_rows, write_config, write_rows


@pytest.fixture(scope="module")
def one_step(tasks_dir, minilm_path, tmp_path_factory) -> tuple[Path, Path]:
    """The case's input: a 1-step fit of MiniLM (lr 0.005) on 8 rows; its config and checkpoint."""
    folder = tmp_path_factory.mktemp("one-step")
    rows = write_rows(folder / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=8))
    config = write_config(folder, rows, minilm_path, max_steps=1, model__lr=0.005)
    fit_here(config)
    return config, folder / "ckpt" / "epoch=0-step=1.ckpt"


@pytest.mark.slow
def test_a_resume_with_new_matryoshka_dims_says_so(one_step, caplog):
    config, ckpt = one_step
    caplog.set_level(logging.WARNING, logger="obliq.commands.train")
    resumed = fit_here(
        config,
        "--trainer.max_steps=2",
        "--model.lr",
        "0.002",
        "--model.loss.init_args.matryoshka_dims",
        "[384, 64]",
        "--ckpt_path",
        str(ckpt),
    )
    assert resumed.trainer.global_step == 2 and resumed.model.loss.matryoshka_dims == [384, 64]
    assert resumed.model.hparams.loss["init_args"]["matryoshka_dims"] == [384, 64]
    assert "model.lr: 0.005 in the checkpoint, 0.002 now: applied" in caplog.text
    assert "model.loss.init_args.matryoshka_dims: None in the checkpoint, [384, 64] now: applied" in caplog.text


def _other(value, annotation):
    """A value other than ``value`` of the setting's type."""
    if value is None:
        kind = next(a for a in typing.get_args(annotation) if a is not type(None))
        if typing.get_origin(kind) is typing.Literal:
            return typing.get_args(kind)[0]
        return [1] if typing.get_origin(kind) is list else kind(1)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, list):
        return [*value, value[-1]]
    if isinstance(value, dict):  # a LoRA rank or alpha pattern
        return {**value, "other": 2}
    raise AssertionError(f"no other value for {value!r}: teach _other this type")


OTHER = {
    ("InfoNCE", "multi_positive"): "supcon",
    ("InfoNCE", "matryoshka_dims"): [384, 32],
    ("InfoNCE", "matryoshka_weights"): [1.0, 0.25],
    ("TeacherScores", "kind"): "margin-mse",
}
"""Another value of a loss's or term's setting where :func:`_other`'s is not one the class accepts."""


def _other_setting(cls, args: dict, key: str, annotation):
    """A value of ``cls``'s setting ``key`` other than ``args[key]`` that ``cls`` accepts with the other ``args``
    (a config that cannot be built is not compared key by key)."""
    value = OTHER.get((cls.__name__, key), _other(args[key], annotation))
    cls(**{**args, key: value})  # refused: teach OTHER this setting
    return value


def _settings(cls) -> dict:
    hints = typing.get_type_hints(cls.__init__)
    return {n: hints[n] for n in inspect.signature(cls).parameters}


def test_changing_any_setting_on_resume_is_reported_or_refused(one_step):
    """Walks every RetrieverModule setting, every setting of its loss (InfoNCE) and of every term of
    obliq.losses, every BiEncoder setting and every LoRA setting: changed on a resume, each is reported as
    applied or refused (a setting a checkpoint does not record is named in UNRECORDED, with why), so a new
    setting cannot be forgotten. The docs' refused row stays REFUSED."""
    import copy

    import obliq.losses
    from obliq.commands.train import REFUSED, UNRECORDED, resume_differences, train_config
    from obliq.losses import InfoNCE, Term
    from obliq.model.checkpoint import read_checkpoint
    from obliq.model.encoder import BiEncoder, LoraSettings
    from obliq.model.module import RetrieverModule, spec

    config, ckpt_path = one_step
    ckpt = read_checkpoint(ckpt_path)
    model = train_config(["fit", "--config", str(config)]).model.as_dict()
    assert resume_differences(ckpt, model, ckpt_path) == []  # a plain resume: nothing to say

    def outcome(changed: dict, name: str) -> str:
        try:
            lines = resume_differences(ckpt, changed, ckpt_path)
        except ValueError as err:
            assert f"{name}: " in str(err), err
            return "refused"
        assert [line.split(": ")[0] for line in lines] == [name], lines
        assert lines[0].endswith(": applied")
        return "applied"

    seen = {}
    for key, annotation in _settings(RetrieverModule).items():
        if key in ("encoder", "loss", "terms"):  # walked below, setting by setting
            continue
        changed = copy.deepcopy(model)
        changed[key] = _other(model[key], annotation)
        seen[key] = outcome(changed, f"model.{key}")
    assert model["loss"]["class_path"] == "obliq.losses.InfoNCE"
    changed = copy.deepcopy(model)
    changed["loss"]["init_args"]["temperature"] = 0.07  # the recipe's loss itself
    seen["loss"] = outcome(changed, "model.loss.init_args.temperature")
    # a checkpoint trained with Matryoshka dimensions and weights (so that each can change alone)
    loss_args = {**model["loss"]["init_args"], "matryoshka_dims": [384, 64], "matryoshka_weights": [1.0, 0.5]}
    with_dims = copy.deepcopy(ckpt)
    with_dims["hyper_parameters"]["loss"] = spec(InfoNCE(**loss_args))
    asked = copy.deepcopy(model)
    asked["loss"]["init_args"] = loss_args
    assert resume_differences(with_dims, asked, ckpt_path) == []
    for key, annotation in _settings(InfoNCE).items():
        changed = copy.deepcopy(asked)
        changed["loss"]["init_args"][key] = _other_setting(InfoNCE, loss_args, key, annotation)
        lines = resume_differences(with_dims, changed, ckpt_path)
        assert [line.split(": ")[0] for line in lines] == [f"model.loss.init_args.{key}"], lines
        assert lines[0].endswith(": applied")
        seen[f"loss.{key}"] = "applied"
    assert not model.get("terms")  # the recipe has none: adding one is a change
    changed = copy.deepcopy(model)
    changed["terms"] = [{"class_path": "obliq.losses.Relational", "init_args": {"weight": 0.5}}]
    seen["terms"] = outcome(changed, "model.terms")
    classes = [getattr(obliq.losses, n) for n in obliq.losses.__all__]
    terms = [c for c in classes if isinstance(c, type) and issubclass(c, Term) and c is not Term]
    assert {c.__name__ for c in terms} >= {"TeacherScores", "Relational", "GuidedMask"}
    for cls in terms:  # a checkpoint trained with the term, resumed with one of its settings changed
        with_term = copy.deepcopy(ckpt)
        with_term["hyper_parameters"]["terms"] = [spec(cls())]
        asked = copy.deepcopy(model)
        asked["terms"] = [spec(cls())]
        assert resume_differences(with_term, asked, ckpt_path) == []
        for key, annotation in _settings(cls).items():
            changed = copy.deepcopy(asked)
            args = changed["terms"][0]["init_args"]
            args[key] = _other_setting(cls, args, key, annotation)
            lines = resume_differences(with_term, changed, ckpt_path)
            assert [line.split(": ")[0] for line in lines] == [f"model.terms[0].init_args.{key}"], lines
            assert lines[0].endswith(": applied")
            seen[f"{cls.__name__}.{key}"] = "applied"
    assert seen and set(seen.values()) == {"applied"}  # no module, loss or term setting is refused
    init_args = model["encoder"]["init_args"]
    for key, annotation in _settings(BiEncoder).items():
        if key in UNRECORDED or key == "lora":
            continue
        changed = copy.deepcopy(model)
        changed["encoder"]["init_args"][key] = _other(init_args[key], annotation)
        seen[key] = outcome(changed, f"model.encoder.init_args.{key}")
        assert (seen[key] == "refused") == (key in REFUSED), key
    lora_hints = typing.get_type_hints(LoraSettings)
    for field in fields(LoraSettings):
        changed = copy.deepcopy(model)
        changed["encoder"]["init_args"]["lora"][field.name] = _other(
            init_args["lora"][field.name], lora_hints[field.name]
        )
        assert outcome(changed, f"model.encoder.init_args.lora.{field.name}") == "refused"
    changed = copy.deepcopy(model)
    changed["encoder"]["init_args"]["lora"] = None  # full training of a LoRA run
    assert outcome(changed, "model.encoder.init_args.lora") == "refused"
    assert set(UNRECORDED) <= set(_settings(BiEncoder))  # the table names real settings

    docs = (REPO / "docs" / "training.md").read_text()
    [row] = [line for line in docs.splitlines() if "refused with the list of differences" in line]
    assert set(re.findall(r"`(\w+)`", row.split("|")[1])) == set(REFUSED)
