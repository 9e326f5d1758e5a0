"""The bi-encoder: bidirectional decoders (C03), pad tokens (C02), padding sides, truncation (C17), LoRA."""

import json
import re
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from obliq.model import BiEncoder, LoraSettings, check_bidirectional, make_bidirectional


# ---------------------------------------------------------------- C03 on the exact case model
def _c03_model(attn: str) -> LlamaModel:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    config._attn_implementation = attn
    return LlamaModel(config).eval()


def _states(model, rows, side="right", mask_none=False):
    width = max(len(r) for r in rows)
    ids, mask = [], []
    for r in rows:
        pad = [0] * (width - len(r))
        ids.append(pad + r if side == "left" else r + pad)
        m = [1] * len(r)
        mask.append([0] * len(pad) + m if side == "left" else m + [0] * len(pad))
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # what BiEncoder.forward passes
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=None if mask_none else mask, position_ids=position_ids)
    return out.last_hidden_state, mask


A, A2, PARTNER = [5, 6, 7, 8], [5, 6, 7, 9], [10, 11, 12, 13, 14, 15]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", ["ones", "none", "batched-right", "batched-left"])
def test_c03_bidirectional_in_every_variant(attn, variant):
    model = _c03_model(attn)
    make_bidirectional(model)
    kw = {"mask_none": variant == "none", "side": "left" if variant == "batched-left" else "right"}
    rows = (lambda a: [a, PARTNER]) if variant.startswith("batched") else (lambda a: [a])
    h_a, mask = _states(model, rows(A), **kw)
    h_a2, _ = _states(model, rows(A2), **kw)
    first = int(mask[0].nonzero()[0])
    assert (h_a[0, first] - h_a2[0, first]).abs().max() > 1e-4
    # A's real-token states are the same alone and batched with padding.
    alone, _ = _states(model, [A])
    real = mask[0].bool()
    assert torch.allclose(h_a[0, real], alone[0], atol=1e-4)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_c03_unpatched_decoder_is_causal(attn):
    """The reference: without the patch position 0 is blind to the last token (exactly 0)."""
    model = _c03_model(attn)
    h_a, _ = _states(model, [A])
    h_a2, _ = _states(model, [A2])
    assert (h_a[0, 0] - h_a2[0, 0]).abs().max() == 0


@pytest.mark.parametrize("route", ["config", "modules", "both"])
def test_self_test_refuses_a_decoder_that_stayed_causal(tiny_llama_dir, route):
    """Whichever of the two switches is left causal, the self-test must not pass silently."""
    enc = BiEncoder(tiny_llama_dir)
    assert enc.bidirectional
    if route in ("config", "both"):
        enc.model.config.is_causal = True
    if route in ("modules", "both"):
        for m in enc.model.modules():
            if hasattr(m, "is_causal") and m is not enc.model:
                m.is_causal = True
    try:
        check_bidirectional(enc)
    except RuntimeError as err:
        assert "still causal" in str(err)
    else:  # this transformers release ignored the switch: the model must really be bidirectional
        ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9]])
        with torch.no_grad():
            h = enc.model(input_ids=ids).last_hidden_state
        assert (h[0, 0] - h[1, 0]).abs().max() > 0
    if route == "both":
        with pytest.raises(RuntimeError, match="still causal"):
            check_bidirectional(enc)


def test_a_decoder_kept_causal_on_request(tiny_llama_dir):
    enc = BiEncoder(tiny_llama_dir, bidirectional=False)  # its causal self-test runs at build
    assert not enc.bidirectional


