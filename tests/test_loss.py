"""InfoNCE values against closed forms (C04a, C05, C06, C34) and its masks against a brute-force reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from obliq.losses import InfoNCE, Matryoshka, StepView, Symmetric, info_nce, positive_mask
from obliq.model.gradcache import grad_cache_step


@pytest.mark.parametrize("tau,expect", [(1.0, 0.798139), (0.05, 4.018150)])
@pytest.mark.parametrize("chunk", [1, 2, None])
def test_c04a_closed_form_for_every_chunk_size(tau, expect, chunk):
    table = torch.nn.Parameter(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]]))
    encode = lambda b: table[b["input_ids"][:, 0]]  # noqa: E731  (an exact "encoder": a lookup)
    queries = {"input_ids": torch.tensor([[0], [1]]), "attention_mask": torch.ones(2, 1)}
    docs = {"input_ids": torch.tensor([[2], [3]]), "attention_mask": torch.ones(2, 1)}
    loss_fn = InfoNCE(temperature=tau)
    view = StepView.of({"positive_index": torch.arange(2), "docs": docs})  # no keys: nothing masked
    loss = grad_cache_step(encode, queries, docs, lambda q, d: loss_fn(q, d, view), chunk)
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
        InfoNCE(temperature=0.0)
    # issue 53 §3: a τ so small that the float32 loss overflows (1e-300: every loss inf) and an infinite
    # Matryoshka weight are refused, naming the setting
    q = F.normalize(torch.tensor([[1.0, 0.2], [0.3, 1.0]]), dim=-1)
    assert not torch.isfinite(info_nce(q, q.flip(0), torch.arange(2), temperature=1e-300))
    for tau in (1e-300, 5e-5):
        with pytest.raises(ValueError, match=r"model\.loss temperature must be a finite number >= 0\.0001, got"):
            InfoNCE(temperature=tau)
    for weight in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match=r"Matryoshka weights: finite positive numbers"):
            Matryoshka(InfoNCE(), [2, 1], [1.0, weight])


# C34: unit vectors A, B, C, D and τ = 0.05 (shared/cases/C34.md); keys are (id hash, text hash).
A, B, C, D = (torch.tensor(v) for v in ([1.0, 0.0], [0.8, 0.6], [0.6, -0.8], [0.6, 0.8]))
KEY = {"A": [1, 11], "B": [2, 22], "C": [3, 33], "D": [4, 44]}


def test_c34_a_row_is_never_its_own_negative():
    """(a1) rows A→B and C→A: query A meets its own text as row 2's positive; (a2) rows A→B and A→D: each
    positive is the other row's negative. The case's unmasked and right values."""
    tau, pos = 0.05, torch.arange(2)
    q, d = torch.stack([A, C]), torch.stack([B, A])
    unmasked = (math.log(1 + math.exp(0.2 / tau)) + math.log(1 + math.exp(-0.6 / tau))) / 2
    assert info_nce(q, d, pos, temperature=tau).item() == pytest.approx(2.009078, abs=1e-6) == unmasked
    keys, query_keys = torch.tensor([KEY["B"], KEY["A"]]), torch.tensor([KEY["A"], KEY["C"]])
    assert info_nce(q, d, pos, keys, tau, query_keys).item() == pytest.approx(3.0721e-06, rel=1e-4)
    assert info_nce(q, d, pos, keys, tau, query_keys).item() == pytest.approx(math.log(1 + math.exp(-12)) / 2, rel=1e-6)
    q, d = torch.stack([A, A]), torch.stack([B, D])
    assert info_nce(q, d, pos, temperature=tau).item() == pytest.approx(2.018150, abs=1e-6)
    keys, query_keys = torch.tensor([KEY["B"], KEY["D"]]), torch.tensor([KEY["A"], KEY["A"]])
    assert info_nce(q, d, pos, keys, tau, query_keys).item() == 0.0
    # the same query text under two ids, or one id under two texts (case, punctuation), is one query
    assert info_nce(q, d, pos, keys, tau, torch.tensor([[5, 11], [1, 11]])).item() == 0.0
    assert info_nce(q, d, pos, keys, tau, torch.tensor([[1, 11], [1, 66]])).item() == 0.0
    assert info_nce(q, d, pos, keys, tau, torch.tensor([[5, 11], [1, 66]])).item() > 2  # two queries


def _reference(q, d, pos, keys, qkeys, tau, symmetric):
    """The loss written out query by query, in float64, from the rule in words (obliq/losses/masks.py notes)."""
    same = lambda a, b: any(x == y for x, y in zip(a, b))  # noqa: E731
    total, terms = 0.0, 0
    rows = range(len(pos))
    for i in rows:
        relevant = {int(pos[r]) for r in rows if same(qkeys[r], qkeys[i])}
        kept = [
            j
            for j in range(len(d))
            if j == pos[i] or not (same(keys[j], qkeys[i]) or any(same(keys[j], keys[p]) for p in relevant))
        ]
        logits = [float(q[i].double() @ d[j].double()) / tau for j in kept]
        total += -logits[kept.index(int(pos[i]))] + math.log(sum(math.exp(x) for x in logits))
        terms += 1
    loss = total / terms
    if not symmetric:
        return loss
    back = 0.0
    for i in rows:
        p = keys[int(pos[i])]
        kept = [
            r
            for r in rows
            if r == i or not (same(qkeys[r], p) or same(keys[int(pos[r])], p) or same(qkeys[r], qkeys[i]))
        ]
        logits = [float(d[int(pos[i])].double() @ q[r].double()) / tau for r in kept]
        back += -logits[kept.index(i)] + math.log(sum(math.exp(x) for x in logits))
    return (loss + back / len(pos)) / 2


@pytest.mark.parametrize("symmetric", [False, True])
def test_masks_and_the_symmetric_loss_match_a_brute_force_reference(symmetric):
    """Random batches with planted collisions (a query that is another row's positive or negative, rows
    sharing a query, shared positives) against the rule written out query by query in float64."""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        n, extra = 6, 5
        q = torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=-1)
        d = torch.nn.functional.normalize(torch.randn(n + extra, 8, generator=g), dim=-1)
        keys = torch.randint(100, 110, (n + extra, 2), generator=g)  # few values: many collisions
        qkeys = torch.randint(100, 110, (n, 2), generator=g)
        pos = torch.arange(n)
        view = StepView(positive_mask(pos, len(d)), pos, torch.arange(len(d)), keys, qkeys)
        got = (Symmetric(InfoNCE(0.1)) if symmetric else InfoNCE(0.1))(q, d, view).item()
        assert got == pytest.approx(_reference(q, d, pos, keys.tolist(), qkeys.tolist(), 0.1, symmetric), rel=1e-5)


@pytest.mark.parametrize("as_mask", [False, True])
def test_teacher_kl_stays_finite_when_a_teacher_probability_underflows(as_mask):
    """Issue 32's kept-back kind (a): teacher scores on a 0–100 scale at teacher τ 0.05 give exp(−2000) = 0 for
    the low grades in float64. The KL is finite and equals scipy's (rel_entr: 0 · log 0 = 0), and so is its
    gradient; written as p · (log p − log q) it was NaN. The same without the positives mask (its default) and
    with it (as :class:`obliq.losses.TeacherScores` passes the view's)."""
    import numpy as np
    from scipy.special import log_softmax, rel_entr, softmax

    from obliq.losses import positive_mask, teacher_distillation

    q = torch.nn.functional.normalize(torch.tensor([[1.0, 0.3]]), dim=-1).requires_grad_()
    d = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 1.0], [0.0, 1.0]]), dim=-1)
    grades = torch.tensor([[100.0, 0.0, 35.0]])
    positives = positive_mask(torch.tensor([0]), 3) if as_mask else None
    got = teacher_distillation(
        q, d, torch.tensor([0]), torch.tensor([0, 0, 0]), grades, "kl", 0.05, 0.05, positives=positives
    )
    p = softmax(grades[0].double().numpy() / 0.05)
    assert (p == 0).any()  # the teacher's probability underflows
    s = (d.double() @ q[0].detach().double()).numpy()
    expected = rel_entr(p, np.exp(log_softmax(s / 0.05))).sum()
    assert math.isfinite(got.item()) and got.item() == pytest.approx(expected, rel=1e-6)
    got.backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("as_mask", [False, True])
