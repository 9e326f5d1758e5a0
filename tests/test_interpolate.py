"""``obliq interpolate`` (issue 31 §1, WiSE-FT and soups): the written checkpoint's update equals
``alpha · mean_i`` of its sources' updates, checked against float64 references computed here from the
sources' own factors and weights; α = 0 gives the base model's embeddings; the result exports like any
checkpoint; checkpoints of different models are refused before anything is written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from support import make_checkpoint

from obliq.commands.interpolate import interpolate
from obliq.model.checkpoint import load_checkpoint, read_checkpoint

TEXTS = ["An aphoristic, restless voice.", "The witness turned the question back on the committee."]


def _updates(ckpt: dict) -> dict[str, torch.Tensor]:
    """Every LoRA module's update ``B @ A · alpha / r`` in float64, by the module's name."""
    lora = ckpt["obliq"]["lora"]
    state = ckpt["state_dict"]
    out = {}
    for name, a in state.items():
        if ".lora_A." in name:
            b = state[name.replace(".lora_A.", ".lora_B.")]
            out[name.split(".lora_A.")[0]] = b.double() @ a.double() * (lora["alpha"] / lora["r"])
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory, minilm_path):
    """The two seeded checkpoints the tests share (``a.ckpt`` seed 1, ``b.ckpt`` seed 2: MiniLM, r 4, length 32),
    made once; :func:`_pair` copies them into a test's folder (none is written to in place)."""
    folder = tmp_path_factory.mktemp("made")
    return [
        make_checkpoint(folder / f"{name}.ckpt", "minilm", length=32, seed=seed) for name, seed in (("a", 1), ("b", 2))
    ]


def _pair(made, folder):
    """Copies of ``a.ckpt`` and ``b.ckpt`` (as make_checkpoint writes them: seeds 1 and 2) in ``folder``."""
    return [Path(shutil.copy(ckpt, folder / ckpt.name)) for ckpt in made]


def test_a_lora_soup_at_alpha_is_the_mean_update_scaled(tmp_path, made):
    one, two = _pair(made, tmp_path)
    report = interpolate([one, two], tmp_path / "soup.ckpt", alpha=0.6)
    assert report["lora_rank"] == 8
    got = _updates(read_checkpoint(tmp_path / "soup.ckpt"))
    first, second = _updates(read_checkpoint(one)), _updates(read_checkpoint(two))
    assert got.keys() == first.keys() and len(got) > 0
    for name in got:
        reference = 0.6 * (first[name] + second[name]) / 2
        assert torch.allclose(got[name], reference, atol=1e-7, rtol=1e-5), name
    interpolate([one, two], tmp_path / "line.ckpt", weights=[0.25, 0.75])  # a point on the line between them
    line = _updates(read_checkpoint(tmp_path / "line.ckpt"))
    for name in line:
        assert torch.allclose(line[name], 0.25 * first[name] + 0.75 * second[name], atol=1e-7, rtol=1e-5), name
    record = read_checkpoint(tmp_path / "soup.ckpt")
    assert record["obliq"]["interpolation"]["alpha"] == 0.6
    assert [s["checkpoint"] for s in record["obliq"]["interpolation"]["sources"]] == [str(one), str(two)]
    assert "optimizer_states" not in record


def test_alpha_zero_is_the_base_model_and_one_is_the_checkpoint(tmp_path, minilm_path):
    from obliq.model.encoder import BiEncoder

    ckpt = make_checkpoint(tmp_path / "m.ckpt", "minilm", length=32, seed=3)
    interpolate([ckpt], tmp_path / "zero.ckpt", alpha=0.0)
    interpolate([ckpt], tmp_path / "one.ckpt", alpha=1.0)
    base = BiEncoder("minilm", query_max_length=32, passage_max_length=32).eval()
    zero = load_checkpoint(tmp_path / "zero.ckpt")
    assert torch.allclose(zero.encode(TEXTS), base.encode(TEXTS), atol=1e-6)
    source, one = read_checkpoint(ckpt)["state_dict"], read_checkpoint(tmp_path / "one.ckpt")["state_dict"]
    assert source.keys() == one.keys() and all(torch.equal(source[k], one[k]) for k in source)
    trained = load_checkpoint(ckpt).encode(TEXTS)
    assert not torch.allclose(trained, base.encode(TEXTS), atol=1e-4)  # the control: the adapter changes things


