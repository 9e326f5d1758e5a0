"""A transformers backbone as the encoder loads it: its weights' dtype, QLoRA's quantized loading, a pad
token for a tokenizer without one, and how many tokens it reads (its position embeddings, as the RoBERTa
family numbers them)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from obliq.files import read_json_object

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The weights dtypes an encoder loads its backbone in, by name."""


POSITION_OFFSET_MODELS = frozenset(
    "roberta xlm-roberta xlm-roberta-xl camembert mpnet roberta-prelayernorm data2vec-text xmod ibert longformer "
    "luke markuplm layoutlmv3".split()
)
"""transformers model types whose position ids start at ``padding_idx + 1`` (``create_position_ids_from_input_ids``):
a table of 514 position embeddings holds 512 tokens (C47; transformers #14243, #9116, #15292, #1363)."""


def model_capacity(path: str, config) -> int | None:
    """How many tokens a backbone reads: its position embeddings (less the ``padding_idx + 1`` rows the
    RoBERTa family skips, :data:`POSITION_OFFSET_MODELS`), or a sentence-transformers folder's own
    ``max_seq_length`` when that is shorter (all-MiniLM-L6-v2: 256 of 512 positions, the length it
    was trained at), so that obliq's encoder and sentence-transformers read the same text.

    A sentence-transformers folder's length is read as sentence-transformers reads it
    (``sentence_transformers.base.modules.transformer.Transformer``): ``max_seq_length`` in
    ``sentence_bert_config.json`` when there, else the tokenizer's ``model_max_length`` (where
    sentence-transformers 5 and later save it: obliq's merged exports).

    Raises:
        ValueError: a file it reads is not one JSON object, or the length it holds is not a positive whole number
            (file and field named).
    """
    positions = getattr(config, "max_position_embeddings", None)
    if positions and getattr(config, "model_type", None) in POSITION_OFFSET_MODELS:
        positions -= (getattr(config, "pad_token_id", None) or 0) + 1
    limits = [positions]
    folder = Path(path)
    if (folder / "sentence_bert_config.json").is_file():
        for name, field in (
            ("sentence_bert_config.json", "max_seq_length"),
            ("tokenizer_config.json", "model_max_length"),
        ):
            if (folder / name).is_file():
                length = read_json_object(folder / name).get(field)
                if length is not None and length != float("inf"):  # inf (JSON's Infinity): no limit, as null
                    whole = isinstance(length, int) or (isinstance(length, float) and length.is_integer())
                    if isinstance(length, bool) or not whole or length < 1:
                        raise ValueError(f"{folder / name}: {field} is a positive whole number, got {length!r}")
                    limits.append(length)
                    break
    limits = [int(n) for n in limits if n]
    return min(limits) if limits else None


def ensure_pad_token(tokenizer) -> None:
    """Give a tokenizer without a pad token one explicitly, at load time (C02).

    The pooling mask is always the tokenizer's attention mask, so pad = eos is safe.
    """
    if tokenizer.pad_token is not None:
        return
    for name in ("eos_token", "unk_token"):
        if getattr(tokenizer, name) is not None:
            tokenizer.pad_token = getattr(tokenizer, name)
            log.info("tokenizer has no pad token; using its %s %r", name, tokenizer.pad_token)
            return
    raise ValueError("the tokenizer has no pad, eos or unk token: set tokenizer.pad_token before encoding")


def quantization_config(quantization: str, compute_dtype: torch.dtype):
    """The bitsandbytes loading settings of QLoRA's base: ``4bit`` (nf4, computing in ``compute_dtype``) or
    ``8bit``. On a CUDA GPU or on the CPU (bitsandbytes' CPU backend: nf4 and int8 forward and backward).

    Raises:
        ValueError: another ``quantization``.
    """
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:  # pragma: no cover - bitsandbytes is a core dependency
        raise ImportError("QLoRA needs bitsandbytes: pip install bitsandbytes") from err
    from transformers import BitsAndBytesConfig

    if quantization == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"quantization must be '4bit', '8bit' or None, got {quantization!r}")


def one_4bit_kernel(model) -> int:
    """Keep every bitsandbytes 4-bit layer of ``model`` on the kernel it trains with, in evaluation too; how many.

    On a CPU with AVX512-BF16, bitsandbytes 0.50 repacks a ``Linear4bit``'s weights for a faster inference kernel
    the first time it runs in eval mode without gradients, and keeps them so: a layer whose input size is not a
    multiple of its 64-weight block then fails (``shape '[96, 1]' is invalid``), training after an evaluation (the
    recipe's evaluation callback) runs the inference kernel, which has no backward (the LoRA weights of earlier
    layers get no gradient), and its block scales are rounded to bf16, so evaluation reads another model than
    training does. Off, one kernel (dequantize, then matmul in the compute dtype) serves both, as on any other
    CPU or GPU."""
    from bitsandbytes.nn import Linear4bit

    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)