@pytest.mark.slow
@pytest.mark.parametrize("backbone", ["minilm", "smollm2", "tiny"])
def test_real_backbones_pass_the_self_test_and_pad_either_side(backbone, tiny_llama_dir):
    enc = BiEncoder(tiny_llama_dir if backbone == "tiny" else backbone)  # the self-test runs here
    assert enc.bidirectional
    texts = ["short one", "a considerably longer text that forces padding on the other row, " * 3]
    right = enc.encode(texts, "passage")
    enc.tokenizer.padding_side = "left"
    left = enc.encode(texts, "passage")
    alone = torch.cat([enc.encode([t], "passage") for t in texts])
    assert torch.allclose(right, left, atol=1e-5)
    assert torch.allclose(right, alone, atol=1e-5)
    assert torch.allclose(right.norm(dim=1), torch.ones(2), atol=1e-6)


# ---------------------------------------------------------------- C02
def test_c02_missing_pad_token_is_set_at_load_and_eos_is_pooled(tiny_llama_dir):
    enc = BiEncoder(tiny_llama_dir, query_prefix="", passage_prefix="")
    tok = enc.tokenizer
    assert tok.pad_token == tok.eos_token
    eos = tok.eos_token
    texts = [f"alpha beta{eos}", f"alpha beta gamma delta{eos}"]
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    batch = enc.tokenize(texts, "passage")
    # The genuine eos (== pad id) is a real token: the mask is the tokenizer's, not ids != pad.
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert batch["input_ids"][0, lengths[0] - 1] == tok.eos_token_id
    # Reference: each text alone, no padding, plain mean of every state.
    enc.eval()
    with torch.no_grad():
        pooled = enc(batch)
        for i, t in enumerate(texts):
            ids = torch.tensor([tok(t)["input_ids"]])
            h = enc.model(input_ids=ids).last_hidden_state[0].mean(0)
            assert torch.allclose(pooled[i], h / h.norm(), atol=1e-5)


# ---------------------------------------------------------------- prefixes, truncation (C17)
def test_prefixes_and_truncation_at_the_configured_length(minilm_path):
    enc = BiEncoder(minilm_path, passage_max_length=200, query_max_length=16)
    enc.tokenizer.model_max_length = int(1e30)  # as some tokenizers report (C17)
    long_doc = "word " * 10_000
    batch = enc.tokenize([long_doc, "short"], "passage")
    assert batch["input_ids"].shape[1] == 200
    assert batch["attention_mask"].sum(1).tolist()[0] == 200
    assert batch["input_ids"][0, -1] == enc.tokenizer.sep_token_id  # special tokens kept
    assert enc.truncated == {"query": 0, "passage": 1}
    # The tokenization travels to data-loader workers without the model.
    import pickle

    clone = pickle.loads(pickle.dumps(enc.text))
    assert torch.equal(clone([long_doc], "passage")["input_ids"], batch["input_ids"][:1])
    ids = enc.tokenize(["hello"], "query")["input_ids"][0].tolist()
    assert enc.tokenizer.decode(ids, skip_special_tokens=True) == "query : hello"
    assert enc.truncated["query"] == 0


def test_max_lengths_are_capped_at_what_the_model_reads(minilm_path, tmp_path):
    """all-MiniLM-L6-v2 has 512 positions but was trained at, and declares, 256 tokens
    (sentence_bert_config.json): obliq reads what sentence-transformers reads. A plain transformers
    copy without that file is capped at its 512 positions."""

    enc = BiEncoder(minilm_path, passage_max_length=1024)
    assert enc.text.max_length["passage"] == 256
    batch = enc.tokenize(["word " * 2000], "passage")
    assert batch["input_ids"].shape[1] == 256
    assert enc.tokenize(["word " * 2000], "passage", max_length=1024)["input_ids"].shape[1] == 256
    assert enc.encode(["word " * 2000], "passage").shape == (1, 384)
    plain = tmp_path / "plain"
    shutil.copytree(minilm_path, plain, ignore=shutil.ignore_patterns("sentence_bert_config.json"))
    assert BiEncoder(str(plain), passage_max_length=1024).text.max_length["passage"] == 512


