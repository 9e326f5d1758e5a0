"""What several test files share (tests import it as ``support``): small real tasks and task folders,
training rows, the tiny random Llama, the tiny training recipe and its process, the two-process
(gloo) GradCache worker, an obliq training checkpoint of a seeded LoRA, and a CSV metrics column.
Fixtures stay in conftest.py; bench scripts use only obliq's public names."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from obliq.tasks import read_jsonl, read_qrels

REPO = Path(__file__).resolve().parents[1]


# --- tasks ----------------------------------------------------------------------------------------


def task_slice(tasks_dir: Path, name: str, out: Path, n_queries: int, n_distractors: int) -> Path:
    """A real task cut small: its first queries, their relevant documents and some others."""
    src = tasks_dir / name
    qrels = read_qrels(src / "qrels" / "test.tsv")
    queries = [o for _, o in read_jsonl(src / "queries.jsonl")][:n_queries]
    wanted = {d for q in queries for d in qrels[q["_id"]]}
    corpus = [o for _, o in read_jsonl(src / "corpus.jsonl")]
    docs = [o for o in corpus if o["_id"] in wanted] + [o for o in corpus if o["_id"] not in wanted][:n_distractors]
    (out / "qrels").mkdir(parents=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps(o) + "\n" for o in docs))
    (out / "queries.jsonl").write_text("".join(json.dumps(o) + "\n" for o in queries))
    rows = [f"{q['_id']}\t{d}\t{g}" for q in queries for d, g in qrels[q["_id"]].items()]
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    (out / "task.json").write_text((src / "task.json").read_text())
    return out


def small_real_task(tasks_dir: Path, root: Path, n_queries: int = 15, n_distractors: int = 40) -> Path:
    """A slice of math-theoremqa named ``math-slice``: 15 real queries, their relevant problems and 40 others."""
    task_slice(tasks_dir, "math-theoremqa", root, n_queries, n_distractors)
    (root / "task.json").write_text(json.dumps({"name": "math-slice", "mechanism": "analogue"}))
    return root


def make_task(root, corpus, queries, qrels, pooled=None):
    """Write a task folder; corpus/queries are lists of dicts (or raw strings), qrels of (q, d, g)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        (root / name).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    (root / "qrels").mkdir(exist_ok=True)
    for name, rows in (("test", qrels), ("pooled", pooled)):
        if rows is not None:
            lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{g}" for q, d, g in rows]
            (root / "qrels" / f"{name}.tsv").write_text("\n".join(lines) + "\n")
    return root


# --- training rows ----------------------------------------------------------------------------


NEGATIVE_CHOICES = (4, 4, 4, 3, 2, 1, 0, 6)  # fewer than k = 4 allowed; 6 checks the cut to k


def _norm(text: str) -> str:
    # The test's own notion of "same text", independent of obliq.data.rows.normalise_text.
    return " ".join(re.sub(r"[^\w\s]", "", text.lower()).split())


