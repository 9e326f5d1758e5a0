"""C58: a resume with changed settings reports every change (applied) or refuses it, for every setting,
derived from the settings themselves (Lightning #20801, PR #21455) — not from a list new settings forget."""

from __future__ import annotations

import inspect
import json
import logging
import re
import typing
from dataclasses import asdict, fields, is_dataclass
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
        "--model.loss",
        json.dumps(MATRYOSHKA),
        "--ckpt_path",
        str(ckpt),
    )
    assert resumed.trainer.global_step == 2 and resumed.model.loss.dims == [384, 64]
    assert resumed.model.hparams.loss["init_args"]["dims"] == [384, 64]
    assert "model.lr: 0.005 in the checkpoint, 0.002 now: applied" in caplog.text
    changed = "model.loss: 'obliq.losses.infonce.InfoNCE' in the checkpoint, 'obliq.losses.matryoshka.Matryoshka' now"
    assert changed + ": applied" in caplog.text


MATRYOSHKA = {
    "class_path": "obliq.losses.Matryoshka",
    "init_args": {
        "loss": {"class_path": "obliq.losses.InfoNCE", "init_args": {"temperature": 0.05}},
        "dims": [384, 64],
    },
}
OLD_LOSS = {  # a checkpoint's model.loss of before issue 56: InfoNCE's flags, every one recorded
    "class_path": "obliq.losses.infonce.InfoNCE",
    "init_args": {"temperature": 0.05, "gather_across_devices": True, "symmetric": True, "multi_positive": "supcon"}
    | {"matryoshka_dims": [384, 64], "matryoshka_weights": None},
}


def test_an_old_checkpoints_infonce_flags_read_as_the_classes_of_now(tmp_path):
    """Issue 56: a checkpoint of InfoNCE with symmetric, multi_positive and matryoshka_dims is the objective of
    Matryoshka(Symmetric(SupCon)): resumed with that, nothing is said; with plain InfoNCE, the change is named (a
    resume never changes the objective silently). The old spelling on a command line or in a recipe is refused,
    naming the class it is now; a flat checkpoint of before obliq.losses reads the same way."""
    from obliq.commands.train import check_flat_objective
    from obliq.losses.settings import objective_differences

    changes = lambda stored, model: [p for p in objective_differences(stored, model) if p[1] != p[2]]  # noqa: E731
    supcon = {"class_path": "obliq.losses.SupCon", "init_args": {"temperature": 0.05}}
    now = {**MATRYOSHKA, "init_args": {**MATRYOSHKA["init_args"]}}
    now["init_args"]["loss"] = {"class_path": "obliq.losses.Symmetric", "init_args": {"loss": supcon}}
    assert changes({"loss": OLD_LOSS}, {"loss": now}) == []
    flat = {"temperature": 0.05, "symmetric": True, "matryoshka_dims": [384, 64]}  # its form: MIL-NCE, the default
    now["init_args"]["loss"]["init_args"]["loss"] = {**supcon, "class_path": "obliq.losses.MILNCE"}
    assert changes(flat, {"loss": now}) == []
    plain = {"loss": MATRYOSHKA["init_args"]["loss"]}
    changed = changes({"loss": OLD_LOSS}, plain)
    assert changed == [("model.loss", "obliq.losses.matryoshka.Matryoshka", "obliq.losses.infonce.InfoNCE")]
    with pytest.raises(ValueError, match=r"^the command line: model\.loss\.init_args\.symmetric, InfoNCE's flag"):
        check_flat_objective(["fit", "--model.loss.init_args.symmetric=true"])
    with pytest.raises(ValueError, match=r"model\.loss\.init_args\.multi_positive, .* obliq\.losses\.MILNCE or"):
        check_flat_objective(["fit", "--model.loss.init_args.multi_positive", "supcon"])
    # any loss, the short form, a wrapper's inner loss: no loss of now has these flags (issue 56 review)
    for argv in (
        ["fit", "--model.loss=obliq.losses.Matryoshka", "--model.loss.init_args.matryoshka_dims=[1]"],
        ["fit", "--model.loss", "MILNCE", "--model.loss.symmetric=true"],
        ["fit", "--model.loss.init_args.loss.init_args.symmetric=true"],
    ):
        with pytest.raises(ValueError, match=r"is no setting of any loss now: model\.loss: obliq\.losses\."):
            check_flat_objective(argv)
    config = tmp_path / "old.yaml"
    for loss in (
        {"class_path": "InfoNCE", "init_args": {"symmetric": True}},
        {
            "class_path": "obliq.losses.Symmetric",
            "init_args": {"loss": {"class_path": "MILNCE", "init_args": {"matryoshka_dims": [8]}}},
        },
    ):
        config.write_text(json.dumps({"model": {"loss": loss}}))
        with pytest.raises(
            ValueError,
            match=rf"^{re.escape(str(config))}: model\.loss\.init_args\.(symmetric|loss\.init_args\.matryoshka_dims), ",
        ):
            check_flat_objective(["fit", "--config", str(config)])
    check_flat_objective(["fit", "--model.loss=obliq.losses.Matryoshka", "--model.loss.init_args.dims=[1]"])


