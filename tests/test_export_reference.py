"""``obliq export`` against peft and plain sentence-transformers (issue 53 §1; C60, C68).

Adapters of generated ``LoraConfig``s (seeded: fractional alpha, rsLoRA, DoRA, rank and alpha patterns, target
lists and regular expressions), built by peft on the small real MiniLM and on the small random NV-Embed replica
(``llama_bidirec``), in both of the paper's adapter layouts (a plain peft folder; a sentence-transformers folder
whose model is a peft adapter), are exported with ``--merge``. The reference is peft's own ``PeftModel`` on the
input folder inside plain sentence-transformers (mean pooling, normalisation, at the lengths obliq reads at); the
exported adapter (read the same way) and the merged folder (read by ``SentenceTransformer(folder)`` with nothing
set) must give its vectors, for texts longer than the query and document lengths. Settings obliq does not carry
are refused by name; malformed adapter files in one line naming the file.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from support import make_checkpoint, save_published_replica

TEXT_ONLY = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
PROMPTS = {"query": "query: ", "document": "passage: "}  # obliq's default prefixes: a plain peft folder's reading
BERT = ["query", "key", "value", "dense"]
DECODER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CARRIED = ["r", "lora_alpha", "target_modules", "use_rslora", "use_dora", "rank_pattern", "alpha_pattern"]
CARRIED += ["exclude_modules"]
EXACT = 0.99999


def random_lora(seed: int, targets: list[str]) -> dict:
    """A ``LoraConfig``'s settings drawn from ``seed``: a subset of ``targets`` (sometimes as a regular expression),
    rank, a fractional alpha, dropout, and at random rsLoRA, DoRA, a rank and an alpha pattern."""
    rng = random.Random(seed)
    chosen = sorted(rng.sample(targets, rng.randint(1, len(targets))))
    config = {
        "r": rng.choice([2, 4, 8]),
        "lora_alpha": round(rng.uniform(0.5, 40.0), 3),
        "lora_dropout": rng.choice([0.0, 0.1]),
        "target_modules": chosen,
    }
    if rng.random() < 0.5:
        config["use_rslora"] = True
    if rng.random() < 0.5:
        config["rank_pattern"] = {rng.choice(chosen): rng.choice([1, 3, 6])}
    if rng.random() < 0.5:
        config["alpha_pattern"] = {rng.choice(chosen): round(rng.uniform(1, 64), 2)}
    if rng.random() < 0.3:
        config["use_dora"] = True
    if rng.random() < 0.3:
        config["target_modules"] = r".*\.(" + "|".join(chosen) + ")"
    return config


CASES = [("minilm", 1, "peft"), ("minilm", 3, "st"), ("replica", 0, "st"), ("replica", 2, "peft")]
"""(base, seed, layout): seeds picked so that the drawn configs hold every class (:func:`_cover_every_class`)."""


def _targets(base: str) -> list[str]:
    return BERT if base == "minilm" else DECODER


def _cover_every_class(cases) -> None:
    """The drawn configs hold every class: fractional alphas, rsLoRA, DoRA, both patterns, target lists and
    expressions, both layouts, both bases."""
    configs = [random_lora(seed, _targets(base)) for base, seed, _ in cases]
    assert all(c["lora_alpha"] != int(c["lora_alpha"]) for c in configs)
    for key in ("use_rslora", "use_dora", "rank_pattern", "alpha_pattern"):
        assert any(key in c for c in configs), key
    assert {type(c["target_modules"]) for c in configs} == {str, list}
    assert {layout for *_, layout in cases} == {"peft", "st"} and {b for b, *_ in cases} == {"minilm", "replica"}


@pytest.fixture(scope="module")
def bases(tmp_path_factory, minilm_path, smollm2_path) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bases")
    return {
        "minilm": minilm_path,
        "replica": save_published_replica(root / "replica", "nvidia/llama-3.2-nv-embedqa-1b-v2", smollm2_path),
    }


def _st_transformer(base: str, bidirectional: bool = False):
    """sentence-transformers' Transformer on ``base`` in float32, plain text in, a pad token (the card's eos)."""
    from sentence_transformers.models import Transformer

    transformer = Transformer(
        base, modality_config=TEXT_ONLY, module_output_name="token_embeddings", model_kwargs={"dtype": torch.float32}
    )
    tokenizer = transformer.tokenizer
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    if bidirectional:  # the model card's recipe for a decoder made bidirectional
        transformer.model.config.is_causal = False
        for module in transformer.model.modules():
            if getattr(module, "is_causal", None) is True:
                module.is_causal = False
    return transformer


def build_adapter(base: str, folder: Path, config: dict, seed: int, layout: str) -> Path:
    """A LoRA of ``config`` made by peft on ``base`` with random weights (A, B ~ N(0, 0.05); DoRA magnitudes
    scaled by 1 + N(0, 0.1); seeded), saved by peft (``layout="peft"``) or as a sentence-transformers folder
    whose model is the peft adapter (``"st"``, the paper's OBLIQ-IR-3B-LoRA layout), naming ``base``."""
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling

    transformer = _st_transformer(base)
    transformer.model = get_peft_model(transformer.model, LoraConfig(**config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in transformer.model.named_parameters():
            if "lora_magnitude" in name:
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            elif "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    if layout == "peft":
        transformer.model.save_pretrained(folder)
    else:
        width = transformer.model.config.hidden_size
        modules = [transformer, Pooling(width, "mean"), Normalize()]
        SentenceTransformer(modules=modules, prompts=PROMPTS, device="cpu").save(str(folder))
    file = folder / "adapter_config.json"
    file.write_text(json.dumps(dict(json.loads(file.read_text()), base_model_name_or_path=base)))
    return folder


def peft_reference(base: str, adapter: Path, texts: list[str], lengths: dict, bidirectional: bool = False) -> dict:
    """peft's own ``PeftModel`` on ``adapter`` inside plain sentence-transformers over ``base`` (the card's
    prefixes as prompts, mean pooling, normalisation), queries and documents read at ``lengths``."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling

    transformer = _st_transformer(base, bidirectional)
    transformer.model = PeftModel.from_pretrained(transformer.model, str(adapter))
    width = transformer.model.config.hidden_size
    st = SentenceTransformer(modules=[transformer, Pooling(width, "mean"), Normalize()], prompts=PROMPTS, device="cpu")
    out = {}
    for kind, encode in (("query", st.encode_query), ("passage", st.encode_document)):
        st.max_seq_length = lengths[kind]
        out[kind] = encode(texts, convert_to_tensor=True, normalize_embeddings=True).float()
    return out


def plain_st(folder: Path, texts: list[str]) -> dict:
    """A merged folder as a plain user reads it: ``SentenceTransformer(folder)``, nothing set."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    return {
        "query": st.encode_query(texts, convert_to_tensor=True, normalize_embeddings=True).float(),
        "passage": st.encode_document(texts, convert_to_tensor=True, normalize_embeddings=True).float(),
    }


def texts_of(tokenizer, counts: list[int], seed: int = 0) -> list[str]:
    """Texts of about ``counts`` tokens each (by ``tokenizer``), of seeded random words, so that what a cut keeps
    differs from what it drops."""
    rng = random.Random(seed)
    words = "court verdict witness policy quietly river stone proof box pigeon lawyer voice night tweet".split()
    out = []
    for n in counts:
        text = ""
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < n:
            text += " ".join(rng.choice(words) for _ in range(max(1, n // 8))) + ". "
        out.append(text)
    return out


def _cosines(a: dict, b: dict) -> dict[str, list[float]]:
    return {kind: (a[kind] * b[kind]).sum(-1).tolist() for kind in ("query", "passage")}


def _probe_file(tmp_path: Path) -> Path:
    probe = tmp_path / "probe.txt"  # two short texts: the export adds one longer than both lengths itself
    probe.write_text("The witness turned the question back on the committee.\nShort.\n")
    return probe


@pytest.mark.parametrize(("base", "seed", "layout"), CASES)
def test_c60_an_exported_adapter_and_merged_folder_are_the_model_peft_loads(tmp_path, bases, base, seed, layout):
    """C60: every setting of the adapter's LoraConfig is carried into the written adapter_config.json, and the
    exported adapter (peft + sentence-transformers) and the merged folder (plain sentence-transformers) equal
    peft's own PeftModel on the input folder (cosine >= 0.99999) for texts longer than the lengths (before:
    rsLoRA 0.78, alpha_pattern 0.53, alpha 12.5 0.99989, and the export passed its own probe at 1.0)."""
    from peft import LoraConfig

    from obliq.commands.export import export

    _cover_every_class(CASES)
    config = random_lora(seed, _targets(base))
    folder = build_adapter(bases[base], tmp_path / "input", config, seed, layout)
    report = export(folder, tmp_path / "out", merge=True, probe_file=_probe_file(tmp_path))

    # MiniLM reads 256 tokens at most (its own max_seq_length); the replica 256 / 1024 (the model card)
    lengths = {"query": 256, "passage": 256} if base == "minilm" else {"query": 256, "passage": 1024}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bases[base])
    texts = texts_of(tokenizer, [8, 300] if base == "minilm" else [8, 280, 1100], seed)
    want = peft_reference(bases[base], folder, texts, lengths)
    adapter = peft_reference(bases[base], tmp_path / "out" / "adapter", texts, lengths)
    merged = plain_st(tmp_path / "out" / "merged", texts)
    for name, got in (("adapter", adapter), ("merged", merged)):
        for kind, cosines in _cosines(got, want).items():
            assert min(cosines) >= EXACT, (name, kind, cosines, config)
    written = LoraConfig.from_pretrained(str(tmp_path / "out" / "adapter")).to_dict()
    given = LoraConfig.from_pretrained(str(folder)).to_dict()
    for key in CARRIED:
        want, got = given[key], written[key]
        if isinstance(want, set | list):
            want, got = sorted(want), sorted(got)
        assert got == want, (key, got, want)
    assert report["probe_min_cosine"] >= EXACT and report["adapter_probe_min_cosine"] >= EXACT


def test_c68_a_merged_folder_read_by_plain_sentence_transformers_cuts_where_obliq_does(tmp_path, tiny_llama_dir):
    """C68: a random Llama made bidirectional by obliq with a plain peft LoRA (r 8 on q/v, seed 0); the merged
    folder loaded as published gives, with encode_query / encode_document, the vectors of peft's PeftModel read
    at 256 / 1024 tokens (cosine >= 0.99999) for queries of 280, 394, 8 tokens and passages of 994, 1374, 8
    (before: saved at the backbone's 2,048 tokens; queries 0.9945, 0.9215; passages 0.9586)."""
    from transformers import AutoTokenizer

    from obliq.commands.export import export

    config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    folder = build_adapter(tiny_llama_dir, tmp_path / "input", config, 0, "peft")
    export(folder, tmp_path / "out", merge=True, probe_file=_probe_file(tmp_path))
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    queries = texts_of(tokenizer, [280, 394, 8], 1)
    passages = texts_of(tokenizer, [994, 1374, 8], 2)
    lengths = {"query": 256, "passage": 1024}
    want_q = peft_reference(tiny_llama_dir, folder, queries, lengths, bidirectional=True)["query"]
    want_p = peft_reference(tiny_llama_dir, folder, passages, lengths, bidirectional=True)["passage"]
    got_q = plain_st(tmp_path / "out" / "merged", queries)["query"]
    got_p = plain_st(tmp_path / "out" / "merged", passages)["passage"]
    assert min((got_q * want_q).sum(-1).tolist()) >= EXACT, (got_q * want_q).sum(-1)
    assert min((got_p * want_p).sum(-1).tolist()) >= EXACT, (got_p * want_p).sum(-1)


def test_c68_a_checkpoints_own_lengths_travel_with_its_merged_folder(tmp_path, minilm_path):
    """A MiniLM training checkpoint read at queries of 24 and passages of 40 tokens: plain sentence-transformers
    on the merged folder gives what peft gives on the exported adapter read at those lengths, for texts longer
    than both (before: the folder read 256 tokens of every text)."""
    from transformers import AutoTokenizer

    from obliq.commands.export import export
    from obliq.model.checkpoint import read_checkpoint

    ckpt_path = make_checkpoint(tmp_path / "m.ckpt", "minilm", length=24)
    ckpt = read_checkpoint(ckpt_path)
    ckpt["obliq"]["encoder"]["passage_max_length"] = 40
    torch.save(ckpt, ckpt_path)
    export(ckpt_path, tmp_path / "out", merge=True, probe_file=_probe_file(tmp_path))
    texts = texts_of(AutoTokenizer.from_pretrained(minilm_path), [10, 30, 60, 120], 3)
    want = peft_reference(minilm_path, tmp_path / "out" / "adapter", texts, {"query": 24, "passage": 40})
    for kind, cosines in _cosines(plain_st(tmp_path / "out" / "merged", texts), want).items():
        assert min(cosines) >= EXACT, (kind, cosines)

    # obliq evaluate reads the folder at its lengths, or at the evaluation's when shorter, and reports what it read
    from obliq.search.encoders import SentenceTransformerEncoder

    encoder = SentenceTransformerEncoder(str(tmp_path / "out" / "merged"), device="cpu")
    policy = encoder.text_policy(512, 512)
    assert (policy["query_max_length"], policy["passage_max_length"]) == (24, 40)
    assert encoder.text_policy(12, 30)["query_max_length"] == 12
    shorter = peft_reference(minilm_path, tmp_path / "out" / "adapter", texts, {"query": 12, "passage": 30})
    for kind, length in (("query", 12), ("passage", 30)):
        for asked, reference in ((None, want), (length, shorter)):
            got = encoder.encode(texts, kind, max_length=asked)
            assert min((got * reference[kind]).sum(-1).tolist()) >= EXACT, (kind, asked)


@pytest.fixture(scope="module")
def small_adapter(tmp_path_factory, minilm_path) -> Path:
    """A plain peft LoRA on MiniLM (r 2 on query/value, seed 0): the folder the refusal tests edit copies of."""
    config = {"r": 2, "lora_alpha": 4, "target_modules": ["query", "value"]}
    return build_adapter(minilm_path, tmp_path_factory.mktemp("small") / "adapter", config, 0, "peft")


UNCARRIED = [
    ("layers_to_transform", [0]),
    ("bias", "all"),
    ("modules_to_save", ["pooler"]),
    ("lora_bias", True),
    ("init_lora_weights", "pissa"),
    ("layer_replication", [[0, 2]]),
    ("alora_invocation_tokens", [101, 102]),
    ("trainable_token_indices", [5, 6]),
    ("fan_in_fan_out", True),
    ("a_setting_of_a_later_peft", 0.5),
]


@pytest.mark.parametrize(("field", "value"), UNCARRIED, ids=[f for f, _ in UNCARRIED])
def test_a_lora_setting_obliq_does_not_carry_is_refused_by_name(tmp_path, small_adapter, field, value):
    """An adapter whose LoraConfig has a setting obliq's encoder does not carry (a variant, a base-changing
    initialisation, a setting this peft does not know) is refused naming the field, before anything is written
    (before: exported as another model, or failing elsewhere)."""
    from obliq.commands.export import export

    folder = tmp_path / "adapter"
    shutil.copytree(small_adapter, folder)
    file = folder / "adapter_config.json"
    file.write_text(json.dumps(dict(json.loads(file.read_text()), **{field: value})))
    with pytest.raises(ValueError) as err:
        export(folder, tmp_path / "out", merge=True)
    message = str(err.value)
    assert str(file) in message and f"field {field}" in message and "\n" not in message, message
    assert not (tmp_path / "out").exists()


def _edit_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **fields}))


def _add_dense(folder: Path) -> None:
    """A Dense projection after pooling (384 → 128 in the reviewer's folder): plain sentence-transformers applies
    it, obliq's adapter encoder does not, so the folder is refused, not read without it."""
    kinds = ("Transformer", "Pooling", "Dense", "Normalize")
    modules = [
        {"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{k}", "type": f"sentence_transformers.models.{k}"}
        for i, k in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))


