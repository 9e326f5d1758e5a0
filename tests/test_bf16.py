"""bf16-mixed (Lightning's CPU autocast, the 3B recipe's precision) on the recipe's backbone replica with bfloat16
weights (issue 54 §3): what must stay float32 does, on the real tensors of a real Lightning step, and GradCache under
autocast gives the full batch's loss and gradient. The recipe itself runs at bf16-mixed in tests/test_recipe_3b.py.

The tolerances: a plain pass over the *same chunks* under autocast (its weight cache off, as GradCache's) does the
same arithmetic as GradCache, so they agree to float32's rounding (1e-6). One pass over the *whole batch* rounds
differently: its weight gradients are one bf16 matmul over all rows (GradCache sums each chunk's in float32), and its
rows are padded to the batch's longest, not the chunk's (other kernel shapes, other bf16 roundings). So the loss agrees
to 4 units of bf16's rounding u = 2^-8 (relative; measured 0.1%), and the gradients to 16u = 6.25% (measured
0.8-1.8% on two sets of texts), of the order of bf16's own distance from the float32 step (measured 2.3-2.6%, printed
beside it). A GradCache fault (a chunk's gradient lost or counted twice, another scale) is tens of percent.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support import save_published_replica

from obliq.losses import InfoNCE, StepView
from obliq.model import BiEncoder, LoraSettings
from obliq.model.gradcache import grad_cache_step, split

QUERIES = [
    "how many primes lie below fifty",
    "the speaker refuses to take a side",
    "prose in a clipped, ironic register",
    "a ball dropped from a tower",
]
POSITIVES = [
    "Count the prime numbers smaller than 50.",
    "Neither position is one I will defend today.",
    "He said little. What he said, he regretted, briefly and with some style, at great length afterwards.",
    "An object falls freely from a height of 80 m.",
]
NEGATIVES = ["a recipe for bread", "tomorrow brings rain", "the match ended in a draw", "shares fell on Monday"]
BF16 = {"device_type": "cpu", "dtype": torch.bfloat16}
U = 2.0**-8
"""bf16's unit roundoff (8 significant bits)."""


@pytest.fixture(scope="module")
def replica(tmp_path_factory, smollm2_path) -> str:
    """The 3B recipe's backbone at small size (tests/support.py: the published config, 2 layers)."""
    folder = tmp_path_factory.mktemp("bf16") / "llama-nv-embed-reasoning-3b"
    return save_published_replica(folder, "nvidia/llama-nv-embed-reasoning-3b", smollm2_path)


def _encoder(path: str, dtype: str, dropout: float) -> BiEncoder:
    """The recipe's LoRA (r 16, α 32) with B drawn from N(0, 0.05) (seed 0), so that A's gradient is not 0."""
    torch.manual_seed(0)
    enc = BiEncoder(path, lora=LoraSettings(r=16, alpha=32, dropout=dropout), dtype=dtype)
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return enc.train()


def _loss_fn():
    loss = InfoNCE(temperature=0.02)
    view = StepView.of({"positive_index": torch.arange(4), "doc_keys": torch.arange(8)})
    return lambda q, d: loss(q, d, view)


def _grads(enc) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in enc.named_parameters() if p.requires_grad}


def _worst(got: dict, ref: dict) -> float:
    assert got.keys() == ref.keys() and ref
    return max(float((got[n] - ref[n]).norm() / ref[n].norm()) for n in ref)


def _cached(enc, chunk, seed=7):
    enc.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    q, d = enc.tokenize(QUERIES, "query"), enc.tokenize(POSITIVES + NEGATIVES, "passage")
    with torch.autocast(**BF16):
        loss = grad_cache_step(enc, q, d, _loss_fn(), chunk)
    return loss, _grads(enc)


def _plain(enc, chunk, seed=7, autocast=True):
    """Plain autograd over ``chunk``-row passes (None: the whole batch), under autocast with its weight cache off
    (GradCache's, :func:`obliq.model.gradcache._autocast_without_cache`), or in float32."""
    enc.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    q, d = enc.tokenize(QUERIES, "query"), enc.tokenize(POSITIVES + NEGATIVES, "passage")
    with torch.autocast(**BF16, cache_enabled=False, enabled=autocast):
        qs = torch.cat([enc(c) for c in split(q, chunk)])
        ds = torch.cat([enc(c) for c in split(d, chunk)])
        loss = _loss_fn()(qs, ds)
    loss.backward()
    return loss.detach(), _grads(enc)


