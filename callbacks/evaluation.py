"""Per-task retrieval evaluation during training (a Lightning callback).

Every ``every_n_steps`` optimizer steps and once at the end of training, the module's encoder is
evaluated on the configured tasks exactly as ``evaluate.py`` does (the same
:class:`~obliq.search.settings.RetrievalSettings`, search, metrics and files), under
``torch.no_grad()`` — not ``inference_mode``, whose tensors cannot enter autograd later — with the
module in eval mode, restored afterwards.

NDCG@10 per task (and its mean over tasks) goes to every Lightning logger (TensorBoard, CSV,
W&B…) as ``eval/<task>/NDCG@10`` at the current global step; the files go to
``<log_dir>/eval/step-<global step>/``. The values also enter ``trainer.callback_metrics`` on every
rank, so ``ModelCheckpoint(monitor="eval/mean/NDCG@10", mode="max", every_n_train_steps=<the same
n>)`` keeps the top-k checkpoints by retrieval quality.

Texts are cut at the retrieval settings' lengths (256 tokens for queries, the OBLIQ-IR paper §4,
even when training uses longer ones), passed to each ``encode`` call: the encoder itself is not
changed.

Evaluation runs on every rank: each encodes its share of the corpus and queries
(:func:`obliq.search.retrieval.encode_texts`; under FSDP every rank must take part in each forward
pass anyway), the embeddings are gathered, and global rank 0 searches, scores, writes the files and
logs; the values are then broadcast, so every rank gets the same metrics. The numbers are those of one
process (``tests/test_distributed.py`` checks DDP and FSDP2 on two CPU processes).
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from obliq.eval.metrics import DEFAULT_MEASURES, check_depth
from obliq.eval.results import evaluate_tasks
from obliq.search.retrieval import check_index, make_retriever
from obliq.search.settings import RetrievalSettings
from obliq.tasks import find_tasks, load_query_split, load_task

log = logging.getLogger(__name__)


class RetrievalEvaluation(Callback):
    """Evaluate ``pl_module.<encoder_attr>`` on retrieval tasks during training.

    Args:
        tasks: task folders (BEIR layout) or folders of task folders.
        split: the query set evaluated: ``test`` (``queries.jsonl`` and ``qrels/test.tsv``) or another
            name, e.g. ``dev`` (``queries-dev.jsonl`` and ``qrels/dev.tsv``; the task is then named
            ``<task>-dev`` in the logged keys and files): what a sweep or checkpoint selection should
            optimise, never the test queries.
        every_n_steps: evaluate when the global step is a multiple of this (0: only at the end).
        at_end: also evaluate when training ends (skipped if that step was just evaluated).
        encoder_attr: the module attribute holding an encoder (``encode(texts, kind, batch_size, max_length)``).
        retrieval: how to retrieve (top_k, batch size, query/passage max lengths …), as ``evaluate``'s
            ``--retrieval``; the corpus-embedding cache is never used (the weights change).
        measures: metrics computed and written (NDCG@10 must be among them; it is logged).
        latency_queries: queries timed one at a time (0: skip, the default during training).
        dirname: folder under the trainer's log dir for the files.
        threads: torch CPU threads while evaluating (restored afterwards); default: the training's own.
            On a small shared CPU, train with 1 (``OMP_NUM_THREADS=1``) and evaluate with 2
            (docs/decisions.md, "Threads on a shared 2-core CPU").
    """

    def __init__(
        self,
        tasks: list[str],
        split: str = "test",
        every_n_steps: int = 1000,
        at_end: bool = True,
        encoder_attr: str = "encoder",
        retrieval: RetrievalSettings = RetrievalSettings(),
        measures: list[str] = list(DEFAULT_MEASURES),
        latency_queries: int = 0,
        dirname: str = "eval",
        threads: int | None = None,
    ):
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be ≥ 0, got {every_n_steps}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if "NDCG@10" not in measures:
            raise ValueError("measures must include NDCG@10 (it is the logged metric)")
        self.task_paths, self.split = list(tasks), split
        self.every_n_steps, self.at_end = every_n_steps, at_end
        self.encoder_attr, self.retrieval = encoder_attr, retrieval
        self.measures, self.latency_queries, self.dirname = list(measures), latency_queries, dirname
        self.threads = threads
        self.tasks = None
        self.last_step: int | None = None
        self.last_summaries: list[dict] = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.tasks is None:
            load = load_task if self.split == "test" else partial(load_query_split, split=self.split)
            self.tasks = [load(p) for p in find_tasks(self.task_paths)]  # fail before training starts
            for task in self.tasks:  # on every rank: no rank may stop halfway through an evaluation
                check_depth(self.measures, self.retrieval.top_k, len(task.doc_ids))
        if not hasattr(pl_module, self.encoder_attr):
            raise AttributeError(f"{type(pl_module).__name__} has no attribute {self.encoder_attr!r} (the encoder)")
        windows = self.retrieval.windows or getattr(getattr(pl_module, self.encoder_attr), "windows", None)
        for task in self.tasks:  # C42: an index faiss cannot train on this corpus; MaxSim it cannot search
            check_index(self.retrieval, task, windows)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self.last_step:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at_end and trainer.global_step != self.last_step:
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: Trainer, pl_module: LightningModule) -> list[dict]:
        """Evaluate now (every rank encodes its share; rank 0 scores, writes the files and logs NDCG@10
        per task); returns the summaries (on rank 0)."""
        step = trainer.global_step
        self.last_step = step
        encoder = getattr(pl_module, self.encoder_attr)
        retrieve = make_retriever(encoder, self.retrieval, self.latency_queries)
        was_training, threads = pl_module.training, torch.get_num_threads()
        pl_module.eval()
        if self.threads:
            torch.set_num_threads(self.threads)
        values = None
        # trainer.log_dir is itself a collective (a broadcast from rank 0): read it on every rank
        output = Path(trainer.log_dir or trainer.default_root_dir) / self.dirname / f"step-{step:08d}"
        try:
            with torch.no_grad():
                if trainer.is_global_zero:
                    name = f"{getattr(encoder, 'name_or_path', type(encoder).__name__)}@step-{step}"
                    self.last_summaries = evaluate_tasks(retrieve, self.tasks, output, name, self.measures)
                else:  # the same retrievals, in the same order: every rank's share of every forward pass
                    for task in self.tasks:
                        retrieve(task)
        finally:
            pl_module.train(was_training)
            torch.set_num_threads(threads)
        if trainer.is_global_zero:
            values = {f"eval/{s['task']}/NDCG@10": s["metrics"]["NDCG@10"] for s in self.last_summaries}
            values["eval/mean/NDCG@10"] = sum(values.values()) / len(values)
            for logger in trainer.loggers:
                logger.log_metrics(values, step=step)
        trainer.strategy.barrier("obliq-retrieval-evaluation")
        # Every rank gets the values, so ModelCheckpoint(monitor="eval/mean/NDCG@10", mode="max")
        # keeps the top-k checkpoints by retrieval quality (its decision is agreed across ranks).
        values = trainer.strategy.broadcast(values if trainer.is_global_zero else None)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in values.items()})
        return self.last_summaries