def task_rows(tasks_dir: Path, task: str, limit: int | None = None, seed: int = 13) -> list[dict]:
    """Training rows from a BEIR task: one row per relevant (query, doc) pair of qrels/test.tsv, in
    file order, with random corpus documents (neither relevant to the query nor equal in text to
    the positive) as negatives."""
    folder = tasks_dir / task
    corpus = {}
    with open(folder / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            corpus[doc["_id"]] = doc["text"]
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = {q["_id"]: q["text"] for q in map(json.loads, f)}
    with open(folder / "qrels" / "test.tsv", encoding="utf-8") as f:
        pairs = [(r["query-id"], r["corpus-id"]) for r in csv.DictReader(f, delimiter="\t") if int(r["score"]) >= 1]
    relevant: dict[str, set[str]] = {}
    for qid, did in pairs:
        relevant.setdefault(qid, set()).add(did)
    ids = list(corpus)
    rng = np.random.default_rng(seed)
    rows = []
    for qid, did in pairs[:limit]:
        want = int(rng.choice(NEGATIVE_CHOICES))
        negatives = []
        while len(negatives) < want:
            cand = ids[int(rng.integers(len(ids)))]
            if (
                cand in relevant[qid]
                or cand in {n["id"] for n in negatives}
                or _norm(corpus[cand]) == _norm(corpus[did])
            ):
                continue
            negatives.append({"id": cand, "text": corpus[cand]})
        rows.append(
            {
                "id": f"{task}/{qid}/{did}",
                "task": task,
                "source": "public",
                "query": queries[qid],
                "positive": {"id": did, "text": corpus[did]},
                "negatives": negatives,
            }
        )
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def file_ids(*paths: Path) -> list[str]:
    """Row ids of files, read here with json (independently of obliq.data)."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out += [json.loads(line)["id"] for line in f if line.strip()]
    return out


class PrefixTokenizer:
    """A real HF tokenizer with the 'query: ' / 'passage: ' prefixes, as BiEncoder.tokenize will do."""

    def __init__(self, path: str, max_query: int = 32, max_passage: int = 48):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.max = {"query": max_query, "passage": max_passage}

    def __call__(self, texts: list[str], kind: str, instructions=None) -> dict[str, torch.Tensor]:
        prefix = {"query": "query: ", "passage": "passage: "}[kind]
        enc = self.tok(
            [prefix + t for t in texts], padding=True, truncation=True, max_length=self.max[kind], return_tensors="pt"
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


# --- models ---------------------------------------------------------------------------------------


def save_tiny_llama(folder: Path, tokenizer_path: str) -> str:
    """A randomly initialised 2-layer Llama (hidden 32) with ``tokenizer_path``'s tokenizer, saved WITHOUT a
    pad token (Llama tokenizers ship without one, C02). Attention dropout 0.1 so dropout matters."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    tokenizer.pad_token = None
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_dropout=0.1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def lora_encoder(path: str, dropout: float = 0.0):
    """A BiEncoder with a LoRA (r 4) whose B matrices are drawn from N(0, 0.05) (seed 0), so it is not the base."""
    from obliq.model import BiEncoder, LoraSettings

    torch.manual_seed(0)
    enc = BiEncoder(path, lora=LoraSettings(r=4, alpha=8, dropout=dropout))
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return enc


def gloo_grad_cache_worker(rank: int, path: str, init_file: str, out_dir: str, shards: list[dict], loss: dict):
    """One of two gloo processes (``torch.multiprocessing.spawn``): a GradCache step (chunks of 1) of
    ``lora_encoder(path)`` under DDP on ``shards[rank]`` (``q``, ``d``, document ``ids``, optional query
    ``qids`` and ``windows``, the documents' :class:`obliq.windows.Windows` fields; query i's positive is
    document i) with the real objective of
    ``RetrieverModule(encoder, build(loss))`` (``loss`` a config: ``class_path`` + ``init_args``) over the step's
    view (:meth:`RetrieverModule.view`, gathered
    across the processes as in training); saves the loss and the gradients to ``out_dir/rank<r>.pt``."""
    import torch.distributed as dist

    from obliq.losses.settings import build
    from obliq.model.gradcache import grad_cache_step
    from obliq.model.module import RetrieverModule

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        enc = lora_encoder(path).eval()  # no dropout: the two setups then draw nothing at random
        ddp = torch.nn.parallel.DistributedDataParallel(enc)
        shard = shards[rank]
        module = RetrieverModule(enc, build(loss))
        batch = {
            "query": enc.tokenize(shard["q"], "query"),
            "docs": enc.tokenize(shard["d"], "passage"),
            "positive_index": torch.arange(len(shard["q"])),
            "doc_keys": torch.tensor(shard["ids"]),
        }
        if shard.get("windows"):  # documents read in windows (obliq.windows), as the training collator reads them
            from obliq.windows import Windows

            enc.windows = Windows(**shard["windows"])
            batch["docs"], batch["doc_window"] = enc.text.windows(shard["d"], "passage", enc.windows)
        if "qids" in shard:
            batch["query_keys"] = torch.tensor(shard["qids"])
        view = module.view(batch)  # a collective call: both processes
        value = grad_cache_step(
            ddp,
            batch["query"],
            batch["docs"],
            lambda q, d: module.objective(q, d, view),
            chunk_size=1,
            no_sync=ddp.no_sync,
            backward_scale=module.backward_scale,
        )
        grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.requires_grad}
        torch.save({"loss": value, "grads": grads}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def two_gloo_ranks(path: str, folder: Path, shards: list[dict], loss: dict) -> list[dict]:
    """:func:`gloo_grad_cache_worker` on two processes; each rank's ``{"loss", "grads"}``."""
    import torch.multiprocessing as mp

    mp.spawn(gloo_grad_cache_worker, args=(path, str(folder / "init"), str(folder), shards, loss), nprocs=2, join=True)
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(2)]


