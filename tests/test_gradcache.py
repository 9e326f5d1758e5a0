"""GradCache gives the loss and every parameter gradient of a plain forward/backward (C04b).

With dropout on, a plain forward over the whole batch draws its masks in a different order than a
chunked one, so the dropout reference is a plain forward/backward over the same chunks *with*
gradient from the same seed: one autograd graph over the whole batch, the masks of the chunks.
With dropout off, the reference is a single forward over the whole batch. The same holds for chunks
grouped by length (``sort_by_length``): the dropout reference is a plain pass over the same sorted
chunks, and without dropout the reference is again one unchunked pass in the input order.
"""

import pytest
import torch

from obliq.losses import InfoNCE, StepView
from obliq.model import BiEncoder, LoraSettings, gradcache
from obliq.model.gradcache import grad_cache_step, length_order, sorted_chunks, split

QUERIES = [
    "which author writes like this",
    "a proof by induction",
    "stance against the policy",
    "the witness dodged the question",
]
POSITIVES = [
    "a passage in the same voice",
    "induction on n proves the claim",
    "this policy is a mistake and here is why",
    "I do not recall, congressman",
]
NEGATIVES = ["cooking pasta at home", "the weather today is mild", "football results", "a stock report"]


def _batch(enc):
    q = enc.tokenize(QUERIES, "query")
    d = enc.tokenize(POSITIVES + NEGATIVES, "passage")
    return q, d


def _grads(enc):
    return {n: p.grad.detach().clone() for n, p in enc.named_parameters() if p.requires_grad}


def _loss_fn():
    loss = InfoNCE(temperature=0.05)
    view = StepView.of({"positive_index": torch.arange(4), "doc_keys": torch.arange(8)})
    return lambda q, d: loss(q, d, view)


def _reference(enc, q, d, chunk, seed):
    """Plain autograd over the same chunks, from the same seed."""
    enc.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    qs = torch.cat([enc(c) for c in split(q, chunk)])
    ds = torch.cat([enc(c) for c in split(d, chunk)])
    loss = _loss_fn()(qs, ds)
    loss.backward()
    return loss.detach(), _grads(enc)


def _reference_sorted(enc, q, d, chunk, seed):
    """Plain autograd over the same length-sorted chunks, from the same seed, rows put back in order."""
    enc.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    (qc, qi), (dc, di) = sorted_chunks(q, chunk), sorted_chunks(d, chunk)
    qs = torch.cat([enc(c) for c in qc])[qi]
    ds = torch.cat([enc(c) for c in dc])[di]
    loss = _loss_fn()(qs, ds)
    loss.backward()
    return loss.detach(), _grads(enc)


def _cached(enc, q, d, chunk, seed, **kwargs):
    enc.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = grad_cache_step(enc, q, d, _loss_fn(), chunk, **kwargs)
    return loss, _grads(enc)


def _assert_close(got, ref, rel=1e-5):
    assert got.keys() == ref.keys() and ref
    for name in ref:
        err = (got[name] - ref[name]).norm()
        assert err <= rel * ref[name].norm() + 1e-10, f"{name}: relative error {err / ref[name].norm():.2e}"


@pytest.fixture(scope="module", params=["minilm", "tiny-llama"])
def encoder(request, tiny_llama_dir):
    torch.manual_seed(0)
    backbone = "minilm" if request.param == "minilm" else tiny_llama_dir
    enc = BiEncoder(backbone, lora=LoraSettings(r=4, alpha=8, dropout=0.3))
    with torch.no_grad():  # B = 0 at init would hide errors in A's gradient path
        for n, p in enc.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return enc.train()


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, None])
def test_gradcache_equals_full_batch_with_dropout(encoder, chunk):
    q, d = _batch(encoder)
    ref_loss, ref = _reference(encoder, q, d, chunk, seed=123)
    loss, got = _cached(encoder, q, d, chunk, seed=123)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    _assert_close(got, ref)


