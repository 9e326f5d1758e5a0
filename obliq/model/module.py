"""The LightningModule: one training step is one GradCache step over the rank's whole batch.

Manual optimisation (Lightning): AdamW (lr 2e-4), linear warmup over the first 3% of steps then
linear decay to 0 (the model card; transformers' ``get_linear_schedule_with_warmup``), optional
gradient clipping. A step whose loss or gradient norm is not finite is skipped and counted;
``max_bad_steps`` in a row stop the run with a checkpoint and a clear message. Under fp16
(``16-mixed``, a GradScaler) the gradients are unscaled before their norm is clipped or logged, the
scaler is updated after every step, and a step it skips for overflow is counted apart
(``train/overflow_steps``), not as a bad step: the schedule advances only on applied steps (the
PyTorch AMP recipe: scale → backward → unscale → clip → step → update).

Logged every step: ``train/loss`` and its terms (``train/infonce``, ``train/infonce_dim<d>``, ``train/teacher``,
``train/relational``), each the value of the objective whose gradient the step applies, summed over the ranks
(torchmetrics' ``SumMetric``), so the same on 1 and N processes (:meth:`RetrieverModule.objective`).

Checkpoints hold only the trainable weights (the LoRA adapter, or everything when training fully),
plus what Lightning saves itself: optimizer, scheduler, loop and data-loader state. Randomness is
re-seeded at every step from (seed, step), so the checkpoint's step number is the RNG state.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from torchmetrics import SumMetric

from obliq.distributed import gather, world
from obliq.loss import (
    InfoNCELoss,
    check_negatives,
    false_negative_masks,
    guided_mask,
    relational_distillation,
    teacher_distillation,
)
from obliq.model.encoder import BiEncoder
from obliq.model.gradcache import chunk_counts_across_ranks, grad_cache_step

log = logging.getLogger(__name__)


class RetrieverModule(L.LightningModule):
    """Trains a :class:`~obliq.model.BiEncoder` with InfoNCE + GradCache.

    Args:
        encoder: the bi-encoder (in a config: ``class_path: obliq.model.BiEncoder`` + ``init_args``).
        temperature: InfoNCE τ (0.02 = scale 50, the model card).
        chunk_size: GradCache chunk (rows per forward pass); None encodes each side in one pass.
        sort_by_length: group each side's rows into GradCache chunks by length, so each chunk is
            padded only to its own longest row (same loss; see :func:`~obliq.model.gradcache.grad_cache_step`).
        gather_across_devices: use every rank's documents as negatives.
        symmetric: also train the reverse direction, each row's positive against every query of the
            batch (:func:`obliq.loss.info_nce`; for passage↔passage sources such as kNN pairs).
        teacher_loss: ``none``, or distil a teacher's scores of each row's candidates on top of InfoNCE
            (:func:`obliq.loss.teacher_distillation`: ``kl`` or ``margin-mse``; rows need
            ``meta.teacher_scores`` and negatives, ``obliq distill pairs --teacher_scores --negatives``).
        teacher_weight: the weight of that term.
        teacher_temperature: τ of the teacher's softmax (kl).
        relational_weight: the weight of the in-batch relational distillation term (0: off): KL of the
            student's softmax over the step's documents from the teacher's (:func:`obliq.loss.relational_distillation`);
            needs ``data.teacher_vectors``. Gives kNN rows, which have no scored candidates, a teacher term.
        relational_temperature: τ of the teacher's softmax there; null sets it from the teacher's score spread.
        guided_margin: null, or leave out of InfoNCE each in-batch candidate the teacher scores above the row's
            positive less this margin (GIST, :func:`obliq.loss.guided_mask`); needs ``data.teacher_vectors``
            and one device.
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        warmup_ratio: share of the total steps with linear warmup.
        max_grad_norm: clip the global gradient norm to this (None: no clipping).
        max_bad_steps: consecutive non-finite steps that stop the run.
        seed: seeds each step's randomness (LoRA and model dropout) as a function of (seed, step),
            so a resumed run draws exactly what an uninterrupted one would.
        matryoshka_dims: null, or train at these nested embedding dimensions too (the loss at each,
            truncated and re-normalised, summed: :func:`obliq.loss.matryoshka`), e.g. ``[384, 192, 96, 48]``;
            evaluate a truncation with ``--retrieval.dim``.
        matryoshka_weights: one weight per dimension (default 1 each).

    Batch: the dictionary of :mod:`obliq.data` (``query``, ``docs``, ``positive_index``,
    ``doc_keys``, ``query_keys``, ...).
    """

    def __init__(
        self,
        encoder: BiEncoder,
        temperature: float = 0.02,
        chunk_size: int | None = 4,
        sort_by_length: bool = True,
        gather_across_devices: bool = True,
        symmetric: bool = False,
        teacher_loss: Literal["none", "kl", "margin-mse"] = "none",
        teacher_weight: float = 1.0,
        teacher_temperature: float = 0.05,
        relational_weight: float = 0.0,
        relational_temperature: float | None = None,
        guided_margin: float | None = None,
        lr: float = 2e-4,
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.03,
        max_grad_norm: float | None = 1.0,
        max_bad_steps: int = 5,
        seed: int = 0,
        matryoshka_dims: list[int] | None = None,
        matryoshka_weights: list[float] | None = None,
    ):
        super().__init__()
        if not 0 <= warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or null, got {chunk_size}")
        if teacher_loss not in ("none", "kl", "margin-mse"):
            raise ValueError(f"teacher_loss must be none, kl or margin-mse, got {teacher_loss!r}")
        if not (teacher_weight >= 0 and math.isfinite(teacher_weight)):  # NaN fails too
            raise ValueError(f"model.teacher_weight must be a finite number >= 0, got {teacher_weight}")
        if not (teacher_temperature > 0 and math.isfinite(teacher_temperature)):
            raise ValueError(f"model.teacher_temperature must be a finite number > 0, got {teacher_temperature}")
        if not (relational_weight >= 0 and math.isfinite(relational_weight)):
            raise ValueError(f"model.relational_weight must be a finite number >= 0, got {relational_weight}")
        if relational_temperature is not None and not (
            relational_temperature > 0 and math.isfinite(relational_temperature)
        ):
            raise ValueError(
                f"model.relational_temperature must be null or a finite number > 0, got {relational_temperature}"
            )
        if guided_margin is not None and not (guided_margin >= 0 and math.isfinite(guided_margin)):
            raise ValueError(f"model.guided_margin must be null or a finite number >= 0, got {guided_margin}")
        self.save_hyperparameters(ignore=["encoder"])
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold only the trainable weights
        self.encoder = encoder
        self.loss = InfoNCELoss(temperature, gather_across_devices, symmetric, matryoshka_dims, matryoshka_weights)
        self.chunk_size = chunk_size
        self.sort_by_length = sort_by_length
        self.bad_steps = 0
        self.consecutive_bad = 0
        self.overflow_steps = 0  # fp16 steps the GradScaler skipped (not bad steps)
        self._grad_norm = torch.tensor(0.0)
        self._t_last: float | None = None
        terms = ["loss", "infonce", *(f"infonce_dim{d}" for d in matryoshka_dims or [])]
        terms += ["teacher"] * (teacher_loss != "none") + ["relational"] * bool(relational_weight)
        # what each rank adds to a logged term, summed over the ranks at every step (module notes)
        self.logged_terms = torch.nn.ModuleDict({t: SumMetric(dist_sync_on_step=True) for t in terms})
        self._shares: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        """Hand the encoder's tokenization (a light, picklable object) to the data module."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and getattr(datamodule, "tokenize", None) is None:
            datamodule.tokenize = self.encoder.text

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
        """Take the peak lr and weight decay from this run's settings and set each group's lr to the
        schedule's value at the current step. A plain resume changes nothing; a resume that asks for
        another lr, weight decay, warmup or ``max_steps`` (a longer run) continues with them from the
        checkpoint's step (the restored optimizer would otherwise keep the old values, and a longer run
        take its first step at the old schedule's last lr, 0 at the end of a run)."""
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
        guided = self._guided_mask(batch)
        check_negatives(self.loss, batch, self.global_step, guided, self.trainer.datamodule)  # issue 49 §4
        try:
            loss = grad_cache_step(
                self.encoder,
                batch["query"],
                batch["docs"],
                lambda q, d: self.objective(q, d, batch, guided),
                self.chunk_size,
                backward=self.manual_backward,
                no_sync=self.trainer.strategy.block_backward_sync if self.trainer.world_size > 1 else None,
                backward_scale=self.loss.backward_scale,
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

    def _teacher_citation(self) -> dict:
        hp = self.hparams
        out = {}
        if hp.teacher_loss != "none":
            out.update(
                teacher_loss=hp.teacher_loss,
                teacher_weight=hp.teacher_weight,
                teacher_temperature=hp.teacher_temperature,
            )
        if hp.get("relational_weight"):
            out.update(relational_weight=hp.relational_weight, relational_temperature=hp.relational_temperature)
        if hp.get("guided_margin") is not None:
            out.update(guided_margin=hp.guided_margin)
        return out

    def _teacher_cosines(self, batch: dict, setting: str) -> torch.Tensor:
        if "teacher_cosines" not in batch:
            raise ValueError(f"model.{setting} needs the teacher's vectors: set data.teacher_vectors")
        return batch["teacher_cosines"].to(self.device)

    def _guided_mask(self, batch: dict) -> torch.Tensor | None:
        """The teacher-guided false-negative mask of this step (None without ``guided_margin``)."""
        if self.hparams.get("guided_margin") is None:
            return None
        teacher = self._teacher_cosines(batch, "guided_margin")
        return guided_mask(teacher, batch["positive_index"].to(self.device), self.hparams.guided_margin)

    def objective(self, q: torch.Tensor, d: torch.Tensor, batch: dict, guided: torch.Tensor | None = None):
        """This rank's loss of the step, the one GradCache back-propagates (times ``loss.backward_scale``,
        which the strategy's gradient average undoes), and each logged term's share of this rank.

        The step's objective, whose gradient the step applies, and what one process computes over the ranks'
        concatenated batch: ``infonce + teacher_weight · teacher + relational_weight · relational``, where

        - ``infonce`` is the contrastive loss (:class:`obliq.loss.InfoNCELoss`; with Matryoshka the weighted
          sum of each dimension's, logged too as ``infonce_dim<d>``); gathered across ranks, every rank
          computes the same value and back-propagates into its own rows;
        - ``teacher`` is the mean of :func:`obliq.loss.teacher_distillation` over every scored row of the
          step, all ranks' (each rank sums its rows' terms and divides by the count of all ranks');
        - ``relational`` is :func:`obliq.loss.relational_distillation` over the whole step: every rank's
          queries against every rank's documents, the teacher's cosines taken from its vectors
          (:class:`obliq.data.datamodule.StepCollator`), like ``infonce``.

        Without ``gather_across_devices`` each rank's contrastive and relational terms are its own batch's,
        and the objective their mean over the ranks. Each logged term is the sum over ranks of the shares
        kept here (``torchmetrics.SumMetric``, synced at every step): the objective's value, the same on 1
        and N processes. Sources: GradCache (Gao et al. 2021) for the cached gradients; DDP averages the
        ranks' gradients (PyTorch ``DistributedDataParallel``), hence the backward scale.

        Raises:
            FloatingPointError: a teacher term is not finite (on every rank, when on one).
        """
        _, ranks = world()
        together = self.loss.backward_scale > 1  # the loss gathers every rank's rows (its scale is the world's)
        scale = ranks / self.loss.backward_scale  # local terms: the strategy's average, undone
        positive_index = batch["positive_index"].to(q.device)
        keys, query_keys = batch["doc_keys"].to(q.device), batch["query_keys"].to(q.device)
        dims, parts = self.hparams.get("matryoshka_dims") or [], []
        nce = self.loss(q, d, positive_index, keys, query_keys, guided, *[parts] * bool(dims))
        total = nce
        shares = {"infonce": nce.detach() / ranks}
        shares.update({f"infonce_dim{dim}": p / ranks for dim, p in zip(dims, parts)})
        if self.hparams.teacher_loss != "none":
            terms = teacher_distillation(
                q,
                d,
                positive_index,
                batch["doc_row"].to(q.device),
                batch["teacher_scores"].to(q.device),
                self.hparams.teacher_loss,
                self.hparams.temperature,
                self.hparams.teacher_temperature,
                reduction="none",
            )
            count = torch.tensor([len(terms), float(not torch.isfinite(terms).all())], device=q.device)
            if ranks > 1:
                torch.distributed.all_reduce(count)
            if count[1] > 0:  # named here, not blamed on the contrastive loss or the lr
                raise FloatingPointError(f"non-finite teacher-score loss ({self.hparams.teacher_loss})")
            term = terms.sum() / count[0].clamp(min=1)
            total = total + self.hparams.teacher_weight * scale * term
            shares["teacher"] = term.detach()
        if self.hparams.get("relational_weight"):
            term = self._relational(q, d, batch, positive_index, keys, query_keys, together)
            total = total + self.hparams.relational_weight * term
            shares["relational"] = term.detach() / ranks
        shares["loss"] = shares["infonce"] + sum(
            w * shares[t]
            for t, w in (
                ("teacher", self.hparams.teacher_weight),
                ("relational", self.hparams.get("relational_weight")),
            )
            if t in shares
        )
        self._shares = shares
        return total

    def _relational(self, q, d, batch, positive_index, keys, query_keys, together: bool) -> torch.Tensor:
        """The relational term over the step (:meth:`objective`), in-batch false negatives left out."""
        if "teacher_query_vectors" in batch:
            tq, td = batch["teacher_query_vectors"].to(q.device), batch["teacher_doc_vectors"].to(q.device)
            if together:
                counts = gather(torch.tensor([d.shape[0]], device=d.device))
                positive_index = gather(positive_index + counts[: world()[0]].sum())
                q, d, tq, td, keys, query_keys = (gather(x) for x in (q, d, tq, td, keys, query_keys))
            teacher = (tq.double() @ td.double().T).float()  # as TeacherTable.cosines: float64, then float32
        else:  # a batch of another collator: its rank's block only
            teacher = self._teacher_cosines(batch, "relational_weight")
        forward, _ = false_negative_masks(positive_index, keys, query_keys)
        term = relational_distillation(
            q, d, teacher, forward, self.hparams.temperature, self.hparams.relational_temperature
        )
        if not torch.isfinite(term):
            raise FloatingPointError(f"non-finite relational teacher loss: {term.item()}")
        return term

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
            "loss": {**self.loss.citation(), "chunk_size": self.chunk_size, **self._teacher_citation()},
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
