"""Two CPU processes (gloo): cross-device negatives under DDP + GradCache give the loss and gradients of one
process over the concatenated batch; ranks sharing the encoding give one process's run; training under DDP and
FSDP2 (evaluation callback, whole-adapter checkpoints, resume); evaluate.py under torchrun. Every check that
needs two processes reads the outputs of ONE torchrun launch (the ``torchrun_launch`` fixture): a process start
costs more than all of these tiny models' work."""

import pytest
import torch
import torch.distributed as dist
from support import lora_encoder, lora_weights

from obliq.losses import InfoNCE, StepView, Symmetric
from obliq.model import BiEncoder, LoraSettings

SYMMETRIC = {
    "class_path": "obliq.losses.Symmetric",
    "init_args": {"loss": {"class_path": "obliq.losses.InfoNCE", "init_args": {"temperature": 0.05}}},
}
# Per rank: 2 queries, docs = [2 positives, 2 negatives]. Rank 1's first positive is rank 0's
# first positive (same id): masked as a negative across ranks too (C05). Rank 1's first query is rank
# 0's document "neg C" (id 3: a passage↔passage row), and its second query is rank 0's first query
# (id 11): masked across ranks too, in both directions of the symmetric loss (C34).
SHARDS = [
    {
        "q": ["query about style", "query about proofs"],
        "d": ["doc A", "doc B", "neg C", "neg D"],
        "ids": [1, 2, 3, 4],
        "qids": [11, 12],
    },
    {
        "q": ["another style query", "a dodge in a hearing"],
        "d": ["doc A", "doc F", "neg G", "neg H"],
        "ids": [1, 6, 7, 8],
        "qids": [3, 11],
    },
]


@pytest.mark.distributed
@pytest.mark.slow
def test_two_processes_equal_one_process_with_the_concatenated_batch(torchrun_launch, tiny_llama_dir):
    """support.gloo_grad_cache_worker on each of the launch's 2 processes (a GradCache step under DDP on its
    shard of SHARDS, symmetric InfoNCE at temperature 0.05) against one process over the concatenated batch."""
    ranks = [torch.load(torchrun_launch / "gradcache" / f"rank{r}.pt", weights_only=True) for r in range(2)]

    enc = lora_encoder(tiny_llama_dir).eval()
    q = enc(enc.tokenize(SHARDS[0]["q"] + SHARDS[1]["q"], "query"))
    d = enc(enc.tokenize(SHARDS[0]["d"] + SHARDS[1]["d"], "passage"))
    keys = torch.tensor(SHARDS[0]["ids"] + SHARDS[1]["ids"])
    query_keys = torch.tensor(SHARDS[0]["qids"] + SHARDS[1]["qids"])
    view = StepView.of({"positive_index": torch.tensor([0, 1, 4, 5]), "doc_keys": keys, "query_keys": query_keys})
    loss = Symmetric(InfoNCE(temperature=0.05, gather_across_devices=False))(q, d, view)
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


# --- evaluation on every rank (issue 17) --------------------------------------------------------


def _eval_worker(rank, path, task_dir, init_file, out_dir):
    """Each of 2 ranks encodes its share of the texts of a real task slice; the run must be the one
    process's. (A step of the torchrun launch: it makes and ends a process group of its own.)"""
    import json
    from pathlib import Path

    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings
    from obliq.tasks import load_task

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        enc = lora_encoder(path).eval()
        retrieval = make_retriever(enc, RetrievalSettings(top_k=20, batch_size=4))(load_task(task_dir))
        (Path(out_dir) / f"run{rank}.json").write_text(json.dumps(retrieval.run))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_encoding_shares_give_the_one_process_run(torchrun_launch, tiny_llama_dir):
    """The corpus (45 texts: an odd share per rank) and the 15 queries are split over 2 gloo processes
    with batches of 4 (ranks pad to the same number of forward passes); the gathered embeddings give
    the one-process run: the same documents in the same order, scores within float rounding."""
    import json

    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings
    from obliq.tasks import load_task

    one = make_retriever(lora_encoder(tiny_llama_dir).eval(), RetrievalSettings(top_k=20, batch_size=4))(
        load_task(torchrun_launch / "slice45")
    ).run
    for rank in (0, 1):
        got = json.loads((torchrun_launch / "shares" / f"run{rank}.json").read_text())
        assert got.keys() == one.keys()
        for q in one:
            assert list(got[q]) == list(one[q])  # same ranking
            assert list(got[q].values()) == pytest.approx(list(one[q].values()), abs=1e-5)