@pytest.mark.parametrize("length", [None, 128, 300, 512, "Infinity"])
def test_a_sentence_transformers_folder_is_read_at_its_own_length(length, minilm_path, tmp_path):
    """obliq reads a sentence-transformers folder at the length sentence-transformers itself loads it with: the
    packaged folder's ``max_seq_length`` (256, in sentence_bert_config.json), and a folder that
    sentence-transformers saved (it keeps the length as the tokenizer's ``model_max_length``, as obliq's merged
    exports do), below, above and at MiniLM's 256 (issue 55: a merged export read at 512 positions), and one whose
    tokenizer has no limit (``Infinity``, as ``json.dumps`` writes a float inf: the 512 positions then)."""
    from sentence_transformers import SentenceTransformer

    folder = minilm_path
    if length is not None:
        st = SentenceTransformer(minilm_path, device="cpu")
        st.max_seq_length = 300 if length == "Infinity" else length
        folder = str(tmp_path / "saved")
        st.save(folder)
    if length == "Infinity":
        config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
        (tmp_path / "saved" / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 1e999}))
    expect = SentenceTransformer(folder, device="cpu").max_seq_length
    assert expect == {None: 256, "Infinity": 512}.get(length, length)
    enc = BiEncoder(folder, query_prefix="", passage_prefix="", passage_max_length=4096)
    assert enc.text.capacity == expect
    assert enc.tokenize(["word " * 2000], "passage")["input_ids"].shape[1] == expect


