"""The 3B recipe's run counted before any GPU hour, and the FLOPs of its training step: the half of
``bench/gpu_check.py`` that needs no GPU (``python bench/gpu_check.py --plan-only`` prints :func:`plan`; the
GPU sections time the step and take their MFU from :func:`step_flops`).

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
time / peak bf16 rate; HFU uses the hardware FLOPs. ``gpu_check.py`` gives both against the rate it measures
(``mfu``, ``hfu``), and MFU also against the datasheet rate when the GPU is known (``mfu_datasheet``).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

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
NF4_BLOCK = 64
"""Weights per bitsandbytes 4-bit block: one fp32 absmax each (no double quantization), beside 4 bits a weight."""
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
    quantized = config.num_hidden_layers * sum(a * b for a, b in lora_pairs(config).values())
    qlora = {  # bitsandbytes nf4 (obliq's BitsAndBytesConfig: no double quantization) on the projections
        "frozen_weights_nf4": (0.5 + 4 / NF4_BLOCK) * quantized / gib,
        "frozen_rest_fp32": 4 * (frozen - quantized) / gib,  # embeddings, norms: prepare_model_for_kbit_training
    }
    qlora["weights_gib"] = qlora["frozen_weights_nf4"] + qlora["frozen_rest_fp32"] + memory["lora_weights_fp32"]
    qlora["total_gib"] = {k: v - memory["frozen_weights_bf16"] + qlora["frozen_weights_nf4"] + qlora["frozen_rest_fp32"]
                          for k, v in total.items()}  # fmt: skip
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
        "qlora": qlora,
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


def print_plan(p: dict) -> None:
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
    q = p["qlora"]
    rows += [
        (
            "QLoRA: frozen projections nf4 + the rest fp32",
            f"{q['frozen_weights_nf4']:.2f} + {q['frozen_rest_fp32']:.2f} GiB",
            f"4 bits + one fp32 absmax per {NF4_BLOCK} weights; embeddings and norms upcast to fp32 (peft's "
            "prepare_model_for_kbit_training)",
        ),
        (
            "QLoRA: total per device, no checkpointing / checkpointing",
            f"{q['total_gib']['no_checkpointing']:.2f} / {q['total_gib']['checkpointing']:.2f} GiB",
            "the totals above with these frozen weights; gpu_check's train_qlora measures the peak",
        ),
    ]
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


def print_table(results: dict) -> None:
    """The measured sections of a ``gpu_check.py`` run as a markdown table (a skipped one: its reason)."""
    rows = [
        ("peak", "measured bf16 TFLOP/s", "measured_tflops"),
        ("peak", "datasheet bf16 TFLOP/s", "datasheet_tflops"),
    ]
    for section in ("train_bf16", "train_qlora"):
        rows += [
            (section, "weights GiB as loaded", "weights_gib"),
            (section, "rows/s", "rows_per_s"),
            (section, "tokens/s", "tokens_per_s"),
            (section, "step s", "step_s"),
            (section, "peak memory GiB", "peak_memory_gib"),
            (section, "MFU (measured peak)", "mfu"),
            (section, "MFU (datasheet peak)", "mfu_datasheet"),
            (section, "HFU (measured peak)", "hfu"),
        ]
    rows += [
        ("train_qlora", "planned weights GiB", "planned_weights_gib"),
        ("generate_vllm", "new tokens/s", "new_tokens_per_s"),
        ("generate_vllm", "requests/s", "requests_per_s"),
        ("generate_vllm", "prompt + new tokens/s", "tokens_per_s"),
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
