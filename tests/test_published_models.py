"""The models the recipe names, as they are published (issue 46 §1-§2), on replicas built here: NV-Embed's
``llama_bidirec`` checkpoints (the 3B reasoning model and its 1B sibling) and the paper's two layouts
(a sentence-transformers + peft adapter, OBLIQ-IR-3B-LoRA; the same merged, OBLIQ-IR-3B) load without
remote code and give what NeMo Automodel's own class gives (tests/nemo_reference.py, its own process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support import nemo_reference, save_published_replica

NAMES = ["nvidia/llama-nv-embed-reasoning-3b", "nvidia/llama-3.2-nv-embedqa-1b-v2"]
TEXTS = [
    "The witness declined to answer and turned the question back on the committee.",
    "Short.",
    "Find problems solved by the pigeonhole principle, where counting forces two items into one box.",
]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, smollm2_path) -> dict[str, str]:
    root = tmp_path_factory.mktemp("published")
    return {name: save_published_replica(root / name.split("/")[1], name, smollm2_path) for name in NAMES}


def _hidden_states(encoder, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's last hidden states inside ``encoder.forward`` (a hook) and the pooled vectors."""
    seen = {}
    hook = encoder.model.register_forward_hook(lambda m, args, out: seen.update(h=out.last_hidden_state))
    try:
        pooled = encoder(batch)
    finally:
        hook.remove()
    return seen["h"], pooled


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_published_llama_bidirec_checkpoint_loads_as_data_and_equals_nemo(name, replicas, tmp_path, caplog):
    """The published config.json (``auto_map`` to NVIDIA's file, ``pooling: avg``, llama3 rope scaling, tied
    embeddings) loads with trust_remote_code off, every weight read, the rope scaling kept; its hidden states
    and pooled vectors, batched with left or with right padding, equal NeMo's ``LlamaBidirectionalModel`` and
    plain ``LlamaModel`` under a full mask on each text alone, in fp32, to 1e-5."""
    from obliq.model import BiEncoder

    folder = replicas[name]
    encoder = BiEncoder(folder, dtype="float32").eval()
    assert type(encoder.model).__name__ == "LlamaBidirectionalModel" and encoder.bidirectional
    assert encoder.model.config.rope_parameters["rope_type"] == "llama3"
    assert encoder.model.config.rope_parameters["factor"] == 32.0
    assert encoder.model.config.tie_word_embeddings is True
    ids = [encoder.tokenize([t], "passage")["input_ids"][0].tolist() for t in TEXTS]
    reference = nemo_reference({"do": "hidden", "folder": folder, "ids": ids}, tmp_path)
    for side in ("left", "right"):
        encoder.tokenizer.padding_side = side
        batch = encoder.tokenize(TEXTS, "passage")
        assert [row.sum().item() for row in batch["attention_mask"]] == [len(r) for r in ids]
        with torch.no_grad():
            hidden, pooled = _hidden_states(encoder, batch)
        for i in range(len(ids)):
            real = batch["attention_mask"][i].bool()
            for ref in ("nemo", "llama"):
                assert (hidden[i][real] - reference[f"{ref}_hidden"][i]).abs().max() <= 1e-5, (side, ref, i)
                assert (pooled[i] - reference[f"{ref}_pooled"][i]).abs().max() <= 1e-5, (side, ref, i)
    # the second reference is bidirectional by construction (every token sees every token), so the equality
    # above is one with a bidirectional model, not with a causal one that both would share


def _edit_config(src: str, dst, **changes) -> str:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return str(dst)


def test_unknown_remote_code_and_an_unimplemented_pooling_are_refused_in_one_line(replicas, tmp_path):
    """An ``auto_map`` to a class obliq does not implement is refused before anything loads — even when its
    ``model_type`` is one transformers knows (it would load it as that other class) — naming the class and the
    opt-in; the opt-in passes the check. A ``pooling`` other than ``avg`` is refused, never replaced."""
    from obliq.model import BiEncoder
    from obliq.model.bidirectional import check_model_code
    from obliq.search.encoders import load_encoder

    base = replicas[NAMES[1]]
    other = {"AutoConfig": "modeling_x.XConfig", "AutoModel": "modeling_x.XBidirectionalModel"}
    for i, changes in enumerate([{"auto_map": other}, {"auto_map": other, "model_type": "llama"}]):
        folder = _edit_config(base, tmp_path / f"remote{i}", **changes)
        for load in (lambda: BiEncoder(folder), lambda: load_encoder(folder, "sentence-transformers")):
            with pytest.raises(ValueError, match="modeling_x.XBidirectionalModel") as err:
                load()
            assert "trust_remote_code: true" in str(err.value) and "\n" not in str(err.value)
        assert check_model_code(folder, trust_remote_code=True) is None  # the opt-in: its own code loads
    folder = _edit_config(base, tmp_path / "cls", pooling="cls")
    with pytest.raises(ValueError, match="pooling 'cls' is not implemented"):
        BiEncoder(folder)