@pytest.mark.slow
def test_gradcache_under_bf16_autocast_equals_a_plain_pass_over_its_chunks(replica):
    """With the recipe's LoRA dropout (0.05) the reference is plain autograd over the same chunks from the same
    seed, under the same autocast: the same loss, every LoRA gradient within 1e-6. The control: cached gradients
    rounded to bf16 (what an autocast loss would hand back) differ by more."""
    enc = _encoder(replica, "bfloat16", dropout=0.05)
    for chunk in (1, 3):
        ref_loss, ref = _plain(enc, chunk)
        loss, got = _cached(enc, chunk)
        assert loss.dtype == torch.float32 and loss.item() == ref_loss.item()
        assert _worst(got, ref) <= 1e-6, (chunk, _worst(got, ref))
    from obliq.model import gradcache

    grad = torch.autograd.grad

    def rounded(outputs, inputs, **kw):
        return tuple(g.to(torch.bfloat16).float() for g in grad(outputs, inputs, **kw))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gradcache.torch.autograd, "grad", rounded)
        _, got = _cached(enc, 3)
    assert _worst(got, ref) > 1e-4


@pytest.mark.slow
def test_gradcache_under_bf16_autocast_equals_the_full_batch(replica):
    """Without dropout, against one pass over the whole batch under autocast: the loss within 4u and every LoRA
    gradient within 16u, relative (module notes); bf16's own distance from the float32 step is printed beside."""
    enc = _encoder(replica, "bfloat16", dropout=0.0)
    full_loss, full = _plain(enc, None)
    fp32_loss, fp32 = _plain(_encoder(replica, "float32", dropout=0.0), None, autocast=False)
    own = _worst(full, fp32)
    for chunk in (1, 3):
        loss, got = _cached(enc, chunk)
        worst, far = _worst(got, full), _worst(got, fp32)
        print(f"chunk {chunk}: GradCache vs full batch under bf16: loss {loss.item():.5f} vs {full_loss.item():.5f}, "
              f"gradients {worst:.4f}; from float32: GradCache {far:.4f}, the full batch {own:.4f}")  # fmt: skip
        assert abs(loss.item() - full_loss.item()) <= 4 * U * abs(full_loss.item()), chunk
        assert worst <= 16 * U, (chunk, worst, own)
    assert abs(full_loss.item() - fp32_loss.item()) <= 1e-2 * abs(fp32_loss.item())


