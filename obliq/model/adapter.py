"""A peft adapter folder read as data: the base it names, how it reads texts, and its weights as a checkpoint.

Two layouts hold a LoRA adapter: obliq's own export (``obliq_encoder.json`` beside peft's files) and a
sentence-transformers folder whose model is a peft adapter (``adapter_config.json``,
``adapter_model.safetensors``, ``modules.json``, its prompts in ``config_sentence_transformers.json``: the
paper's OBLIQ-IR-3B-LoRA, as sentence-transformers + peft save it). ``obliq evaluate`` encodes either with
:class:`~obliq.model.BiEncoder`; ``obliq export`` reads either as a checkpoint
(:func:`obliq.model.checkpoint.adapter_checkpoint`) to merge it.

The base an adapter names may be a path relative to the adapter's own folder (what
:meth:`~obliq.model.BiEncoder.save_pretrained` records for a base given as a relative path), read by
:func:`resolve_base`: never from the current folder, where the same relative path may be another model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from obliq.aliases import _ALIASES, resolve_model
from obliq.files import read_json_object, read_text

if TYPE_CHECKING:
    from obliq.model.lora import LoraSettings

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
    base = read_json_object(file, "a peft adapter's settings").get("base_model_name_or_path")
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


def check_adapter_weights(folder: Path) -> None:
    """Refuse an adapter folder without its weights file (peft's ``adapter_model.safetensors`` or ``.bin``),
    which peft reports as an error that reads like an adapter of another model.

    Raises:
        FileNotFoundError: a folder without either file (the folder named).
    """
    if folder.is_dir() and not any((folder / f"adapter_model.{ext}").is_file() for ext in ("safetensors", "bin")):
        raise FileNotFoundError(
            f"{folder}: no adapter weights (adapter_model.safetensors or adapter_model.bin): the folder holds the "
            "adapter's settings without its weights; copy the weights file there"
        )


BASE_DIGEST = "backbone_sha256"
"""The field of ``obliq_encoder.json`` that records an adapter's base by its weights (:func:`base_digest`)."""


def base_digest(base: str) -> str | None:
    """The identity of a base model by its weights: SHA-256 over its weight files (``*.safetensors``, else
    ``*.bin``: names and contents) in its folder (an alias's, a path's, or a Hub id's cached snapshot); None when
    no such folder or file is here. Two models of one shape and other weights get other digests; a copy of a
    model, the same. Each file's digest is cached by its path, size, modification time and inode
    (``<cache>/digests``), so a base of several GB is read once."""
    import hashlib

    from obliq.files import cache_dir, file_sha256

    folder = Path(resolve_model(base))
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(base, local_files_only=True))
        except Exception:  # not cached, not a Hub id: nothing here to identify
            return None
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        st = file.stat()
        key = hashlib.sha256(f"{file.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode()).hexdigest()
        cached = cache_dir() / "digests" / key
        try:
            value = cached.read_text(encoding="utf-8").strip()
        except OSError:
            value = file_sha256(file)
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(value, encoding="utf-8")
            except OSError:  # a read-only cache: computed again next time
                pass
        digest.update(f"{file.name}:{value}\n".encode())
    return digest.hexdigest()


def check_base(file: Path, recorded: str, base: str) -> None:
    """Refuse loading an adapter on a base other than the one it was trained on: ``recorded`` (``file``'s
    :data:`BASE_DIGEST`) must be the :func:`base_digest` of ``base`` (no digest here: nothing to compare).

    Raises:
        ValueError: the weights differ (the file and field named).
    """
    found = base_digest(base)
    if found is not None and found != recorded:
        raise ValueError(
            f"{file}: field {BASE_DIGEST}: the adapter was trained on a base with other weights than {base!r} "
            f"(digest {recorded[:12]}…, here {found[:12]}…): a model of the same shape is another model; load it "
            "on the base it was trained on"
        )


READ_MODULES = ("Transformer", "Pooling", "Normalize")
"""The sentence-transformers modules an adapter folder may hold (by the end of their type's name): what
:class:`~obliq.model.BiEncoder` computes."""


def st_reading(path: Path) -> dict:
    """How a sentence-transformers folder holding a peft adapter (the OBLIQ-IR-3B-LoRA layout) reads texts, as
    :class:`~obliq.model.BiEncoder` settings: its saved ``query`` / ``document`` prompts as the prefixes (none
    saved: the model card's ``query: `` / ``passage: ``, BiEncoder's defaults). Its pooling must be the mean over
    every token, prompt included (what BiEncoder computes); a plain peft folder (no ``modules.json``) gives no
    settings.

    Raises:
        ValueError: the folder pools otherwise than by the mean, or holds a module other than a transformer,
            pooling and normalisation (a Dense projection: the file named).
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
        try:
            modules = json.loads(read_text(path / "modules.json"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path / 'modules.json'}:{err.lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise ValueError(
                f"{path / 'modules.json'}: a sentence-transformers modules.json is a JSON list of modules "
                f'({{"path", "type"}} objects), not {type(modules).__name__}'
            )
        other = [str(m.get("type")) for m in modules if not str(m.get("type", "")).endswith(READ_MODULES)]
        if other:  # a Dense projection, a LayerNorm…: BiEncoder computes none of them
            raise ValueError(
                f"{path / 'modules.json'}: module {other[0]} after the adapter's transformer; obliq's encoder of an "
                "adapter reads a transformer, mean pooling and normalisation only, and will not drop a module"
            )
        for module in modules:
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


CARRIED = ("r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules", "use_rslora", "use_dora")
CARRIED += ("rank_pattern", "alpha_pattern")
"""The settings of a peft ``LoraConfig`` obliq carries into its encoder (:class:`~obliq.model.lora.LoraSettings`)."""

INERT = (
    "task_type",
    "peft_type",
    "auto_mapping",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "megatron_config",
    "megatron_core",
    "runtime_config",
    "qalora_group_size",
    "ensure_weight_tying",
)
"""Settings that do not change what a loaded adapter computes: its bookkeeping, and options of settings refused
when they are on (``qalora_group_size`` of ``use_qalora``; ``ensure_weight_tying`` of ``modules_to_save``)."""

PLAIN_INIT = (True, False, "gaussian")
"""``init_lora_weights`` values that only draw the LoRA matrices (the trained ones replace them); the others
(PiSSA, OLoRA, LoftQ, EVA, CorDA, LoRA-GA, …) change the base weights or read data to start."""


def lora_settings(folder: str | Path) -> LoraSettings:
    """The LoRA of a peft adapter folder, its ``adapter_config.json`` read by peft's ``LoraConfig``, as
    :class:`~obliq.model.lora.LoraSettings`: every setting that changes what the adapter computes is carried
    (:data:`CARRIED`: a fractional alpha, rsLoRA, DoRA, rank and alpha patterns, target and excluded modules as
    lists or a regular expression), or the folder is refused naming it. So an export of the folder is the model
    peft loads from it.

    Raises:
        ValueError: the file is not a JSON object (the file named); not a LoRA adapter (``peft_type``); a setting
            peft rejects, one this peft does not know, or one obliq does not carry (:data:`PLAIN_INIT` for
            ``init_lora_weights``) set to other than its default (the field named).
    """
    import dataclasses

    from peft import LoraConfig, __version__

    from obliq.model.lora import LoraSettings

    file = Path(folder) / ADAPTER_CONFIG
    raw = read_json_object(file, "a peft adapter's settings")
    if raw.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{file}: field peft_type: {raw['peft_type']!r}; obliq reads LoRA adapters only")
    fields = {f.name for f in dataclasses.fields(LoraConfig)}
    unknown = sorted(k for k, v in raw.items() if k not in fields and v not in (None, False, [], {}, ""))
    if unknown:
        raise ValueError(
            f"{file}: field {unknown[0]}: {raw[unknown[0]]!r} is a setting this peft ({__version__}) does not know, "
            "and loading would drop it: the adapter would be read as another model; update peft"
        )
    try:
        config = LoraConfig(**{k: v for k, v in raw.items() if k in fields and k != "peft_type"})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{file}: peft refuses the adapter's settings ({str(err).splitlines()[0]})") from None
    default = LoraConfig()
    for name in sorted(fields - set(CARRIED) - set(INERT)):
        value = getattr(config, name)
        if name == "init_lora_weights" and value in PLAIN_INIT:
            continue
        if value != getattr(default, name):
            raise ValueError(
                f"{file}: field {name}: {value!r} is a LoRA setting obliq does not carry (it carries "
                f"{', '.join(CARRIED)}); its encoder and exports would be another model than the adapter"
            )

    def listed(modules):
        return sorted(modules) if isinstance(modules, list | set | tuple) else modules

    if not config.target_modules:  # peft then picks its own per-model defaults, obliq its own: name them instead
        raise ValueError(
            f"{file}: field target_modules is {raw.get('target_modules')!r}: name the modules the adapter wraps "
            "(its weights' names say which), so that obliq and peft read the same model"
        )
    try:
        return LoraSettings(
            r=int(config.r),
            alpha=config.lora_alpha,
            dropout=float(config.lora_dropout or 0.0),
            target_modules=listed(config.target_modules),
            exclude_modules=listed(config.exclude_modules),
            use_rslora=bool(config.use_rslora),
            use_dora=bool(config.use_dora),
            rank_pattern=dict(config.rank_pattern or {}),
            alpha_pattern=dict(config.alpha_pattern or {}),
        )
    except ValueError as err:  # r, lora_alpha, lora_dropout or a pattern out of range
        raise ValueError(f"{file}: {err}") from None