def _other(value, annotation):
    """A value other than ``value`` of the setting's type."""
    if value is None:
        kind = next(a for a in typing.get_args(annotation) if a is not type(None))
        if typing.get_origin(kind) is typing.Literal:
            return typing.get_args(kind)[0]
        if is_dataclass(kind):  # settings of their own (windows): their defaults, as a config gives them (a dict)
            return asdict(kind())
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
    ("Matryoshka", "dims"): [384, 32],
    ("Matryoshka", "weights"): [1.0, 0.25],
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
    """Walks every RetrieverModule setting, every setting of its loss (InfoNCE, wrapped in Matryoshka) and of every
    term of obliq.losses, every BiEncoder setting and every LoRA setting: changed on a resume, each is reported as
    applied or refused (a setting a checkpoint does not record is named in UNRECORDED, with why), so a new
    setting cannot be forgotten. The docs' refused row stays REFUSED."""
    import copy

    import obliq.losses
    from obliq.commands.train import train_config
    from obliq.losses import InfoNCE, Matryoshka, Term
    from obliq.losses.settings import build
    from obliq.model.checkpoint import read_checkpoint
    from obliq.model.encoder import BiEncoder, LoraSettings
    from obliq.model.module import RetrieverModule, spec
    from obliq.model.resume import REFUSED, UNRECORDED, resume_differences

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
    # a checkpoint trained with Matryoshka dimensions and weights over the recipe's loss (each can change alone)
    loss = {"class_path": "obliq.losses.Matryoshka", "init_args": {"loss": model["loss"], "dims": [384, 64]}}
    loss["init_args"]["weights"] = [1.0, 0.5]
    with_dims = copy.deepcopy(ckpt)
    with_dims["hyper_parameters"]["loss"] = spec(build(loss))
    asked = copy.deepcopy(model)
    asked["loss"] = loss
    assert resume_differences(with_dims, asked, ckpt_path) == []
    inner = loss["init_args"]["loss"]["init_args"]
    walks = [(Matryoshka, ["loss"], {**loss["init_args"], "loss": InfoNCE()}), (InfoNCE, ["loss", "loss"], inner)]
    for cls, path, args in walks:
        for key, annotation in _settings(cls).items():
            if key == "loss":  # the wrapped loss: walked setting by setting
                continue
            changed = copy.deepcopy(asked)
            entry = changed["loss"]
            for step in path[1:]:  # into the wrapped loss
                entry = entry["init_args"][step]
            entry["init_args"][key] = _other_setting(cls, args, key, annotation)
            lines = resume_differences(with_dims, changed, ckpt_path)
            name = "model." + ".init_args.".join(path) + f".init_args.{key}"
            assert [line.split(": ")[0] for line in lines] == [name], lines
            assert lines[0].endswith(": applied")
            seen[f"{cls.__name__}.{key}"] = "applied"
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
