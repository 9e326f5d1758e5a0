"""Issue 47 §2: InfoNCE over rows with several positives, in its two standard forms (MIL-NCE: the log of the
summed probability of a row's positives; SupCon: the mean of each positive's log-likelihood with the other
positives out of the denominator), checked in float64 against a reference written here from the definitions
(plain loops over rows, columns and keys), with its gradients, the in-batch false negatives of several
positives (a positive shared by two rows, two rows of one query, a query that is another row's document), the
symmetric direction, and under GradCache against one full-batch pass. Across two processes:
tests/test_logged_loss.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from support import lora_encoder

from obliq.losses import MILNCE, StepView, SupCon, Symmetric, info_nce, negatives_left, positive_mask
from obliq.model.gradcache import grad_cache_step

TAU = 0.1
# 4 rows, 11 documents. Row 0: positives 0, 4, 5; row 1: positive 1 and 6; row 2: positive 2; row 3: positive 3,
# 7, 8. Document 9 is a copy (same text key) of row 0's positive 5: a false negative of row 0 and of row 2
# (which has row 0's query); row 2's query is row 0's query (same key): row 0's positives are row 2's false
# negatives and the other way round. Row 3's query is document 10 (a passage↔passage row): masked for it.
DOC_ROW = [0, 1, 2, 3, 0, 0, 1, 3, 3, 1, 2]
POSITIVE = [True] * 4 + [True, True, True, True, True, False, False]
DOC_KEYS = [[100 + j, 200 + j] for j in range(11)]
DOC_KEYS[9][1] = DOC_KEYS[5][1]  # the same normalised text as document 5
QUERY_KEYS = [[300, 400], [301, 401], [300, 402], [110, 403]]  # row 2 shares row 0's query id; row 3 is document 10


FORMS = {"mil-nce": MILNCE, "supcon": SupCon}


def _loss(q, d, positives, keys, qkeys, form: str, symmetric: bool = False) -> torch.Tensor:
    """The loss of ``form`` (:class:`MILNCE` or :class:`SupCon`, made :class:`Symmetric` or not) at τ ``TAU`` over a
    view of these positives and keys."""
    positives = positive_mask(positives, len(d))
    view = StepView(positives, positives.to(torch.uint8).argmax(1), torch.arange(len(d)), keys, qkeys)
    loss = FORMS[form](TAU)
    return (Symmetric(loss) if symmetric else loss)(q, d, view)


def _positives() -> torch.Tensor:
    p = torch.zeros(4, 11, dtype=torch.bool)
    for j, (row, pos) in enumerate(zip(DOC_ROW, POSITIVE)):
        p[row, j] = pos
    return p


def _same(a, b) -> bool:
    return any(x == y for x, y in zip(a, b))


def _masked(i: int, j: int, positives) -> bool:
    """Forward: query i must not meet document j (its own positives never are)."""
    if positives[i][j]:
        return False
    if _same(QUERY_KEYS[i], DOC_KEYS[j]):
        return True
    for r in range(4):
        if _same(QUERY_KEYS[i], QUERY_KEYS[r]) and any(
            positives[r][p] and _same(DOC_KEYS[p], DOC_KEYS[j]) for p in range(11)
        ):
            return True
    return False


def _masked_back(p: int, i: int, r: int, positives) -> bool:
    """Reverse: document p, a positive of row i, must not meet query r."""
    if r == i:
        return False
    return (
        _same(DOC_KEYS[p], QUERY_KEYS[r])
        or _same(QUERY_KEYS[i], QUERY_KEYS[r])
        or any(positives[r][x] and _same(DOC_KEYS[x], DOC_KEYS[p]) for x in range(11))
    )


def _reference(q, d, positives, form: str, symmetric: bool) -> torch.Tensor:
    """The loss from its definition, one row and one column at a time, in float64 (autograd for gradients)."""
    q, d = q.double(), d.double()
    pos = positives.tolist()
    rows = []
    for i in range(4):
        s = [q[i] @ d[j] / TAU for j in range(11)]
        own = [j for j in range(11) if pos[i][j]]
        negatives = [j for j in range(11) if not pos[i][j] and not _masked(i, j, pos)]
        if form == "mil-nce":
            num = torch.log(sum(torch.exp(s[j]) for j in own))
            den = torch.log(sum(torch.exp(s[j]) for j in own + negatives))
            rows.append(den - num)
        else:
            each = [-(s[p] - torch.log(torch.exp(s[p]) + sum(torch.exp(s[n]) for n in negatives))) for p in own]
            rows.append(sum(each) / len(each))
    loss = sum(rows) / 4
    if not symmetric:
        return loss
    back = []
    for i in range(4):
        each = []
        for p in (j for j in range(11) if pos[i][j]):
            t = [d[p] @ q[r] / TAU for r in range(4)]
            kept = [r for r in range(4) if not _masked_back(p, i, r, pos)]
            each.append(-(t[i] - torch.log(sum(torch.exp(t[r]) for r in kept))))
        back.append(sum(each) / len(each))
    return (loss + sum(back) / 4) / 2


def _vectors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(4, 16, generator=g, dtype=torch.float64), dim=-1)
    d = F.normalize(torch.randn(11, 16, generator=g, dtype=torch.float64), dim=-1)
    return q, d


@pytest.mark.parametrize("form", ["mil-nce", "supcon"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_both_forms_equal_a_float64_reference_with_gradients(form, symmetric):
    q, d = _vectors()
    q.requires_grad_(True), d.requires_grad_(True)
    keys, qkeys, positives = torch.tensor(DOC_KEYS), torch.tensor(QUERY_KEYS), _positives()
    # the example's masks at work (module notes): row 0 loses 2 and 9, row 2 loses 0, 4, 5, 9, row 3 loses 10
    assert negatives_left(positives, keys, qkeys).tolist() == [6, 9, 6, 7]
    got = _loss(q, d, positives, keys, qkeys, form, symmetric)
    gq, gd = torch.autograd.grad(got, (q, d))
    want = _reference(q, d, positives, form, symmetric)
    rq, rd = torch.autograd.grad(want, (q, d))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)  # the loss is returned in float32
    assert torch.allclose(gq, rq, rtol=1e-6, atol=1e-9) and torch.allclose(gd, rd, rtol=1e-6, atol=1e-9)
    assert want.item() > 0.1  # the example is not degenerate


def test_the_two_forms_differ_with_several_positives_and_agree_with_one():
    q, d = _vectors(1)
    keys, qkeys = torch.tensor(DOC_KEYS), torch.tensor(QUERY_KEYS)
    several = _positives()
    mil, sup = (_loss(q, d, several, keys, qkeys, f).item() for f in ("mil-nce", "supcon"))
    assert abs(mil - sup) > 1e-3
    one = torch.tensor([0, 1, 2, 3])  # one positive a row: both are sentence-transformers' MNRL, masks included
    mil, sup = (_loss(q, d, one, keys, qkeys, f).item() for f in ("mil-nce", "supcon"))
    assert mil == pytest.approx(sup, rel=1e-12)
    assert mil == pytest.approx(_reference(q, d, F.one_hot(one, 11).bool(), "mil-nce", False).item(), rel=1e-6)


def test_a_row_without_negatives_adds_zero_and_a_finite_gradient():
    """Two rows of one query whose documents are all their positives: nothing left to contrast (C05's right value)."""
    q, d = _vectors(2)
    q, d = q[:2].clone().requires_grad_(True), d[:4].clone().requires_grad_(True)
    positives = torch.tensor([[True, False, True, False], [False, True, False, True]])
    keys, qkeys = torch.arange(4), torch.tensor([7, 7])
    assert negatives_left(positives, keys, qkeys).tolist() == [0, 0]
    for form in ("mil-nce", "supcon"):
        loss = _loss(q, d, positives, keys, qkeys, form)
        loss.backward()
        assert loss.item() == 0.0 and torch.isfinite(q.grad).all() and torch.isfinite(d.grad).all()
        assert q.grad.abs().max() == 0.0
        q.grad = d.grad = None


def test_a_positive_shared_by_two_rows_is_neither_rows_negative():
    """Rows 0 and 1 (other queries) each hold a copy of one document among their positives: for each, the other
    row's copy is a copy of its own positive, left out; so are its own other positives under SupCon."""
    q, d = _vectors(3)
    positives = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 1, 0]], dtype=torch.bool)
    keys = torch.tensor([[1, 11], [2, 12], [3, 13], [4, 13], [5, 15]])  # documents 2 and 3: one text
    for form in ("mil-nce", "supcon"):
        got = _loss(q[:2], d[:5], positives, keys, torch.tensor([[90, 91], [92, 93]]), form)
        # the same loss as a batch where each row's copy of the shared text is absent from the other row
        s = q[:2] @ d[:5].T / TAU
        if form == "mil-nce":
            r0 = torch.logsumexp(s[0, [0, 1, 2, 4]], 0) - torch.logsumexp(s[0, [0, 2]], 0)
            r1 = torch.logsumexp(s[1, [0, 1, 3, 4]], 0) - torch.logsumexp(s[1, [1, 3]], 0)
        else:
            r0 = sum(torch.logsumexp(s[0, [p, 1, 4]], 0) - s[0, p] for p in (0, 2)) / 2
            r1 = sum(torch.logsumexp(s[1, [p, 0, 4]], 0) - s[1, p] for p in (1, 3)) / 2
        assert got.item() == pytest.approx(((r0 + r1) / 2).item(), rel=1e-6)


