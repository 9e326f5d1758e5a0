"""Export a training checkpoint: the LoRA adapter (peft format) and, on request, a merged
sentence-transformers folder that loads with ``SentenceTransformer(path)`` and no obliq import.

The merge is computed in float32 and cast to the training dtype once (the model card's caveat:
folding ``W + BA·scaling`` directly in bf16 loses digits), then checked on a probe set against the
adapter path: every cosine between merged and adapter embeddings must be ≥ ``min_cosine``, or the
merged folder is removed and the export refuses.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import torch

from obliq.model.encoder import BiEncoder, LoraSettings

PROBE = [
    "A passage in the same restless, aphoristic voice as this one.",
    "The witness declined to answer and turned the question back on the committee.",
    "Find problems solved by the pigeonhole principle.",
    "Tweets that quietly oppose the policy without naming it.",
    "The court adjourned; nobody expected the verdict, least of all the defendant's lawyers.",
    "Short.",
]


def load_checkpoint(path: str | Path, **overrides) -> BiEncoder:
    """Rebuild the encoder of a training checkpoint (``train.py fit``) with its trained weights.

    Args:
        path: a ``.ckpt`` file written by :class:`~obliq.model.module.RetrieverModule`.
        overrides: BiEncoder settings to change (e.g. ``dtype="float32"``).

    Raises:
        FileNotFoundError: no such file.
        KeyError: the file is not an obliq checkpoint, or lacks trained weights.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise ValueError(f"{path}: not a readable checkpoint ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if "obliq" not in ckpt:
        raise KeyError(f"{path}: not an obliq training checkpoint (no 'obliq' section)")
    settings = dict(ckpt["obliq"]["encoder"], **overrides)
    lora = ckpt["obliq"]["lora"]
    encoder = BiEncoder(**settings, lora=LoraSettings(**lora) if lora else None)
    state = {k.removeprefix("encoder."): v for k, v in ckpt["state_dict"].items()}
    trainable = {n for n, p in encoder.named_parameters() if p.requires_grad}
    missing = sorted(trainable - state.keys())
    if missing:
        raise KeyError(f"{path}: {len(missing)} trained weights missing, e.g. {missing[:3]}")
    encoder.load_state_dict(state, strict=False)
    return encoder.eval()


def _probe_embeddings(encode, texts: list[str]) -> torch.Tensor:
    return torch.cat([encode(texts, "query"), encode(texts, "passage")])


def export(
    checkpoint: Path,
    out: Path,
    merge: bool = False,
    min_cosine: float = 0.999,
    probe_file: Path | None = None,
) -> dict:
    """Write ``<out>/adapter`` (peft adapter + obliq settings) and, with ``merge``, ``<out>/merged``.

    Args:
        checkpoint: a training checkpoint (``.ckpt``).
        out: output folder.
        merge: also write a merged sentence-transformers folder (prompts ``query`` / ``document``
            hold the prefixes; mean pooling; normalisation).
        min_cosine: the least cosine between merged and adapter embeddings on the probe set.
        probe_file: texts to probe with, one per line (default: a built-in set).

    Returns:
        What was written and the probe's minimum cosine.

    Raises:
        ValueError: the merged model's embeddings drift below ``min_cosine`` (nothing merged is kept).
    """
    out = Path(out)
    encoder = load_checkpoint(checkpoint)
    adapter_dir = out / "adapter"
    for stale in (adapter_dir, out / "merged"):  # a previous export's: never mix two checkpoints
        shutil.rmtree(stale, ignore_errors=True)
    encoder.save_pretrained(adapter_dir)
    report = {"checkpoint": str(checkpoint), "adapter": str(adapter_dir)}
    if merge:
        probe = Path(probe_file).read_text().splitlines() if probe_file else PROBE
        report.update(merge_to_sentence_transformers(checkpoint, out / "merged", probe, min_cosine))
    (out / "export.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def merge_to_sentence_transformers(checkpoint: Path, folder: Path, probe: list[str], min_cosine: float) -> dict:
    """Merge LoRA in float32, cast once to the training dtype, save and verify a sentence-transformers folder."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    encoder = load_checkpoint(checkpoint, dtype="float32")
    expect = _probe_embeddings(encoder.encode, probe)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[encoder.settings["dtype"]]
    model = encoder.model.merge_and_unload() if encoder.is_peft else encoder.model
    model = model.to(dtype)
    folder = Path(folder)
    hf_dir = folder.with_name(folder.name + ".hf-tmp")
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.save_pretrained(hf_dir)  # config.is_causal=False travels with a bidirectional decoder
    encoder.tokenizer.save_pretrained(hf_dir)
    try:
        s = encoder.settings
        # The model's capacity (as obliq's own loader caps it), not the training length: a merged
        # folder then encodes the text an adapter would under the same evaluation settings.
        capacity = getattr(model.config, "max_position_embeddings", None) or s["passage_max_length"]
        transformer = Transformer(str(hf_dir), max_seq_length=capacity)
        st = SentenceTransformer(
            modules=[transformer, Pooling(encoder.hidden_size, "mean"), Normalize()],
            prompts={"query": s["query_prefix"], "document": s["passage_prefix"]},
            device="cpu",
        )
        shutil.rmtree(folder, ignore_errors=True)
        st.save(str(folder))
    finally:
        shutil.rmtree(hf_dir, ignore_errors=True)

    loaded = SentenceTransformer(str(folder), device="cpu")

    def st_encode(texts, kind):
        fn = loaded.encode_query if kind == "query" else loaded.encode_document
        loaded.max_seq_length = encoder.settings[f"{kind}_max_length"]
        return fn(texts, convert_to_tensor=True, normalize_embeddings=True).float().cpu()

    got = _probe_embeddings(st_encode, probe)
    cosine = float((got * expect).sum(-1).min())
    if cosine < min_cosine:
        shutil.rmtree(folder, ignore_errors=True)
        raise ValueError(
            f"merged model drifts from the adapter: min cosine {cosine:.5f} < {min_cosine} on {len(probe)} probe "
            "texts; use the adapter export (or merge to float32)"
        )
    return {"merged": str(folder), "merged_dtype": str(dtype).removeprefix("torch."), "probe_min_cosine": cosine}
