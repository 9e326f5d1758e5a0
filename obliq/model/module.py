"""The LightningModule: one training step is one GradCache step over the rank's whole batch.

Manual optimisation (Lightning): AdamW (lr 2e-4), linear warmup over the first 3% of steps then
linear decay to 0 (the model card; transformers' ``get_linear_schedule_with_warmup``), optional
gradient clipping. A step whose loss or gradient norm is not finite is skipped and counted;
``max_bad_steps`` in a row stop the run with a checkpoint and a clear message. Under fp16
(``16-mixed``, a GradScaler) the gradients are unscaled before their norm is clipped or logged, the
scaler is updated after every step, and a step it skips for overflow is counted apart
(``train/overflow_steps``), not as a bad step: the schedule advances only on applied steps (the
PyTorch AMP recipe: scale → backward → unscale → clip → step → update).

Logged every step: ``train/loss`` and its parts: the main loss's value under its name and the parts it logs
(:class:`obliq.losses.Loss`: ``train/infonce``, ``train/infonce_dim<d>`` for InfoNCE under Matryoshka) and each
term's (``train/teacher``, ``train/relational``), each the value of the objective whose gradient the step applies,
summed over the ranks (torchmetrics' ``SumMetric``), so the same on 1 and N processes
(:meth:`RetrieverModule.objective`).

Checkpoints hold only the trainable weights (the LoRA adapter, or everything when training fully),
plus what Lightning saves itself: optimizer, scheduler, loop and data-loader state. Randomness is
re-seeded at every step from (seed, step), so the checkpoint's step number is the RNG state.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torchmetrics import SumMetric

from obliq.data.reader import BatchRef
from obliq.distributed import world
from obliq.losses import InfoNCE, Loss, StepView, Term, check_negatives
from obliq.losses.settings import spec
from obliq.model.encoder import BiEncoder
from obliq.model.gradcache import chunk_counts_across_ranks, grad_cache_step

log = logging.getLogger(__name__)


def check_plan_negatives(datamodule, loss: Loss, first: int, last: int, most: int = 20_000) -> None:
    """Refuse, before training, a step of the plan in which no row has a negative left (issue 53 §3: found at
    step 20 otherwise): the check of :func:`obliq.losses.check_negatives` on each step's identity keys, read from
    the data's index (the step's rows on every rank together; mask terms, which need the model, left out).

    Args:
        datamodule: a :class:`~obliq.data.TrainingDataModule` whose plan is built (its loader made).
        loss: the main loss, which counts each row's negatives (:meth:`obliq.losses.Loss.negatives_left`).
        first, last: the global steps to check, ``[first, last)``; at most ``most`` of them.

    Raises:
        ValueError: :func:`~obliq.losses.check_negatives`'s message, naming the step and the data (or the loss's
            refusal of a step, e.g. InfoNCE's of rows with several positives).
    """
    plan, reader = datamodule.plan, datamodule.plan.rows
    for step in range(first, min(last, first + most)):
        epoch, at = divmod(step, plan.steps_per_epoch)
        source, row = plan.step_rows(epoch, at)
        parts = [(int(i), row[source == i]) for i in np.unique(source)]
        keys = [k for i, r in parts for k in reader.keys(i, r)]
        kept = [n for i, r in parts for n in reader.positives(i, r)]
        cut = [k for i, r in parts for k in reader.cut_keys(i, r)]
        docs = [k[2:].reshape(-1, 2) for k in keys]  # each row's kept positives, then its kept negatives
        doc_row = torch.tensor([r for r, d in enumerate(docs) for _ in range(len(d))])
        is_positive = torch.tensor([j < n for d, n in zip(docs, kept) for j in range(len(d))])
        positives = (doc_row[None, :] == torch.arange(len(docs))[:, None]) & is_positive[None, :]
        view = StepView(
            positives,
            positives.to(torch.uint8).argmax(1),
            doc_row,
            torch.as_tensor(np.concatenate(docs)),
            torch.as_tensor(np.stack([k[:2] for k in keys])),
            cut_keys=torch.as_tensor(np.concatenate([c.reshape(-1, 2) for c in cut])),
            cut_row=torch.tensor([r for r, c in enumerate(cut) for _ in range(len(c) // 2)], dtype=torch.long),
            gathered=True,  # every rank's rows of the step
        )
        try:
            check_negatives(view, loss, step, None, datamodule)
        except ValueError:  # the message names the rows: read them
            rows = reader[BatchRef(epoch, at, source, row)]
            check_negatives(view, loss, step, {"row_ids": [r.id for r in rows]}, datamodule)
            raise


class RetrieverModule(L.LightningModule):
    """Trains a :class:`~obliq.model.BiEncoder` with a main loss and its terms + GradCache.

    Args:
        encoder: the bi-encoder (in a config: ``class_path: obliq.model.BiEncoder`` + ``init_args``).
        loss: the main loss, any :class:`obliq.losses.Loss` (asked only what that protocol says); default
            ``InfoNCE()``: τ 0.02 = scale 50, the model card.
        terms: the terms beside it (:mod:`obliq.losses`: ``TeacherScores``, ``Relational``, ``GuidedMask``, or
            any :class:`~obliq.losses.Term`), each computed over the step's view (every rank's rows when the
            loss gathers them); a term's batch keys are checked before a run (:func:`obliq.losses.check_terms`).
        chunk_size: GradCache chunk (rows per forward pass); None encodes each side in one pass.
        sort_by_length: group each side's rows into GradCache chunks by length, so each chunk is
            padded only to its own longest row (same loss; see :func:`~obliq.model.gradcache.grad_cache_step`).
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        warmup_ratio: share of the total steps with linear warmup.
        max_grad_norm: clip the global gradient norm to this (None: no clipping).
        max_bad_steps: consecutive non-finite steps that stop the run.
        seed: seeds each step's randomness (LoRA and model dropout) as a function of (seed, step),
            so a resumed run draws exactly what an uninterrupted one would.

    Batch: the dictionary of :mod:`obliq.data` (``query``, ``docs``, ``positive_index``, ``doc_positive``,
    ``doc_keys``, ``query_keys``, ...).

    Raises:
        ValueError: bad settings, or two logged parts of one name (two terms, or a term and the loss).
    """

    def __init__(
        self,
        encoder: BiEncoder,
        loss: Loss | None = None,
        terms: list[Term] | None = None,
        chunk_size: int | None = 4,
        sort_by_length: bool = True,
        lr: float = 2e-4,
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.03,
        max_grad_norm: float | None = 1.0,
        max_bad_steps: int = 5,
        seed: int = 0,
    ):
        super().__init__()
        if not 0 <= warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or null, got {chunk_size}")
        loss = InfoNCE() if loss is None else loss
        terms = list(terms or [])
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            twice = next(n for n in names if names.count(n) > 1)
            where = [i for i, n in enumerate(names) if n == twice]
            raise ValueError(f"model.terms: entries {where} are both the term {twice!r}: give each term once")
        logged = ["loss", loss.name, *loss.logged()]
        clash = next((n for n in names if n in logged), None) or next((n for n in logged if logged.count(n) > 1), None)
        if clash is not None:
            raise ValueError(f"model.loss ({type(loss).__name__}) and its terms both log train/{clash}: rename one")
        self.save_hyperparameters(ignore=["encoder", "loss", "terms"])
        # the objective's settings as a config gives them (a resume compares them: model.resume.resume_differences)
        self.hparams["loss"] = spec(loss)
        self.hparams["terms"] = [spec(t) for t in terms]
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold only the trainable weights
        self.encoder = encoder
        self.loss = loss
        self.terms = torch.nn.ModuleList(terms)
        self.chunk_size = chunk_size
        self.sort_by_length = sort_by_length
        self.bad_steps = 0
        self.consecutive_bad = 0
        self.overflow_steps = 0  # fp16 steps the GradScaler skipped (not bad steps)
        self._grad_norm = torch.tensor(0.0)
        self._t_last: float | None = None
        logged += [t.name for t in terms if adds(t)]
        # what each rank adds to a logged term, summed over the ranks at every step (module notes)
        self.logged_terms = torch.nn.ModuleDict({t: SumMetric(dist_sync_on_step=True) for t in logged})
        self._shares: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        """Hand the encoder's tokenization (a light, picklable object) to the data module; refuse a term the
        training rows leave nothing to compute (:meth:`~obliq.losses.Term.rows_problem`, on the first rows of
        every file).

        Raises:
            ValueError: ``model.terms[i] (Class) …``, the term's reason.
        """
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and getattr(datamodule, "tokenize", None) is None:
            datamodule.tokenize = self.encoder.text
        first_rows = getattr(datamodule, "first_rows", None)
        if stage == "fit" and first_rows is not None and self.terms:
            rows = list(first_rows())
            for i, term in enumerate(self.terms):
                problem = term.rows_problem(rows)
                if problem:
                    raise ValueError(f"model.terms[{i}] ({type(term).__name__}) {problem}")

    def configure_model(self) -> None:
        """Under FSDP2 (:class:`~obliq.model.sharding.LoraModelParallelStrategy`; Lightning calls this
        hook once the processes run), shard the encoder so that LoRA weights and frozen weights never
        share a unit (:func:`obliq.model.sharding.shard_encoder`). Other strategies: nothing to do."""
        if self.device_mesh is None or getattr(self, "_sharded", False):
            return
        from obliq.model.sharding import shard_encoder

        if self.device_mesh["tensor_parallel"].size() > 1:
            raise ValueError(
                "tensor parallelism is not supported: use obliq.model.sharding.LoraModelParallelStrategy "
                "(data parallel only) instead of ModelParallelStrategy"
            )
        units = shard_encoder(self.encoder, self.device_mesh["data_parallel"])
        self._sharded = True
        log.info("FSDP2: %d units (%d trainable)", len(units), sum(k == "trainable" for k, _ in units))

    def total_steps(self) -> int:
        """Optimizer steps of the whole run: ``max_steps`` when set, else steps per epoch × epochs,
        computed from the data plan (never by reading the loader, whose state may not be restored)."""
        trainer = self.trainer
        if trainer.max_steps and trainer.max_steps > 0:
            return int(trainer.max_steps)
        datamodule = trainer.datamodule
        if datamodule is None or not hasattr(datamodule, "steps_per_epoch") or not trainer.max_epochs:
            raise ValueError("set trainer.max_steps, or max_epochs with obliq's TrainingDataModule")
        return int(datamodule.steps_per_epoch(trainer.world_size)) * int(trainer.max_epochs)

    def configure_optimizers(self):
        from transformers import get_linear_schedule_with_warmup

        params = [p for p in self.encoder.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the encoder has no trainable parameter")
        optimizer = torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        total = self.total_steps()
        warmup = math.ceil(self.hparams.warmup_ratio * total)
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_start(self) -> None:
        """Refuse a plan with a step that has no negative (:func:`check_plan_negatives`) before the first step
        trains; then take the peak lr and weight decay from this run's settings and set each group's lr to the
        schedule's value at the current step. A plain resume changes nothing; a resume that asks for
        another lr, weight decay, warmup or ``max_steps`` (a longer run) continues with them from the
        checkpoint's step (the restored optimizer would otherwise keep the old values, and a longer run
        take its first step at the old schedule's last lr, 0 at the end of a run)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if getattr(datamodule, "plan", None) is not None and getattr(datamodule.plan, "rows", None) is not None:
            last = self.trainer.max_steps if self.trainer.max_steps > 0 else self.total_steps()
            check_plan_negatives(datamodule, self.loss, self.global_step, last)
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        scheduler.base_lrs = [self.hparams.lr] * len(optimizer.param_groups)
        for group, fn in zip(optimizer.param_groups, scheduler.lr_lambdas):
            group["initial_lr"], group["weight_decay"] = self.hparams.lr, self.hparams.weight_decay
            lr = self.hparams.lr * fn(scheduler.last_epoch)
            if group["lr"] != lr:
                log.warning(
                    "lr at step %d follows the current schedule: %.3g (the checkpoint had %.3g)",
                    scheduler.last_epoch,
                    lr,
                    group["lr"],
                )
                group["lr"] = lr

    # ------------------------------------------------------------------ training
    def training_step(self, batch, batch_idx: int):
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(self.hparams.seed * 1_000_003 + self.global_step)  # CPU and every CUDA device
        view = self.view(batch)
        check_negatives(view, self.loss, self.global_step, batch, self.trainer.datamodule)  # issue 49 §4
        try:
            loss = grad_cache_step(
                self.encoder,
                batch["query"],
                batch["docs"],
                lambda q, d: self.objective(q, d, view),
                self.chunk_size,
                backward=self.manual_backward,
                no_sync=self.trainer.strategy.block_backward_sync if self.trainer.world_size > 1 else None,
                backward_scale=self.backward_scale,
                pad_to=chunk_counts_across_ranks(batch["query"], batch["docs"], self.chunk_size)
                if self.device_mesh is not None
                else None,  # FSDP: the same passes on every rank
                sort_by_length=self.sort_by_length,
            )
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)
            if scaler is None:  # fp32 / bf16: clip here; a non-finite gradient is a bad step
                grad_norm = self._clip()
                if not torch.isfinite(grad_norm):
                    raise FloatingPointError(f"non-finite gradient norm {grad_norm.item()}")
        except FloatingPointError as err:
            optimizer.zero_grad(set_to_none=True)
            self._bad_step(err)
            return None
        lr = optimizer.param_groups[0]["lr"]  # the rate this step used
        if scaler is None:
            optimizer.step()
        else:
            # fp16: Lightning's step unscales the gradients, calls on_before_optimizer_step (which clips
            # and measures the unscaled norm), lets the scaler skip a step whose gradients overflowed,
            # and updates the scale every step. An overflow is the scaler's business, not a bad step.
            scale = scaler.get_scale()
            optimizer.step()
            if scaler.get_scale() < scale:  # the scale backed off: this step was skipped
                self.overflow_steps += 1
                self.log("train/overflow_steps", float(self.overflow_steps), batch_size=len(batch["positive_index"]))
                return None
            grad_norm = self._grad_norm
        scheduler.step()
        self.consecutive_bad = 0
        self._log_step(batch, grad_norm, lr)
        return loss

    @property
    def backward_scale(self) -> float:
        """Factor for the backward pass: DDP/FSDP average the ranks' gradients, and each rank's gradient of a
        gathered objective (:attr:`obliq.losses.Loss.gathers`) already is its share of the global one's, so the
        average is scaled back up."""
        return float(world()[1]) if self.loss.gathers else 1.0

    def view(self, batch: dict) -> StepView:
        """The step's :class:`~obliq.losses.StepView` (every rank's rows when the loss gathers them), with the
        mask terms' masks. A collective call under several processes."""
        windows = self.encoder.windows
        reduce = windows.reduce if windows is not None else "mean"
        view = StepView.of(batch, gathered=self.loss.gathers, device=self.device, reduce=reduce)
        for term in self.terms:
            view = view.with_mask(term.mask(view))
        return view

    def objective(self, q: torch.Tensor, d: torch.Tensor, view: StepView) -> torch.Tensor:
        """This rank's loss of the step, the one GradCache back-propagates (times :attr:`backward_scale`,
        which the strategy's gradient average undoes), and each logged part's share of this rank.

        The step's objective, whose gradient the step applies, is what one process computes over the ranks'
        concatenated batch: ``loss + Σ_t weight_t · term_t``, every part over the view's rows (every rank's
        queries against every rank's documents when the loss gathers them: each rank computes the same value
        and back-propagates into its own rows). The loss's value is logged under its name, and the parts it
        reports beside it (:meth:`obliq.losses.Loss.logged`: Matryoshka's ``infonce_dim<d>``) too. When it does
        not gather, each rank's parts are its own batch's, and the objective their mean over the ranks. Each
        logged part is the sum over ranks of the shares kept here (``torchmetrics.SumMetric``, synced at every
        step): the objective's value, the same on 1 and N processes. Sources: GradCache (Gao et al. 2021) for
        the cached gradients; DDP averages the ranks' gradients (PyTorch ``DistributedDataParallel``), hence the
        backward scale.

        Args:
            q: (B_r, h) this rank's query embeddings; d: (M_r, h) its document embeddings.
            view: the step's view (:meth:`view`).

        Raises:
            FloatingPointError: a term is not finite (on every rank, when on one: the view is the same).
        """
        ranks = world()[1]
        q, d = view.embeddings(q, d)
        parts: dict[str, torch.Tensor] = {}
        main = self.loss(q, d, view, parts)
        total = main
        shares = {self.loss.name: main.detach() / ranks, **{name: p / ranks for name, p in parts.items()}}
        loss = shares[self.loss.name]
        for term in self.terms:
            value = term(q, d, view, self.loss.temperature)
            if value is None:
                continue
            if not torch.isfinite(value):  # named here, not blamed on the contrastive loss or the lr
                raise FloatingPointError(f"non-finite {term.name} term ({type(term).__name__}): {value.item()}")
            total = total + term.weight * value
            shares[term.name] = value.detach() / ranks
            loss = loss + term.weight * shares[term.name]
        shares["loss"] = loss
        self._shares = shares
        return total

    def on_before_optimizer_step(self, optimizer) -> None:
        """Under fp16 (a GradScaler), Lightning calls this after unscaling the gradients: clip them and
        keep their true norm. Other precisions clip in :meth:`training_step`."""
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            self._grad_norm = self._clip()

    def _clip(self) -> torch.Tensor:
        params = [p for p in self.encoder.parameters() if p.grad is not None]
        limit = self.hparams.max_grad_norm
        if not params:
            return torch.tensor(0.0)
        norm = torch.nn.utils.clip_grad_norm_(params, limit if limit is not None else float("inf"))
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor under FSDP2

    def _bad_step(self, err: Exception) -> None:
        self.bad_steps += 1
        self.consecutive_bad += 1
        log.warning("step %d skipped: %s (%d in a row)", self.global_step, err, self.consecutive_bad)
        if self.consecutive_bad >= self.hparams.max_bad_steps:
            path = Path(self.trainer.default_root_dir) / "checkpoints" / "bad-steps.ckpt"
            self.trainer.save_checkpoint(path)
            raise FloatingPointError(
                f"{self.consecutive_bad} consecutive steps had a non-finite loss or gradient (last: {err}); "
                f"stopped at step {self.global_step}, checkpoint {path}. Lower the lr, check the data, "
                "or use bf16 instead of fp16."
            )

    def _log_step(self, batch, grad_norm: torch.Tensor, lr: float) -> None:
        now = time.perf_counter()
        n = len(batch["positive_index"])
        tokens = int(batch["query"]["attention_mask"].sum() + batch["docs"]["attention_mask"].sum())
        metrics = {
            "train/lr": lr,
            "train/grad_norm": grad_norm,
            "train/bad_steps": float(self.bad_steps),  # skipped so far (non-finite loss or gradient)
        }
        if self._t_last is not None:
            elapsed = now - self._t_last
            metrics["train/anchors_per_s"] = n * self.trainer.world_size / elapsed
            metrics["train/tokens_per_s"] = tokens * self.trainer.world_size / elapsed
        if torch.cuda.is_available() and self.device.type == "cuda":
            metrics["train/gpu_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self._t_last = now
        self.log_dict(metrics, prog_bar=False, batch_size=n)
        values = {}
        for name, share in self._shares.items():  # summed over the ranks here (SumMetric, dist_sync_on_step)
            values[name] = self.logged_terms[name](share)
            self.log(f"train/{name}", self.logged_terms[name], on_step=True, on_epoch=False, batch_size=n)
        self.log("loss", values["loss"], prog_bar=True, logger=False, batch_size=n)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        trainable = {f"encoder.{n}" for n, p in self.encoder.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        checkpoint["obliq"] = {
            "bad_steps": self.bad_steps,
            "overflow_steps": self.overflow_steps,
            "encoder": self.encoder.settings,
            "lora": None if self.encoder.lora is None else vars(self.encoder.lora),
            "loss": {**self.loss.citation(), "chunk_size": self.chunk_size},
            "terms": [t.citation() for t in self.terms],
        }  # the model card's loss line

    def check_checkpoint_state(self, state: dict) -> None:
        """Refuse a checkpoint ``state_dict`` that misses a trainable weight or holds one of another shape.

        Raises:
            KeyError: a missing weight, or a shape that differs (another LoRA rank, another backbone).
        """
        trainable = {f"encoder.{n}": tuple(p.shape) for n, p in self.encoder.named_parameters() if p.requires_grad}
        missing = sorted(trainable.keys() - state.keys())
        if missing:
            raise KeyError(
                f"checkpoint lacks {len(missing)} trainable weights, e.g. {missing[:3]}: "
                "was it written with another LoRA configuration?"
            )
        wrong = [k for k, shape in trainable.items() if tuple(state[k].shape) != shape]
        if wrong:
            raise KeyError(
                f"checkpoint weight {wrong[0]} has shape {tuple(state[wrong[0]].shape)}, the model "
                f"{trainable[wrong[0]]} ({len(wrong)} such): was it written with another LoRA rank "
                "or backbone?"
            )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "state_dict" in checkpoint:  # FSDP2 strategies load (and check) the weights themselves
            self.check_checkpoint_state(checkpoint["state_dict"])
        self.bad_steps = checkpoint.get("obliq", {}).get("bad_steps", 0)
        self.overflow_steps = checkpoint.get("obliq", {}).get("overflow_steps", 0)


def adds(term: Term) -> bool:
    """Whether a term adds a value to the objective (it overrides :meth:`Term.forward`), not only a mask."""
    return type(term).forward is not Term.forward
