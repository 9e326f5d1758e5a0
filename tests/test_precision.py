"""C21: fp16 mixed precision under the manual GradCache step, through Lightning's GradScaler path (on
the CPU), against the plain PyTorch AMP recipe: scale → backward → unscale → clip → step → update."""

from __future__ import annotations

import copy
import csv

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.precision import MixedPrecision

from obliq.data.collate import Collator
from obliq.data.rows import RowCaps, parse_row
from obliq.losses import InfoNCE, StepView
from obliq.model import BiEncoder, LoraSettings
from obliq.model.module import RetrieverModule

QUERIES = [
    "how many primes below twenty",
    "a ball thrown upward",
    "count the ways to seat five people",
    "the area under a curve",
]
DOCS = [
    "Find the number of prime numbers less than 20.",
    "A projectile is launched vertically at 10 m/s.",
    "In how many ways can 5 guests sit at a round table?",
    "Integrate x squared from 0 to 3.",
]


def _batch(encoder: BiEncoder) -> dict:
    rows = [
        parse_row(
            f'{{"id": "r{i}", "task": "t", "source": "public", "query": "{q}", '
            f'"positive": {{"id": "d{i}", "text": "{d}"}}, "negatives": []}}',
            "rows",
            i + 1,
        )
        for i, (q, d) in enumerate(zip(QUERIES, DOCS))
    ]
    return Collator(encoder.text, RowCaps(max_negatives=0))(rows)


def _lora(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" in n}


def _fit(encoder, tmp_path, steps, init_scale, max_grad_norm=1.0):
    module = RetrieverModule(
        copy.deepcopy(encoder),
        InfoNCE(temperature=0.05),
        chunk_size=None,
        lr=1e-3,
        warmup_ratio=0.0,
        max_grad_norm=max_grad_norm,
        seed=3,
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler)],
        logger=CSVLogger(tmp_path, name="log"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    batch = _batch(module.encoder)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader([batch] * steps, batch_size=None))
    return module, scaler


def _recipe(encoder, steps, init_scale, max_grad_norm=1.0):
    """The PyTorch AMP recipe by hand, one plain forward per side (GradCache with one chunk is that)."""
    enc = copy.deepcopy(encoder)
    params = [p for p in enc.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    loss_fn, batch = InfoNCE(0.05, gather_across_devices=False), _batch(enc)
    view = StepView.of({"positive_index": batch["positive_index"], "doc_keys": batch["doc_keys"]})
    first_real, norms = None, []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(3 * 1_000_003 + step)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(enc(batch["query"]), enc(batch["docs"]), view)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)))
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() >= before and first_real is None:
            first_real = step
    return enc, first_real, norms


def _encoder(backbone: str) -> BiEncoder:
    torch.manual_seed(0)
    enc = BiEncoder(backbone, lora=LoraSettings(r=4, alpha=8, dropout=0.0), query_max_length=24, passage_max_length=24)
    with torch.no_grad():  # a "trained" adapter, so the first step's update is not lr-only
        for name, p in enc.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    for m in enc.modules():  # no dropout: both paths compute exactly the same thing
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.0
    return enc


@pytest.fixture(scope="module")
def encoder(minilm_path):
    """MiniLM with LoRA r4, the case's model."""
    return _encoder(minilm_path)


@pytest.mark.slow
def test_c21_the_first_fp16_step_is_the_amp_recipes_and_its_norm_is_unscaled(encoder, tmp_path):
    start = _lora(encoder)
    module, scaler = _fit(encoder, tmp_path, steps=1, init_scale=2.0**10)
    reference, first_real, norms = _recipe(encoder, steps=1, init_scale=2.0**10)
    assert first_real == 0 and module.overflow_steps == 0 and module.bad_steps == 0
    ours, theirs = _lora(module.encoder), _lora(reference)
    update = sum(float((ours[k] - start[k]).norm()) for k in start)  # the case's measure: Σ ‖ΔW‖
    expected = sum(float((theirs[k] - start[k]).norm()) for k in start)
    assert update > 0 and update == pytest.approx(expected, abs=1e-4)
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in start) < 1e-4
    logged = [
        float(r["train/grad_norm"])
        for r in csv.DictReader(open(next(tmp_path.rglob("metrics.csv"))))
        if r.get("train/grad_norm")
    ]
    assert logged == pytest.approx(norms, rel=1e-3)  # the unscaled norm, not 2^10 times it
    assert logged[0] < 1e3  # and far below what a scaled norm would read


@pytest.mark.slow
def test_c21_a_huge_initial_scale_backs_off_and_training_proceeds(tiny_llama_dir, tmp_path):
    """2^40 overflows fp16: the scaler skips and halves until the gradients fit, exactly as the
    recipe does; no skipped step counts as a bad one, and the run does not stop. (A tiny Llama
    through the same path, so that the ~30 skipped steps stay quick.)"""
    encoder = _encoder(tiny_llama_dir)
    start = _lora(encoder)
    steps = 40
    module, scaler = _fit(encoder, tmp_path, steps=steps, init_scale=2.0**40)
    _, first_real, _ = _recipe(encoder, steps=steps, init_scale=2.0**40)
    assert first_real is not None and 0 < first_real < steps
    assert module.overflow_steps == first_real and module.bad_steps == 0
    assert scaler.get_scale() == 2.0 ** (40 - first_real)  # halved once per skipped step
    scheduler = module.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == steps - first_real  # the schedule advanced on applied steps only
    assert any(not torch.equal(v, _lora(module.encoder)[k]) for k, v in start.items())  # it trained