@pytest.mark.slow
def test_without_rng_replay_the_gradients_are_wrong(encoder, monkeypatch):
    """The negative control: the check above can fail (the loss alone would not show it)."""
    q, d = _batch(encoder)
    ref_loss, ref = _reference(encoder, q, d, 2, seed=5)
    monkeypatch.setattr(gradcache.RandState, "replay", lambda self: torch.random.fork_rng(devices=[]))
    loss, got = _cached(encoder, q, d, 2, seed=5)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    worst = max(((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref)
    assert worst > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_gradcache_equals_one_unchunked_forward_without_dropout(encoder, chunk):
    encoder.eval()  # no dropout anywhere: the chunking itself must not change anything
    try:
        q, d = _batch(encoder)
        ref_loss, ref = _reference(encoder, q, d, None, seed=0)
        loss, got = _cached(encoder, q, d, chunk, seed=0)
    finally:
        encoder.train()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    _assert_close(got, ref)


def test_nan_loss_is_refused_before_any_backward():
    table = torch.nn.Parameter(torch.ones(2, 2))
    batch = {"input_ids": torch.tensor([[0], [1]]), "attention_mask": torch.ones(2, 1)}
    with pytest.raises(FloatingPointError):
        grad_cache_step(lambda b: table[b["input_ids"][:, 0]], batch, batch, lambda q, d: (q * float("nan")).sum(), 1)
    assert table.grad is None


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [2, 8])
def test_idle_passes_that_match_other_ranks_change_nothing(encoder, chunk):
    """``pad_to`` (FSDP: every rank runs the same passes) adds one-row idle passes with zero weight:
    the loss and gradients equal the full-batch reference, and the encoder runs the padded count."""
    q, d = _batch(encoder)
    ref_loss, ref = _reference(encoder, q, d, chunk, seed=3)
    calls = []
    encoder.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    loss = grad_cache_step(
        lambda b: calls.append(len(b["input_ids"])) or encoder(b), q, d, _loss_fn(), chunk, pad_to=(3, 6)
    )
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    _assert_close(_grads(encoder), ref)
    real = len(split(q, chunk)) + len(split(d, chunk))
    assert len(calls) == 2 * (3 + 6) and calls.count(1) == 2 * (9 - real)  # no-grad + grad passes


def test_length_order_groups_rows_and_the_inverse_restores_them():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    batch = {"input_ids": torch.arange(20).reshape(5, 4), "attention_mask": mask}
    assert length_order(batch).tolist() == [1, 4, 3, 0, 2]  # stable: row 1 before row 4
    chunks, inverse = sorted_chunks(batch, 2)
    assert [c["attention_mask"].sum(1).tolist() for c in chunks] == [[1, 1], [2, 3], [4]]
    assert torch.equal(torch.cat([c["input_ids"] for c in chunks])[inverse], batch["input_ids"])


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_length_sorted_chunks_equal_the_reference_with_dropout(encoder, chunk):
    q, d = _batch(encoder)
    assert length_order(d).tolist() != list(range(8))  # the sort really regroups these rows
    ref_loss, ref = _reference_sorted(encoder, q, d, chunk, seed=11)
    loss, got = _cached(encoder, q, d, chunk, seed=11, sort_by_length=True)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    _assert_close(got, ref)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 3])
def test_length_sorted_chunks_equal_one_unchunked_forward_without_dropout(encoder, chunk):
    """Independent of sorted_chunks: the loss and gradients of one pass over the batch in input order."""
    encoder.eval()
    try:
        q, d = _batch(encoder)
        ref_loss, ref = _reference(encoder, q, d, None, seed=0)
        loss, got = _cached(encoder, q, d, chunk, seed=0, sort_by_length=True)
    finally:
        encoder.train()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    _assert_close(got, ref)


@pytest.mark.slow
@pytest.mark.parametrize("sort", [False, True])
def test_the_last_chunk_is_encoded_once_and_each_chunk_padded_to_its_own_rows(encoder, sort):
    """The last chunk's graph from the first pass is kept: chunks + (chunks - 1) forward passes.
    Sorted, every chunk's rows are no longer than the next chunk's."""
    q, d = _batch(encoder)
    calls = []
    encoder.zero_grad(set_to_none=True)
    grad_cache_step(
        lambda b: calls.append(b["attention_mask"].sum(1).tolist()) or encoder(b),
        q,
        d,
        _loss_fn(),
        2,
        sort_by_length=sort,
    )
    assert len(calls) == 2 * (2 + 4) - 1
    if sort:
        docs = calls[2:6]
        assert all(max(a) <= min(b) for a, b in zip(docs, docs[1:]))