@pytest.mark.parametrize("file", ["sentence_bert_config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("length", ["256", 0, -3, True, 12.5, [256]])
def test_a_folders_length_that_is_no_whole_number_is_refused_by_file_and_field(file, length, minilm_path, tmp_path):
    """A sentence-transformers folder whose length is not a positive whole number is refused with the file and
    the field named, before any weight loads (not Python's bare ``int()`` message, nor a silent ``0``)."""
    folder = tmp_path / "model"
    shutil.copytree(minilm_path, folder)
    field = {"sentence_bert_config.json": "max_seq_length", "tokenizer_config.json": "model_max_length"}[file]
    for name in ("sentence_bert_config.json", "tokenizer_config.json"):
        config = json.loads((folder / name).read_text())
        config.pop("max_seq_length", None)
        if name == file:
            config[field] = length
        (folder / name).write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"{re.escape(str(folder / file))}: {field} is a positive whole number"):
        BiEncoder(str(folder))


def test_instructions_only_when_enabled(minilm_path):
    off = BiEncoder(minilm_path)
    on = BiEncoder(minilm_path, use_instructions=True)
    assert off.text.format(["q"], "query", ["find style"]) == ["query: q"]
    assert on.text.format(["q", "r"], "query", ["find style", None]) == ["Instruct: find style\nquery: q", "query: r"]
    assert on.text.format(["d"], "passage", ["x"]) == ["passage: d"]


# ---------------------------------------------------------------- LoRA
@pytest.mark.slow
def test_lora_on_smollm2_wraps_the_seven_projections_and_trains_only_lora(smollm2_path):
    enc = BiEncoder(smollm2_path, lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    layers = enc.backbone_config.num_hidden_layers
    wrapped = [n for n, m in enc.model.named_modules() if hasattr(m, "lora_A") and "lora_A" not in n]
    kinds = sorted({n.rsplit(".", 1)[-1] for n in wrapped})
    assert kinds == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert len(wrapped) == 7 * layers
    before = {n: p.detach().clone() for n, p in enc.named_parameters()}
    trainable = [p for p in enc.parameters() if p.requires_grad]
    assert all("lora_" in n for n, p in enc.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    q = enc(enc.tokenize(["what style is this", "another question"], "query"))
    d = enc(enc.tokenize(["a passage", "another passage"], "passage"))
    torch.nn.functional.cross_entropy(q @ d.T / 0.05, torch.arange(2)).backward()
    opt.step()
    changed = {n for n, p in enc.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_A" in n for n in changed)  # B starts at zero, so A moves only after B; both get grads
    assert all(p.grad is None for n, p in enc.named_parameters() if "lora_" not in n)


def test_bert_lora_defaults_and_save_load_round_trip(minilm_path, tmp_path, monkeypatch):
    import peft.utils.save_and_load as peft_save

    asked = []  # saving never asks the hub about the base model (peft's save_embedding_layers="auto" does)
    monkeypatch.setattr(peft_save, "check_file_exists_on_hf_hub", lambda *a, **k: asked.append(a) or True)
    enc = BiEncoder(minilm_path, lora=LoraSettings())
    kinds = {n.rsplit(".", 1)[-1] for n, m in enc.model.named_modules() if hasattr(m, "lora_A") and "lora_A" not in n}
    assert kinds == {"query", "key", "value", "dense"}
    assert not any("pooler" in n for n, _ in enc.named_parameters())
    with torch.no_grad():  # make the adapter non-trivial
        for n, p in enc.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    texts = ["one passage", "and another"]
    expect = enc.encode(texts, "passage")
    enc.save_pretrained(tmp_path / "adapter")
    assert asked == []
    loaded = BiEncoder.from_pretrained(tmp_path / "adapter")
    assert torch.allclose(loaded.encode(texts, "passage"), expect, atol=1e-6)
    assert not torch.allclose(BiEncoder(minilm_path).encode(texts, "passage"), expect, atol=1e-3)


@pytest.mark.gpu
def test_qlora_4bit_smollm2_trains_lora_only_on_gpu(smollm2_path):
    enc = BiEncoder(smollm2_path, lora=LoraSettings(), quantization="4bit", dtype="bfloat16").cuda()
    q = enc(enc.tokenize(["a query", "another"], "query"))
    d = enc(enc.tokenize(["a passage", "another passage"], "passage"))
    torch.nn.functional.cross_entropy(q @ d.T / 0.02, torch.arange(2, device=q.device)).backward()
    grads = [n for n, p in enc.named_parameters() if p.grad is not None]
    assert grads and all("lora_" in n for n in grads)


def test_a_new_encoder_is_in_train_mode_with_or_without_lora(minilm_path):
    """from_pretrained leaves eval mode; Lightning keeps each module's mode, so full fine-tuning
    would run without dropout."""
    for lora in (None, LoraSettings(r=4, alpha=8)):
        enc = BiEncoder(minilm_path, lora=lora)
        dropouts = [m for m in enc.modules() if isinstance(m, torch.nn.Dropout)]
        assert dropouts and all(m.training for m in enc.modules())


def test_a_huge_text_is_cut_before_the_tokenizer_sees_it_whole(minilm_path):
    import time

    enc = BiEncoder(minilm_path, query_max_length=16)
    start = time.perf_counter()
    huge = enc.tokenize(["word " * 4_000_000], "query")  # 20 MB
    assert time.perf_counter() - start < 5
    assert torch.equal(huge["input_ids"], enc.tokenize(["word " * 100], "query")["input_ids"])
    assert huge["input_ids"].shape[1] == 16 and enc.truncated["query"] == 2


def _hostile_texts() -> dict[str, str]:
    """Texts on which a character estimate of a token's length fails (issue 24 §3)."""
    import base64
    import random

    rng = random.Random(0)
    words = " ".join(rng.choice(["style", "voice", "the", "witness", "policy", "Committee"]) for _ in range(400))
    blob = base64.b64encode(bytes(rng.randrange(256) for _ in range(30_000))).decode()
    return {
        "whitespace-run": "start" + " " * 60_000 + words,
        "newline-run": "start" + "\n\t" * 30_000 + words,
        "zero-width-run": "\u200b" * 40_000 + words,
        "zero-width-inside": "\u200b\u200c".join(words[:3000]),
        "long-url": "see https://example.org/" + "a1b2c3/" * 5_000 + " " + words,
        "base64": "data:" + blob + " " + words,
        "smiles": "CC(=O)Oc1ccccc1C(=O)O." * 800,
        "combining": "e\u0301" * 20_000 + " " + words,
        "cjk": "中文文本没有空格" * 3_000,
        "plain-long": words * 20,
        "short": "Short.",
        "exactly-words": words[:200],
    }


@pytest.mark.parametrize("model", ["minilm", "smollm2"])
def test_ids_are_the_tokenizers_own_truncation_of_the_whole_text(model, minilm_path, smollm2_path):
    """§3: the ids of every text are `tokenizer(text, truncation=True, max_length=L)` of the whole text,
    and the truncated count is the number of texts whose whole tokenization is longer than L."""
    from transformers import AutoTokenizer

    from obliq.model.tokenizer import TextTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path if model == "minilm" else smollm2_path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    texts = _hostile_texts()
    whole = {name: len(tokenizer("passage: " + t)["input_ids"]) for name, t in texts.items()}
    for limit in (8, 33, 128):
        # the reference: the tokenizer's own truncation of each whole text (computed once, read twice)
        want = {
            name: tokenizer("passage: " + t, truncation=True, max_length=limit)["input_ids"]
            for name, t in texts.items()
        }
        text = TextTokenizer(tokenizer, passage_max_length=limit)
        batch = text(list(texts.values()), "passage")
        for row, name in enumerate(texts):
            got = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
            assert got == want[name], (model, limit, name)
        assert text.truncated["passage"] == sum(n > limit for n in whole.values()), (model, limit)
        one = TextTokenizer(tokenizer, passage_max_length=limit)  # one text at a time: the same ids
        for name, t in texts.items():
            ids = one([t], "passage")["input_ids"][0].tolist()
            assert ids == want[name], name


# ---------------------------------------------------------------- C47: RoBERTa-family position ids
def _roberta_dir(folder):
    """A random 1-layer RoBERTa in roberta-base's layout: byte-level BPE, model_max_length 512,
    max_position_embeddings 514, pad id 1 (shared/cases/C47)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    corpus = [f"passage {i} about the river, the town and the {i % 7} bridges over it." for i in range(200)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    folder.mkdir()
    bpe.save_model(str(folder))
    tok = RobertaTokenizerFast(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=512)
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=514,
        pad_token_id=1,
        type_vocab_size=1,
    )
    RobertaModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder, tok


def test_c47_roberta_positions_follow_the_models_own_convention(tmp_path):
    """C47 (transformers #14243, #9116, #15292, #1363): obliq's embeddings equal transformers' own forward
    (masked mean pooling) and plain sentence-transformers on the same folder, and at most 512 tokens are
    read of a 722-token passage (514 position rows less padding_idx + 1)."""
    import torch.nn.functional as F
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoModel

    folder, tok = _roberta_dir(tmp_path / "roberta")
    texts = ["the river and the town.", "passage 3 about the bridges over it, and more about the town " * 3]
    long_text = " ".join(f"bridge{i} river" for i in range(200))
    assert len(tok(long_text)["input_ids"]) > 700
    enc = BiEncoder(str(folder), query_prefix="", passage_prefix="", query_max_length=1024, passage_max_length=1024)
    ours = enc.encode(texts + [long_text], kind="passage")
    model = AutoModel.from_pretrained(folder).eval()
    batch = tok(texts + [long_text], padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # transformers' default position ids
    mask = batch["attention_mask"].unsqueeze(-1).float()
    theirs = F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    cos = (F.normalize(ours.float(), dim=-1) * theirs).sum(-1)
    assert cos.min().item() > 0.999999
    st = SentenceTransformer(
        modules=[models.Transformer(str(folder), max_seq_length=512), models.Pooling(32, "mean"), models.Normalize()],
        device="cpu",
    )
    ref = torch.from_numpy(st.encode(texts + [long_text]))
    assert (F.normalize(ours.float(), dim=-1) * ref).sum(-1).min().item() > 0.999999
    assert enc.tokenize([long_text], "passage")["input_ids"].shape[1] == 512
