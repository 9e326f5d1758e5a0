"""The training LightningDataModule: indexed sources, a stateful plan sampler, a row reader, a collator.

How the pieces fit (the batch structure and guarantees are in the package docstring, :mod:`obliq.data`):

- :class:`TrainingDataModule` indexes every file once (:mod:`obliq.data.index`), drops or rejects
  duplicate row ids across the whole mixture, and builds one loader per rank (:class:`PlanLoader`,
  a torchdata ``StatefulDataLoader``) over
- :class:`PlanSampler`, which yields a :class:`~obliq.data.reader.BatchRef` (the rows of one step of this rank, from
  :class:`~obliq.data.mixture.MixturePlan`) per step and whose state is ``(epoch, next step)``;
- :class:`~obliq.data.reader.RowReader`, a map-style dataset that reads and re-validates a
  :class:`~obliq.data.reader.BatchRef`'s rows with one ``pread`` each (:mod:`obliq.data.reader`); and
- :class:`~obliq.data.collate.Collator`, which tokenizes them with the injected ``tokenize(texts, kind)``
  and adds a teacher's vectors of the batch's queries and documents
  (:class:`~obliq.data.teacher_table.TeacherTable`) when one is given.

Exact resume. The loader is torchdata's ``StatefulDataLoader``, which Lightning 2.x checkpoints by
itself (``loops.fit_loop.state_dict.combined_loader`` in the checkpoint) and restores before the
first batch after ``trainer.fit(..., ckpt_path=...)``. With worker processes the sampler runs
ahead of training (``prefetch_factor * num_workers`` batches are dispatched early); the
``StatefulDataLoader`` takes the sampler's ``state_dict()`` as each batch is *dispatched* and
publishes it only once that batch is *yielded* to the training loop, so a checkpoint holds the
position after the last consumed batch, never after a prefetched one. Lightning does not prefetch
on top of that because the loader has a length. Lightning writes the checkpoint from rank 0 only
and every rank loads it: the saved state (epoch, next step, and a fingerprint of the mixture) is
the same on every rank, each rank re-derives its own rows from its rank number, and workers hold
no state at all (each batch is read whole by whichever worker gets it), so a position also
resumes under another ``num_workers`` (:class:`PlanLoader`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any, Literal

import lightning as L
import numpy as np
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from obliq.data.collate import Collator, Tokenize
from obliq.data.index import index_file
from obliq.data.mixture import MixturePlan, Source, StepArrangement
from obliq.data.reader import BatchRef, RowReader
from obliq.data.rows import RowCaps, RowError, TrainingRow
from obliq.data.teacher_table import TeacherTable


def collision_line(c: dict) -> str:
    """The log line of :meth:`~obliq.data.mixture.MixturePlan.collisions`: every role pair counted."""
    by_pair = ", ".join(f"{name} {n}" for name, n in c["pairs"].items())
    return (
        f"epoch {c['epoch']} of {c['steps']} steps: {c['colliding_pairs']} pairs of rows meet one text in a step "
        f"({by_pair}; by id or normalised text), {c['rows_colliding']} rows in {c['steps_colliding']} steps; of "
        f"these, {c['rows_own_text_as_document']} rows meet their own query text as a document and "
        f"{c['rows_sharing_a_query']} share a query with another row (the loss masks such false negatives)"
        + (
            f"; {c['cut_positives_in_step']} documents in a step are a positive data.max_positives left out of "
            f"another row ({c['rows_with_cut_positive_in_step']} rows; masked for them, never their negatives)"
            if c.get("cut_positives_in_step")
            else ""
        )
    )


class PlanSampler(DistributedSampler):
    """Yields one :class:`BatchRef` per step of one rank; stateful, for exact resume.

    State: ``epoch`` and ``step`` (the next step to yield). When a pass ends, the next ``iter()``
    starts the following epoch; :meth:`set_epoch` (called by Lightning at each epoch start) only
    moves to another epoch, so calling it with the current epoch keeps a restored position.
    A ``DistributedSampler`` subclass so that Lightning's ``use_distributed_sampler`` leaves it in
    place instead of wrapping it: the plan already shards by rank.

    Args:
        plan: the mixture plan (fixes ``world_size``).
        rank: this rank, in ``[0, plan.world_size)``.
    """

    def __init__(self, plan: MixturePlan, rank: int = 0):
        super().__init__(
            range(plan.rows_per_epoch), num_replicas=plan.world_size, rank=rank, shuffle=plan.shuffle, seed=plan.seed
        )
        self.plan, self.step = plan, 0

    def __len__(self) -> int:
        return self.plan.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of ``epoch``, unless already in it."""
        if epoch != self.epoch:
            self.epoch, self.step = epoch, 0

    def __iter__(self) -> Iterator[BatchRef]:
        if self.step >= self.plan.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0
        while self.step < self.plan.steps_per_epoch:
            step = self.step
            self.step += 1  # before yielding: the state names the next batch
            source, row = self.plan.batch(self.epoch, step, self.rank)
            yield BatchRef(self.epoch, step, source, row)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "step", "plan"}``: plain ints and the plan's fingerprint; the same on every rank."""
        return {"epoch": self.epoch, "step": self.step, "plan": self.plan.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`.

        Raises:
            ValueError: the saved position belongs to a different mixture, batch size, world size,
                seed or shuffle setting, where continuing could not be exact.
        """
        saved, now = state["plan"], self.plan.fingerprint()
        if saved != now:
            diff = sorted(k for k in now if saved.get(k) != now[k])
            raise ValueError(
                f"the checkpoint's data position was saved for a different data setup ({', '.join(diff)} differ: "
                f"saved {[saved.get(k) for k in diff]}, now {[now[k] for k in diff]}); "
                "resuming it exactly is impossible"
            )
        self.epoch, self.step = int(state["epoch"]), int(state["step"])


class PlanLoader(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader`` that also resumes a position saved with another ``num_workers``.

    ``StatefulDataLoader`` refuses (with a bare ``AssertionError``) a state saved with a different
    number of workers. Here all the position is the :class:`PlanSampler`'s (workers hold none), so
    in that case its state as of the last consumed batch (the loader snapshots at every step) is
    taken out of the saved state and loaded into the sampler directly; otherwise the state goes to
    ``StatefulDataLoader`` unchanged.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (any ``num_workers``)."""
        main = state_dict.get("_snapshot", {}).get("_main_snapshot", state_dict)
        if state_dict and main.get("_num_workers", 0) != self.num_workers and "_index_sampler_state" in main:
            self.sampler.load_state_dict(main["_index_sampler_state"])  # type: ignore[attr-defined]
            return super().load_state_dict({})
        return super().load_state_dict(state_dict)


class TrainingDataModule(L.LightningDataModule):
    """Streams a mixture of training-row JSONL sources into tokenized, resumable, rank-sharded batches.

    Args:
        sources: the sources (files or globs, each plain, with a ``weight`` or with a ``count``);
            see :class:`~obliq.data.mixture.Source` and :mod:`obliq.data.mixture`.
        batch_size: anchors (rows) per rank per step, N. The whole step batch of one rank; the
            model splits it into GradCache chunks.
        max_negatives: k, hard negatives kept per row (default 4; rows may have fewer).
        max_positives: positives kept per row, its first ones in file order (None, the default: all of them;
            a single-positive row always brings its one). Both are kept as :attr:`caps`
            (:class:`~obliq.data.rows.RowCaps`, which checks and reads them).
        seed: seed of the epoch order and of the per-source subsets (>= 0).
        shuffle: ``False`` reads sources and rows in file order.
        on_bad_row: ``"fail"`` raises the first bad row's ``file:line:field`` error; ``"skip"``
            leaves bad rows out, counts them by kind (:data:`~obliq.data.rows.ERROR_KINDS`), logs the
            counts and keeps them in :attr:`stats` and in the checkpoint.
        num_workers: loader worker processes per rank (reading and tokenizing).
        prefetch_factor: batches each worker prepares ahead.
        index_dir: where file indexes are cached (default ``$OBLIQ_CACHE/data-index``).
        tokenize: ``tokenize(texts, kind)`` (see :class:`Collator`); may be set later as an
            attribute, e.g. by the LightningModule's ``setup`` (``trainer.datamodule.tokenize =
            self.encoder.tokenize``). Worker processes are forked, so it need not be picklable.
        no_duplicates: no text twice in a step, in any role (:class:`~obliq.data.mixture.StepArrangement`);
            None (default): on when a source holds passage↔passage rows (``source: knn`` or
            ``random-control``, whose queries are corpus documents), off otherwise.
        group_by: ``none``, ``source`` or ``task``: each step drawn from one source or one task.
        group_order: ``proportional`` or ``round-robin`` (with ``group_by``).
        teacher_vectors: a teacher's vectors (``obliq distill graph --vectors_out``), for its in-batch terms.

    The in-step collisions of the first epoch (:meth:`~obliq.data.mixture.MixturePlan.collisions`: a text
    twice in a step, every role pair counted) are logged when a loader is made (:func:`collision_line`) and
    kept in :attr:`stats` (``stats["collisions"]``).

    Raises:
        ValueError: bad arguments; a file shared by two sources; two sources of one name; (fail mode) a
            duplicate row id.
        RowError: (fail mode) a bad row, at setup.
        RuntimeError: a loader is asked for before ``tokenize`` is set.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        batch_size: int = 32,
        max_negatives: int = 4,
        seed: int = 0,
        shuffle: bool = True,
        on_bad_row: Literal["fail", "skip"] = "fail",
        num_workers: int = 2,
        prefetch_factor: int = 2,
        index_dir: str | None = None,
        tokenize: Tokenize | None = None,
        no_duplicates: bool | None = None,
        group_by: Literal["none", "source", "task"] = "none",
        group_order: Literal["proportional", "round-robin"] = "proportional",
        teacher_vectors: str | None = None,
        max_positives: int | None = None,
    ):
        super().__init__()
        if on_bad_row not in ("fail", "skip"):
            raise ValueError(f"on_bad_row must be 'fail' or 'skip', got {on_bad_row!r}")
        if not sources:
            raise ValueError("no sources")
        self.caps = RowCaps(max_negatives, max_positives)
        if batch_size < 1 or num_workers < 0 or prefetch_factor < 1 or seed < 0:
            raise ValueError("need batch_size >= 1, num_workers >= 0, prefetch_factor >= 1, seed >= 0")
        self.sources = [s if isinstance(s, Source) else Source(**s) for s in sources]
        names = [s.name for s in self.sources if s.name is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"two data sources share a name: {sorted(n for n in names if names.count(n) > 1)[0]!r}")
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.on_bad_row, self.num_workers, self.prefetch_factor = on_bad_row, num_workers, prefetch_factor
        if index_dir is None:
            from obliq.files import cache_dir

            index_dir = str(cache_dir() / "data-index")
        self.index_dir, self.tokenize = index_dir, tokenize
        self.no_duplicates = no_duplicates
        StepArrangement(bool(no_duplicates), group_by, group_order)  # checks the settings now
        self.group_by, self.group_order = group_by, group_order
        self.teacher = TeacherTable(teacher_vectors) if teacher_vectors else None
        self.arrangement: StepArrangement | None = None
        self.reader: RowReader | None = None
        self.plan: MixturePlan | None = None
        self.stats: dict[str, Any] | None = None
        self.restored_stats: dict[str, Any] | None = None

    def _files(self) -> list[list[str]]:
        files = [source.files() for source in self.sources]
        seen: dict[str, str] = {}
        for source, paths in zip(self.sources, files):
            for path in paths:
                real = os.path.realpath(path)
                if real in seen:
                    raise ValueError(f"{path} is in two sources ({seen[real]!r} and {source.path!r})")
                seen[real] = source.path
        return files

    def prepare_data(self) -> None:
        """Index every file (once per node; Lightning calls this on local rank 0 before ``setup``)."""
        for paths in self._files():
            for path in paths:
                index_file(path, self.index_dir, self.on_bad_row)

    def first_rows(self, n: int = 64) -> Iterator[TrainingRow]:
        """The first ``n`` rows of every file of every source (after :meth:`setup`): the sample a check of the
        rows' content reads (the teacher's coverage, a term's inputs)."""
        for s, files in enumerate(self.reader.indexes):
            for f, fi in enumerate(files):
                for p in range(min(fi.rows, n)):
                    yield self.reader.read(s, f, p)

    def setup(self, stage: str | None = None) -> None:
        """Load the indexes (building missing ones), settle duplicate ids and compute :attr:`stats`."""
        if self.reader is not None:
            return
        indexes = [[index_file(p, self.index_dir, self.on_bad_row) for p in paths] for paths in self._files()]
        reader = RowReader(indexes)
        excluded = self._duplicates(reader)
        reader = RowReader(indexes, excluded, self.caps)
        self.reader = reader
        if self.teacher is not None:  # the first 64 rows of every file: vectors of another corpus are refused
            try:
                self.teacher.check_covers(self.first_rows())
            except ValueError:
                self.reader = None
                raise
        sizes = self.reader.sizes
        no_duplicates = self.no_duplicates
        if no_duplicates is None:  # passage↔passage rows: a query is another row's document
            first = [
                self.reader.read(s, f, 0) for s, files in enumerate(indexes) for f, fi in enumerate(files) if fi.rows
            ]
            no_duplicates = any(row.source in ("knn", "random-control") for row in first)
        self.arrangement = StepArrangement(no_duplicates, self.group_by, self.group_order)
        per_epoch = MixturePlan(self.sources, sizes, self.batch_size, 1, self.seed, self.shuffle).per_epoch
        sources = []
        for s, (source, files) in enumerate(zip(self.sources, indexes)):
            skipped = Counter()
            for fi in files:
                skipped.update(fi.skipped)
            dups = sum(len(v) for (src, _), v in excluded.items() if src == s)
            if dups:
                skipped["duplicate-id"] += dups
            sources.append(
                {
                    "name": source.name,
                    "path": source.path,
                    "files": len(files),
                    "rows": sizes[s],
                    "per_epoch": per_epoch[s],
                    "skipped": dict(sorted(skipped.items())),
                    "repaired_chars": sum(fi.repaired_chars for fi in files),
                    "repaired_rows": sum(fi.repaired_rows for fi in files),
                }
            )
        self.stats = {
            "sources": sources,
            "arrangement": asdict(self.arrangement),
            "rows_per_epoch": sum(per_epoch),
            "skipped": sum(sum(src["skipped"].values()) for src in sources),
            "repaired_chars": sum(src["repaired_chars"] for src in sources),
        }
        for src in sources:
            rank_zero_info(
                f"data: {src['path']}: {src['files']} file(s), {src['rows']} rows, {src['per_epoch']} per epoch, "
                f"skipped {src['skipped'] or 0}, repaired {src['repaired_chars']} chars in {src['repaired_rows']} rows"
            )
        if self.stats["skipped"]:
            where = sorted({str(fi.folder / "errors.txt") for files in indexes for fi in files if fi.skipped})
            rank_zero_warn(
                f"data: skipped {self.stats['skipped']} bad rows; messages in {', '.join(where) or 'the log'}"
            )

    def _duplicates(self, reader: RowReader) -> dict[tuple[int, int], np.ndarray]:
        """Find rows whose id an earlier row of the mixture (source, file, line order) already has.

        Uses the indexed 64-bit id hashes (8 bytes per row, held only during this call) and
        confirms each candidate by reading both rows.
        """
        flat = [(s, f) for s, files in enumerate(reader.indexes) for f in range(len(files))]
        if not flat:
            return {}
        hashes = np.concatenate([reader.indexes[s][f].array("ids") for s, f in flat])
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        repeat = np.flatnonzero(ordered[1:] == ordered[:-1]) + 1
        if not repeat.size:
            return {}
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        first = order[starts[np.searchsorted(starts, repeat, side="right") - 1]]
        later = order[repeat]
        file_starts = np.cumsum([0, *(reader.indexes[s][f].rows for s, f in flat)])

        def where(g: int) -> tuple[int, int, int]:
            k = int(np.searchsorted(file_starts[1:], g, side="right"))
            return (*flat[k], int(g - file_starts[k]))

        excluded: dict[tuple[int, int], list[int]] = {}
        messages: list[str] = []
        for g_first, g_later in sorted(zip(first.tolist(), later.tolist()), key=lambda p: p[1]):
            a, b = where(g_first), where(g_later)
            row_a, row_b = reader.read(*a), reader.read(*b)
            if row_a.id != row_b.id:  # a 64-bit hash collision, not a duplicate
                continue
            fa, fb = reader.indexes[a[0]][a[1]], reader.indexes[b[0]][b[1]]
            line_a, line_b = (int(reader._array(*x[:2], "lines")[x[2]]) for x in (a, b))
            err = RowError(
                fb.path, line_b, "id", "duplicate-id", f"row id {row_b.id!r} already used at {fa.path}:{line_a}"
            )
            if self.on_bad_row == "fail":
                raise err
            messages.append(str(err))
            excluded.setdefault(b[:2], []).append(b[2])
        if messages:
            more = f" (and {len(messages) - 5} more)" if len(messages) > 5 else ""
            rank_zero_warn(f"data: skipped {len(messages)} rows with duplicate ids: " + "; ".join(messages[:5]) + more)
        return {k: np.array(sorted(v), np.int64) for k, v in excluded.items()}

    def make_dataloader(self, rank: int = 0, world_size: int = 1) -> PlanLoader:
        """The loader of one rank: ``len()`` steps per epoch, each yielding one batch dictionary.

        Raises:
            RuntimeError: ``tokenize`` is not set.
        """
        if self.tokenize is None:
            raise RuntimeError(
                "TrainingDataModule.tokenize is not set: pass tokenize=... or set it before the loader is built "
                "(the LightningModule does `self.trainer.datamodule.tokenize = self.encoder.text` in setup)"
            )
        self.setup()
        assert self.reader is not None
        self.plan = MixturePlan(
            self.sources,
            self.reader.sizes,
            self.batch_size,
            world_size,
            self.seed,
            self.shuffle,
            self.reader.content(),
            self.arrangement,
            self.reader,
        )
        collisions = self.plan.collisions(0)
        self.stats["collisions"] = collisions
        how = "in plain order" if self.arrangement.plain else f"arranged {self.stats['arrangement']}"
        rank_zero_info(f"data: steps {how}; {collision_line(collisions)}")
        return PlanLoader(
            self.reader,
            sampler=PlanSampler(self.plan, rank),
            batch_size=None,
            collate_fn=Collator(self.tokenize, self.caps, self.teacher),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
            snapshot_every_n_steps=1,  # the saved position is exact after every step
        )

    def steps_per_epoch(self, world_size: int = 1) -> int:
        """Steps of every rank per epoch, from the data plan (the loader is not read)."""
        self.setup()
        assert self.reader is not None
        return MixturePlan(
            self.sources, self.reader.sizes, self.batch_size, world_size, self.seed, self.shuffle
        ).steps_per_epoch

    def train_dataloader(self) -> PlanLoader:
        """The loader of this rank (``trainer.global_rank`` of ``trainer.world_size``)."""
        trainer = self.trainer
        return self.make_dataloader(trainer.global_rank, trainer.world_size) if trainer else self.make_dataloader()

    def state_dict(self) -> dict[str, Any]:
        """``{"stats": ...}``: the row, skip and repair counts, saved in the checkpoint by Lightning.

        The stream position is not here: it is the loader's state, which Lightning saves itself.
        """
        return {"stats": self.stats}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's counts in :attr:`restored_stats` (for comparison; nothing else to restore)."""
        self.restored_stats = state_dict.get("stats")