def gloo_view_loss_worker(rank: int, init_file: str, out_dir: str, parts: list[dict], loss: dict):
    """One of two gloo processes: the loss ``build(loss)`` (a config) of ``parts[rank]`` (``batch``, a collated batch;
    ``q`` (B_r, h), ``d`` (M_r, h) its embeddings) over the view gathered across both, as training builds it
    (:meth:`StepView.of` with ``gathered``); saves the value to ``out_dir/rank<r>.pt``."""
    import torch.distributed as dist

    from obliq.losses import StepView
    from obliq.losses.settings import build

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        part = parts[rank]
        view = StepView.of(part["batch"], gathered=True)
        q, d = view.embeddings(part["q"], part["d"])
        torch.save({"loss": build(loss)(q, d, view).item()}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def two_gloo_view_losses(folder: Path, parts: list[dict], loss: dict) -> list[float]:
    """:func:`gloo_view_loss_worker` on two processes; each rank's loss."""
    import torch.multiprocessing as mp

    mp.spawn(gloo_view_loss_worker, args=(str(folder / "init"), str(folder), parts, loss), nprocs=2, join=True)
    return [torch.load(folder / f"rank{r}.pt", weights_only=True)["loss"] for r in range(2)]


# --- training -------------------------------------------------------------------------------------


def write_config(folder: Path, rows: Path, backbone: str, max_steps: int, **extra) -> Path:
    """The tiny training recipe: a LoRA (r 4) on ``backbone``, 4 rows a step, GradCache chunks of 2, a
    checkpoint every step under ``folder/ckpt``; ``section__name=value`` overrides a key."""
    cfg = {
        "seed_everything": 0,
        "run_dir": str(folder / "runs"),  # where the run's version folder is claimed (this config writes elsewhere)
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": max_steps,
            "deterministic": True,
            "default_root_dir": str(folder),
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "log_every_n_steps": 1,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(folder)}},
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {
                        "dirpath": str(folder / "ckpt"),
                        "save_last": True,
                        "every_n_train_steps": 1,
                        "save_top_k": -1,
                    },
                }
            ],
        },
        "model": {
            "encoder": {
                "class_path": "obliq.model.BiEncoder",
                "init_args": {
                    "backbone": backbone,
                    "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
                    "query_max_length": 32,
                    "passage_max_length": 48,
                },
            },
            "loss": {"class_path": "obliq.losses.InfoNCE", "init_args": {"temperature": 0.05}},
            "chunk_size": 2,
            "lr": 1e-3,
        },
        "data": {"sources": [{"path": str(rows)}], "batch_size": 4, "max_negatives": 2, "num_workers": 0},
    }
    for key, value in extra.items():
        section, name = key.split("__")
        cfg[section][name] = value
    path = folder / "config.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def lora_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's trained weights (every one a LoRA weight)."""
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert state and all("lora_" in k for k in state)
    return state


def start_training(config: Path, *extra: str, cwd: Path = REPO, drop_env: tuple[str, ...] = ()) -> subprocess.Popen:
    """``python train.py fit --config <config> <extra>`` as a process (PYTHONHASHSEED 0, one thread);
    ``drop_env``: variables left out of its environment."""
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", str(config), *extra],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def fit_here(config: Path, *extra: str):
    """``train.py fit --config <config> <extra>`` in this process, on one thread as :func:`start_training`'s
    process (so the same numbers, to the bit), without the start-up of another process; returns the CLI."""
    from obliq.commands.train import cli

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return cli(["fit", "--config", str(config), *extra])
    finally:
        torch.set_num_threads(threads)


COMMANDS = """import importlib, json, os, sys
from obliq.cli import main
for step in json.loads(sys.argv[1]):
    if isinstance(step, dict):  # {"call": "module:function", "args": [...]}: function(rank, *args)
        module, name = step["call"].split(":")
        getattr(importlib.import_module(module), name)(int(os.environ["RANK"]), *step["args"])
    else:
        main(step)
"""
"""A script that runs its steps in turn: obliq command lines (``["train", "fit", …]``, ``["evaluate", …]``), each
as ``obliq``, train.py and evaluate.py run one (:func:`obliq.cli.main`), or functions of the tests' modules
called with the process's rank (``{"call": "support:gloo_grad_cache_worker", "args": [...]}``)."""


