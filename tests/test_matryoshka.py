"""Matryoshka loss: a float64 reference written here, autograd against finite differences, GradCache
equal to one full-batch pass, two processes equal to one (cross-device negatives)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support import lora_encoder, two_gloo_ranks

from obliq.losses import InfoNCE, Matryoshka, StepView, info_nce
from obliq.model.gradcache import grad_cache_step


def _view(positive, n_docs: int, keys=None) -> StepView:
    """The step view of query i's positive ``positive[i]`` among ``n_docs`` documents of identity ``keys``."""
    docs = {"input_ids": torch.zeros(n_docs, 1, dtype=torch.long)}  # only its row count is read
    return StepView.of({"positive_index": torch.as_tensor(positive), "doc_keys": keys, "docs": docs})


def _reference(q, d, positive, keys, tau, dims, weights):
    """Σ_dims w · mean_i [logsumexp_j s_ij − s_i,pos(i)], s = (q̂·d̂)/τ over truncated-then-renormalised
    float64 vectors, the columns holding a copy (same key) of i's positive left out — numpy, by hand."""
    total = 0.0
    for dim, w in zip(dims, weights):
        qq = q[:, :dim] / np.linalg.norm(q[:, :dim], axis=1, keepdims=True)
        dd = d[:, :dim] / np.linalg.norm(d[:, :dim], axis=1, keepdims=True)
        losses = []
        for i in range(len(qq)):
            s = dd @ qq[i] / tau
            keep = [j for j in range(len(dd)) if j == positive[i] or keys[j] != keys[positive[i]]]
            m = s[keep].max()
            losses.append(m + np.log(np.exp(s[keep] - m).sum()) - s[positive[i]])
        total += w * np.mean(losses)
    return total


def test_matryoshka_loss_equals_a_float64_reference():
    rng = np.random.default_rng(0)
    q, d = rng.standard_normal((4, 12)), rng.standard_normal((9, 12))
    positive, keys = [0, 2, 4, 6], [10, 11, 12, 13, 14, 15, 16, 17, 10]  # doc 8 copies query 0's positive
    dims, weights = [12, 6, 3], [1.0, 0.5, 2.0]
    loss = Matryoshka(InfoNCE(temperature=0.05), dims, weights)
    view = _view(positive, len(d), torch.tensor(keys))
    got = loss(torch.tensor(q, dtype=torch.float32), torch.tensor(d, dtype=torch.float32), view)
    ref = _reference(q, d, positive, keys, 0.05, dims, weights)
    assert got.item() == pytest.approx(ref, rel=1e-6)
    # negative control: without re-normalising the truncated vectors the value differs
    raw = sum(
        w
        * info_nce(
            torch.tensor(q[:, :k]), torch.tensor(d[:, :k]), torch.tensor(positive), torch.tensor(keys), 0.05
        ).item()
        for k, w in zip(dims, weights)
    )
    assert abs(raw - ref) > 1e-2
    # one dimension, the full one, is the plain loss on unit vectors
    qt, dt = F.normalize(torch.tensor(q), dim=-1), F.normalize(torch.tensor(d), dim=-1)
    plain = info_nce(qt, dt, torch.tensor(positive), torch.tensor(keys), 0.05)
    assert Matryoshka(InfoNCE(0.05), [12])(qt, dt, view).item() == pytest.approx(plain.item(), rel=1e-6)


def test_matryoshka_gradients_equal_those_of_a_float64_reference():
    """The reference (float64 torch, written here, no masking) is checked against finite differences;
    the loss's gradients (its output is float32) against the reference's."""
    dims, weights = [8, 4, 2], [1.0, 1.0, 0.5]

    def reference(q, d):
        total = 0
        for k, w in zip(dims, weights):
            a, b = q[:, :k] / q[:, :k].norm(dim=1, keepdim=True), d[:, :k] / d[:, :k].norm(dim=1, keepdim=True)
            s = a @ b.T / 0.1
            total = total + w * (torch.logsumexp(s, dim=1) - s[torch.arange(3), torch.arange(3)]).mean()
        return total

    torch.manual_seed(0)
    q = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    d = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(reference, (q, d))
    ref_q, ref_d = torch.autograd.grad(reference(q, d), (q, d))
    loss = Matryoshka(InfoNCE(temperature=0.1), dims, weights)
    got = loss(q, d, _view(torch.arange(3), 5))
    assert got.item() == pytest.approx(reference(q, d).item(), rel=1e-6)
    got_q, got_d = torch.autograd.grad(got, (q, d))
    torch.testing.assert_close(got_q, ref_q, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_d, ref_d, rtol=1e-5, atol=1e-7)


