"""bench/gpu_check.py and its part bench/gpu_plan.py: the CPU smoke run with a tiny Llama writes every section
(numbers or a skip reason), its FLOP count equals torch's FlopCounterMode on a real forward/backward, and the 3B
plan (meta device) counts the card's LoRA parameters, memory terms and steps."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

SECTIONS = {
    "peak": ["measured_tflops"],
    "train_bf16": ["rows_per_s", "tokens_per_s", "step_s", "peak_memory_gib", "mfu", "hfu", "model_tflop_per_step"],
    "train_qlora": ["rows_per_s", "tokens_per_s", "step_s", "peak_memory_gib", "mfu", "hfu"],
    "latency": ["p50_ms", "p95_ms", "encode_p50_ms", "search_p50_ms"],
    "generate_vllm": ["new_tokens_per_s", "requests_per_s", "tokens_per_s", "generate_s"],
}


def _bench(name: str):
    """``bench/<name>.py`` loaded as ``python bench/gpu_check.py`` loads it: with bench/ first on the path, so
    that the script finds its part beside it (``gpu_plan``)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


def _gpu_check():
    return _bench("gpu_check")


def _gpu_plan():
    return _bench("gpu_plan")


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
    printed = capsys.readouterr().out
    assert "| train_bf16 | rows/s |" in printed and "| optimizer steps | 483 |" in printed  # the printed tables
    result = json.loads(out.read_text())
    for section, keys in SECTIONS.items():
        got = result[section]
        if "skipped" in got:
            assert isinstance(got["skipped"], str) and got["skipped"].strip(), section
        else:
            assert all(_number(got[k]) for k in keys), (section, got)
    assert "skipped" not in result["train_bf16"] and "skipped" not in result["latency"]  # both run on CPU
    assert "CUDA" in result["train_qlora"]["skipped"]
    assert result["plan"]["lora_params"] == 24_313_856  # the 3B plan, whatever the run's own model
    assert result["plan"]["mfu_source"] == "assumed, not measured"  # a CPU run measures no GPU MFU
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
    gp = _gpu_plan()
    want = gp.step_flops(**gp.flop_terms(enc), layers=2, hidden=64, length=32, tokens=4 * 32, tokens_again=0)
    assert counter.get_total_flops() == want["model"]


def test_byte_tokenizer_needs_no_file():
    tok = _gpu_check().byte_tokenizer()
    ids = tok(["é a"])["input_ids"][0]
    assert len(ids) == 4 and max(ids) < len(tok) == 259 and tok.pad_token_id == 0