def torchrun_commands(folder: Path, commands: list, timeout: float = 600) -> None:
    """Each of ``commands`` in turn, in ONE launch of two gloo processes (``torchrun --standalone``, PYTHONHASHSEED
    0, one thread each), so the processes import torch, Lightning and transformers once for all of them (a
    process start costs more than a tiny model's steps). A command is an obliq command line or a function of
    the rank (``{"call": "module:function", "args": [...]}``, JSON arguments; this tests folder is importable),
    such as the workers written for ``mp.spawn``, which make and end a process group of their own (on a file of
    their own): these come first. Lightning sees a torchelastic launch (no launcher of its own) and each fit
    builds its own trainer and model; the first command line that needs the process group makes it
    (evaluate.py's own call, when it comes first), the later ones join it."""
    script = folder / "commands.py"
    folder.mkdir(parents=True, exist_ok=True)
    script.write_text(COMMANDS)
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    paths = [str(REPO), str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]  # as train.py; tests
    env["PYTHONPATH"] = os.pathsep.join(paths)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    done = subprocess.run(
        [*command, json.dumps(commands)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-5000:]


def make_checkpoint(path: Path, backbone: str, r: int = 4, alpha: int = 8, length: int = 64, seed: int = 0, **kw):
    """A training checkpoint in obliq's format (what RetrieverModule.on_save_checkpoint writes) for a LoRA
    whose B matrices are drawn from N(0, 0.02) (seeded), so the merge changes the weights."""
    from obliq.model.encoder import BiEncoder, LoraSettings

    encoder = BiEncoder(
        backbone,
        lora=LoraSettings(r=r, alpha=alpha, dropout=0.0),
        query_max_length=length,
        passage_max_length=length,
        **kw,
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in encoder.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    ckpt = {
        "obliq": {
            "encoder": encoder.settings,
            "lora": vars(encoder.lora),
            "loss": {"loss": "InfoNCE", "temperature": 0.02, "scale": 50.0},
        },
        "state_dict": {f"encoder.{n}": p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad},
        "hyper_parameters": {"lr": 2e-4, "weight_decay": 0.0, "warmup_ratio": 0.03, "max_grad_norm": 1.0},
        "global_step": 7,
        "epoch": 0,
    }
    torch.save(ckpt, path)
    return path


def csv_column(csv_text: str, name: str) -> list[str]:
    """The non-empty values of column ``name`` of a CSV text (Lightning's CSVLogger metrics)."""
    lines = csv_text.strip().splitlines()
    col = lines[0].split(",").index(name)
    return [line.split(",")[col] for line in lines[1:] if line.split(",")[col]]


# --- published checkpoints (replicas) ---------------------------------------------------------------

SMALL = {
    # the published heads-to-KV-heads ratio and head size = hidden / heads, at a few thousand parameters a layer
    "nvidia/llama-3.2-nv-embedqa-1b-v2": {"hidden_size": 64, "num_attention_heads": 8, "head_dim": 8},
    "nvidia/llama-nv-embed-reasoning-3b": {"hidden_size": 96, "num_attention_heads": 6, "head_dim": 16},
}


def save_published_replica(folder: Path, name: str, tokenizer_path: str, seed: int = 0) -> str:
    """A replica of a published NV-Embed checkpoint: its ``config.json`` exactly as published
    (:data:`obliq.model.bidirectional.PUBLISHED`: ``model_type: llama_bidirec``, the ``auto_map`` to NVIDIA's
    own file, ``pooling: avg``, llama3 rope scaling, tied embeddings, the 128,256-token vocabulary) with 2
    layers of the sizes in :data:`SMALL`, and ``LlamaModel``'s weight names in ``model.safetensors``, random
    (seeded) and written by transformers' plain ``LlamaModel``; ``tokenizer_path``'s tokenizer (its ids lie
    below the vocabulary)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    from obliq.model.bidirectional import PUBLISHED

    small = {**SMALL[name], "num_hidden_layers": 2, "num_key_value_heads": 2, "intermediate_size": 256}
    published = dict(PUBLISHED[name], **small)
    keep = {k: v for k, v in published.items() if k not in ("architectures", "auto_map", "model_type", "pooling")}
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaModel(LlamaConfig(**keep)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(published, indent=2))
    return str(folder)


def nemo_reference(request: dict, folder: Path) -> dict:
    """``tests/nemo_reference.py`` on ``request`` in a process of its own (NeMo's class registers itself with
    transformers on import; obliq is never imported there); its output."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "request.json").write_text(json.dumps(request))
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "nemo_reference.py"),
            str(folder / "request.json"),
            str(folder / "out.pt"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(folder / "out.pt", weights_only=True)


def cli_fails(argv: list[str], capsys, *needles: str) -> str:
    """``obliq <argv>`` ends with one line on stderr (exit 2) holding every needle, no traceback; that line."""
    import pytest

    from obliq.cli import main as obliq_main

    with pytest.raises(SystemExit) as stop:
        obliq_main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert stop.value.code == 2 and "Traceback" not in err and len(lines) == 1, (argv, err)
    assert all(n in lines[0] for n in needles), (argv, lines[0])
    return lines[0]