def test_malformed_adapter_files_are_refused_in_one_line_naming_the_file(tmp_path, small_adapter):
    """Issue 53 §3: adapter_config.json not JSON or a list, modules.json a dict or naming a module obliq does not
    compute (a Dense projection), and an adapter without its
    weights file are refused in one line naming the file (before: a JSON or attribute traceback, and "trained on
    another model" for the missing weights), by export and by evaluate's loader."""
    from obliq.commands.export import export
    from obliq.search.encoders import load_encoder

    def variant(name: str, edit) -> Path:
        folder = tmp_path / name
        shutil.copytree(small_adapter, folder)
        edit(folder)
        return folder

    cases = {
        "not-json": (lambda f: (f / "adapter_config.json").write_text("{'r': 2"), "adapter_config.json", "JSON"),
        "a-list": (lambda f: (f / "adapter_config.json").write_text("[]"), "adapter_config.json", "not list"),
        "modules-dict": (lambda f: (f / "modules.json").write_text('{"0": {"path": ""}}'), "modules.json", "list"),
        "no-weights": (lambda f: (f / "adapter_model.safetensors").unlink(), "", "no adapter weights"),
        "a-dense-module": (_add_dense, "modules.json", "module sentence_transformers.models.Dense"),
        "targets-null": (lambda f: _edit_config(f, target_modules=None), "adapter_config.json", "target_modules"),
        "targets-empty": (lambda f: _edit_config(f, target_modules=[]), "adapter_config.json", "target_modules"),
    }
    for name, (edit, file, needle) in cases.items():
        folder = variant(name, edit)
        loaders = [lambda: export(folder, tmp_path / f"out-{name}"), lambda: load_encoder(str(folder))]
        # null or no targets: peft's loader (evaluate's) fills in its own per-model defaults; export names them
        for load in loaders[:1] if name.startswith("targets-") else loaders:
            with pytest.raises((ValueError, FileNotFoundError)) as err:
                load()
            message = str(err.value)
            assert str(folder / file).rstrip("/") in message and needle in message, (name, message)
            assert "\n" not in message and "another model" not in message, (name, message)


