"""The per-task evaluation callback inside a real (tiny) Lightning training run with MiniLM."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from obliq.callbacks import RetrievalEvaluation
from support import small_real_task
from torch.utils.data import DataLoader

from obliq.eval.results import evaluate_tasks
from obliq.search.retrieval import retrieve_dense
from obliq.search.settings import RetrievalSettings
from obliq.tasks import load_task


class TinyRetriever(LightningModule):
    """Wraps the encoder; one contrastive-ish step per batch on a fixed pair."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.seen = []  # (grad enabled, inference mode, module training) at each encode call
        self.query_lengths = set()  # max_length asked for while queries are encoded
        self.training_flags = []
        self.threads = set()  # torch CPU threads at each encode call
        original = encoder.encode

        def spy(*args, **kwargs):
            self.seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled(), self.training))
            self.threads.add(torch.get_num_threads())
            if kwargs.get("kind") == "query":
                self.query_lengths.add(kwargs.get("max_length"))
            return original(*args, **kwargs)

        encoder.encode = spy

    def training_step(self, batch, batch_idx):
        self.training_flags.append(self.training)
        q = self.encoder(self.encoder.tokenize(["Find the number of primes below 20."], "query"))
        p = self.encoder(self.encoder.tokenize(["How many prime numbers are smaller than 30?"], "passage"))
        return 1 - (q * p).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        return DataLoader(list(range(8)), batch_size=1)