def test_the_module_reads_several_positives_from_a_batch_view():
    """StepView.of: a batch's doc_row and doc_positive give each row's positives; each form over it equals the
    reference."""
    q, d = _vectors(4)
    batch = {
        "positive_index": torch.arange(4),
        "doc_row": torch.tensor(DOC_ROW),
        "doc_positive": torch.tensor(POSITIVE),
        "doc_keys": torch.tensor(DOC_KEYS),
        "query_keys": torch.tensor(QUERY_KEYS),
    }
    view = StepView.of(batch)
    assert torch.equal(view.positives, _positives())
    for form in ("mil-nce", "supcon"):
        got = Symmetric(FORMS[form](TAU))(q, d, view)
        assert got.item() == pytest.approx(_reference(q, d, _positives(), form, True).item(), rel=1e-6)


def test_bad_positive_masks_are_refused():
    q, d = _vectors()
    with pytest.raises(ValueError, match="row 1 has no positive"):
        info_nce(q[:2], d[:3], torch.tensor([[True, False, False], [False, False, False]]))
    with pytest.raises(ValueError, match="document 0 is the positive of two rows"):
        info_nce(q[:2], d[:3], torch.tensor([[True, False, False], [True, True, False]]))
    with pytest.raises(ValueError, match=r"InfoNCE takes one positive a row: row 0 has 2 .*obliq\.losses\.MILNCE"):
        info_nce(q[:2], d[:3], torch.tensor([[True, True, False], [False, False, True]]))