def test_a_written_adapter_lists_its_targets_sorted(tmp_path, tiny_llama_dir):
    """Issue 53 §3: peft writes target_modules from a set, in an order that changes with the hash seed, so each
    re-export of one checkpoint wrote another adapter_config.json; the export writes them sorted."""
    from obliq.commands.export import export

    ckpt = make_checkpoint(tmp_path / "t.ckpt", tiny_llama_dir, length=16)  # all seven decoder projections
    export(ckpt, tmp_path / "out", probe_file=_probe_file(tmp_path))
    targets = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert targets == sorted(DECODER)


def test_an_adapter_on_another_base_of_its_shape_is_refused(tmp_path, smollm2_path):
    """Issue 53 §3: an adapter whose base folder now holds another model of the same shape (the replica drawn
    with another seed) was evaluated without a word. The adapter records its base's weights digest; loading it
    on other weights is refused in one line naming the field; on its own base (or a copy of it) it loads."""
    from obliq.model import BiEncoder, LoraSettings
    from obliq.search.encoders import load_encoder

    name = "nvidia/llama-3.2-nv-embedqa-1b-v2"
    base = save_published_replica(tmp_path / "base", name, smollm2_path, seed=0)
    BiEncoder(base, lora=LoraSettings(r=2, alpha=4, dropout=0.0)).save_pretrained(tmp_path / "adapter")
    load_encoder(str(tmp_path / "adapter"))
    shutil.copytree(base, tmp_path / "copy")
    shutil.rmtree(base)
    save_published_replica(tmp_path / "base", name, smollm2_path, seed=1)
    with pytest.raises(ValueError, match="field backbone_sha256: the adapter was trained on a base with other") as err:
        load_encoder(str(tmp_path / "adapter"))
    assert "\n" not in str(err.value) and str(tmp_path / "adapter" / "obliq_encoder.json") in str(err.value)
    shutil.rmtree(base)
    shutil.copytree(tmp_path / "copy", base)  # a copy of the base it was trained on: the same model
    load_encoder(str(tmp_path / "adapter"))