@pytest.mark.slow
def test_a_bf16_mixed_step_keeps_pooling_norms_similarities_loss_and_cached_gradients_in_float32(
    replica, monkeypatch, tmp_path
):
    """One real Lightning step at ``precision="bf16-mixed"`` (the recipe's), bfloat16 weights, GradCache chunks of
    2 sorted by length. On the tensors of that step: the backbone's hidden states are bf16 (autocast is on); the
    pooled vectors are float32 and equal a float64 masked mean and L2 norm of those hidden states to 1e-6 (a sum or
    norm taken in bf16 misses by ~1e-3), unit length to 1e-6; the loss's scores are float64 q·d/τ of the float32
    vectors; the loss is float32 and equals the float64 loss of the same vectors; GradCache's cached gradients
    (the loss's gradient with respect to the vectors) are float32 and equal the float64 gradient to 1e-5; every
    LoRA gradient is float32."""
    from lightning.pytorch import Trainer

    from obliq.data.collate import Collator
    from obliq.data.rows import RowCaps, parse_row
    from obliq.losses import infonce
    from obliq.model import encoder as encoder_module
    from obliq.model import module as module_module
    from obliq.model.module import RetrieverModule

    seen = {"pool": [], "scores": [], "objective": [], "grads": [], "lora": []}
    pool = encoder_module.mean_pool

    def pooled(hidden, mask):
        out = pool(hidden, mask)
        h, m = hidden.detach().double(), mask.double().unsqueeze(-1)
        expect = F.normalize((h * m).sum(1) / m.sum(1), dim=-1)
        seen["pool"].append((hidden.dtype, out.dtype, float((out.detach().double() - expect).abs().max()),
                             float((out.detach().double().norm(dim=-1) - 1).abs().max())))  # fmt: skip
        return out

    scored = infonce.scored

    def scores(queries, docs, view, temperature):
        s = scored(queries, docs, view, temperature)
        expect = queries.detach().double() @ docs.detach().double().T / temperature
        seen["scores"].append((queries.dtype, s.scores.dtype, float((s.scores.detach() - expect).abs().max())))
        return s

    step = module_module.grad_cache_step

    def cached(encode, queries, docs, loss_fn, *args, **kwargs):
        def objective(q, d):
            loss = loss_fn(q, d)
            q.register_hook(lambda g: seen["grads"].append(("q", g.dtype, g.detach().clone())))
            d.register_hook(lambda g: seen["grads"].append(("d", g.dtype, g.detach().clone())))
            seen["objective"].append((q.detach().clone(), d.detach().clone(), loss.dtype, loss.detach()))
            return loss

        loss = step(encode, queries, docs, objective, *args, **kwargs)
        seen["loss_fn"] = loss_fn
        return loss

    monkeypatch.setattr(encoder_module, "mean_pool", pooled)
    monkeypatch.setattr(infonce, "scored", scores)
    monkeypatch.setattr(module_module, "grad_cache_step", cached)

    enc = _encoder(replica, "bfloat16", dropout=0.05)
    module = RetrieverModule(enc, InfoNCE(temperature=0.02), chunk_size=2, lr=1e-3, warmup_ratio=0.0, seed=3)
    rows = [
        parse_row(
            f'{{"id": "r{i}", "task": "t", "source": "public", "query": "{q}", '
            f'"positive": {{"id": "d{i}", "text": "{p}"}}, "negatives": [{{"id": "n{i}", "text": "{n}"}}]}}',
            "rows",
            i + 1,
        )
        for i, (q, p, n) in enumerate(zip(QUERIES, POSITIVES, NEGATIVES))
    ]
    batch = Collator(enc.text, RowCaps(max_negatives=1))(rows)
    clip = module._clip  # called after the GradCache step, before the optimizer's

    def clip_after_reading_the_gradients():
        seen["lora"] = [(n, p.grad.dtype) for n, p in module.encoder.named_parameters() if p.grad is not None]
        return clip()

    monkeypatch.setattr(module, "_clip", clip_after_reading_the_gradients)
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=1,
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader([batch], batch_size=None))
    assert trainer.global_step == 1 and module.bad_steps == 0

    assert len(seen["pool"]) >= 6  # 2 query chunks and 4 document chunks, at least once each
    for hidden_dtype, out_dtype, err, norm_err in seen["pool"]:
        assert hidden_dtype == torch.bfloat16  # autocast is on: the test sees bf16 where bf16 is meant
        assert out_dtype == torch.float32 and err <= 1e-6 and norm_err <= 1e-6, (err, norm_err)
    # similarities: of float32 vectors, in float64
    [(vector_dtype, score_dtype, err)] = seen["scores"]
    assert vector_dtype == torch.float32 and score_dtype == torch.float64 and err <= 1e-9
    # the loss and the cached gradients, against float64 outside autocast
    [(q, d, loss_dtype, loss)] = seen["objective"]
    assert q.dtype == d.dtype == torch.float32 and loss_dtype == torch.float32
    q64, d64 = q.double().requires_grad_(), d.double().requires_grad_()
    view = StepView.of(batch)
    expect = InfoNCE(temperature=0.02)(q64, d64, view)
    assert abs(loss.double().item() - expect.item()) <= 1e-6 * abs(expect.item())
    gq, gd = torch.autograd.grad(expect, [q64, d64])
    grads = {side: (dtype, g) for side, dtype, g in seen["grads"]}
    assert grads.keys() == {"q", "d"}
    for side, ref in (("q", gq), ("d", gd)):
        dtype, g = grads[side]
        assert dtype == torch.float32
        assert float((g.double() - ref).norm()) <= 1e-5 * float(ref.norm()), side
    # the parameters' gradients (peft keeps LoRA in float32)
    assert seen["lora"] and all(dtype == torch.float32 for _, dtype in seen["lora"])
    assert all("lora_" in n for n, _ in seen["lora"])
