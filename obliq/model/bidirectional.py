"""Published bidirectional decoders read as data: NV-Embed's ``llama_bidirec`` family without remote code.

NVIDIA publishes its bidirectional Llama embedders (``nvidia/llama-nv-embed-reasoning-3b``, the recipe's
backbone, and ``nvidia/llama-3.2-nv-embedqa-1b-v2``) with ``model_type: llama_bidirec`` and an
``auto_map`` to a Python file of its own (``llama_bidirectional_model.LlamaBidirectionalModel``), so
transformers loads them only with ``trust_remote_code=True``. The class is transformers' ``LlamaModel``
with every attention non-causal and a non-causal padding mask, its config ``LlamaConfig`` plus
``pooling`` (``avg``: the masked mean) and ``temperature``, its weights ``LlamaModel``'s (NeMo
Automodel's ``LlamaBidirectionalModel``, ``../shared/reference/published-formats.md``).

obliq registers a class of its own for each family of :data:`FAMILIES` with transformers' Auto classes
(:func:`register`), so ``AutoConfig`` / ``AutoModel`` — and through them sentence-transformers and peft —
read such a folder with ``trust_remote_code=False``, as data; :func:`check_model_code` refuses, before
anything loads, a folder whose ``auto_map`` names a class obliq does not implement (transformers would
otherwise load it as another class when its ``model_type`` is one it knows), and a ``pooling`` obliq
does not implement; :func:`check_loading` refuses a backbone whose file did not load whole. The next
family published the same way (a Mistral or Qwen bidirectional checkpoint) is one :class:`Family` entry.

A decoder that transformers loads causal is made bidirectional by :func:`make_bidirectional`, and every
encoder is built through :func:`check_bidirectional`, the self-test that its attention is what it claims (C03).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from obliq.files import read_json_object


@dataclass(frozen=True)
class Family:
    """A bidirectional decoder family published with remote code, read by obliq as data.

    Attributes:
        model_type: the ``model_type`` of its ``config.json``.
        config: the transformers configuration class it extends (by name).
        model: the transformers model class whose weights and forward it has (by name).
        remote_classes: the ``auto_map`` ``AutoModel`` entries (``file.Class``) it stands for.
        poolings: the ``pooling`` values of its configuration obliq implements (``avg``: masked mean).
    """

    model_type: str
    config: str
    model: str
    remote_classes: tuple[str, ...]
    poolings: tuple[str, ...] = ("avg",)


FAMILIES = (
    Family("llama_bidirec", "LlamaConfig", "LlamaModel", ("llama_bidirectional_model.LlamaBidirectionalModel",)),
)
"""The published bidirectional families obliq reads without remote code."""


def make_bidirectional(model: nn.Module) -> None:
    """Turn a transformers decoder's attention bidirectional (NV-Embed style), in place.

    transformers ≥ 5 builds a bidirectional mask when ``config.is_causal`` is False, but the SDPA
    path still passes ``is_causal=True`` to the kernel when the mask is None (no padding) unless
    each attention module's ``is_causal`` flag is False too (C03) — so both are set.
    """
    model.config.is_causal = False
    for module in model.modules():
        if getattr(module, "is_causal", None) is True:
            module.is_causal = False


def has_causal_attention(model: nn.Module) -> bool:
    """Whether any attention module of ``model`` is flagged causal (a decoder's, until :func:`make_bidirectional`)."""
    return any(getattr(m, "is_causal", False) is True for m in model.modules())


@torch.no_grad()
def check_bidirectional(encoder, expect: bool = True) -> None:
    """Self-test of a :class:`~obliq.model.BiEncoder`: changing the last token must change position 0's hidden
    state (C03).

    Runs with mask all ones, mask None, alone and batched with a longer, padded partner.

    Raises:
        RuntimeError: a model meant to be bidirectional behaves causally on some path.
    """
    model = encoder.model
    vocab = int(getattr(encoder.backbone_config, "vocab_size", 100))
    base = [min(5 + i, vocab - 1) for i in range(3)]
    a, b = base + [min(8, vocab - 1)], base + [min(9, vocab - 2)]
    was_training = model.training
    model.eval()
    device = encoder.device
    try:

        def first_state(ids: list[int], mask: list[int] | None, partner: bool) -> torch.Tensor:
            rows = [ids] + ([ids + ids] if partner else [])
            width = max(len(r) for r in rows)
            input_ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], device=device)
            inputs = {"input_ids": input_ids}
            if mask is not None or partner:
                m = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
                inputs["attention_mask"] = m
            return model(**inputs).last_hidden_state[0, 0].float()

        for variant in (
            {"mask": [1] * 4, "partner": False},
            {"mask": None, "partner": False},
            {"mask": [1] * 4, "partner": True},
        ):
            diff = (first_state(a, **variant) - first_state(b, **variant)).abs().max().item()
            if expect and diff == 0.0:
                raise RuntimeError(
                    f"bidirectional self-test failed ({variant}): position 0 ignores the last token, "
                    "the backbone is still causal; refusing to build a causal bi-encoder"
                )
            if not expect and diff != 0.0:
                raise RuntimeError(f"causal self-test failed ({variant}): position 0 sees a later token")
    finally:
        model.train(was_training)


