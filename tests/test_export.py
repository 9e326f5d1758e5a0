"""Exports a user can publish (issue 24): an instruct decoder's merged folder reads plain text as the
adapter does (C33), a card without a machine path whose base model is a Hub id or absent (C35), an
evaluation table only from this checkpoint's own evaluation, and probe settings that can check."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from support import make_checkpoint

from obliq.model.checkpoint import read_checkpoint


def _python_blocks(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, flags=re.S)


@pytest.fixture(scope="module")
def minilm_ckpt(tmp_path_factory, minilm_path) -> Path:
    """A MiniLM LoRA checkpoint (seed 0, lengths 32), built once: the tests read it; one that changes it writes
    the changed copy to a file of its own."""
    return make_checkpoint(tmp_path_factory.mktemp("minilm") / "m.ckpt", "minilm", length=32)


@pytest.mark.slow
def test_c33_an_exported_instruct_decoder_reads_plain_text_as_the_adapter(tmp_path, smollm2_path):
    """C33: SmolLM2-135M-Instruct LoRA (r 4, alpha 8, lora_B ~ N(0, 0.02), seed 0, prefixes "query: " /
    "passage: ", lengths 64). In plain sentence-transformers the merged folder gives cosine >= 0.999 with
    the adapter for every probe text, batched and one at a time (before: 0.74, every input wrapped in
    SmolLM2's chat template); so does the adapter card's transformers + peft snippet."""
    from sentence_transformers import SentenceTransformer

    from obliq.commands.export import PROBE, export
    from obliq.model.checkpoint import load_checkpoint

    ckpt = make_checkpoint(tmp_path / "smol.ckpt", "smollm2")
    report = export(ckpt, tmp_path / "out", merge=True)
    assert report["probe_min_cosine"] >= 0.999
    merged = tmp_path / "out" / "merged"
    config = json.loads((merged / "sentence_bert_config.json").read_text())
    assert "message" not in config.get("modality_config", {})
    assert (merged / "chat_template.jinja").is_file() or "chat_template" in (
        merged / "tokenizer_config.json"
    ).read_text()

    adapter = load_checkpoint(ckpt, dtype="float32")
    model = SentenceTransformer(str(merged), device="cpu")  # plain sentence-transformers, no obliq
    for kind, fn in (("query", model.encode_query), ("passage", model.encode_document)):
        want = adapter.encode(PROBE, kind)
        batched = fn(PROBE, convert_to_tensor=True).float()
        single = torch.stack([fn([t], convert_to_tensor=True)[0].float() for t in PROBE])
        assert (batched * want).sum(-1).min() >= 0.999, kind
        assert (single * want).sum(-1).min() >= 0.999, kind

    # the adapter card's transformers + peft snippet, run as a user would (the Hub id is the local copy here)
    card = (tmp_path / "out" / "adapter" / "README.md").read_text()
    [snippet] = [b for b in _python_blocks(card) if "PeftModel" in b]
    code = snippet.replace("HuggingFaceTB/SmolLM2-135M-Instruct", smollm2_path)
    code = code.replace("path/to/this/folder", str(tmp_path / "out" / "adapter"))
    scope: dict = {}
    exec(compile(code, "card-snippet", "exec"), scope)
    want = adapter.encode(["your query"], "query")
    assert float((scope["embedding"].float() * want).sum()) >= 0.999


@pytest.mark.slow
def test_c33_a_failed_verification_names_the_chat_template(tmp_path, monkeypatch, tiny_llama_dir):
    """Without the text-only modality the check fails and says why; the export is one transaction (issue 30
    §2), so neither the merged folder nor the adapter written before the check is left. The decoder is the
    tiny random Llama with SmolLM2-135M-Instruct's tokenizer (its chat template, what sentence-transformers
    wraps texts in): the merge, the check and the clean-up are SmolLM2's, at a fraction of the cost."""
    import obliq.commands.export

    ckpt = make_checkpoint(tmp_path / "tiny.ckpt", tiny_llama_dir)
    monkeypatch.setattr(obliq.commands.export, "TEXT_ONLY", None)  # what sentence-transformers infers by itself
    with pytest.raises(ValueError, match="'message' modality: sentence-transformers wraps every text in the") as err:
        obliq.commands.export.export(ckpt, tmp_path / "out", merge=True)
    assert "chat template" in str(err.value) and "float32" not in str(err.value).split("chat template")[0][-40:]
    assert not (tmp_path / "out" / "merged").exists() and not (tmp_path / "out" / "adapter").exists()


