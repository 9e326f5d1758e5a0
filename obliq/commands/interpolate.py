"""``obliq interpolate``: a trained model pulled back toward its base, or several averaged, in weight space.

    θ = θ_base + α · Σ_i w_i (θ_i − θ_base)        (w_i = 1/n unless given; Σ w_i = 1)

One checkpoint and α < 1 is WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022:
the fine-tuned weights interpolated with the pre-trained ones keep more of what the base knew); several
checkpoints of one run (its step checkpoints) at α = 1 is a uniform model soup (Wortsman et al., "Model
soups", ICML 2022); two checkpoints with weights (1 − t, t) at α = 1 is the straight line between them.
For a LoRA checkpoint the update is the adapter's ``B·A·alpha/r``, so the same rule is applied to that
product, exactly: n adapters are stacked (``A`` by rows, ``B`` by columns, each ``B`` times α·w_i) into one
adapter of rank n·r with LoRA alpha n·alpha, whose update is α times their weighted mean (one adapter:
its ``B`` times α). A full fine-tuning checkpoint's weights are interpolated with the
backbone's own (read from its local folder or cache) in float64 and cast back once.

The output is a training checkpoint of the same backbone and settings that ``obliq export`` and the
training callback's evaluation read like any other; it records where it came from (``obliq.interpolation``)
and holds no optimizer state, so it cannot be resumed as a training run.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from obliq.claims import claim_outputs
from obliq.files import publish
from obliq.model.checkpoint import read_checkpoint, weights_digest

LORA_WEIGHT = re.compile(r"\.lora_(A|B)\.")
"""A LoRA factor's name in a state dict (peft: ``….lora_A.default.weight``)."""

KEPT = ("obliq", "hyper_parameters", "TrainingDataModule", "pytorch-lightning_version")
"""What an interpolated checkpoint keeps of its first source: its settings and data statistics, never its
optimizer, scheduler or loop state."""


def interpolate(
    checkpoints: list[Path],
    out: Path,
    alpha: float = 1.0,
    weights: list[float] | None = None,
    overwrite: bool = False,
) -> dict:
    """Write ``θ_base + α · Σ_i w_i (θ_i − θ_base)`` of ``checkpoints`` as a training checkpoint ``out``.

    Args:
        checkpoints: training checkpoints (``.ckpt``) of one backbone with the same encoder and LoRA settings
            (one for WiSE-FT, several for a soup).
        out: the new checkpoint (``.ckpt``); never one of ``checkpoints``.
        alpha: the share of the trained update kept, in [0, 1]: 0 gives the base model, 1 the checkpoint
            (or the soup) itself.
        weights: each checkpoint's share w_i of the mean, non-negative, summing to 1 (within 1e-9); None: 1/n.
        overwrite: replace ``out`` if it exists.

    Returns:
        What was written: ``out``, ``alpha``, the sources (path, step, weights digest), the LoRA rank of the
        result (None for full fine-tuning) and the weights digest of ``out``.

    Raises:
        ValueError: no checkpoint; ``alpha`` outside [0, 1] (or NaN); ``weights`` not one per checkpoint,
            negative, NaN or not summing to 1; checkpoints of different backbones, encoder or LoRA settings, or
            weights (names, shapes, dtypes); a full fine-tuning weight of another shape than the backbone's.
        FileNotFoundError / KeyError: as :func:`obliq.model.checkpoint.read_checkpoint`.
    """
    paths = [Path(p) for p in checkpoints]
    if not paths:
        raise ValueError("interpolate: give at least one checkpoint")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha: {alpha} is outside [0, 1] (0 is the base model, 1 the trained one)")
    shares = [1 / len(paths)] * len(paths) if weights is None else [float(w) for w in weights]
    if len(shares) != len(paths) or not all(w >= 0 for w in shares) or not abs(sum(shares) - 1) <= 1e-9:  # NaN fails
        raise ValueError(
            f"weights: {weights} must give each of the {len(paths)} checkpoints a share >= 0, summing to 1"
        )
    real = [p.resolve() for p in paths]
    twice = sorted({str(p) for p, r in zip(paths, real) if real.count(r) > 1})
    if twice:  # a symlink (last.ckpt) and its target count as one: a soup would weigh it twice without saying
        raise ValueError(f"checkpoints: {twice} name one file more than once; give each checkpoint once (--weights)")
    if Path(out).is_dir():
        raise ValueError(f"out: {out} is a folder; give the new checkpoint's file name (a .ckpt inside it)")
    ckpts = [read_checkpoint(p) for p in paths]
    _check_alike(paths, ckpts)
    with claim_outputs(
        {"out": out}, command="interpolate", inputs=paths, overwrite=overwrite, what="a checkpoint"
    ) as claimed:
        out = claimed["out"]
        first = ckpts[0]
        lora = first["obliq"].get("lora")
        states = [c["state_dict"] for c in ckpts]
        scales = [float(alpha) * w for w in shares]
        if lora:
            state, lora = _lora_mean(states, lora, scales)
        else:
            state = _full_mean(states, _base_weights(first, paths[0]), scales)
        sources = [
            {"checkpoint": str(p), "step": int(c.get("global_step", 0)), "weight": w}
            | {"weights_digest": weights_digest(c)}
            for p, c, w in zip(paths, ckpts, shares)
        ]
        result = {k: first[k] for k in KEPT if k in first}
        result["obliq"] = dict(first["obliq"], lora=lora, interpolation={"alpha": float(alpha), "sources": sources})
        result["state_dict"] = state
        result["global_step"] = max(s["step"] for s in sources)
        result["epoch"] = int(first.get("epoch", 0))
        with publish(out) as tmp:
            torch.save(result, tmp)
        return {
            "out": str(out),
            "alpha": float(alpha),
            "sources": sources,
            "lora_rank": lora["r"] if lora else None,
            "weights_digest": weights_digest(result),
        }