def test_teacher_distillation_against_hand_computed_values(as_mask):
    """Listwise KL and MarginMSE over each row's own candidates (its positive, then its negatives), written out
    with math: a row without scores is left out; NaN marks the negatives a row does not have. The same without
    the positives mask (its default) and with it (as :class:`obliq.losses.TeacherScores` passes the view's)."""
    from obliq.losses import positive_mask, teacher_distillation

    q = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2], [0.1, 1.0], [0.5, 0.5]]), dim=-1)
    d = torch.nn.functional.normalize(
        torch.tensor([[1, 0.0], [0, 1.0], [1, 1.0], [1, -1.0], [0.3, 1.0], [2, 1.0]]), dim=-1
    )
    pos, doc_row = torch.arange(3), torch.tensor([0, 1, 2, 0, 0, 1])  # row 0: negs 3, 4; row 1: neg 5; row 2: none
    t = torch.tensor([[0.9, 0.2, 0.5], [0.7, 0.6, float("nan")], [0.3, float("nan"), float("nan")]])
    tau, tau_t = 0.05, 0.1
    positives = positive_mask(pos, 6) if as_mask else None

    def cos(i, j):
        return float(q[i].double() @ d[j].double())

    expect_kl, expect_mm = [], []
    for i, cands in ((0, [0, 3, 4]), (1, [1, 5])):
        s = [cos(i, j) for j in cands]
        tt = t[i, : len(cands)].tolist()
        zt = sum(math.exp(x / tau_t) for x in tt)
        zs = sum(math.exp(x / tau) for x in s)
        p = [math.exp(x / tau_t) / zt for x in tt]
        expect_kl.append(sum(pj * (math.log(pj) - (sj / tau - math.log(zs))) for pj, sj in zip(p, s)))
        expect_mm.append(sum(((s[0] - s[m]) - (tt[0] - tt[m])) ** 2 for m in range(1, len(s))) / (len(s) - 1))
    got = teacher_distillation(q, d, pos, doc_row, t, "kl", tau, tau_t, positives=positives).item()
    assert got == pytest.approx(sum(expect_kl) / 2, rel=1e-5)
    got = teacher_distillation(q, d, pos, doc_row, t, "margin-mse", 0.05, 0.05, positives=positives).item()
    assert got == pytest.approx(sum(expect_mm) / 2, rel=1e-5)
    none = torch.full((3, 3), float("nan"))
    assert teacher_distillation(q, d, pos, doc_row, none, "kl", 0.05, 0.05, positives=positives).item() == 0.0
    with pytest.raises(ValueError, match="kl"):
        teacher_distillation(q, d, pos, doc_row, t, "mse", 0.05, 0.05)


def test_the_loss_protocol_itself_is_refused_as_a_loss():
    """``--model.loss=obliq.losses.Loss`` (jsonargparse offers the base class among the choices): refused as the
    protocol it is, not later for logging under the name a term would (issue 56 review)."""
    from obliq.losses import Loss

    with pytest.raises(TypeError, match=r"^obliq\.losses\.Loss is the protocol a main loss follows, not a loss"):
        Loss()