def test_a_backbone_missing_weights_is_refused_not_filled_at_random(replicas, tmp_path):
    """transformers fills a weight missing from the file with random values and only warns: refused."""
    from safetensors.torch import load_file, save_file

    from obliq.model import BiEncoder

    folder = tmp_path / "missing"
    shutil.copytree(replicas[NAMES[1]], folder)
    weights = load_file(folder / "model.safetensors")
    del weights["layers.1.mlp.down_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing keys .*layers.1.mlp.down_proj.weight"):
        BiEncoder(str(folder))


@pytest.fixture(scope="module")
def paper_layouts(replicas, tmp_path_factory) -> dict[str, str]:
    """The paper's two layouts on the 3B replica, built by sentence-transformers + peft over NeMo's class."""
    root = tmp_path_factory.mktemp("layouts")
    out = {"base": replicas[NAMES[0]], "adapter": str(root / "OBLIQ-IR-3B-LoRA"), "merged": str(root / "OBLIQ-IR-3B")}
    request = {
        "do": "build",
        "base": out["base"],
        "adapter_out": out["adapter"],
        "merged_out": out["merged"],
        "seed": 1,
    }
    nemo_reference(request, root / "build")
    return out


@pytest.mark.slow
def test_the_papers_adapter_and_merged_layouts_evaluate_as_sentence_transformers_and_peft_rank(
    paper_layouts, tasks_dir, tmp_path
):
    """``obliq evaluate --model <folder>`` on both layouts: every score of its run (a cosine) equals plain
    sentence-transformers + peft over NeMo's class (the card's prefixes, queries at 256 tokens, passages at
    1024) to 1e-5, so the rankings are the same; the adapter and the merged folder agree with each other."""
    from support import small_real_task

    from obliq.cli import main
    from obliq.tasks import load_task

    task_dir = small_real_task(tasks_dir, tmp_path / "task", n_queries=6, n_distractors=14)
    task = load_task(task_dir)
    queries, doc_ids, passages = task.query_texts, task.doc_ids, task.doc_texts
    runs = {}
    for layout in ("adapter", "merged"):
        folder = paper_layouts[layout]
        request = {"do": "encode", "folder": folder, "queries": queries, "passages": passages}
        if layout == "adapter":
            request["base"] = paper_layouts["base"]
        ref = nemo_reference(request, tmp_path / f"ref-{layout}")
        assert ref["prompts"]["query"] == "query: " and ref["prompts"]["document"] == "passage: "
        cosines = ref["queries"] @ ref["passages"].T
        main(["evaluate", "--model", folder, "--tasks", str(task_dir), "--output", str(tmp_path / layout)])
        run = tmp_path / layout / "math-slice" / "run.trec"
        qids = task.query_ids
        scored = {}
        for line in run.read_text().splitlines():
            qid, _, did, rank, score, _ = line.split()
            scored[(qid, did)] = float(score)
        assert len(scored) == len(qids) * len(doc_ids)
        for (qid, did), score in scored.items():
            assert abs(score - cosines[qids.index(qid), doc_ids.index(did)].item()) <= 1e-5, (layout, qid, did)
        runs[layout] = scored
    assert runs["adapter"].keys() == runs["merged"].keys()
    assert max(abs(runs["adapter"][k] - runs["merged"][k]) for k in runs["adapter"]) <= 1e-4
    # obliq export merges the adapter layout (checked by its probe against the adapter) into a folder that
    # evaluates as the adapter does
    main(["export", "--checkpoint", paper_layouts["adapter"], "--out", str(tmp_path / "export"), "--merge", "true"])
    assert json.loads((tmp_path / "export" / "export.json").read_text())["probe_min_cosine"] >= 0.999
    main(["evaluate", "--model", str(tmp_path / "export" / "merged"), "--tasks", str(task_dir)]
         + ["--output", str(tmp_path / "exported")])  # fmt: skip
    for line in (tmp_path / "exported" / "math-slice" / "run.trec").read_text().splitlines():
        qid, _, did, _, score, _ = line.split()
        assert abs(float(score) - runs["adapter"][(qid, did)]) <= 1e-5, (qid, did)
    with pytest.raises(SystemExit):  # a merged folder holds no adapter: nothing to export
        main(["export", "--checkpoint", paper_layouts["merged"], "--out", str(tmp_path / "nothing")])