def test_bad_matryoshka_settings_are_refused():
    with pytest.raises(ValueError, match="positive integers"):
        Matryoshka(InfoNCE(), [0, 4])
    with pytest.raises(ValueError, match="given twice"):
        Matryoshka(InfoNCE(), [4, 4])
    with pytest.raises(ValueError, match="one weight per"):
        Matryoshka(InfoNCE(), [4, 2], [1.0])
    with pytest.raises(ValueError, match="outside 1 … 8"):
        Matryoshka(InfoNCE(), [16])(torch.randn(2, 8), torch.randn(2, 8), _view(torch.arange(2), 2))
    cited = Matryoshka(InfoNCE(), [8, 4]).citation()
    assert "Kusupati et al. 2022 (Matryoshka)" in cited["references"] and cited["class"] == "Matryoshka(InfoNCE)"
    assert cited["matryoshka_dims"] == [8, 4]  # what an export records (obliq_export.json)


QUERIES = ["which author writes like this", "a proof by induction", "stance against the policy", "the witness dodged"]
DOCS = [
    "a passage in the same voice",
    "induction on n",
    "this policy is a mistake",
    "I do not recall",
    "pasta",
    "weather",
]
DIMS = [32, 16, 8, 4]  # the tiny Llama's hidden size is 32


def _grads(enc):
    return {n: p.grad.detach().clone() for n, p in enc.named_parameters() if p.requires_grad}


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 3])
def test_gradcache_with_matryoshka_equals_one_full_batch_pass(tiny_llama_dir, chunk):
    enc = lora_encoder(tiny_llama_dir).eval()  # no dropout: one unchunked pass is the reference
    loss = Matryoshka(InfoNCE(temperature=0.05), DIMS, [1.0, 1.0, 0.5, 0.25])
    view = _view(torch.arange(4), len(DOCS), torch.arange(len(DOCS)))
    fn = lambda q, d: loss(q, d, view)  # noqa: E731
    q, d = enc.tokenize(QUERIES, "query"), enc.tokenize(DOCS, "passage")
    enc.zero_grad(set_to_none=True)
    ref = fn(enc(q), enc(d))
    ref.backward()
    ref_grads = _grads(enc)
    enc.zero_grad(set_to_none=True)
    got = grad_cache_step(enc, q, d, fn, chunk, sort_by_length=True)
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)
    for name, g in ref_grads.items():
        assert (_grads(enc)[name] - g).norm() <= 1e-5 * g.norm() + 1e-10, name
    # and the gradients are not those of the plain loss (the nested terms matter)
    enc.zero_grad(set_to_none=True)
    InfoNCE(temperature=0.05)(enc(q), enc(d), view).backward()
    plain = _grads(enc)
    assert max(((plain[n] - g).norm() / g.norm()).item() for n, g in ref_grads.items()) > 1e-2


SHARDS = [
    {"q": QUERIES[:2], "d": DOCS[:3], "ids": [1, 2, 3]},
    {"q": QUERIES[2:], "d": [DOCS[0], *DOCS[3:5]], "ids": [1, 5, 6]},  # rank 1's first doc is rank 0's positive
]


@pytest.mark.distributed
@pytest.mark.slow
def test_matryoshka_across_two_processes_equals_one_process(tiny_llama_dir, tmp_path):
    ranks = two_gloo_ranks(
        tiny_llama_dir,
        tmp_path,
        SHARDS,
        {
            "class_path": "obliq.losses.Matryoshka",
            "init_args": {
                "loss": {"class_path": "obliq.losses.InfoNCE", "init_args": {"temperature": 0.05}},
                "dims": DIMS,
            },
        },
    )
    enc = lora_encoder(tiny_llama_dir).eval()
    q = enc(enc.tokenize(SHARDS[0]["q"] + SHARDS[1]["q"], "query"))
    d = enc(enc.tokenize(SHARDS[0]["d"] + SHARDS[1]["d"], "passage"))
    keys = torch.tensor(SHARDS[0]["ids"] + SHARDS[1]["ids"])
    view = _view(torch.tensor([0, 1, 3, 4]), len(keys), keys)
    loss = Matryoshka(InfoNCE(0.05, gather_across_devices=False), DIMS)(q, d, view)
    loss.backward()
    ref = {n: p.grad for n, p in enc.named_parameters() if p.requires_grad}
    for r in ranks:
        assert r["loss"].item() == pytest.approx(loss.item(), rel=1e-6)
        for name, g in ref.items():
            assert (r["grads"][name] - g).norm() <= 1e-5 * g.norm() + 1e-10, name