def _check_alike(paths: list[Path], ckpts: list[dict]) -> None:
    """Refuse checkpoints that are not of one model: other encoder or LoRA settings, other weights."""
    first = ckpts[0]
    for path, ckpt in zip(paths[1:], ckpts[1:]):
        for part in ("encoder", "lora"):
            if ckpt["obliq"].get(part) != first["obliq"].get(part):
                raise ValueError(
                    f"{path}: its {part} settings differ from {paths[0]}'s ({ckpt['obliq'].get(part)} vs "
                    f"{first['obliq'].get(part)}): only checkpoints of one model are interpolated"
                )
        a, b = first["state_dict"], ckpt["state_dict"]
        if a.keys() != b.keys():
            raise ValueError(f"{path}: its weights are not {paths[0]}'s (e.g. {sorted(a.keys() ^ b.keys())[:3]})")
        for name in a:
            if a[name].shape != b[name].shape or a[name].dtype != b[name].dtype:
                raise ValueError(
                    f"{path}: weight {name!r} is {tuple(b[name].shape)} {b[name].dtype}, "
                    f"{paths[0]}'s {tuple(a[name].shape)} {a[name].dtype}"
                )


def _lora_mean(states: list[dict], lora: dict, scales: list[float]) -> tuple[dict, dict]:
    """The adapter whose update is ``Σ_i scales_i · B_i A_i · alpha / r``: A's stacked by rows, B's by columns
    times ``scales_i``; rank n·r with LoRA alpha n·alpha keeps the scaling ``alpha / r`` (peft's default), alpha
    √n·alpha the scaling ``alpha / √r`` (rsLoRA); a module's pattern rank and alpha grow alike."""
    state = {}
    for name, first in states[0].items():
        factor = LORA_WEIGHT.search(name)
        tensors = [s[name] for s in states]
        if factor is None:  # another trainable weight beside the adapter: no base to interpolate with
            raise ValueError(
                f"{name}: a trained weight outside the LoRA adapter; interpolating a LoRA checkpoint scales the "
                "adapter's update only"
            )
        if factor.group(1) == "A":
            state[name] = torch.cat(tensors, dim=0).clone()
        else:
            stacked = torch.cat([t.double() * scale for t, scale in zip(tensors, scales)], dim=1)
            state[name] = stacked.to(first.dtype)
    n = len(states)
    grow = n**0.5 if lora.get("use_rslora") else n  # rsLoRA scales by alpha / √r: alpha grows by √n
    return state, dict(
        lora,
        r=lora["r"] * n,
        alpha=lora["alpha"] * grow,
        rank_pattern={k: v * n for k, v in (lora.get("rank_pattern") or {}).items()},
        alpha_pattern={k: v * grow for k, v in (lora.get("alpha_pattern") or {}).items()},
    )


def _base_weights(ckpt: dict, path: Path) -> dict:
    """The backbone's own weights under the checkpoint's names (full fine-tuning's θ_base)."""
    from obliq.model.encoder import BiEncoder
    from obliq.model.settings import stored_settings

    encoder = BiEncoder(**stored_settings(ckpt["obliq"].get("encoder"), path))
    own = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    missing = sorted(ckpt["state_dict"].keys() - own.keys())
    if missing:
        raise ValueError(f"{path}: weights the backbone does not have, e.g. {missing[:3]}")
    return own


def _full_mean(states: list[dict], base: dict, scales: list[float]) -> dict:
    """``θ_base + Σ_i scales_i · (θ_i − θ_base)`` per weight, in float64, cast back once."""
    out = {}
    for name, first in states[0].items():
        theta0 = base[name]
        if theta0.shape != first.shape:
            raise ValueError(f"{name}: {tuple(first.shape)} in the checkpoint, {tuple(theta0.shape)} in the backbone")
        base64 = theta0.double()
        update = sum(scale * (s[name].double() - base64) for s, scale in zip(states, scales))
        out[name] = (base64 + update).to(first.dtype)
    return out