def test_full_fine_tuning_interpolates_with_the_backbones_weights(tmp_path, minilm_path):
    from obliq.model.encoder import BiEncoder

    encoder = BiEncoder("minilm", query_max_length=32, passage_max_length=32)
    base = {f"encoder.{k}": v.detach().clone() for k, v in encoder.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    state = {
        f"encoder.{n}": (p.detach() + torch.randn(p.shape, generator=generator) * 0.01).clone()
        for n, p in encoder.named_parameters()
        if p.requires_grad
    }
    torch.save(
        {"obliq": {"encoder": encoder.settings, "lora": None}, "state_dict": state, "global_step": 5, "epoch": 0},
        tmp_path / "full.ckpt",
    )
    interpolate([tmp_path / "full.ckpt"], tmp_path / "half.ckpt", alpha=0.5)
    half = read_checkpoint(tmp_path / "half.ckpt")["state_dict"]
    for name, theta in state.items():
        reference = (base[name].double() + 0.5 * (theta.double() - base[name].double())).float()
        assert torch.equal(half[name], reference), name
    interpolate([tmp_path / "full.ckpt"], tmp_path / "zero.ckpt", alpha=0.0)
    zero = load_checkpoint(tmp_path / "zero.ckpt").encode(TEXTS)
    assert torch.allclose(zero, encoder.eval().encode(TEXTS), atol=1e-6)


def test_the_result_exports_like_any_checkpoint(tmp_path, made):
    from obliq.commands.export import export

    one, two = _pair(made, tmp_path)
    interpolate([one, two], tmp_path / "soup.ckpt", alpha=0.5)
    report = export(tmp_path / "soup.ckpt", tmp_path / "out", merge=True)
    assert report["probe_min_cosine"] >= 0.999 and (tmp_path / "out" / "merged").is_dir()
    # what the weights are travels with them: alpha and the sources in the record and the card
    record = json.loads((tmp_path / "out" / "adapter" / "obliq_export.json").read_text())
    assert record["interpolation"]["alpha"] == 0.5
    assert [s["checkpoint"] for s in record["interpolation"]["sources"]] == [str(one), str(two)]
    card = (tmp_path / "out" / "adapter" / "README.md").read_text()
    assert "| interpolation | `obliq interpolate`: alpha 0.5" in card and "a.ckpt" in card and "b.ckpt" in card


def test_other_models_and_bad_alphas_are_refused_before_anything_is_written(tmp_path, made):
    one = Path(shutil.copy(made[0], tmp_path / "a.ckpt"))
    other_rank = make_checkpoint(tmp_path / "r8.ckpt", "minilm", r=8, length=32)
    other_length = make_checkpoint(tmp_path / "l64.ckpt", "minilm", length=64)
    out = tmp_path / "out.ckpt"
    with pytest.raises(ValueError, match=r"r8\.ckpt: its lora settings differ"):
        interpolate([one, other_rank], out)
    with pytest.raises(ValueError, match=r"l64\.ckpt: its encoder settings differ"):
        interpolate([one, other_length], out)
    with pytest.raises(ValueError, match=re.escape("alpha: 1.5 is outside [0, 1]")):
        interpolate([one], out, alpha=1.5)
    with pytest.raises(ValueError, match=re.escape("weights: [0.5, 0.6] must give each of the 2 checkpoints")):
        interpolate([one, one], out, weights=[0.5, 0.6])
    with pytest.raises(ValueError, match="weights: "):
        interpolate([one, one], out, weights=[float("nan"), 1.0])
    with pytest.raises(ValueError, match="alpha: nan is outside"):
        interpolate([one], out, alpha=float("nan"))
    (tmp_path / "last.ckpt").symlink_to(one)
    with pytest.raises(ValueError, match="name one file more than once"):
        interpolate([one, tmp_path / "last.ckpt"], out)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        interpolate([one], tmp_path / "folder")
    with pytest.raises(ValueError, match="input"):
        interpolate([one], one)
    with pytest.raises(ValueError, match="interpolate: give at least one checkpoint"):
        interpolate([], out)
    with pytest.raises(IsADirectoryError, match="folder: a folder, not a checkpoint file"):
        interpolate([one, tmp_path / "folder"], out)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not out.exists() and left == ["a.ckpt", "folder", "l64.ckpt", "last.ckpt", "r8.ckpt"]