def _classes(family: Family) -> tuple[type, type]:
    """obliq's configuration and model class of ``family``: the transformers classes it names, the
    configuration with ``pooling`` and ``temperature`` fields, the model bidirectional once built."""
    import transformers

    base_config, base_model = getattr(transformers, family.config), getattr(transformers, family.model)
    name = family.remote_classes[0].rsplit(".", 1)[-1]
    config = type(
        name.replace("Model", "Config"),
        (base_config,),
        {
            "__module__": __name__,
            "__annotations__": {"pooling": str, "temperature": float},
            "model_type": family.model_type,
            "pooling": "avg",
            "temperature": 1.0,
        },
    )

    def __init__(self, config):
        base_model.__init__(self, config)
        make_bidirectional(self)

    model = type(name, (base_model,), {"__module__": __name__, "config_class": config, "__init__": __init__})
    return config, model


_REGISTERED: dict[str, tuple[type, type]] = {}


def register() -> None:
    """Register obliq's class of every family in :data:`FAMILIES` with ``AutoConfig`` and ``AutoModel``
    (idempotent; replaces a class another library registered under the same ``model_type``)."""
    from transformers import AutoConfig, AutoModel

    for family in FAMILIES:
        if family.model_type not in _REGISTERED:
            _REGISTERED[family.model_type] = _classes(family)
        config, model = _REGISTERED[family.model_type]
        AutoConfig.register(family.model_type, config, exist_ok=True)
        AutoModel.register(config, model, exist_ok=True)


def _config_file(path: str | os.PathLike) -> Path | None:
    """The ``config.json`` a model folder (or a hub id in the local cache) loads, or None."""
    folder = Path(os.path.expanduser(str(path)))
    if not folder.is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(path), "config.json")
        except Exception:  # not a hub id: nothing to check here, the loader names the problem
            return None
        return Path(cached) if isinstance(cached, str) else None
    return folder / "config.json" if (folder / "config.json").is_file() else None