@pytest.mark.slow
def test_a_reexport_in_another_process_finds_the_same_store(tmp_path, minilm_path):
    """Issue 53 §3: every re-export added a cache store, because the adapter's target_modules were written in the
    order of a set, which Python's string hashing changes from process to process (PYTHONHASHSEED). Two exports
    of one checkpoint in two processes with other hash seeds write the same adapter_config.json and find one store."""
    import os
    import subprocess
    import sys

    from support import make_checkpoint, make_task

    from obliq.search.settings import RetrievalSettings
    from obliq.search.store import Store
    from obliq.tasks import load_task

    checkpoint = make_checkpoint(tmp_path / "a.ckpt", minilm_path, length=32)
    docs = [{"_id": f"d{i}", "text": f"document {i}"} for i in range(3)]
    task_dir = make_task(tmp_path / "t", docs, [{"_id": "q", "text": "document"}], [("q", "d0", 1)])
    settings, task = RetrievalSettings(cache_dir=tmp_path / "stores"), load_task(task_dir)
    found, configs = set(), set()
    for seed in ("1", "2", "3"):
        argv = [
            sys.executable,
            "-m",
            "obliq.cli",
            "export",
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(tmp_path / "x"),
        ]
        env = dict(os.environ, PYTHONHASHSEED=seed, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        done = subprocess.run([*argv, "--overwrite", "true"], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        configs.add((tmp_path / "x" / "adapter" / "adapter_config.json").read_text())
        found.add(str(Store.of(str(tmp_path / "x" / "adapter"), settings, task).folder))
    assert len(configs) == 1 and len(found) == 1, (configs, found)
