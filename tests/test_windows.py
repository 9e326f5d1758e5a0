"""Long texts read in token windows (issue 55): the windows themselves (every token of the text, the prefix in
each, cut only between tokens, a short text unchanged), the two reductions against float64 formulas, GradCache
with windows equal to one pass over the whole batch (value and gradient) and to an independent loss written out
here, and a training run whose encoder keeps its windows."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import fit_here, lora_encoder, task_rows, two_gloo_ranks, write_config, write_rows

from obliq.losses import InfoNCE, StepView, Symmetric
from obliq.model import BiEncoder
from obliq.model.gradcache import grad_cache_step
from obliq.windows import Windows, maxsim_scores, mean_of_windows

WORDS = ["style", "voice", "unbelievable", "the", "of", "ñandú", "co-operate", "42", "x" * 30, "!"]


@pytest.fixture(scope="module")
def tokenizers(minilm_path, tiny_llama_dir):
    """MiniLM's WordPiece (special tokens at both ends) and SmolLM2's byte-level BPE (none), with prefixes."""
    return {
        "minilm": BiEncoder(minilm_path, query_prefix="query: ", passage_prefix="passage: ").text,
        "bpe": BiEncoder(tiny_llama_dir, query_prefix="query: ", passage_prefix="passage: ").text,
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=0, max_size=120),
    size=st.integers(12, 40),
    half=st.booleans(),
    max_windows=st.integers(1, 20),
    which=st.sampled_from(["minilm", "bpe"]),
)
def test_windows_hold_every_token_of_the_text_with_its_prefix(tokenizers, words, size, half, max_windows, which):
    text = tokenizers[which]
    tok = text.tokenizer
    stride = size // 2 if half else max(1, size // 3)
    windows = Windows(size=size, stride=stride, max_windows=max_windows)
    body = " ".join(words)
    batch, owner = text.windows([body, "short one"], "passage", windows)
    assert owner.tolist() == sorted(owner.tolist()) and set(owner.tolist()) == {0, 1}
    rows = [[int(i) for i, m in zip(ids, mask) if m] for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
    mine = [r for r, o in zip(rows, owner.tolist()) if o == 0]
    assert all(len(r) <= size for r in mine)
    whole = tok("passage: " + body)["input_ids"]  # the reference: the whole text, tokenized once
    head, tail = text.specials()
    own = whole[head : len(whole) - tail]
    if len(whole) <= size:  # fits: one window, the ids of the whole text
        assert mine == [whole]
    else:
        prefix = tok("passage: ", add_special_tokens=False)["input_ids"]
        n = next((i for i in range(len(prefix)) if i >= len(own) or prefix[i] != own[i]), len(prefix))
        room = size - head - tail - n
        assert mine[0] == text([body], "passage", max_length=size)["input_ids"][0].tolist()  # truncation's ids
        for r in mine:  # the special tokens and the prefix in every window
            assert (
                r[:head] == whole[:head]
                and r[head : head + n] == own[:n]
                and r[len(r) - tail :] == whole[len(whole) - tail :]
            )
        pieces = [r[head + n : len(r) - tail] for r in mine]
        want = own[n:]
        expected = 1 + math.ceil((len(want) - room) / stride)
        assert len(mine) == min(expected, max_windows)
        for j, p in enumerate(pieces):  # runs of the text's own tokens, stride apart
            assert p == want[j * stride : j * stride + room]
        if expected <= max_windows:  # nothing lost: the last window reaches the text's last token
            assert (len(mine) - 1) * stride + len(pieces[-1]) == len(want)
    short = [r for r, o in zip(rows, owner.tolist()) if o == 1]
    assert short == [tok("passage: short one")["input_ids"]]


def test_a_text_past_max_windows_is_cut_and_counted(tokenizers):
    text = tokenizers["minilm"]
    before = text.truncated["passage"]
    _, owner = text.windows(["word " * 500], "passage", Windows(size=32, stride=16, max_windows=3))
    assert owner.tolist() == [0, 0, 0] and text.truncated["passage"] == before + 1


def test_window_settings_are_checked():
    for bad, field in (({"stride": 256}, "stride"), ({"size": 0}, "size"), ({"reduce": "max"}, "reduce")):
        with pytest.raises(ValueError, match=f"windows.{field}"):
            Windows.of(bad)
    with pytest.raises(ValueError, match="unknown field 'strides'"):
        Windows.of({"strides": 3})


def _float64_reference(q, w, owner, n):
    q, w = q.double().numpy(), w.double().numpy()
    mean = np.stack([w[owner == i].sum(0) for i in range(n)])
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    best = np.stack([(q @ w[owner == i].T).max(1) for i in range(n)], 1)
    return mean, best


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31 - 1), st.booleans())
def test_the_reductions_match_float64_formulas(n, most, seed, repeat):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, most + 1, (n,), generator=gen)
    owner = torch.repeat_interleave(torch.arange(n), counts)[torch.randperm(int(counts.sum()), generator=gen)]
    w = torch.nn.functional.normalize(torch.randn(len(owner), 5, generator=gen, dtype=torch.float64), dim=1)
    if repeat:  # two windows the same vector: a tie inside a document
        w[-1] = w[0]
    q = torch.nn.functional.normalize(torch.randn(3, 5, generator=gen, dtype=torch.float64), dim=1)
    mean, best = _float64_reference(q, w, owner.numpy(), n)
    np.testing.assert_allclose(mean_of_windows(w, owner, n).numpy(), mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(maxsim_scores(q, w, owner, n).numpy(), best, rtol=0, atol=1e-12)


def test_a_document_without_a_window_is_refused():
    with pytest.raises(ValueError, match="window_doc: 1 document.s. have no window"):
        mean_of_windows(torch.ones(2, 3), torch.tensor([0, 2]), 3)


QUERIES = ["which author writes like this", "the witness dodged the question again and again"]
DOCS = [
    " ".join(["a passage in the same voice, long and winding, with clauses piled on clauses"] * 4),
    "I do not recall, congressman",
    " ".join(["the weather today is mild and the markets are calm"] * 5),
]


def _batch(enc, windows):
    q = enc.tokenize(QUERIES, "query")
    d, doc_window = enc.text.windows(DOCS, "passage", windows)
    batch = {"query": q, "docs": d, "doc_window": doc_window, "positive_index": torch.arange(2)}
    batch["doc_keys"] = torch.arange(len(DOCS))
    return batch


def _independent_loss(enc, loss_name, reduce, windows, temperature=0.05):
    """The loss written out from each text encoded on its own: every window of a document by itself, the mean or
    the best window by a Python loop, softmax cross-entropy by its formula (float64)."""
    q = enc(enc.tokenize(QUERIES, "query")).double()
    scores = torch.empty(len(QUERIES), len(DOCS), dtype=torch.float64)
    for j, text in enumerate(DOCS):
        d, _ = enc.text.windows([text], "passage", windows)
        vs = torch.cat([enc({k: v[i : i + 1] for k, v in d.items()}) for i in range(len(d["input_ids"]))]).double()
        if reduce == "mean":
            m = vs.sum(0)
            scores[:, j] = q @ (m / m.norm())
        else:
            scores[:, j] = torch.stack([torch.max(q[i] @ vs.T) for i in range(len(QUERIES))])
    s = scores / temperature
    forward = torch.stack([torch.logsumexp(s[i], 0) - s[i, i] for i in range(len(QUERIES))]).mean()
    if loss_name == "infonce":
        return forward
    back = torch.stack([torch.logsumexp(s[:, i], 0) - s[i, i] for i in range(len(QUERIES))]).mean()
    return (forward + back) / 2


@pytest.mark.parametrize("reduce", ["mean", "maxsim"])
@pytest.mark.parametrize("loss_name", ["infonce", "symmetric"])
def test_gradcache_with_windows_equals_one_pass_and_the_written_out_loss(minilm_path, reduce, loss_name):
    enc = lora_encoder(minilm_path).eval()  # no dropout: chunks and one pass draw nothing
    windows = Windows(size=16, stride=8, reduce=reduce)
    batch = _batch(enc, windows)
    assert len(batch["doc_window"]) > 2 * len(DOCS)  # long documents: several windows each
    loss = InfoNCE(temperature=0.05) if loss_name == "infonce" else Symmetric(InfoNCE(temperature=0.05))
    view = StepView.of(batch, reduce=reduce)

    def objective(q, d):
        q, d = view.embeddings(q, d)
        return loss(q, d, view)

    def grads():
        return {n: p.grad.clone() for n, p in enc.named_parameters() if p.requires_grad}

    enc.zero_grad(set_to_none=True)
    whole = objective(enc(batch["query"]), enc(batch["docs"]))  # one pass over every window
    whole.backward()
    reference = grads()
    for chunk in (1, 3):
        enc.zero_grad(set_to_none=True)
        value = grad_cache_step(enc, batch["query"], batch["docs"], objective, chunk, sort_by_length=True)
        assert value.item() == pytest.approx(whole.item(), rel=1e-5)
        for name, g in grads().items():
            assert (g - reference[name]).norm() <= 1e-5 * reference[name].norm() + 1e-9, name
    enc.zero_grad(set_to_none=True)
    written = _independent_loss(enc, loss_name, reduce, windows)
    assert whole.item() == pytest.approx(written.item(), rel=1e-5)
    written.backward()
    for name, g in grads().items():
        assert (g - reference[name]).norm() <= 1e-4 * reference[name].norm() + 1e-9, name


def test_a_fit_with_windows_trains_on_them_and_the_model_keeps_them(tasks_dir, minilm_path, tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=8))
    config = write_config(tmp_path / "run", rows, minilm_path, 2)
    windows = '{"size": 24, "stride": 12, "reduce": "maxsim", "queries": true}'
    cli = fit_here(config, f"--model.encoder.init_args.windows={windows}")
    module = cli.model
    assert module.encoder.windows == Windows(size=24, stride=12, reduce="maxsim", queries=True)
    batch = next(iter(cli.datamodule.train_dataloader()))
    assert len(batch["doc_window"]) > batch["docs"]["input_ids"].shape[0] / 2 and "query_window" in batch
    assert batch["docs"]["input_ids"].shape[1] <= 24
    module.encoder.save_pretrained(tmp_path / "saved")
    again = BiEncoder.from_pretrained(tmp_path / "saved")
    assert again.windows == module.encoder.windows


@pytest.mark.distributed
@pytest.mark.slow
def test_windows_across_two_processes_equal_one_process(minilm_path, tmp_path):
    """Each rank's windows gathered with their document rows shifted as the documents are: two processes give
    the loss and gradients of one process over the concatenated batch (MaxSim: the windows themselves reach the
    loss; the mean reduces the same gathered windows, tested in one process above)."""
    windows = {"size": 16, "stride": 8, "reduce": "maxsim"}
    shards = [
        {"q": QUERIES[:1], "d": DOCS[:2], "ids": [1, 2], "windows": windows},
        {"q": QUERIES[1:], "d": [DOCS[2], DOCS[1]], "ids": [3, 2], "windows": windows},  # rank 0's negative again
    ]
    ranks = two_gloo_ranks(minilm_path, tmp_path, shards, {"class_path": "obliq.losses.InfoNCE"})
    enc = lora_encoder(minilm_path).eval()
    texts = shards[0]["d"] + shards[1]["d"]
    d, doc_window = enc.text.windows(texts, "passage", Windows(**windows))
    batch = {"query": enc.tokenize(QUERIES, "query"), "docs": d, "doc_window": doc_window}
    batch |= {"positive_index": torch.tensor([0, 2]), "doc_keys": torch.tensor([1, 2, 3, 2])}
    view = StepView.of(batch, reduce="maxsim")
    q, docs = view.embeddings(enc(batch["query"]), enc(d))
    loss = InfoNCE(gather_across_devices=False)(q, docs, view)
    loss.backward()
    for r in ranks:
        assert r["loss"].item() == pytest.approx(loss.item(), rel=1e-5)
        for name, p in enc.named_parameters():
            if p.requires_grad:
                g = r["grads"][name]
                assert (g - p.grad).norm() <= 1e-4 * p.grad.norm() + 1e-9, name


def test_search_in_windows_equals_brute_force_and_keys_its_store(tasks_dir, minilm_path, tmp_path):
    """``retrieval.windows`` at search: MaxSim's run is the brute-force ranking over every window (float64, ties by
    id), the mean's is the mean vectors' ranking; the store is keyed by the windows; the reading is reported."""
    from support import small_real_task

    from obliq.eval.results import reads_text
    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings
    from obliq.search.store import Store
    from obliq.tasks import load_task

    task = load_task(small_real_task(tasks_dir, tmp_path / "slice", n_queries=6, n_distractors=12))
    enc = BiEncoder(minilm_path, query_prefix="", passage_prefix="")
    windows = Windows(size=32, stride=16, reduce="maxsim")
    vectors, owner = enc.encode_windows(task.doc_texts, "passage", windows=windows)
    assert len(owner) > 2 * len(task.doc_ids)
    q = enc.encode(task.query_texts, "query").double().numpy()
    v = vectors.double().numpy()
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    best = np.stack([(q @ v[owner.numpy() == i].T).max(1) for i in range(len(task.doc_ids))], 1)
    mean = mean_of_windows(vectors.double(), owner, len(task.doc_ids)).numpy()
    for reduce, scores in (("maxsim", best), ("mean", q @ mean.T)):
        settings = RetrievalSettings(top_k=5, cache=False, windows=replace_reduce(windows, reduce))
        got = make_retriever(enc, settings)(task)
        for i, qid in enumerate(task.query_ids):
            rank = {d: r for r, d in enumerate(sorted(task.doc_ids))}  # ties: id descending (trec_eval's order)
            order = sorted(range(len(task.doc_ids)), key=lambda j: (-np.float32(scores[i, j]), -rank[task.doc_ids[j]]))
            want = [task.doc_ids[j] for j in order[:5]]
            ranked = sorted(got.run[qid].items(), key=lambda kv: (-kv[1], kv[0]))
            assert [d for d, _ in ranked] == want, (reduce, qid)
        assert got.reads["windows"]["reduce"] == reduce and "windows of 32 tokens" in reads_text(got.reads)
    plain = RetrievalSettings(cache_dir=tmp_path / "cache")
    keyed = Store.of(minilm_path, plain, task).folder
    assert Store.of(minilm_path, RetrievalSettings(cache_dir=tmp_path / "cache", windows=windows), task).folder != keyed


def replace_reduce(windows: Windows, reduce: str) -> Windows:
    from dataclasses import replace

    return replace(windows, reduce=reduce)
