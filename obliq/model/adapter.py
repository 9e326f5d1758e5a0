"""A peft adapter folder read as data: the base it names, how it reads texts, and its weights as a checkpoint.

Two layouts hold a LoRA adapter: obliq's own export (``obliq_encoder.json`` beside peft's files) and a
sentence-transformers folder whose model is a peft adapter (``adapter_config.json``,
``adapter_model.safetensors``, ``modules.json``, its prompts in ``config_sentence_transformers.json``: the
paper's OBLIQ-IR-3B-LoRA, as sentence-transformers + peft save it). ``obliq evaluate`` encodes either with
:class:`~obliq.model.BiEncoder`; ``obliq export`` reads either as a checkpoint (:func:`adapter_checkpoint`) to
merge it.

The base an adapter names may be a path relative to the adapter's own folder (what
:meth:`~obliq.model.BiEncoder.save_pretrained` records for a base given as a relative path), read by
:func:`resolve_base`: never from the current folder, where the same relative path may be another model.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from obliq.aliases import _ALIASES, resolve_model
from obliq.files import read_text

ADAPTER_CONFIG = "adapter_config.json"


def resolve_base(file: Path, field: str, base: str) -> str:
    """The base model that ``file`` (an adapter's ``adapter_config.json`` or ``obliq_encoder.json``) names in
    ``field``, a relative path read from the file's folder, as :func:`obliq.rerank.config.load_policy` reads
    the paths of a policy file (issue 49 §3). An alias, an absolute path, a hub id (``owner/name``) found
    nowhere here, or a relative path found in neither folder, is returned as given.

    Raises:
        ValueError: ambiguous: a relative path that exists from the current folder but not beside the file
            (an adapter written before bases were recorded relative to it: trained from which folder is
            unknown, and the current folder's may be another model), or beside the file and from the
            current folder as two different folders.
    """
    if base.lower() in _ALIASES or os.path.isabs(os.path.expanduser(base)):
        return base
    beside, here = file.parent / base, Path(base)
    if here.exists() and not (beside.exists() and os.path.samefile(beside, here)):
        found = f"beside it as {beside} and " if beside.exists() else f"not beside it ({beside}), only "
        raise ValueError(
            f"{file}: field {field}: the relative path {base!r} is ambiguous: found {found}from the current "
            f"folder as {here.resolve()}, which may be another model; write the base's absolute path, or its "
            f"path relative to {file.parent}, in {field}"
        )
    return str(beside) if beside.exists() else base


def adapter_base(path: Path) -> str:
    """The base model a peft adapter folder names (``adapter_config.json``'s ``base_model_name_or_path``, a
    relative path read from the adapter's folder: :func:`resolve_base`), checked to exist before anything
    loads.

    Raises:
        ValueError: the file names no base, or a relative path that is ambiguous (:func:`resolve_base`).
        FileNotFoundError: the base is a folder that does not exist here (the adapter's file named).
    """
    file = path / ADAPTER_CONFIG
    base = json.loads(read_text(file)).get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ValueError(f"{file}: base_model_name_or_path is missing: which model the adapter adapts is unknown")
    base = resolve_base(file, "base_model_name_or_path", base)
    try:
        resolve_model(base)
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{file}: the adapter's base model {base!r} is not here ({err}); copy that model here and name it in "
            "base_model_name_or_path"
        ) from None
    return base


def st_reading(path: Path) -> dict:
    """How a sentence-transformers folder holding a peft adapter (the OBLIQ-IR-3B-LoRA layout) reads texts, as
    :class:`~obliq.model.BiEncoder` settings: its saved ``query`` / ``document`` prompts as the prefixes (none
    saved: the model card's ``query: `` / ``passage: ``, BiEncoder's defaults). Its pooling must be the mean over
    every token, prompt included (what BiEncoder computes); a plain peft folder (no ``modules.json``) gives no
    settings.

    Raises:
        ValueError: the folder pools otherwise than by the mean (the file named).
    """
    settings: dict = {}
    prompts_file = path / "config_sentence_transformers.json"
    if prompts_file.is_file():
        prompts = json.loads(read_text(prompts_file)).get("prompts") or {}
        if "query" in prompts:
            settings["query_prefix"] = prompts["query"]
        passage = next((prompts[k] for k in ("document", "passage", "corpus") if k in prompts), None)
        if passage is not None:
            settings["passage_prefix"] = passage
    if (path / "modules.json").is_file():
        for module in json.loads(read_text(path / "modules.json")):
            pooling = path / module.get("path", "") / "config.json"
            if module.get("type", "").endswith("Pooling") and pooling.is_file():
                config = json.loads(read_text(pooling))
                mode = config.get("pooling_mode")  # sentence-transformers 6; before: one boolean per mode
                modes = (
                    {mode}
                    if isinstance(mode, str)
                    else {k for k, v in config.items() if k.startswith("pooling_mode") and v}
                )
                if modes not in ({"mean"}, {"pooling_mode_mean_tokens"}) or config.get("include_prompt") is False:
                    raise ValueError(
                        f"{pooling}: pools by {', '.join(sorted(modes)) or 'nothing'}"
                        f"{' without the prompt' if config.get('include_prompt') is False else ''}; obliq's encoder "
                        "of an adapter pools by the mean over every token, prompt included, and will not pool otherwise"
                    )
    return settings


def adapter_checkpoint(folder: str | Path, trust_remote_code: bool = False) -> dict:
    """An adapter folder (either layout) as the content of a training checkpoint
    (:func:`obliq.model.checkpoint.read_checkpoint`'s form: ``obliq`` settings, ``state_dict`` of the trained
    LoRA weights), so that ``obliq export`` merges and verifies it as it does a checkpoint of its own. The LoRA
    settings are the adapter's (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``); nothing of its
    training is known (no step, no loss): ``obliq.imported`` names the folder.

    Raises:
        FileNotFoundError: the folder holds no adapter, or its base is not here (:func:`adapter_base`).
        ValueError: as :class:`~obliq.model.BiEncoder` for an adapter that does not fit its base.
    """
    from obliq.model.encoder import CONFIG_NAME, BiEncoder, LoraSettings

    folder = Path(folder)
    if (folder / CONFIG_NAME).is_file():
        encoder = BiEncoder.from_pretrained(folder, trainable=True, trust_remote_code=trust_remote_code)
    elif (folder / ADAPTER_CONFIG).is_file():
        config = json.loads(read_text(folder / ADAPTER_CONFIG))
        targets = config.get("target_modules")
        lora = LoraSettings(
            r=int(config["r"]),
            alpha=int(config["lora_alpha"]),
            dropout=float(config.get("lora_dropout") or 0.0),
            target_modules=sorted(targets) if isinstance(targets, list | tuple) else None,
        )
        encoder = BiEncoder(
            adapter_base(folder),
            adapter=str(folder),
            lora=lora,
            trust_remote_code=trust_remote_code,
            **st_reading(folder),
        )
    else:
        raise FileNotFoundError(
            f"{folder}: no adapter here ({ADAPTER_CONFIG} or {CONFIG_NAME}); a merged model has nothing to export: "
            "evaluate it directly"
        )
    state = {f"encoder.{n}": p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad}
    return {
        "obliq": {"encoder": encoder.settings, "lora": asdict(encoder.lora), "imported": folder.name},
        "state_dict": state,
    }