@pytest.mark.parametrize("form", ["mil-nce", "supcon"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_gradcache_with_several_positives_equals_one_full_batch_pass(tiny_llama_dir, form, chunk):
    """A GradCache step (chunks of 1 and 3) over a batch with several positives a row gives the loss and every
    LoRA gradient of one forward/backward over the whole batch."""
    enc = lora_encoder(tiny_llama_dir).eval()
    queries = ["who wrote this", "a proof by cases", "a stance on taxes", "the dodge"]
    docs = [f"document {j} about {w}" for j, w in enumerate("abcdefghijk")]
    view = StepView.of(
        {
            "positive_index": torch.arange(4),
            "doc_row": torch.tensor(DOC_ROW),
            "doc_positive": torch.tensor(POSITIVE),
            "doc_keys": torch.tensor(DOC_KEYS),
            "query_keys": torch.tensor(QUERY_KEYS),
        }
    )
    loss = Symmetric(FORMS[form](0.05))
    qt, dt = enc.tokenize(queries, "query"), enc.tokenize(docs, "passage")
    cached = grad_cache_step(enc, qt, dt, lambda q, d: loss(q, d, view), chunk)
    grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.requires_grad}
    enc.zero_grad(set_to_none=True)
    full = loss(enc(qt), enc(dt), view)
    full.backward()
    assert cached.item() == pytest.approx(full.item(), rel=1e-6) and math.isfinite(full.item())
    for name, p in enc.named_parameters():
        if p.requires_grad:
            assert (grads[name] - p.grad).norm() <= 1e-5 * p.grad.norm() + 1e-10, name
