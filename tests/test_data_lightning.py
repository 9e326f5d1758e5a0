"""The DataModule under a real Lightning Trainer: a fit stopped at step k and resumed from its
checkpoint sees exactly the batches of an uninterrupted fit (mid-epoch and at epoch boundaries)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from support import task_rows, write_rows

from obliq.data import Source, TrainingDataModule


class Tiny(L.LightningModule):
    """A bag-of-embeddings bi-encoder with in-batch InfoNCE; records the row ids of every step."""

    def __init__(self, tokenize):
        super().__init__()
        self.tok = tokenize
        self.emb = torch.nn.EmbeddingBag(1024, 8, mode="mean", padding_idx=0)  # token ids mod 1024; BERT pads with 0
        self.seen: list[list[str]] = []

    def setup(self, stage):
        self.trainer.datamodule.tokenize = self.tok  # the wiring obliq's LightningModule uses

    def training_step(self, batch, batch_idx):
        self.seen.append(list(batch["row_ids"]))
        q = F.normalize(self.emb(batch["query"]["input_ids"] % 1024), dim=-1)
        d = F.normalize(self.emb(batch["docs"]["input_ids"] % 1024), dim=-1)
        return F.cross_entropy(q @ d.T / 0.05, batch["positive_index"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tokenize, sources, index_dir, ckpt_dir=None, max_steps=-1, ckpt_path=None):
    dm = TrainingDataModule(sources, batch_size=8, num_workers=2, seed=2, index_dir=index_dir)
    model = Tiny(tokenize)
    callbacks = (
        []
        if ckpt_dir is None
        else [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=max_steps, save_top_k=-1, filename="{step}")]
    )
    trainer = L.Trainer(
        max_epochs=2,
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model.seen, dm


@pytest.fixture
def one_thread():
    # The model is tiny: intra-op threads only add contention on a shared CPU.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.distributed
def test_trainer_fit_stopped_and_resumed_sees_the_same_batches(tasks_dir, tokenize, tmp_path, one_thread):
    stance = task_rows(tasks_dir, "stance-tweets", 130)
    sources = [
        Source(str(write_rows(tmp_path / "a.jsonl", stance[:70]))),
        Source(str(write_rows(tmp_path / "b.jsonl", stance[70:130])), count=25),
        Source(str(write_rows(tmp_path / "c.jsonl", task_rows(tasks_dir, "math-theoremqa", 30))), weight=1.0),
    ]
    index = str(tmp_path / "index")
    whole, dm = _fit(tokenize, sources, index)
    steps = dm.plan.steps_per_epoch
    assert len(whole) == 2 * steps and steps == 16  # 125 rows, 8 per step
    for k in (3, steps, steps + 2):
        ckpt_dir = tmp_path / f"ckpt{k}"
        head, _ = _fit(tokenize, sources, index, ckpt_dir=ckpt_dir, max_steps=k)
        ckpt = ckpt_dir / f"step={k}.ckpt"
        state = torch.load(ckpt, weights_only=True)
        loader_state = state["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert len(loader_state) == 1  # Lightning saved the StatefulDataLoader's state ...
        assert state["TrainingDataModule"]["stats"]["rows_per_epoch"] == 125  # ... and the DataModule's counts
        tail, _ = _fit(tokenize, sources, index, ckpt_path=str(ckpt))
        assert len(head) == k
        assert head + tail == whole, k


def test_lightning_ddp_leaves_the_plan_sampler_in_place(tasks_dir, tokenize, tmp_path):
    # Under DDP Lightning replaces a map-style loader's sampler by a DistributedSampler unless it
    # already is one; the plan shards by rank itself, so it must be left alone. (A 2-process
    # ddp_spawn fit is too slow for the suite; this checks the decision Lightning takes there.)
    from lightning.pytorch.trainer.states import RunningStage

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False)
    assert trainer._accelerator_connector.is_distributed
    prepare = trainer._data_connector._prepare_dataloader
    plain = torch.utils.data.DataLoader(list(range(10)), batch_size=2)
    assert isinstance(
        prepare(plain, shuffle=True, mode=RunningStage.TRAINING).sampler, torch.utils.data.DistributedSampler
    )
    dm = TrainingDataModule(
        [Source(str(write_rows(tmp_path / "a.jsonl", task_rows(tasks_dir, "stance-tweets", 40))))],
        batch_size=8,
        num_workers=0,
        index_dir=str(tmp_path / "index"),
        tokenize=tokenize,
    )
    loader = dm.make_dataloader(rank=1, world_size=2)
    prepared = prepare(loader, shuffle=True, mode=RunningStage.TRAINING)
    assert prepared is loader and prepared.sampler.rank == 1 and len(prepared) == 3