@pytest.mark.slow
def test_c35_a_local_copy_of_minilm_as_backbone_gives_a_card_without_a_machine_path(tmp_path, minilm_path, minilm_ckpt):
    """C35: with a local folder as backbone the card has no base_model line (given one, it is that Hub id)
    and no path of this machine anywhere; the usage code names a placeholder."""
    from huggingface_hub import ModelCard
    from huggingface_hub.utils import validate_repo_id

    from obliq.commands.export import export

    local = tmp_path / "models" / "my-minilm"
    shutil.copytree(minilm_path, local)
    ckpt = make_checkpoint(tmp_path / "m.ckpt", str(local), length=32)
    export(ckpt, tmp_path / "out", merge=True)
    machine = [str(tmp_path), str(local), str(Path.home()), minilm_path]
    for kind in ("adapter", "merged"):
        card = (tmp_path / "out" / kind / "README.md").read_text()
        assert not any(m in card for m in machine), kind
        assert "base_model" not in ModelCard(card).data.to_dict()
        assert "/tmp" not in card and "/work" not in card and "site-packages" not in card
    export(ckpt, tmp_path / "named", base_model="sentence-transformers/all-MiniLM-L6-v2")
    card = (tmp_path / "named" / "adapter" / "README.md").read_text()
    base = ModelCard(card).data.to_dict()["base_model"]
    validate_repo_id(base)
    assert base == "sentence-transformers/all-MiniLM-L6-v2" and str(local) not in card
    with pytest.raises(ValueError, match="not a Hub model id"):
        export(ckpt, tmp_path / "bad", base_model=str(local))
    # the packaged model (an alias): its Hub id, recorded by obliq's alias table
    export(minilm_ckpt, tmp_path / "alias")
    card = (tmp_path / "alias" / "adapter" / "README.md").read_text()
    assert ModelCard(card).data.to_dict()["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert minilm_path not in card


@pytest.mark.slow
def test_the_card_takes_only_this_checkpoints_evaluation_and_probes_must_check(tmp_path, tasks_dir, minilm_ckpt):
    from obliq.commands.evaluate import evaluate
    from obliq.commands.export import export

    ckpt = minilm_ckpt
    other = make_checkpoint(tmp_path / "o.ckpt", "minilm", length=32, seed=1)
    export(ckpt, tmp_path / "mine")
    export(other, tmp_path / "theirs")
    from support import task_slice

    # a small slice of the task (its name kept): what is checked is whose evaluation the card takes
    task = str(task_slice(tasks_dir, "math-theoremqa", tmp_path / "tasks" / "math-theoremqa", 3, 10))
    settings = dict(retrieval={"top_k": 100, "batch_size": 64, "cache": False}, latency_queries=0)
    from obliq.search.settings import RetrievalSettings

    settings["retrieval"] = RetrievalSettings(**settings["retrieval"])
    measures = ["NDCG@10", "Recall@100"]
    evaluate(str(tmp_path / "theirs" / "adapter"), [task], tmp_path / "eval-theirs", measures=measures, **settings)
    with pytest.raises(ValueError, match="not an export of this checkpoint"):
        export(ckpt, tmp_path / "card", results=tmp_path / "eval-theirs")
    evaluate(str(tmp_path / "mine" / "adapter"), [task], tmp_path / "eval-mine", measures=measures, **settings)
    export(ckpt, tmp_path / "card", results=tmp_path / "eval-mine")
    assert "| math-theoremqa |" in (tmp_path / "card" / "adapter" / "README.md").read_text()

    empty = tmp_path / "probe.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match="no probe text"):
        export(ckpt, tmp_path / "p", merge=True, probe_file=empty)
    with pytest.raises(ValueError, match="min_cosine"):
        export(ckpt, tmp_path / "p", merge=True, min_cosine=1.5)
    assert not (tmp_path / "p").exists()  # refused before anything is written


def test_nan_weights_are_refused_before_anything_is_written(tmp_path, minilm_ckpt):
    """Issue 32 §3: a diverged run's NaN weights were exported (and a merge passed its probe check, since
    NaN < 0.999 is false). The export refuses in one line naming the weight, and writes nothing."""
    from obliq.commands.export import export

    ckpt_path = tmp_path / "m.ckpt"  # the shared checkpoint with a NaN, as a file of this test
    ckpt = read_checkpoint(minilm_ckpt)
    name = next(n for n in ckpt["state_dict"] if "lora_B" in n)
    ckpt["state_dict"][name][0, 0] = float("nan")
    torch.save(ckpt, ckpt_path)
    with pytest.raises(ValueError, match=rf"weight '{re.escape(name)}' holds NaN"):
        export(ckpt_path, tmp_path / "out", merge=True)
    assert not (tmp_path / "out").exists()


def test_c47_a_roberta_lora_merges_and_its_check_names_no_wrong_cause(tmp_path):
    """C47: a merged export of a LoRA on a RoBERTa-family backbone was refused because "the folder's decoder
    attends causally" (it is no decoder). It now merges, and the merged folder read by plain
    sentence-transformers gives the adapter's embeddings (the export's own probe check, min cosine 0.999)."""
    from test_encoder import _roberta_dir

    from obliq.commands.export import export

    folder, _ = _roberta_dir(tmp_path / "roberta")
    ckpt = make_checkpoint(tmp_path / "r.ckpt", str(folder), length=512)
    report = export(ckpt, tmp_path / "out", merge=True)
    assert report["probe_min_cosine"] >= 0.999 and (tmp_path / "out" / "merged").is_dir()


def test_a_resized_or_foreign_checkpoint_is_refused_in_one_line(tmp_path, minilm_ckpt):
    """Issue 32 §3: a checkpoint with a resized weight gave a traceback, one with a weight the encoder lacks was
    loaded with the weight silently dropped (strict=False). Both are refused, naming the weight; nothing written."""
    from obliq.commands.export import export

    ckpt = read_checkpoint(minilm_ckpt)
    name = next(n for n in ckpt["state_dict"] if "lora_B" in n)
    resized = dict(ckpt, state_dict={**ckpt["state_dict"], name: ckpt["state_dict"][name][:, :2]})
    torch.save(resized, tmp_path / "resized.ckpt")
    with pytest.raises(ValueError, match=rf"weight '{re.escape(name.removeprefix('encoder.'))}' has shape"):
        export(tmp_path / "resized.ckpt", tmp_path / "out")
    foreign = dict(ckpt, state_dict={**ckpt["state_dict"], "encoder.extra.weight": torch.zeros(2)})
    torch.save(foreign, tmp_path / "foreign.ckpt")
    with pytest.raises(KeyError, match="weights the encoder does not have"):
        export(tmp_path / "foreign.ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["loss", "hyper_parameters"])
def test_a_dimension_the_model_was_not_trained_at_is_warned_about(tmp_path, minilm_ckpt, caplog, where):
    """Issue 32 §3: ``--retrieval.dim`` that is not a trained Matryoshka dimension was accepted in silence. The
    export records the checkpoint's matryoshka_dims (the loss's citation, ``ckpt["obliq"]["loss"]``; a checkpoint
    of before obliq.losses: its hyper-parameters); evaluating it at another dimension warns."""
    import logging

    from obliq.commands.export import export
    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings

    ckpt_path = tmp_path / "m.ckpt"  # the shared checkpoint with matryoshka_dims, as a file of this test
    ckpt = read_checkpoint(minilm_ckpt)
    if where == "loss":
        ckpt["obliq"]["loss"]["matryoshka_dims"] = [384, 96]
    else:
        ckpt["hyper_parameters"]["matryoshka_dims"] = [384, 96]
    torch.save(ckpt, ckpt_path)
    export(ckpt_path, tmp_path / "out")
    adapter = str(tmp_path / "out" / "adapter")
    assert json.loads((tmp_path / "out" / "adapter" / "obliq_export.json").read_text())["matryoshka_dims"] == [384, 96]
    with caplog.at_level(logging.WARNING):
        make_retriever(adapter, RetrievalSettings(dim=96, cache=False))
    assert "not a dimension it was trained at" not in caplog.text
    with caplog.at_level(logging.WARNING):
        make_retriever(adapter, RetrievalSettings(dim=64, cache=False))
    assert "retrieval.dim 64 is not a dimension it was trained at (matryoshka_dims: [384, 96])" in caplog.text
