"""Cross-device negatives: 2 gloo processes under DDP + GradCache give the loss and gradients of one
process over the concatenated batch."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from obliq.loss import InfoNCELoss
from obliq.model import BiEncoder, LoraSettings
from obliq.model.gradcache import grad_cache_step

# Per rank: 2 queries, docs = [2 positives, 2 negatives]. Rank 1's first positive is rank 0's
# first positive (same id): masked as a negative across ranks too (C05).
SHARDS = [
    {"q": ["query about style", "query about proofs"], "d": ["doc A", "doc B", "neg C", "neg D"],
     "ids": [1, 2, 3, 4]},
    {"q": ["another style query", "a dodge in a hearing"], "d": ["doc A", "doc F", "neg G", "neg H"],
     "ids": [1, 6, 7, 8]},
]


def _encoder(path):
    torch.manual_seed(0)
    enc = BiEncoder(path, lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return enc.eval()  # no dropout: the two setups then draw nothing at random


def _worker(rank, path, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        enc = _encoder(path)
        ddp = torch.nn.parallel.DistributedDataParallel(enc)
        shard = SHARDS[rank]
        loss_fn = InfoNCELoss(temperature=0.05)
        keys = torch.tensor(shard["ids"])
        loss = grad_cache_step(
            ddp, enc.tokenize(shard["q"], "query"), enc.tokenize(shard["d"], "passage"),
            lambda q, d: loss_fn(q, d, torch.arange(2), keys), chunk_size=1,
            no_sync=ddp.no_sync, backward_scale=loss_fn.backward_scale,
        )
        grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.requires_grad}
        torch.save({"loss": loss, "grads": grads}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
def test_two_processes_equal_one_process_with_the_concatenated_batch(tiny_llama_dir, tmp_path):
    mp.spawn(_worker, args=(tiny_llama_dir, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    enc = _encoder(tiny_llama_dir)
    q = enc(enc.tokenize(SHARDS[0]["q"] + SHARDS[1]["q"], "query"))
    d = enc(enc.tokenize(SHARDS[0]["d"] + SHARDS[1]["d"], "passage"))
    keys = torch.tensor(SHARDS[0]["ids"] + SHARDS[1]["ids"])
    loss = InfoNCELoss(temperature=0.05, gather_across_devices=False)(q, d, torch.tensor([0, 1, 4, 5]), keys)
    loss.backward()
    ref = {n: p.grad for n, p in enc.named_parameters() if p.requires_grad}

    for r in ranks:
        assert r["loss"].item() == pytest.approx(loss.item(), rel=1e-6)
        for name, g in ref.items():
            assert (r["grads"][name] - g).norm() <= 1e-5 * g.norm() + 1e-10, name


def test_fsdp_units_never_mix_lora_and_frozen_weights(tiny_llama_dir, tmp_path):
    """Every FSDP2 unit holds only trainable (LoRA) or only frozen parameters; the blocks' LoRA
    weights form one unit per block."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from obliq.model.sharding import shard_encoder

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        enc = BiEncoder(tiny_llama_dir, lora=LoraSettings(r=4, alpha=8))
        trainable = sum(p.numel() for p in enc.parameters() if p.requires_grad)
        total = sum(p.numel() for p in enc.parameters())
        units = shard_encoder(enc, init_device_mesh("cpu", (1,)))
        groups = []
        for module in enc.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group  # FSDP2's unit (private API)
                if group is not None and group not in groups:
                    groups.append(group)
        kinds = [{p.sharded_param.requires_grad for p in g.fsdp_params} for g in groups]
        assert all(len(k) == 1 for k in kinds)
        assert sum(k == {True} for k in kinds) == 2 and sum(k == {False} for k in kinds) == 3  # 2 blocks + rest
        assert [k for k, _ in units] == ["trainable", "frozen"] * 2 + ["frozen"]
        assert sum(n for k, n in units if k == "trainable") == trainable
        assert sum(n for _, n in units) == total
    finally:
        dist.destroy_process_group()