def test_an_adapter_whose_base_is_missing_or_differs_is_refused_before_encoding(paper_layouts, replicas, tmp_path):
    """The adapter's base folder gone: refused naming the adapter's file; a base of another shape (the 1B
    replica): refused by the load, before a corpus is encoded."""
    from obliq.search.encoders import load_encoder

    for name, base in (("gone", str(tmp_path / "nowhere")), ("other", replicas[NAMES[1]])):
        folder = tmp_path / name
        shutil.copytree(paper_layouts["adapter"], folder)
        config = json.loads((folder / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = base
        (folder / "adapter_config.json").write_text(json.dumps(config))
        with pytest.raises((FileNotFoundError, ValueError)) as err:
            load_encoder(str(folder))
        if name == "gone":
            assert str(folder / "adapter_config.json") in str(err.value) and "nowhere" in str(err.value)
        else:
            assert "does not fit the base model" in str(err.value) and "size mismatch" in str(err.value)


def test_the_next_bidirectional_family_is_one_table_entry(monkeypatch, smollm2_path, tmp_path):
    """A Mistral checkpoint published the NV-Embed way (``mistral_bidirec``, an ``auto_map`` to its own file) is
    read with one :class:`Family` entry added and nothing else: bidirectional, every weight read, equal to
    transformers' plain ``MistralModel`` under a full mask."""
    from transformers import AutoTokenizer, MistralConfig, MistralModel

    from obliq.model import BiEncoder
    from obliq.model import bidirectional as bd

    entry = bd.Family("mistral_bidirec", "MistralConfig", "MistralModel", ("modeling.MistralBidirectionalModel",))
    monkeypatch.setattr(bd, "FAMILIES", (*bd.FAMILIES, entry))
    sizes = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    torch.manual_seed(0)
    plain = MistralModel(MistralConfig(vocab_size=49152, **sizes)).eval()
    plain.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(smollm2_path).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(model_type="mistral_bidirec", auto_map={"AutoModel": entry.remote_classes[0]}, pooling="avg")
    (tmp_path / "config.json").write_text(json.dumps(config))
    encoder = BiEncoder(str(tmp_path)).eval()
    assert type(encoder.model).__name__ == "MistralBidirectionalModel" and encoder.bidirectional
    batch = encoder.tokenize(TEXTS[:1], "passage")
    with torch.no_grad():
        hidden, _ = _hidden_states(encoder, batch)
        n = batch["input_ids"].shape[1]
        want = plain(input_ids=batch["input_ids"], attention_mask=torch.zeros(1, 1, n, n)).last_hidden_state
    assert (hidden - want).abs().max() <= 1e-5


def test_a_llama_bidirec_config_over_other_weights_is_refused_on_every_loading_path(minilm_path, tmp_path):
    """MiniLM's BERT weights under a ``llama_bidirec`` config.json: transformers (and sentence-transformers) would
    build the Llama at random and only warn; both obliq loaders refuse it, naming the folder."""
    from obliq.model import BiEncoder
    from obliq.search.encoders import load_encoder

    folder = tmp_path / "wrong-weights"
    shutil.copytree(minilm_path, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="llama_bidirec", num_key_value_heads=config["num_attention_heads"], pooling="avg")
    (folder / "config.json").write_text(json.dumps(config))
    for load in (lambda: BiEncoder(str(folder)), lambda: load_encoder(str(folder), "sentence-transformers")):
        with pytest.raises(ValueError, match="missing keys .*refusing to encode with random weights"):
            load()


@pytest.mark.slow
def test_weights_of_more_layers_than_the_config_are_refused_on_every_loading_path(replicas, tmp_path):
    """Issue 53 §3: a ``llama_bidirec`` folder whose file holds a layer its configuration does not have would be
    evaluated on the configuration's layers only; both obliq loaders refuse it, naming the weights not read."""
    from safetensors.torch import load_file, save_file

    from obliq.model import BiEncoder
    from obliq.search.encoders import load_encoder

    folder = tmp_path / "more-layers"
    shutil.copytree(replicas[NAMES[1]], folder)
    weights = load_file(folder / "model.safetensors")
    layers = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("layers."))
    extra = {
        k.replace("layers.0.", f"layers.{layers}.", 1): v.clone()
        for k, v in weights.items()
        if k.startswith("layers.0.")
    }
    save_file({**weights, **extra}, folder / "model.safetensors", metadata={"format": "pt"})
    for load in (lambda: BiEncoder(str(folder)), lambda: load_encoder(str(folder), "sentence-transformers")):
        with pytest.raises(ValueError, match=rf"unexpected keys .*layers\.{layers}\."):
            load()


def _transformers_builds(config: dict, rope_type: str) -> str:
    """What plain transformers makes of a configuration (the ``LlamaModel`` its ``llama_bidirec`` family is):
    ``ok``, ``unknown`` (a ``KeyError`` of ``rope_type`` itself, what ``obliq evaluate`` printed as
    ``error: <type>``) or ``other`` (another refusal, e.g. a missing rope parameter)."""
    from transformers import LlamaConfig, LlamaModel

    keep = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type", "pooling")}
    try:
        LlamaModel(LlamaConfig(**keep))
    except KeyError as err:
        return "unknown" if err.args == (rope_type,) else "other"
    except Exception:
        return "other"
    return "ok"


def test_an_auto_map_that_is_no_object_and_an_unknown_rope_type_are_refused_in_one_line(replicas, tmp_path, capsys):
    """Issue 53 §3: ``"auto_map": null`` stopped transformers with a ``TypeError`` traceback, and an unknown
    ``rope_scaling`` type with ``error: nonexistent``. Generated configurations (seeded): an ``auto_map`` of
    every other JSON type is refused naming the file and the field; each rope type — transformers' own, near
    misses and random names, under ``rope_type`` or the older ``type`` — is refused naming the file and the
    type exactly when plain transformers cannot build the model for it (``KeyError``), and passes otherwise."""
    import random

    from support import cli_fails
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from obliq.model.bidirectional import check_model_code

    base = replicas[NAMES[1]]
    published = json.loads((Path(base) / "config.json").read_text())
    for i, value in enumerate([None, [], ["modeling_x.X"], "modeling_x.X", 3, True]):
        folder = _edit_config(base, tmp_path / f"map{i}", auto_map=value)
        with pytest.raises(ValueError) as err:
            check_model_code(folder)
        assert str(Path(folder) / "config.json") in str(err.value) and "auto_map" in str(err.value), value
    rng = random.Random(53)
    names = ["default", *ROPE_INIT_FUNCTIONS, "nonexistent", "Llama3", "llama-3", "yarn ", "", "mrope", "ntk"]
    names += ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz3_") for _ in range(rng.randrange(2, 9))) for _ in range(4)]
    full = {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    seen = set()
    for i, name in enumerate(names):
        rope = {rng.choice(["rope_type", "type"]): name, **full}
        reference = _transformers_builds({**published, "rope_scaling": rope}, name)
        folder = _edit_config(base, tmp_path / f"rope{i}", rope_scaling=rope)
        try:
            check_model_code(folder)
            refused = None
        except ValueError as err:
            refused = str(err)
        seen.add(reference)
        if reference == "unknown":
            assert refused and str(Path(folder) / "config.json") in refused and repr(name) in refused, (name, refused)
            assert "\n" not in refused
        else:
            assert refused is None, (name, reference, refused)
    assert {"ok", "unknown"} <= seen
    null = _edit_config(base, tmp_path / "cli-null", auto_map=None)
    bad = _edit_config(base, tmp_path / "cli-rope", rope_scaling={"rope_type": "nonexistent", "factor": 2.0})
    task = tmp_path / "t"
    (task / "qrels").mkdir(parents=True)
    (task / "corpus.jsonl").write_text('{"_id": "d1", "text": "a text"}\n')
    (task / "queries.jsonl").write_text('{"_id": "q1", "text": "a query"}\n')
    (task / "qrels" / "test.tsv").write_text("q1\td1\t1\n")
    for folder, needle in ((null, "auto_map"), (bad, "'nonexistent'")):
        argv = [
            "evaluate",
            "--model",
            folder,
            "--tasks",
            str(task),
            "--output",
            str(tmp_path / "out"),
            "--latency_queries",
            "0",
        ]
        cli_fails(argv, capsys, str(Path(folder) / "config.json"), needle)