def check_model_code(path: str | os.PathLike, trust_remote_code: bool = False) -> Family | None:
    """Register obliq's families and check, before anything loads, that ``path``'s configuration asks for
    no code obliq does not have.

    Args:
        path: a model folder, or a hub id (its cached ``config.json`` is read when there is one).
        trust_remote_code: the user's own opt-in to run a model's code; then an unknown ``auto_map`` passes.

    Returns:
        The :class:`Family` obliq reads the model as, or None (a model transformers reads itself, or the
        model's own code, opted in).

    Raises:
        ValueError: the ``auto_map`` names an ``AutoModel`` class obliq does not implement and
            ``trust_remote_code`` is off (one line naming the class and the opt-in); the configuration's
            ``pooling`` is one obliq does not implement; ``config.json`` is not a JSON object, its ``auto_map``
            not an object; a RoPE type transformers does not implement for the model (:func:`check_rope`).
    """
    register()
    file = _config_file(path)
    if file is None:
        return None
    config = read_json_object(file, "a model configuration")
    family = next((f for f in FAMILIES if f.model_type == config.get("model_type")), None)
    auto_map = config.get("auto_map", {})
    if not isinstance(auto_map, dict):  # transformers reads `"AutoConfig" in auto_map`: a traceback on null
        raise ValueError(
            f"{file}: field auto_map must be a JSON object (Auto class → module.Class), got {json_type(auto_map)}; "
            "remove it when the model has no code of its own"
        )
    remote = auto_map.get("AutoModel")
    if isinstance(remote, list | tuple):  # ["file.Class", "file.FastClass"]
        remote = remote[0]
    if remote and (family is None or remote.split("--")[-1] not in family.remote_classes):
        if trust_remote_code:  # the user's opt-in: the model's own class loads, not obliq's
            return None
        known = ", ".join(f"{f.model_type} ({', '.join(f.remote_classes)})" for f in FAMILIES)
        raise ValueError(
            f"{file}: auto_map names the model's own class {remote!r} (model_type "
            f"{config.get('model_type')!r}), which obliq does not implement and will not load as another class; "
            f"set trust_remote_code: true to run that code yourself (obliq reads {known} as data)"
        )
    check_rope(config, file, family)
    if family is not None and config.get("pooling", "avg") not in family.poolings:
        raise ValueError(
            f"{file}: pooling {config['pooling']!r} is not implemented by obliq for {family.model_type} "
            f"(it implements {', '.join(family.poolings)}: the masked mean); refusing rather than pool otherwise"
        )
    return family


