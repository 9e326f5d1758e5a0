"""Training checkpoints read as data: the one safe reader (``weights_only=True``: no pickled code
runs), what a checkpoint says about itself (:class:`CheckpointInfo`: its step, the encoder's and the
module's settings, the data it was trained on), the encoder rebuilt from it, and a LoRA adapter folder
read as such a checkpoint (:func:`adapter_checkpoint`).

Every caller that needs a checkpoint's step or settings reads them here, never with
``torch.load(weights_only=False)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from obliq.aliases import portable_name
from obliq.model.adapter import ADAPTER_CONFIG, adapter_base, lora_settings, st_reading
from obliq.model.encoder import CONFIG_NAME, BiEncoder
from obliq.model.lora import LoraSettings
from obliq.model.settings import stored_settings
from obliq.runs import FINAL


@dataclass(frozen=True)
class CheckpointInfo:
    """What an obliq training checkpoint records about itself (:func:`checkpoint_info`).

    Attributes:
        path: the file.
        step: optimizer steps taken (Lightning's ``global_step``).
        epoch: the epoch it was saved in.
        encoder: the encoder's settings (:func:`obliq.model.settings.stored_settings`: data only).
        lora: the LoRA settings, or None for full fine-tuning.
        hyper_parameters: the module's settings (temperature, lr, chunk size, …).
        data: the training data's statistics (sources, rows, rows per epoch), when saved.
    """

    path: Path
    step: int
    epoch: int
    encoder: dict
    lora: dict | None
    hyper_parameters: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)


def checkpoint_info(path: str | Path, ckpt: dict | None = None) -> CheckpointInfo:
    """The step and settings of a training checkpoint, read safely (:func:`read_checkpoint`).

    Args:
        path: a ``.ckpt`` written by :class:`~obliq.model.module.RetrieverModule`.
        ckpt: its content when already read.

    Raises:
        FileNotFoundError / ValueError / KeyError: as :func:`read_checkpoint`; ValueError also for
            an ``obliq`` section without encoder settings.
    """
    ckpt = ckpt if ckpt is not None else read_checkpoint(path)
    obliq = ckpt["obliq"]
    return CheckpointInfo(
        path=Path(path),
        step=int(ckpt.get("global_step", 0)),
        epoch=int(ckpt.get("epoch", 0)),
        encoder=stored_settings(obliq.get("encoder"), path),
        lora=obliq.get("lora"),
        hyper_parameters=dict(ckpt.get("hyper_parameters") or {}),
        data=dict((ckpt.get("TrainingDataModule") or {}).get("stats") or {}),
    )


def step_checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """``(step, file)`` of every step checkpoint below a run's folder (not ``last``/``final``), by step;
    the step is read from each file (:func:`checkpoint_info`).

    Args:
        folder: a run folder (:attr:`obliq.runs.RunFolder.path`).
    """
    files = [
        f for f in sorted(Path(folder).rglob("*.ckpt")) if f.name not in ("last.ckpt", FINAL) and not f.is_symlink()
    ]
    return sorted(((checkpoint_info(f).step, f) for f in files), key=lambda p: (p[0], str(p[1])))


EXPORT_RECORD = "obliq_export.json"
"""What an exported folder records of its checkpoint (``obliq export``): the checkpoint's name, step and
:func:`weights_digest`, so results evaluated on the folder can be matched to a checkpoint."""


def weights_digest(ckpt: dict) -> str:
    """SHA-256 of a checkpoint's trained weights (every tensor of its ``state_dict``, by name) and encoder
    settings: two checkpoints with the same digest hold the same trained model."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(ckpt["obliq"].get("encoder"), sort_keys=True, default=str).encode())
    for name in sorted(ckpt["state_dict"]):
        tensor = ckpt["state_dict"][name]
        digest.update(name.encode() + str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def exported_from(folder: str | Path) -> dict | None:
    """The record of the checkpoint an exported folder was made from (:data:`EXPORT_RECORD`), or None
    (not an obliq export, or not a folder)."""
    import json

    file = Path(folder) / EXPORT_RECORD
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_checkpoint(path: str | Path) -> dict:
    """Read a training checkpoint as data (``weights_only=True``: no pickled code runs).

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: a folder.
        ValueError: not a readable checkpoint.
        KeyError: not an obliq training checkpoint (no ``obliq`` section).
    """
    import pickle
    import zipfile

    from obliq.errors import weights_only_refusal

    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a folder, not a checkpoint file (.ckpt)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint")
    with path.open("rb") as f:
        head = f.read(24)
    if not zipfile.is_zipfile(path) and not head.startswith((b"PK", b"\x80")):  # neither a (cut) zip nor a pickle
        raise ValueError(
            f"{path}: not a readable checkpoint (a .ckpt is a zip archive written by torch.save; it starts {head!r})"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise weights_only_refusal(err, path) from None
    except Exception as err:  # truncated, a foreign archive …: whatever torch.load raises
        first = (str(err).splitlines() or [""])[0]
        raise ValueError(f"{path}: not a readable checkpoint ({type(err).__name__}: {first})") from None
    if not isinstance(ckpt, dict) or "obliq" not in ckpt:
        raise KeyError(f"{path}: not an obliq training checkpoint (no 'obliq' section)")
    return ckpt


def adapter_checkpoint(folder: str | Path, trust_remote_code: bool = False) -> dict:
    """An adapter folder (either layout of :mod:`obliq.model.adapter`) as the content of a training checkpoint
    (:func:`read_checkpoint`'s form: ``obliq`` settings, ``state_dict`` of the trained LoRA weights), so that
    ``obliq export`` merges and verifies it as it does a checkpoint of its own. The LoRA settings are the
    adapter's own ``adapter_config.json``'s, every one carried or refused (:func:`~obliq.model.adapter.lora_settings`);
    nothing of its training is known (no step, no loss): ``obliq.imported`` names the folder.

    Raises:
        FileNotFoundError: the folder holds no adapter, or its base is not here
            (:func:`~obliq.model.adapter.adapter_base`).
        ValueError: a LoRA setting obliq does not carry (:func:`~obliq.model.adapter.lora_settings`); as
            :class:`~obliq.model.BiEncoder` for an adapter that does not fit its base.
    """
    folder = Path(folder)
    if not (folder / ADAPTER_CONFIG).is_file():
        raise FileNotFoundError(
            f"{folder}: no adapter here (no {ADAPTER_CONFIG}); a merged or fully trained model has nothing to "
            "export: evaluate it directly"
        )
    lora = lora_settings(folder)
    if (folder / CONFIG_NAME).is_file():
        encoder = BiEncoder.from_pretrained(folder, trainable=True, trust_remote_code=trust_remote_code)
    else:
        encoder = BiEncoder(
            adapter_base(folder),
            adapter=str(folder),
            lora=lora,
            trust_remote_code=trust_remote_code,
            **st_reading(folder),
        )
    encoder.lora = lora  # the adapter's own settings, whatever obliq_encoder.json records
    state = {f"encoder.{n}": p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad}
    return {
        "obliq": {"encoder": encoder.settings, "lora": asdict(lora), "imported": folder.name},
        "state_dict": state,
    }


def load_checkpoint(
    path: str | Path,
    ckpt: dict | None = None,
    backbone: str | None = None,
    trust_remote_code: bool = False,
    **overrides,
) -> BiEncoder:
    """Rebuild the encoder of a training checkpoint (``train.py fit``) with its trained weights.

    The checkpoint is data: its encoder settings are read through
    :func:`obliq.model.settings.stored_settings` (never ``trust_remote_code``, which comes from the
    caller alone), and the backbone it names is checked against the caller's when one is given.

    Args:
        path: a ``.ckpt`` file written by :class:`~obliq.model.module.RetrieverModule`.
        ckpt: its content when already read (:func:`read_checkpoint`).
        backbone: the backbone the caller expects (an alias, folder or hub id); None accepts the
            checkpoint's.
        trust_remote_code: let the backbone run its own code (the caller's choice; off by default).
        overrides: BiEncoder settings to change (e.g. ``dtype="float32"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a readable checkpoint; a backbone other than ``backbone``; a weight of another shape.
        KeyError: the file is not an obliq checkpoint, lacks trained weights, or holds weights the encoder
            does not have.
    """
    ckpt = ckpt if ckpt is not None else read_checkpoint(path)
    settings = stored_settings(ckpt["obliq"].get("encoder"), path)
    if backbone is not None and portable_name(backbone) != portable_name(settings["backbone"]):
        raise ValueError(f"{path}: trained on backbone {settings['backbone']!r}, not {backbone!r}")
    lora = ckpt["obliq"].get("lora")
    encoder = BiEncoder(
        **dict(settings, **overrides), trust_remote_code=trust_remote_code, lora=LoraSettings(**lora) if lora else None
    )
    state = {k.removeprefix("encoder."): v for k, v in ckpt["state_dict"].items()}
    trainable = {n for n, p in encoder.named_parameters() if p.requires_grad}
    missing = sorted(trainable - state.keys())
    if missing:
        raise KeyError(f"{path}: {len(missing)} trained weights missing, e.g. {missing[:3]}")
    own = encoder.state_dict()
    unknown = sorted(state.keys() - own.keys())
    if unknown:  # not dropped silently: weights of another model or LoRA layout
        raise KeyError(f"{path}: {len(unknown)} weights the encoder does not have, e.g. {unknown[:3]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(
                f"{path}: weight {name!r} has shape {tuple(tensor.shape)}, the encoder's {tuple(own[name].shape)} "
                "(a resized or other model)"
            )
    encoder.load_state_dict(state, strict=False)  # the frozen base weights come from the backbone
    return encoder.eval()
