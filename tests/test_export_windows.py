"""Exports of a model that reads long texts in token windows (issue 55 §1, export): both folders record the
windows (``obliq_encoder.json``) and obliq reads either back as the mean of a text's windows (against
``encode_windows`` reduced in float64); the cards say how long documents are encoded and what plain
sentence-transformers does instead, and that statement is true (a text within one window: obliq's vector; a
longer one: another); the cards' obliq snippets give obliq's vectors; a MaxSim export is refused by mteb with the
setting named."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support import make_checkpoint

from obliq.model import BiEncoder
from obliq.model.checkpoint import load_checkpoint
from obliq.windows import Windows

pytestmark = pytest.mark.slow

MEAN = Windows(size=24, stride=12, reduce="mean")
MAXSIM = Windows(size=24, stride=12, reduce="maxsim", queries=True)
SHORT = "The witness declined to answer."
LONG = " ".join(
    [
        "The committee asked about the budget, and the witness talked about the weather instead.",
        "Later the chairman read a poem about pigeons that nobody had asked for.",
        "In the end the markets closed calm and the defendant's lawyers went home early.",
        "A stranger sold umbrellas outside while it did not rain for the whole of the afternoon.",
    ]
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, minilm_path) -> dict[str, Path]:
    """A MiniLM LoRA checkpoint (lengths 32) trained with mean windows of 24 tokens, and one with MaxSim windows
    (queries windowed too), each exported with its merged folder."""
    root = tmp_path_factory.mktemp("export-windows")
    from obliq.commands.export import export

    out = {}
    for name, windows in (("mean", MEAN), ("maxsim", MAXSIM)):
        ckpt = make_checkpoint(root / f"{name}.ckpt", "minilm", length=32, windows=windows)
        export(ckpt, root / name, merge=True)
        out[name], out[f"{name}.ckpt"] = root / name, ckpt
    return out


def _python_blocks(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, flags=re.S)


def _float64_mean(encoder: BiEncoder, texts: list[str]) -> np.ndarray:
    """The reference: every window encoded (``encode_windows``), summed per text and normalised in float64."""
    vectors, owner = encoder.encode_windows(texts, "passage")
    v, owner = vectors.double().numpy(), owner.numpy()
    mean = np.stack([v[owner == i].sum(0) for i in range(len(texts))])
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["adapter", "merged"])
def test_both_folders_record_the_windows_and_read_long_texts_as_their_mean(exported, kind):
    folder = exported["mean"] / kind
    saved = json.loads((folder / "obliq_encoder.json").read_text())
    assert Windows.of(saved["windows"]) == MEAN
    assert saved["is_adapter"] is (kind == "adapter") and saved["dtype"] == "float32"
    encoder = BiEncoder.from_pretrained(folder)
    assert encoder.windows == MEAN
    assert len(encoder.text.windows([LONG], "passage", MEAN)[1]) >= 3  # the long text is several windows
    got = encoder.encode([LONG, SHORT], "passage").double().numpy()
    np.testing.assert_allclose(got, _float64_mean(encoder, [LONG, SHORT]), rtol=0, atol=1e-6)
    trained = load_checkpoint(exported["mean.ckpt"], dtype="float32").encode([LONG, SHORT], "passage")
    assert float((torch.from_numpy(got).float() * trained).sum(-1).min()) >= 0.9999  # the checkpoint's vectors


def test_plain_sentence_transformers_differs_only_past_one_window_as_the_card_says(exported):
    from sentence_transformers import SentenceTransformer

    merged = exported["mean"] / "merged"
    obliq = BiEncoder.from_pretrained(merged).encode([SHORT, LONG], "passage")
    plain = SentenceTransformer(str(merged), device="cpu")  # no obliq, no trust_remote_code
    got = plain.encode_document([SHORT, LONG], convert_to_tensor=True, normalize_embeddings=True).float()
    cosine = (got * obliq).sum(-1)
    assert float(cosine[0]) >= 0.9999 and float(cosine[1]) < 0.99  # one window: the same; several: not
    first = BiEncoder.from_pretrained(merged).encode_windows([LONG], "passage")[0][0]
    assert float(got[1] @ first) >= 0.9999  # what plain sentence-transformers gives: the first window's vector
    # documents cut at one window; a plain encode at the longer query length (obliq reads it as the capacity)
    assert plain[0].document_length == 24 and plain[0].query_length == 32 and plain.max_seq_length == 32
    modules = json.loads((merged / "modules.json").read_text())
    assert all(m["type"].startswith("sentence_transformers.") for m in modules)  # no module asking for code
    for kind in ("adapter", "merged"):
        card = (exported["mean"] / kind / "README.md").read_text()
        text = " ".join(card.split())
        assert "windows of 24 tokens, 12 apart" in text and "the mean of its windows' vectors" in text, kind
        assert "queries: one window" in text, kind
        assert "truncates" in text and "trust_remote_code" in text, kind
    merged_card = " ".join((merged / "README.md").read_text().split())
    assert "`encode_document` truncates at 24 tokens" in merged_card and "`max_seq_length`, 32" in merged_card


@pytest.mark.parametrize("kind", ["adapter", "merged"])
def test_the_cards_obliq_snippet_gives_obliqs_vectors(exported, kind):
    folder = exported["mean"] / kind
    card = (folder / "README.md").read_text()
    [snippet] = [b for b in _python_blocks(card) if "BiEncoder.from_pretrained" in b]
    scope: dict = {}
    exec(compile(snippet.replace("path/to/this/folder", str(folder)), "card-snippet", "exec"), scope)
    want = _float64_mean(BiEncoder.from_pretrained(folder), scope["texts"])
    np.testing.assert_allclose(scope["vectors"].double().numpy(), want, rtol=0, atol=1e-6)


def test_a_maxsim_export_says_a_document_is_its_windows_and_mteb_refuses_it(exported):
    from obliq.eval.mteb_bridge import MtebEncoder
    from obliq.search.settings import RetrievalSettings

    folder = exported["maxsim"]
    for kind in ("adapter", "merged"):
        assert Windows.of(json.loads((folder / kind / "obliq_encoder.json").read_text())["windows"]) == MAXSIM
        text = " ".join((folder / kind / "README.md").read_text().split())
        assert "scored by its best window (MaxSim)" in text and "queries: read in windows too" in text, kind
    card = (folder / "merged" / "README.md").read_text()
    [snippet] = [b for b in _python_blocks(card) if "maxsim_scores" in b]
    scope: dict = {}
    exec(compile(snippet.replace("path/to/this/folder", str(folder / "merged")), "card-snippet", "exec"), scope)
    encoder = BiEncoder.from_pretrained(folder / "merged")
    q = encoder.encode(scope["queries"], "query").double()
    vectors, owner = encoder.encode_windows(scope["docs"], "passage")
    best = [[float((qi @ vectors[owner == j].double().T).max()) for j in range(len(scope["docs"]))] for qi in q]
    np.testing.assert_allclose(scope["scores"].double().numpy(), best, rtol=0, atol=1e-6)
    for model in (str(folder / "merged"), str(folder / "adapter")):
        with pytest.raises(ValueError, match="windows.reduce maxsim: mteb scores one vector a document"):
            MtebEncoder(model)
    mean = MtebEncoder(str(exported["mean"] / "merged"))  # mean windows: mteb gets obliq's vectors
    got = mean.encode(
        [{"text": [LONG, SHORT]}],
        task_metadata=SimpleNamespace(name="AnyTask"),
        hf_split="test",
        hf_subset="default",
        prompt_type=None,
    )
    want = BiEncoder.from_pretrained(exported["mean"] / "merged").encode([LONG, SHORT], "passage").numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="retrieval.windows.reduce maxsim"):
        MtebEncoder(str(exported["mean"] / "merged"), RetrievalSettings(windows=MAXSIM))


def test_windows_wider_than_the_backbone_read_alike_from_every_folder(tmp_path):
    """Windows of 300 tokens on MiniLM (which reads 256): the checkpoint, its adapter and its merged folder all
    read a long text in the same 256-token windows, give the same vectors, and say 256 (the merged folder's
    sentence-transformers length is the tokenizer's ``model_max_length``; obliq read it at the 512 positions)."""
    from obliq.commands.export import export
    from obliq.search.retrieval import text_policy
    from obliq.search.settings import RetrievalSettings

    wide = Windows(size=300, stride=128)
    ckpt = make_checkpoint(tmp_path / "wide.ckpt", "minilm", length=32, windows=wide)
    export(ckpt, tmp_path / "wide", merge=True)
    text = " ".join([LONG] * 6)
    trained = load_checkpoint(ckpt, dtype="float32")
    n_windows = len(trained.text.windows([text], "passage", wide)[1])
    assert trained.text.cap(wide.size) == 256 and n_windows >= 3
    want = trained.encode([text], "passage")
    task = SimpleNamespace(name="AnyTask")
    for kind in ("adapter", "merged"):
        encoder = BiEncoder.from_pretrained(tmp_path / "wide" / kind)
        assert len(encoder.text.windows([text], "passage", wide)[1]) == n_windows, kind
        assert float((encoder.encode([text], "passage") * want).sum()) >= 0.99999, kind
        assert text_policy(encoder, task, RetrievalSettings())["windows"]["size"] == 256, kind
        card = " ".join((tmp_path / "wide" / kind / "README.md").read_text().split())
        assert "windows of 256 tokens, 128 apart" in card, kind