def json_type(value) -> str:
    """A JSON value's type in JSON's words (``null``, ``a list``, ``a string``…), for messages."""
    if value is None:
        return "null"
    kinds = {bool: "true/false", str: "a string", list: "a list", dict: "an object", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def check_rope(config: dict, file: Path, family: Family | None = None) -> None:
    """Refuse a ``rope_scaling`` (or ``rope_parameters``) whose type transformers does not implement for the
    model, before anything loads (transformers would stop with a bare ``KeyError: '<type>'`` while building it).

    A type is implemented when it is one of transformers' shared RoPE kinds (``default`` and the keys of
    ``ROPE_INIT_FUNCTIONS``: ``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``…) or a kind the model's
    own transformers code names (``mrope`` for Qwen2-VL, say); a ``model_type`` transformers does not know is
    left to its loader. The type is ``rope_type`` or, in older configurations, ``type``; a value nested by layer
    type is checked per layer.

    Raises:
        ValueError: one line naming ``file``, the field and the type (or the field's wrong JSON type).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"{file}: field {key} must be a JSON object or null, got {json_type(value)}")
        nested = value and all(isinstance(v, dict) or v is None for v in value.values())
        for part in [v for v in value.values() if v is not None] if nested else [value]:
            kind = part.get("rope_type", part.get("type", "default"))
            if isinstance(kind, str) and (kind == "default" or kind in ROPE_INIT_FUNCTIONS):
                continue
            names = _model_code_text(family.model.removesuffix("Model").lower() if family else config.get("model_type"))
            if names is not None and not (isinstance(kind, str) and kind and f'"{kind}"' in names):
                known = ", ".join(["default", *ROPE_INIT_FUNCTIONS])
                raise ValueError(
                    f"{file}: field {key}: rope type {kind!r} is not one transformers implements for this model "
                    f"(it implements {known}); fix its rope_type"
                )


def _model_code_text(model_type) -> str | None:
    """The source of transformers' modules for ``model_type`` (configuration and modeling files), or None when
    transformers has no such model."""
    import importlib.util

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        return None
    spec = importlib.util.find_spec(f"transformers.models.{model_type_to_module_name(model_type)}")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return "".join(f.read_text(encoding="utf-8", errors="replace") for f in sorted(folder.glob("*.py")))


def check_loading(path: str, loading: dict, every_weight: bool) -> None:
    """Refuse a backbone whose weights did not all load (transformers fills a missing weight with random
    values and only warns): missing or mismatched keys always, unexpected ones (weights of the file the
    model did not read) for a published family (:data:`FAMILIES`), whose file must be read whole. A causal
    LM's unused ``lm_head`` is unexpected and harmless for other backbones; BERT's CLS ``pooler``, which mean
    pooling never uses (BiEncoder drops it; a full fine-tune saves none), may be missing.

    Args:
        path: the folder, for the message.
        loading: transformers' loading report (``from_pretrained(..., output_loading_info=True)``).
        every_weight: refuse unexpected keys too.

    Raises:
        ValueError: naming the folder and the first keys of each kind.
    """
    kinds = ["missing_keys", "mismatched_keys"] + (["unexpected_keys"] if every_weight else [])
    found = {k: sorted(str(x) for x in loading.get(k) or () if not str(x).startswith("pooler.")) for k in kinds}
    found = {k: v for k, v in found.items() if v}
    if found:
        said = "; ".join(
            f"{len(v)} {k.replace('_', ' ')} ({', '.join(v[:3])}{', …' if len(v) > 3 else ''})"
            for k, v in found.items()
        )
        raise ValueError(
            f"{path}: the backbone's weights do not match its configuration: {said}; "
            "refusing to encode with random weights"
        )


def check_file_weights(model, folder: str | os.PathLike, every_weight: bool = False) -> None:
    """Refuse a model whose weights are not all in its folder's safetensors files: the check of
    :func:`check_loading` for a loader that does not report what it loaded (sentence-transformers, whose
    ``Transformer`` module fills a missing weight at random as transformers does, e.g. BERT weights under a
    ``llama_bidirec`` configuration). A folder without safetensors files is not checked here.

    Args:
        model: the loaded transformers model (its ``state_dict`` names, with or without its
            ``base_model_prefix``).
        folder: the folder its weights were read from.
        every_weight: refuse weights of the files the model did not read too (a published family, whose
            files must be read whole: weights of more layers than its configuration has, say).

    Raises:
        ValueError: naming the folder and the first weights missing from its files (or not read).
    """
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return
    stored: set[str] = set()
    for file in files:
        with safe_open(str(file), "pt") as f:
            stored.update(f.keys())
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    names = set(model.state_dict())
    missing = sorted(n for n in names if n not in stored and prefix + n not in stored)
    unread = sorted(n for n in stored if every_weight and n not in names and n.removeprefix(prefix) not in names)
    found = {"missing": missing, "unexpected": unread}
    if missing or unread:
        said = "; ".join(
            f"{len(v)} {k} keys ({', '.join(v[:3])}{', …' if len(v) > 3 else ''})" for k, v in found.items() if v
        )
        raise ValueError(
            f"{folder}: the backbone's weights do not match its configuration: {said}; refusing to encode with "
            + ("random weights" if missing else "part of its weights")
        )


PUBLISHED = {
    "nvidia/llama-3.2-nv-embedqa-1b-v2": {
        "architectures": ["LlamaBidirectionalModel"],
        "auto_map": {
            "AutoConfig": "llama_bidirectional_model.LlamaBidirectionalConfig",
            "AutoModel": "llama_bidirectional_model.LlamaBidirectionalModel",
        },
        "model_type": "llama_bidirec",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "pooling": "avg",
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "transformers_version": "4.44.2",
    },
}
"""``config.json`` of the published checkpoints (``../shared/reference/published-formats.md``). The 3B
reasoning model's is its 1B sibling's with the 3B's published sizes (Llama-3.2-3B: hidden 3072, 28
layers, 24 heads, 8 KV heads, head size 128, intermediate 8192); the fields the reference does not
list for it are taken as the 1B's. Tests build small replicas from these; ``bench/gpu_check.py``
plans the 3B run from its."""
PUBLISHED["nvidia/llama-nv-embed-reasoning-3b"] = dict(
    PUBLISHED["nvidia/llama-3.2-nv-embedqa-1b-v2"],
    hidden_size=3072,
    num_hidden_layers=28,
    num_attention_heads=24,
    num_key_value_heads=8,
    head_dim=128,
)
