"""Long texts in token windows (issue 55) at their edges, found by an adversarial review: a tokenizer that
truncates on the left, no texts at all, a window cut to the backbone's positions, MaxSim asked of an encoder that
reads texts its own way."""

import pytest
import torch
from transformers import AutoTokenizer

from obliq.model import BiEncoder
from obliq.model.tokenizer import TextTokenizer
from obliq.windows import Windows

LONG = " ".join(f"w{i}" for i in range(60))


def _rows(batch) -> list[list[int]]:
    return [[int(i) for i, m in zip(ids, mask) if m] for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]


def test_a_tokenizer_that_truncates_on_the_left_reads_windows_from_the_start(minilm_path):
    """Windows read a text from its first token, the prefix in each, whichever side the tokenizer truncates on
    (its truncation_side is for a text cut at the max length, not for windows)."""
    windows = Windows(size=12, stride=6, max_windows=3)
    right = TextTokenizer(AutoTokenizer.from_pretrained(minilm_path))
    left = TextTokenizer(AutoTokenizer.from_pretrained(minilm_path, truncation_side="left"))
    (want, want_owner), (got, got_owner) = (t.windows([LONG, "short one"], "passage", windows) for t in (right, left))
    assert _rows(got) == _rows(want) and got_owner.tolist() == want_owner.tolist()
    assert left.tokenizer.decode(_rows(got)[0]).startswith("[CLS] passage : w0 w1")
    assert left.truncated["passage"] == 1  # the text past 3 windows: cut, and counted


def test_no_texts_encode_to_no_vectors_with_windows(minilm_path):
    """``encode([])`` gives (0, hidden) with windows as without (a task with no queries of a split, mteb)."""
    enc = BiEncoder(minilm_path, windows=Windows(size=32, stride=16, queries=True))
    for kind in ("passage", "query"):
        assert enc.encode([], kind).shape == (0, enc.hidden_size)


def test_a_window_cut_to_the_backbones_positions_says_so(minilm_path):
    """MiniLM reads 256 positions: windows of 512 tokens, 300 apart, leave no room for the stride once cut; the
    refusal names the size asked for and the cut, not only the cut size."""
    text = TextTokenizer(AutoTokenizer.from_pretrained(minilm_path), capacity=256)
    with pytest.raises(ValueError, match=r"windows.size: 512 \(cut to the backbone's 256 positions\)"):
        text.windows(["word " * 600], "passage", Windows(size=512, stride=300))


def test_maxsim_asked_of_a_sentence_transformers_encoder_names_the_fix():
    """MaxSim over windows needs obliq's encoder: the refusal says which setting gives it, as the mean's does."""
    from obliq.search.retrieval import retrieve_maxsim
    from obliq.search.settings import RetrievalSettings

    class Plain:  # an encoder that reads texts its own way (sentence-transformers')
        def encode(self, texts, kind="query", batch_size=32, max_length=None):
            return torch.zeros(len(texts), 4)

    class Task:
        name, candidates, doc_texts, doc_ids = "t", None, ["a"], ["d"]

    windows = Windows(size=32, stride=16, reduce="maxsim")
    settings = RetrievalSettings(windows=windows, cache=False)
    with pytest.raises(ValueError, match="retrieval.windows: .*use retrieval.encoder obliq"):
        retrieve_maxsim(Plain(), Task(), settings, windows, None, 0)


def test_encode_refuses_maxsim_windows_before_claiming_a_store(tasks_dir, minilm_path, tmp_path):
    """``obliq encode`` stores one vector a text: MaxSim windows are refused before any store folder is made."""
    from support import small_real_task

    from obliq.commands.encode import encode
    from obliq.search.settings import RetrievalSettings

    task = small_real_task(tasks_dir, tmp_path / "slice", n_queries=2, n_distractors=4)
    windows = Windows(size=32, stride=16, reduce="maxsim")
    settings = RetrievalSettings(encoder="obliq", cache_dir=tmp_path / "cache", windows=windows)
    with pytest.raises(ValueError, match="retrieval.windows.reduce maxsim: a store holds one vector a text"):
        encode(minilm_path, [str(task)], settings)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("where", ["settings", "saved model"])
