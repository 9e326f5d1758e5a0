"""bench/gpu_check.py: the CPU smoke run with a tiny Llama writes every section (numbers or a skip
reason), and its FLOP count equals torch's FlopCounterMode on a real forward/backward."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

SECTIONS = {
    "peak": ["measured_tflops"],
    "train_bf16": ["rows_per_s", "tokens_per_s", "step_s", "peak_memory_gib", "mfu", "hfu", "model_tflop_per_step"],
    "train_qlora": ["rows_per_s", "tokens_per_s", "step_s", "peak_memory_gib", "mfu", "hfu"],
    "latency": ["p50_ms", "p95_ms", "encode_p50_ms", "search_p50_ms"],
}


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_tiny_cpu_run_reports_every_section(tmp_path, capsys):
    """The script's own main with the smoke test's arguments, in this process (no start-up of torch,
    transformers and peft to pay again); the threads it sets are this process's, so they are restored."""
    out = tmp_path / "check.json"
    threads = torch.get_num_threads()
    try:
        _gpu_check().main(["--tiny", "--device", "cpu", "--threads", "1", "--steps", "2", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert "| train_bf16 | rows/s |" in capsys.readouterr().out  # the printed table
    result = json.loads(out.read_text())
    for section, keys in SECTIONS.items():
        got = result[section]
        if "skipped" in got:
            assert isinstance(got["skipped"], str) and got["skipped"].strip(), section
        else:
            assert all(_number(got[k]) for k in keys), (section, got)
    assert "skipped" not in result["train_bf16"] and "skipped" not in result["latency"]  # both run on CPU
    assert "CUDA" in result["train_qlora"]["skipped"]
    faiss = result["faiss"]
    assert _number(faiss["cpu"]["search_s"])
    assert _number(faiss["gpu"]["search_s"]) if "skipped" not in faiss["gpu"] else faiss["gpu"]["skipped"]
    train = result["train_bf16"]
    assert train["tokens_per_step"] == (8 + 8 * 5) * 32 and train["rows_per_s"] * train["step_s"] == pytest.approx(8)
    # the tiny config by hand: q 64×64, k/v 64×32 (2 KV heads of 16), o 64×64, gate/up 64×128, down 128×64
    assert train["n_lin"] == 2 * (4096 + 2048 + 2048 + 4096 + 8192 * 3)
    assert train["n_lora"] == 2 * 16 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert train["mfu"] == pytest.approx(
        train["model_tflop_per_step"] / train["step_s"] / result["peak"]["measured_tflops"]
    )


def test_flop_formula_equals_flop_counter_on_a_forward_backward(tmp_path):
    """step_flops against torch.utils.flop_counter on the tiny LoRA Llama (eager attention, so the
    attention products are counted as matmuls too), one chunk of 4 × 32 tokens."""
    from torch.utils.flop_counter import FlopCounterMode

    from obliq.model import BiEncoder, LoraSettings

    gc = _gpu_check()
    tokenizer, _ = gc.load_tokenizer("smollm2")
    gc.random_backbone(gc.TINY, tokenizer, tmp_path, "cpu")
    enc = BiEncoder(
        str(tmp_path),
        lora=LoraSettings(r=16, alpha=32),
        attn_implementation="eager",
        query_max_length=32,
        passage_max_length=32,
    ).train()
    ids = torch.randint(3, len(tokenizer), (4, 32))
    with FlopCounterMode(display=False) as counter:
        enc({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).sum().backward()
    want = gc.step_flops(**gc.flop_terms(enc), layers=2, hidden=64, length=32, tokens=4 * 32, tokens_again=0)
    assert counter.get_total_flops() == want["model"]


def test_byte_tokenizer_needs_no_file():
    tok = _gpu_check().byte_tokenizer()
    ids = tok(["é a"])["input_ids"][0]
    assert len(ids) == 4 and max(ids) < len(tok) == 259 and tok.pad_token_id == 0