@pytest.mark.slow
def test_callback_evaluates_every_n_steps_and_at_end(tmp_path, tasks_dir):
    from obliq.model import BiEncoder

    torch.manual_seed(0)
    task_dir = small_real_task(tasks_dir, tmp_path / "math-slice")
    module = TinyRetriever(BiEncoder("minilm", query_max_length=64, passage_max_length=64)).train()
    settings = RetrievalSettings(top_k=100, query_max_length=32, passage_max_length=64)
    threads = torch.get_num_threads()
    callback = RetrievalEvaluation(
        tasks=[str(task_dir)],
        every_n_steps=2,
        retrieval=settings,
        measures=["NDCG@10", "Recall@10", "Recall@100"],
        threads=threads + 1,
    )
    logger = CSVLogger(tmp_path / "logs", name="run")
    best = ModelCheckpoint(
        tmp_path / "best",
        filename="step{step}",
        auto_insert_metric_name=False,
        monitor="eval/mean/NDCG@10",
        mode="max",
        save_top_k=1,
        every_n_train_steps=2,
    )
    trainer = Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=1,
        logger=logger,
        callbacks=[callback, best],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)

    # evaluated at step 2 (every_n_steps) and at the end (step 3), under no_grad, not inference_mode
    eval_dir = tmp_path / "logs" / "run" / "version_0" / "eval"
    assert sorted(p.name for p in eval_dir.iterdir()) == ["step-00000002", "step-00000003"]
    assert module.seen and all(s == (False, False, False) for s in module.seen)
    assert module.training_flags == [True, True, True]  # train mode restored after the step-2 evaluation
    assert module.threads == {threads + 1} and torch.get_num_threads() == threads  # its own threads, then restored
    assert module.query_lengths == {32}  # evaluation length, not the training length (64)
    assert module.encoder.tokenize(["word " * 200], "query")["input_ids"].shape[1] == 64  # the encoder is untouched

    # the same files as evaluate.py, and the logged NDCG@10 is the written one
    logged = {}
    with open(tmp_path / "logs" / "run" / "version_0" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("eval/math-slice/NDCG@10"):
                logged[int(row["step"])] = float(row["eval/math-slice/NDCG@10"])
    for step in (2, 3):
        folder = eval_dir / f"step-{step:08d}"
        assert {p.name for p in (folder / "math-slice").iterdir()} == {
            "run.trec",
            "run.trec.json",
            "per_query.jsonl",
            "summary.json",
        }
        assert (folder / "results.md").is_file() and (folder / "recall_at_k.png").is_file()
        summary = json.loads((folder / "math-slice" / "summary.json").read_text())
        assert summary["n_queries"] == 15
        assert logged[step] == pytest.approx(summary["metrics"]["NDCG@10"], abs=1e-6)

    # top-k checkpoints by the evaluation: ModelCheckpoint saw the step-2 mean NDCG@10
    assert best.best_model_path.endswith("step2.ckpt") and best.best_model_score.item() == pytest.approx(logged[2])

    # the end-of-training evaluation saw the final weights: re-evaluating them now gives the same numbers
    module.eval()
    with torch.no_grad():
        [again] = evaluate_tasks(
            lambda task: retrieve_dense(module.encoder, task, settings),
            [load_task(task_dir)],
            tmp_path / "again",
            "final",
            ["NDCG@10", "Recall@10"],
        )
    assert again["metrics"]["NDCG@10"] == pytest.approx(callback.last_summaries[0]["metrics"]["NDCG@10"], abs=1e-6)


class _Frozen(TinyRetriever):
    """A training step that changes nothing (lr 0): the callback evaluates the untrained encoder."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.slow
def test_one_model_gives_one_number_through_every_command(tmp_path, tasks_dir, capsys):
    """Untrained all-MiniLM-L6-v2 under the quickstart recipe's reading policy (no prefixes, at most
    256 tokens): evaluate.py, the quickstart's base system, the dose sweep's dose 0 and the training
    callback give the same NDCG@10 on the same queries (issue 14: one system, one number). A smaller slice (8
    queries, their relevant problems and 12 others): the four paths encode it four times."""
    from obliq.cli import main as obliq_main
    from obliq.commands.dose import dose_sweep
    from obliq.model import BiEncoder
    from obliq.search.retrieval import make_retriever

    REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
    task_dir = small_real_task(tasks_dir, tmp_path / "math-slice", n_queries=8, n_distractors=12)
    numbers = {}
    [s] = obliq_main(
        [
            "evaluate",
            "--model",
            "minilm",
            "--tasks",
            str(task_dir),
            "--output",
            str(tmp_path / "ev"),
            "--latency_queries",
            "0",
            "--retrieval.cache",
            "false",
        ]
    )
    numbers["evaluate.py"] = (s["metrics"]["NDCG@10"], s["reads"])
    [s] = evaluate_tasks(
        make_retriever("minilm", RetrievalSettings(cache=False)),
        [load_task(task_dir)],
        tmp_path / "qs",
        "MiniLM (base)",
        ["NDCG@10"],
    )  # the quickstart's base system
    numbers["quickstart"] = (s["metrics"]["NDCG@10"], s["reads"])
    sweep = dose_sweep(REPO / "configs" / "quickstart.yaml", [0], [str(task_dir)], out=tmp_path / "sweep")
    dose0 = json.loads((tmp_path / "sweep" / "dose-0" / "eval" / "math-slice" / "summary.json").read_text())
    assert sweep["ndcg@10"]["math-slice"] == [dose0["metrics"]["NDCG@10"]]
    assert "every dose trains 40 steps of 32 rows" in capsys.readouterr().out  # what the sweep holds fixed
    numbers["dose sweep, dose 0"] = (dose0["metrics"]["NDCG@10"], dose0["reads"])
    module = _Frozen(BiEncoder("minilm", query_prefix="", passage_prefix="")).train()
    callback = RetrievalEvaluation(tasks=[str(task_dir)], every_n_steps=0, measures=["NDCG@10"])
    Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path / "logs"),
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(module)
    numbers["training callback"] = (
        callback.last_summaries[0]["metrics"]["NDCG@10"],
        callback.last_summaries[0]["reads"],
    )
    reference, reads = numbers["evaluate.py"]
    assert reads == {"query_prefix": "", "passage_prefix": "", "query_max_length": 256, "passage_max_length": 256}
    for path, (value, read) in numbers.items():
        assert value == pytest.approx(reference, abs=1e-6) and read == reads, path