EVALUATED = {"top_k": 50, "batch_size": 4, "query_max_length": 32, "passage_max_length": 48}
"""The training callback's retrieval settings (and the one-process evaluation's)."""


def _evaluate_args(task_dir) -> list[str]:
    """evaluate.py's arguments (all but ``--output``): MiniLM on a task."""
    return [
        "--model",
        "minilm",
        "--tasks",
        str(task_dir),
        "--measures",
        "[NDCG@10,Recall@10]",
        "--latency_queries",
        "0",
        "--retrieval.cache",
        "false",
        "--retrieval.top_k",
        "50",
    ]


FSDP = {"class_path": "obliq.model.sharding.LoraModelParallelStrategy"}


@pytest.fixture(scope="module")
def torchrun_launch(tiny_llama_dir, tasks_dir, tmp_path_factory):
    """ONE torchrun launch of 2 CPU processes for every test here but the FSDP-unit one (support.torchrun_commands),
    in turn: support.gloo_grad_cache_worker (into ``<root>/gradcache``) and :func:`_eval_worker` on ``slice45``
    (``<root>/shares``), each on a process group of its own; evaluate.py's command (``obliq evaluate``, MiniLM on
    ``slice``, into ``<root>/two``; it makes the launch's process group, as evaluate.py does); then 4 training
    steps on 40 rows under DDP and under FSDP2 (``<root>/ddp``, ``<root>/fsdp``), each with the evaluation callback
    at step 4 (the last) and a checkpoint monitoring its NDCG@10, and the FSDP2 run resumed from its step-2
    checkpoint (``<root>/resumed``). Returns the root."""
    import yaml
    from support import small_real_task, task_rows, torchrun_commands, write_config, write_rows

    root = tmp_path_factory.mktemp("torchrun-launch")
    task_dir = small_real_task(tasks_dir, root / "slice", n_distractors=30)
    shares_task = small_real_task(tasks_dir, root / "slice45", n_distractors=40)
    rows = write_rows(root / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=40))
    for folder in ("gradcache", "shares"):
        (root / folder).mkdir()
    grad_cache = [tiny_llama_dir, str(root / "gc.init"), str(root / "gradcache"), SHARDS]
    shares = [tiny_llama_dir, str(shares_task), str(root / "eval.init"), str(root / "shares")]
    commands = [
        {"call": "support:gloo_grad_cache_worker", "args": [*grad_cache, SYMMETRIC]},
        {"call": "test_distributed:_eval_worker", "args": shares},
        ["evaluate", *_evaluate_args(task_dir), "--output", str(root / "two")],
    ]
    for name, strategy in [("ddp", "ddp"), ("fsdp", FSDP), ("resumed", FSDP)]:
        config = write_config(
            root / name, rows, tiny_llama_dir, max_steps=4, trainer__devices=2, trainer__strategy=strategy
        )
        cfg = yaml.safe_load(config.read_text())
        cfg["trainer"]["callbacks"] += [
            {
                "class_path": "obliq.callbacks.RetrievalEvaluation",
                "init_args": {
                    "tasks": [str(task_dir)],
                    "every_n_steps": 4,
                    "measures": ["NDCG@10", "Recall@10"],
                    "retrieval": EVALUATED,
                },
            },  # at step 4 (the last): the end adds no second evaluation
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {
                    "dirpath": str(root / name / "best"),
                    "monitor": "eval/mean/NDCG@10",
                    "mode": "max",
                    "save_top_k": 1,
                    "every_n_train_steps": 4,
                },
            },
        ]
        config.write_text(yaml.safe_dump(cfg))
        resume = ["--ckpt_path", str(root / "fsdp" / "ckpt" / "epoch=0-step=2.ckpt")] if name == "resumed" else []
        commands.append(["train", "fit", "--config", str(config), *resume])
    torchrun_commands(root, commands, timeout=900)
    return root


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_training_callback_evaluates_on_every_rank_under_ddp_and_fsdp2(strategy, torchrun_launch, tmp_path):
    """2 CPU processes train 4 steps with the evaluation callback at step 4 (the last): under FSDP2 too (its
    parameters are sharded, so every rank must encode); the logged NDCG@10 equals one process's
    evaluation of the saved weights, and every rank got the value (the monitored checkpoint)."""
    import csv

    from obliq.eval.results import evaluate_tasks
    from obliq.model.checkpoint import load_checkpoint
    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings
    from obliq.tasks import load_task

    run = torchrun_launch / strategy
    with open(next(run.rglob("metrics.csv"))) as f:
        logged = [float(r["eval/math-slice/NDCG@10"]) for r in csv.DictReader(f) if r.get("eval/math-slice/NDCG@10")]
    encoder = load_checkpoint(run / "ckpt" / "last.ckpt")
    [one] = evaluate_tasks(
        make_retriever(encoder, RetrievalSettings(**EVALUATED)),
        [load_task(torchrun_launch / "slice")],
        tmp_path / "one",
        "one process",
        ["NDCG@10", "Recall@10"],
    )
    assert logged == [pytest.approx(one["metrics"]["NDCG@10"], abs=1e-9)]
    assert list((run / "best").glob("*.ckpt"))  # the monitor saw the value on every rank


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_on_two_cpu_processes_matches_ddp_saves_the_whole_adapter_and_resumes(torchrun_launch):
    """The sharded path (Lightning's ModelParallelStrategy + FSDP2 ``fully_shard``, 2 gloo processes):
    the same adapter as DDP after 4 steps; each checkpoint holds every LoRA weight at full shape
    (gathered from both ranks, not rank 0's slice); a resume from step 2 ends bit-identical.
    Rows carry 0-6 negatives (at most 2 used), so at some steps the ranks hold different numbers of
    documents, hence of GradCache chunks: FSDP needs the same passes on both (idle passes pad).
    The three fits (DDP, FSDP, the resume) are the launch's: each builds its own trainer and model from its
    config, as train.py does."""
    ddp, sharded = (lora_weights(torchrun_launch / name / "ckpt" / "last.ckpt") for name in ("ddp", "fsdp"))
    assert sharded.keys() == ddp.keys() and len(ddp) == 2 * 7 * 2  # 2 layers x 7 projections x (A, B)
    for key, value in ddp.items():
        assert sharded[key].shape == value.shape, key
        assert (sharded[key] - value).norm() <= 1e-5 * value.norm() + 1e-8, key
    again = lora_weights(torchrun_launch / "resumed" / "ckpt" / "last.ckpt")
    assert all(torch.equal(again[k], sharded[k]) for k in sharded)


@pytest.mark.distributed
@pytest.mark.slow
def test_evaluate_py_under_torchrun_equals_one_process(torchrun_launch, tmp_path):
    """evaluate.py's command under torchrun (2 processes share the encoding, rank 0 scores) gives one process's
    metrics; the one process runs here."""
    import json

    from obliq.cli import main as obliq_main

    obliq_main(["evaluate", *_evaluate_args(torchrun_launch / "slice"), "--output", str(tmp_path / "one")])
    two, one = (
        json.loads((d / "math-slice" / "summary.json").read_text()) for d in (torchrun_launch / "two", tmp_path / "one")
    )
    assert two["metrics"] == one["metrics"]