def test_plan_only_counts_the_3b_run_on_the_meta_device(tmp_path, capsys):
    """--plan-only: the 3B model built on the meta device gives the card's ~24M LoRA parameters (exactly
    28 layers × 868,352), memory terms that add up to the totals, and ceil(rows / 320) steps."""
    gc = _gpu_check()
    out = tmp_path / "plan.json"
    gc.main(["--plan-only", "--out", str(out)])
    assert "| optimizer steps | 483 |" in capsys.readouterr().out
    plan = json.loads(out.read_text())["plan"]
    assert plan["lora_params"] == plan["lora_params_formula"] == 28 * 868_352 == 24_313_856
    assert round(plan["lora_params"] / 1e6) == 24  # the card's "~24M"
    # the recipe read from configs/obliq-ir-3b.yaml is the one the GPU sections time per device
    assert (plan["anchors_per_device"], plan["negatives"], plan["chunk"], plan["length"]) == (
        gc.RECIPE["anchors"],
        gc.RECIPE["negatives"],
        gc.RECIPE["chunk"],
        gc.RECIPE["length"],
    )
    assert plan["devices"] == 40 and plan["anchors_per_step"] == 320
    terms = {**plan["memory_gib"], **plan["activations_gib"]}
    assert all(_number(v) and v > 0 for v in terms.values()), terms
    for mode, activations in plan["activations_gib"].items():
        assert plan["total_gib"][mode] == pytest.approx(sum(plan["memory_gib"].values()) + activations)
        for gpu in ("H100", "H200"):
            fits = plan["fits"][gpu]
            assert fits["headroom_gib"][mode] == pytest.approx(fits["capacity_gib"] - plan["total_gib"][mode])
    assert plan["memory_gib"]["frozen_weights_bf16"] == pytest.approx(2 * plan["frozen_params"] / 2**30)
    assert plan["activations_gib"]["checkpointing"] < plan["activations_gib"]["no_checkpointing"]
    assert plan["steps"] == math.ceil(154_361 / 320) == 483  # the last step holds the remaining 121 anchors
    assert plan["mfu"] == _gpu_plan().ASSUMED_MFU and plan["mfu_source"] == "assumed, not measured"
    assert plan["predicted_minutes"] == pytest.approx(483 * plan["model_tflop_per_step"] / (0.35 * 989.4 * 40) / 60)


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_activation_bytes_equal_the_saved_tensors_of_a_small_llama():
    """activation_bytes' per-layer figure against torch's saved-tensors hooks on a small LoRA Llama
    (the 3B's head counts, narrower) run forward on CPU under bf16 autocast: a second layer adds
    exactly its bytes. CPU dropout keeps its fp32 noise (4 B per element) where CUDA keeps a bool mask."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModel

    from obliq.model.bidirectional import PUBLISHED, register
    from obliq.model.lora import DECODER_LORA_TARGETS

    gp = _gpu_plan()
    register()
    drop = ("architectures", "auto_map", "transformers_version", "torch_dtype")
    small = {k: v for k, v in PUBLISHED["nvidia/llama-nv-embed-reasoning-3b"].items() if k not in drop}
    small.update(hidden_size=192, intermediate_size=512, head_dim=8, vocab_size=300)
    tokens = (2, 24)

    def saved_bytes(layers: int):
        config = AutoConfig.for_model(**dict(small, num_hidden_layers=layers))
        torch.manual_seed(0)
        model = get_peft_model(
            AutoModel.from_config(config, dtype=torch.bfloat16),
            LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=DECODER_LORA_TARGETS),
        ).train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: dict = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        ids = torch.randint(3, 300, tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        return sum(seen.values()), config

    one, _ = saved_bytes(1)
    two, config = saved_bytes(2)
    want = gp.activation_bytes(config, 16, tokens[0] * tokens[1], mask_bytes=4)
    assert two - one == want["per_layer"]


def test_the_plan_refuses_a_device_count_it_cannot_plan_and_out_is_not_replaced(tmp_path, capsys):
    """Issue 53 §3: a recipe with ``trainer.devices: -1`` (all visible GPUs) planned -3,859 steps and exited 0; now
    the plan says which field it cannot count and the call fails. An existing --out is kept unless --overwrite."""
    import yaml

    gc = _gpu_check()
    recipe = yaml.safe_load(_gpu_plan().PLAN_RECIPE.read_text())
    for bad in (-1, "auto", 0):
        edited = tmp_path / f"recipe-{bad}.yaml"
        edited.write_text(yaml.safe_dump({**recipe, "trainer": {**recipe["trainer"], "devices": bad}}))
        with pytest.raises(SystemExit) as exit_:
            gc.main(["--plan-only", "--recipe", str(edited)])
        assert exit_.value.code == 2
        assert f"recipe-{bad}.yaml: trainer.devices is {bad!r}" in capsys.readouterr().err
    kept = tmp_path / "earlier.json"
    kept.write_text('{"earlier": "results"}')
    with pytest.raises(SystemExit):
        gc.main(["--plan-only", "--out", str(kept)])
    assert "--out" in capsys.readouterr().err and kept.read_text() == '{"earlier": "results"}'


def test_the_generation_replica_has_the_3b_shape_and_vllm_is_skipped_with_its_environment_named(tmp_path):
    """generate_vllm's model: the backbone's shape as a causal Llama whose LM head is the embedding table (no
    parameter added: the 3B encoder's count, built on the meta device); the tiny one written and read back by
    transformers. Without vLLM the section says where to run it."""
    from transformers import AutoModel, AutoModelForCausalLM

    gc = _gpu_check()
    with torch.device("meta"):
        causal = AutoModelForCausalLM.from_config(gc.causal_config(gc.LLAMA_3B), dtype=torch.bfloat16)
        encoder = AutoModel.from_config(gc.causal_config(gc.LLAMA_3B), dtype=torch.bfloat16)
    assert sum(p.numel() for p in causal.parameters()) == sum(p.numel() for p in encoder.parameters())
    assert causal.config.tie_word_embeddings and causal.config.rope_parameters["rope_type"] == "llama3"
    written = gc.causal_replica(gc.TINY, tmp_path, "cpu")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert written["architectures"] == ["LlamaForCausalLM"] and written["vocab_size"] == 128256
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(gc._Skip, match=r"vLLM is not installed .*pip install -e '.\[gen\]'"):
            gc.measure_vllm(gc.TINY, gc.TINY_RECIPE, "cpu", tmp_path / "other")


def test_the_plan_counts_qlora_weights_from_the_shape():
    """QLoRA's frozen weights in the plan: the projections at 4 bits plus an fp32 absmax per 64 weights, the
    embedding table and the norms in fp32, counted here from Llama-3.2-3B's published sizes by hand."""
    gp = _gpu_plan()
    plan = gp.plan()
    h, i, vocab, layers, kv = 3072, 8192, 128_256, 28, 8 * 128
    projections = layers * (h * h + 2 * h * kv + h * h + 3 * h * i)
    assert plan["frozen_params"] - projections == vocab * h + (2 * layers + 1) * h  # embeddings and norms
    q = plan["qlora"]
    assert q["frozen_weights_nf4"] == pytest.approx(projections * (0.5 + 4 / 64) / 2**30)
    assert q["frozen_rest_fp32"] == pytest.approx(4 * (vocab * h + (2 * layers + 1) * h) / 2**30)
    for mode, total in plan["total_gib"].items():
        saved = plan["memory_gib"]["frozen_weights_bf16"] - q["frozen_weights_nf4"] - q["frozen_rest_fp32"]
        assert q["total_gib"][mode] == pytest.approx(total - saved) and saved > 3  # GiB