@pytest.mark.parametrize("case", ["hnsw", "candidates"])
def test_evaluate_refuses_maxsim_it_cannot_search_before_the_model_loads(
    case, where, minilm_path, tmp_path, monkeypatch
):
    """MaxSim over windows is searched exactly over the whole corpus: an approximate index, or a task ranked over
    candidate sets, is refused by ``obliq evaluate`` before the encoder loads, and nothing is written; so with
    MaxSim asked in ``retrieval.windows`` as with a saved model that reads in MaxSim windows itself."""
    import obliq.search.retrieval as retrieval
    from obliq.commands.evaluate import evaluate
    from obliq.search.settings import RetrievalSettings

    task = _tiny_task(tmp_path / "t", candidates=case == "candidates")
    windows = {"size": 32, "stride": 16, "reduce": "maxsim"}
    model = "minilm"
    if where == "saved model":
        BiEncoder(minilm_path, windows=windows).save_pretrained(tmp_path / "model")
        model, windows = str(tmp_path / "model"), None
    monkeypatch.setattr(retrieval, "load_encoder", lambda *a, **k: pytest.fail("the encoder loaded"))
    settings = RetrievalSettings(windows=windows, index="hnsw" if case == "hnsw" else "flat", top_k=2)
    with pytest.raises(ValueError, match=MAXSIM_REFUSAL[case]):
        evaluate(model, [str(task)], tmp_path / "out", settings, measures=["NDCG@2"])
    assert not (tmp_path / "out").exists()


MAXSIM_REFUSAL = {"hnsw": "MaxSim over windows is searched exactly: use flat", "candidates": "candidate sets is not"}


def _tiny_task(root, candidates: bool):
    from support import make_task

    docs = [{"_id": f"d{i}", "text": f"text {i}"} for i in range(4)]
    task = make_task(root, docs, [{"_id": "q", "text": "text"}], [("q", "d1", 1)])
    if candidates:
        (task / "top_ranked").mkdir()
        (task / "top_ranked" / "test.jsonl").write_text('{"query-id": "q", "corpus-ids": ["d0", "d1"]}\n')
    return task


def test_the_training_callback_and_the_audit_refuse_maxsim_with_an_approximate_index_before_any_work(
    minilm_path, tmp_path, monkeypatch
):
    """The training callback refuses at ``setup`` (before the first step: the encoder's own MaxSim windows read),
    and ``obliq audit`` before any model loads, what MaxSim cannot search."""
    from obliq.callbacks import RetrievalEvaluation
    from test_audit_lean import write_task

    import obliq.search.retrieval as retrieval
    from obliq.commands.audit import audit
    from obliq.search.settings import RetrievalSettings

    class Module:  # what the callback reads of a LightningModule: its encoder
        encoder = BiEncoder(minilm_path, windows={"size": 32, "stride": 16, "reduce": "maxsim"})

    callback = RetrievalEvaluation([str(_tiny_task(tmp_path / "t", False))], retrieval=RetrievalSettings(index="hnsw"))
    with pytest.raises(ValueError, match=MAXSIM_REFUSAL["hnsw"]):
        callback.setup(None, Module(), "fit")
    monkeypatch.setattr(retrieval, "load_encoder", lambda *a, **k: pytest.fail("the encoder loaded"))
    settings = RetrievalSettings(index="hnsw", windows={"size": 32, "stride": 16, "reduce": "maxsim"})
    task = write_task(tmp_path / "audit-task")
    with pytest.raises(ValueError, match=MAXSIM_REFUSAL["hnsw"]):
        audit(task, tmp_path / "out", models=["bm25", "minilm"], paired=[("left", "right")], retrieval=settings)
    assert not (tmp_path / "out").exists()
