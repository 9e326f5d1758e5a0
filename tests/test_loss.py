"""InfoNCE values against closed forms (C04a, C05, C06)."""

import math

import pytest
import torch

from obliq.loss import InfoNCELoss, info_nce
from obliq.model.gradcache import grad_cache_step


@pytest.mark.parametrize("tau,expect", [(1.0, 0.798139), (0.05, 4.018150)])
@pytest.mark.parametrize("chunk", [1, 2, None])
def test_c04a_closed_form_for_every_chunk_size(tau, expect, chunk):
    table = torch.nn.Parameter(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]]))
    encode = lambda b: table[b["input_ids"][:, 0]]  # noqa: E731  (an exact "encoder": a lookup)
    queries = {"input_ids": torch.tensor([[0], [1]]), "attention_mask": torch.ones(2, 1)}
    docs = {"input_ids": torch.tensor([[2], [3]]), "attention_mask": torch.ones(2, 1)}
    loss_fn = InfoNCELoss(temperature=tau)
    loss = grad_cache_step(encode, queries, docs, lambda q, d: loss_fn(q, d, torch.arange(2)), chunk)
    assert loss.item() == pytest.approx(expect, abs=1e-6)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(0.2 / tau)), rel=1e-6)
    # The gradient reached the "encoder" and equals the closed form's: d/dq1 = (-p1 + softmax·P)/τ.
    s = torch.softmax(torch.tensor([0.6, 0.8]) / tau, 0)
    g_q1 = (-torch.tensor([0.6, 0.8]) + s[0] * torch.tensor([0.6, 0.8]) + s[1] * torch.tensor([0.8, 0.6])) / tau / 2
    assert torch.allclose(table.grad[0], g_q1, atol=1e-5)


@pytest.mark.parametrize("tau", [1.0, 0.05])
def test_c05_duplicate_positive_is_masked(tau):
    q = torch.tensor([[1.0, 0.0], [0.8, 0.6]])
    d = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # document d1 twice in the batch
    pos = torch.arange(2)
    assert info_nce(q, d, pos, temperature=tau).item() == pytest.approx(math.log(2), abs=1e-6)
    same_id = torch.tensor([7, 7])
    assert info_nce(q, d, pos, same_id, temperature=tau).item() == pytest.approx(0.0, abs=1e-7)


def test_c06_negative_that_is_the_positive_is_masked_by_text_key():
    q = torch.tensor([[1.0, 0.0]], requires_grad=True)
    d = torch.tensor([[0.8, 0.6], [0.8, 0.6], [0.0, 1.0]])  # positive d1, d7 (same text), honest
    naive = info_nce(q, d, torch.tensor([0]), temperature=0.05)
    (g,) = torch.autograd.grad(naive, q)
    assert naive.item() == pytest.approx(0.693147, abs=1e-6)
    assert torch.allclose(g, torch.zeros(1, 2), atol=1e-5)  # [0, 0] up to the e^-16 term
    keys = torch.tensor([[1, 100], [7, 100], [9, 300]])  # (id hash, text hash): d7 shares d1's text
    masked = info_nce(q, d, torch.tensor([0]), keys, temperature=0.05)
    assert masked.item() == pytest.approx(math.log(1 + math.exp(-16)), rel=1e-4)  # 1.1254e-7
    (g,) = torch.autograd.grad(masked, q)
    assert g.abs().sum() > 0


def test_masking_never_hides_the_target_and_rejects_bad_temperature():
    q = torch.eye(2)
    keys = torch.tensor([3, 3])  # both rows' positives are the same document
    loss = info_nce(q, q, torch.arange(2), keys, temperature=0.1)
    assert torch.isfinite(loss)
    with pytest.raises(ValueError):
        InfoNCELoss(temperature=0.0)
