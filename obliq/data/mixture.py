"""The epoch plan of a mixture: which rows each (epoch, step, rank) batch holds, in O(1) memory.

Per-epoch counts. Source ``i`` has ``n_i`` valid rows and contributes ``c_i`` rows to every epoch:

- plain source (no weight, no count): ``c_i = n_i``, every row once;
- ``count=c`` (the dose): exactly ``c`` rows each epoch, the same rows every epoch: the first ``c``
  of a seeded permutation of the source (so a dose of 5,000 is contained in a dose of 10,000); a
  count above ``n_i`` is an error (a dose of more rows than there are), unless the source asks to
  ``repeat``: it then takes the whole source ``c // n_i`` times (each time in a new seeded order)
  and then the first ``c mod n_i`` rows of one more order;
- ``weight=w``: the weighted sources share ``sum(n_j for weighted j)`` rows per epoch in
  proportion to their weights (largest-remainder rounding, so the per-epoch counts are exact and
  the same every epoch); a weighted source is read as an endless sequence of seeded permutations
  of its rows, epoch ``e`` taking positions ``[e*c_i, (e+1)*c_i)``, so a down-weighted source shows
  different rows in successive epochs and no row twice before all were shown once.

The ``E = sum(c_i)`` rows of an epoch are put in a seeded pseudo-random order (a bijection of
``[0, E)`` keyed by ``(seed, epoch)``, see :func:`permute`) and cut into steps: each step gives
every rank ``batch_size`` consecutive rows of that order, except the epoch's tail (the last step,
or the last two when the last alone would leave a rank empty), whose rows are dealt over the ranks
so that batch sizes differ by at most one and none is empty. Every rank therefore runs the same
number of steps, and each row of the epoch lands in exactly one (step, rank) batch.

Nothing here reads a file or holds a per-row array: a batch's rows are computed from
``(epoch, step, rank)`` alone, which is what makes exact resume a matter of two integers.

**Arranged steps** (:class:`StepArrangement`, optional). The epoch's seeded order can be rearranged
before it is cut into steps, as a deterministic function of ``(seed, epoch)`` and the rows' keys
(so a resume still needs only the two integers; the arranged order of an epoch is computed once and
held, one int64 per row):

- ``group_by`` (``source`` or ``task``): each step is drawn from one group (sentence-transformers'
  multi-dataset batch samplers, FlagEmbedding's ``same_dataset_within_batch``): in-batch negatives
  then come from the same task, not trivially from another. The epoch's rows are taken group by
  group, in steps of the step size; the full steps of all groups are put in a seeded random order
  (``proportional``: a group's share of steps is its share of the epoch, i.e. the mixture's counts
  and weights) or in turn (``round-robin``); each group's remainder is left to the epoch's last steps,
  the only steps that may mix groups. The number of steps per epoch does not change.
- ``no_duplicates``: no text twice in a step in any role (query, positive, negative, by id or
  normalised text; sentence-transformers' ``NoDuplicatesBatchSampler``): a row whose keys meet the
  step's is deferred to a later step. Rows that cannot be placed without a collision (at the end of
  an epoch, or where one text is in more rows than there are steps) are placed anyway and counted:
  :meth:`MixturePlan.collisions` reports the rows and steps affected in any plan.
"""

from __future__ import annotations

import functools
import glob
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal, Protocol

import numpy as np

_ROUNDS = 6
_ORDER, _CYCLE = 0, 1


@dataclass(frozen=True)
class Source:
    """One source of training rows.

    Attributes:
        path: a JSONL file, or a glob (``*``, ``?``, ``[...]``, recursive ``**``); matching files
            are read in sorted order.
        weight: share of the weighted rows per epoch (> 0); see the module docstring.
        count: exact number of rows per epoch (>= 0), e.g. the kNN dose.
        name: what the source is called (``knn``, ``synthetic``): how the dose sweep, the quickstart
            and an ablation pick a source of a recipe; unique within a mixture. None: unnamed.
        repeat: let a ``count`` above the source's rows repeat rows within an epoch (otherwise an error).

    At most one of ``weight`` and ``count`` may be set; with neither, every row once per epoch.

    Raises:
        ValueError: both set, a weight that is not a finite positive number, a negative count, or an
            empty name.
    """

    path: str
    weight: float | None = None
    count: int | None = None
    name: str | None = None
    repeat: bool = False

    def __post_init__(self):
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"source {self.path}: name must be a non-empty string, got {self.name!r}")
        if self.weight is not None and self.count is not None:
            raise ValueError(f"source {self.path}: give a weight or a count, not both")
        if self.weight is not None and not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"source {self.path}: weight must be a finite number > 0, got {self.weight}")
        if self.count is not None and (
            isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0
        ):
            raise ValueError(f"source {self.path}: count must be an integer >= 0, got {self.count!r}")

    def files(self) -> list[str]:
        """The matching files, sorted.

        Raises:
            FileNotFoundError: nothing matches.
        """
        found = sorted(p for p in glob.glob(os.path.expanduser(self.path), recursive=True) if os.path.isfile(p))
        if not found:
            raise FileNotFoundError(f"source {self.path}: no file matches")
        return found


def _mix(z: np.ndarray) -> np.ndarray:
    # SplitMix64 finaliser (Steele, Lea & Flood 2014), on uint64 with wrap-around.
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _feistel(x: np.ndarray, keys: np.ndarray, half: int) -> np.ndarray:
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (_mix(right ^ key) & mask)
    return (left << shift) | right


def permute(positions: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """Apply a keyed pseudo-random bijection of ``[0, n)`` to ``positions``.

    A balanced Feistel network (Luby & Rackoff 1988) on the smallest ``4**h >= n`` with the
    SplitMix64 finaliser as round function, restricted to ``[0, n)`` by cycle walking (Black &
    Rogaway, "Ciphers with arbitrary finite domains", 2002): any position maps to one row, in O(1)
    memory, so an epoch of any size is shuffled without a per-row array.

    Args:
        positions: integer array, values in ``[0, n)``, any shape.
        n: domain size (>= 1).
        keys: uint64 round keys, shape ``(rounds,)``.

    Returns:
        int64 array of the same shape, values in ``[0, n)``; distinct positions map to distinct values.
    """
    x = np.asarray(positions, dtype=np.uint64)
    if n <= 1:
        return np.zeros(x.shape, np.int64)
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    y = _feistel(x, keys, half)
    out = y >= np.uint64(n)
    while out.any():  # at most 4*n - n steps of the walk; about 1.4 on average
        y[out] = _feistel(y[out], keys, half)
        out = y >= np.uint64(n)
    return y.astype(np.int64)


@functools.lru_cache(maxsize=256)
def _keys(seed: int, *tag: int) -> np.ndarray:
    return np.random.SeedSequence([seed, *tag]).generate_state(_ROUNDS, dtype=np.uint64)


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Largest-remainder (Hamilton) rounding of ``total * w / sum(w)``; ties go to the earlier source."""
    quotas = [total * w / sum(weights) for w in weights]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def named_source(sources: Sequence[dict | Source], name: str, where: object = "the mixture") -> int:
    """The index of the source called ``name`` among ``sources`` (dicts as in a recipe, or :class:`Source`).

    Raises:
        ValueError: no source or several sources have that name (the names found are listed).
    """
    names = [s.get("name") if isinstance(s, dict) else s.name for s in sources]
    hits = [i for i, n in enumerate(names) if n == name]
    if len(hits) != 1:
        raise ValueError(
            f"{where}: {'no' if not hits else 'more than one'} data source named {name!r} "
            f"(sources named: {', '.join(str(n) for n in names)})"
        )
    return hits[0]


@dataclass(frozen=True)
class StepArrangement:
    """How an epoch's rows are arranged into steps (module docstring, "Arranged steps").

    Attributes:
        no_duplicates: keep every text out of a step once it is in it (any role).
        group_by: ``none``, ``source`` (the mixture's sources) or ``task`` (the rows' ``task`` field):
            each step drawn from one group.
        order: with ``group_by``: ``proportional`` (seeded random order of all groups' steps) or
            ``round-robin`` (the groups in turn).

    Raises:
        ValueError: an unknown ``group_by`` or ``order``.
    """

    no_duplicates: bool = False
    group_by: Literal["none", "source", "task"] = "none"
    order: Literal["proportional", "round-robin"] = "proportional"

    def __post_init__(self):
        if self.group_by not in ("none", "source", "task"):
            raise ValueError(f"group_by must be none, source or task, got {self.group_by!r}")
        if self.order not in ("proportional", "round-robin"):
            raise ValueError(f"order must be proportional or round-robin, got {self.order!r}")

    @property
    def plain(self) -> bool:
        """True when the steps are the epoch's order cut as it is."""
        return not self.no_duplicates and self.group_by == "none"


class RowKeys(Protocol):
    """What an arranged plan reads of the rows (:class:`obliq.data.datamodule.RowReader` provides it)."""

    def keys(self, source: int, rows: np.ndarray) -> list[np.ndarray]:
        """The identity keys of each row (int64 arrays, :meth:`obliq.data.rows.TrainingRow.keys`)."""
        ...

    def tasks(self, source: int, rows: np.ndarray) -> list[str]:
        """The ``task`` field of each row."""
        ...


def _greedy(members: np.ndarray, keys: list[set], size: int) -> np.ndarray:
    """``members`` reordered block by block (blocks of ``size``, the last one shorter) so that no block
    holds a key twice where the rows allow it: a row that meets the open block's keys waits, and the
    waiting rows are tried first when the next block opens. A key held by more rows than there are
    blocks left cannot be kept apart: it is spread, at most ``ceil(rows left with it / blocks left)`` to
    a block (these are the collisions :meth:`MixturePlan.collisions` counts). Every block but the last
    holds exactly ``size`` rows."""
    left: dict[int, int] = {}
    for i in members.tolist():
        for k in keys[i]:
            left[k] = left.get(k, 0) + 1
    out: list[int] = []
    waiting: list[int] = []
    rest = iter(members.tolist())
    unplaced, exhausted = len(members), False
    while unplaced:
        blocks = -(-unplaced // size)
        block, used, kept = [], {}, []

        def fits(i: int) -> bool:
            return all(used.get(k, 0) < max(1, -(-left[k] // blocks)) for k in keys[i])

        def place(i: int) -> None:
            block.append(i)
            for k in keys[i]:
                used[k] = used.get(k, 0) + 1

        for i in waiting:
            if len(block) < size and fits(i):
                place(i)
            else:
                kept.append(i)
        waiting = kept
        while len(block) < size and not exhausted:
            i = next(rest, None)
            if i is None:
                exhausted = True
            elif fits(i):
                place(i)
            else:
                waiting.append(i)
        while len(block) < size and waiting:  # nothing fits any more: the rows that meet the block least
            best = min(range(len(waiting)), key=lambda j: sum(used.get(k, 0) for k in keys[waiting[j]]))
            place(waiting.pop(best))
        for i in block:
            for k in keys[i]:
                left[k] -= 1
        unplaced -= len(block)
        out += block
    return np.asarray(out, dtype=np.int64)


class MixturePlan:
    """Rows of every (epoch, step, rank) batch of a mixture, computed on demand (module docstring).

    Args:
        sources: the sources, in order.
        sizes: valid rows of each source, same order.
        batch_size: anchors per rank per step (N).
        world_size: number of ranks.
        seed: seed of all orders (>= 0).
        shuffle: ``False`` keeps file order: sources one after another, rows in file order.
        content: per source, a digest of its rows (ids in file order); part of the fingerprint, so a
            saved position is not resumed over other rows of the same count.
        arrangement: how an epoch's rows are arranged into steps (default: cut as they are).
        rows: what an arrangement reads of the rows (their keys and tasks); needed unless the
            arrangement is plain, and by :meth:`collisions`.

    Attributes:
        per_epoch: rows each source contributes to every epoch.
        rows_per_epoch: ``sum(per_epoch)``.
        steps_per_epoch: steps of every rank per epoch.

    Raises:
        ValueError: a source with no valid rows is asked for rows, fewer rows per epoch than ranks,
            a layout that would leave a batch empty (``batch_size`` 1 with an uneven tail), or a bad
            ``batch_size`` / ``world_size`` / ``seed``.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        sizes: Sequence[int],
        batch_size: int,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        content: Sequence[str] | None = None,
        arrangement: StepArrangement | None = None,
        rows: RowKeys | None = None,
    ):
        if batch_size < 1 or world_size < 1 or seed < 0:
            raise ValueError(
                f"need batch_size >= 1, world_size >= 1, seed >= 0; got {batch_size}, {world_size}, {seed}"
            )
        if len(sources) != len(sizes):
            raise ValueError("one size per source")
        self.sources, self.sizes = list(sources), [int(n) for n in sizes]
        self.batch_size, self.world_size, self.seed, self.shuffle = batch_size, world_size, seed, shuffle
        self.content = list(content) if content is not None else [None] * len(self.sources)
        self.arrangement, self.rows = arrangement or StepArrangement(), rows
        if not self.arrangement.plain and rows is None:
            raise ValueError("an arranged step plan needs the rows' keys (rows=...)")
        self._arranged: dict[int, np.ndarray] = {}

        weighted = [i for i, s in enumerate(sources) if s.weight is not None]
        shares = (
            _apportion(sum(self.sizes[i] for i in weighted), [sources[i].weight for i in weighted]) if weighted else []
        )
        share = dict(zip(weighted, shares))
        self.per_epoch = [
            s.count if s.count is not None else share.get(i, self.sizes[i]) for i, s in enumerate(sources)
        ]
        for s, n, c in zip(sources, self.sizes, self.per_epoch):
            if c > 0 and n == 0:
                raise ValueError(f"source {s.path}: no valid rows, but {c} are needed per epoch")
            if s.count is not None and s.count > n and not s.repeat:
                raise ValueError(
                    f"source {s.path}: count {s.count} is more than its {n} valid rows (a dose of rows it does "
                    "not have); lower the count, or set repeat: true to repeat rows within an epoch"
                )
        self._starts = np.cumsum([0, *self.per_epoch])
        self.rows_per_epoch = int(self._starts[-1])
        if self.rows_per_epoch < world_size:
            raise ValueError(f"{self.rows_per_epoch} rows per epoch cannot give each of {world_size} ranks a batch")

        step_rows = batch_size * world_size
        self.steps_per_epoch = -(-self.rows_per_epoch // step_rows)
        last = self.rows_per_epoch - (self.steps_per_epoch - 1) * step_rows
        tail_steps = 1 if last >= world_size else 2
        self._head_steps = self.steps_per_epoch - tail_steps
        self._tail_rows = self.rows_per_epoch - self._head_steps * step_rows
        self._tail_batches = tail_steps * world_size
        if self._tail_rows // self._tail_batches < 1:
            raise ValueError(
                f"batch_size {batch_size} on {world_size} ranks leaves an empty batch at the end of an epoch of "
                f"{self.rows_per_epoch} rows; change batch_size or the mixture"
            )

    def bounds(self, step: int, rank: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` in the epoch's order held by ``(step, rank)``.

        Raises:
            IndexError: step or rank out of range.
        """
        if not (0 <= step < self.steps_per_epoch and 0 <= rank < self.world_size):
            raise IndexError(
                f"step {step} / rank {rank} outside {self.steps_per_epoch} steps x {self.world_size} ranks"
            )
        if step < self._head_steps:
            lo = (step * self.world_size + rank) * self.batch_size
            return lo, lo + self.batch_size
        b = (step - self._head_steps) * self.world_size + rank
        base = self._head_steps * self.world_size * self.batch_size
        return base + b * self._tail_rows // self._tail_batches, base + (b + 1) * self._tail_rows // self._tail_batches

    def batch(self, epoch: int, step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows of one batch.

        Returns:
            ``(source, row)``: int64 arrays of shape ``(n,)``, ``n`` the batch size (see module
            docstring): the source index and the row number among that source's valid rows.
        """
        lo, hi = self.bounds(step, rank)
        if self.arrangement.plain:
            q = np.arange(lo, hi, dtype=np.int64)
            return self._rows(
                epoch, permute(q, self.rows_per_epoch, _keys(self.seed, _ORDER, epoch)) if self.shuffle else q
            )
        return self._rows(epoch, self._order(epoch)[lo:hi])

    def _rows(self, epoch: int, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, row)`` of positions ``p`` of the epoch's mixture (before its order)."""
        source = np.searchsorted(self._starts[1:], p, side="right").astype(np.int64)
        row = p - self._starts[source]
        for i in np.unique(source):
            sel = source == i
            n, c = self.sizes[i], self.per_epoch[i]
            t = row[sel] + (epoch * c if self.sources[i].weight is not None else 0)
            cycle, within = np.divmod(t, n)
            if self.shuffle:
                for k in np.unique(cycle):
                    at = cycle == k
                    within[at] = permute(within[at], n, _keys(self.seed, _CYCLE, int(i), int(k)))
            row[sel] = within
        return source, row

    def _read(self, epoch: int, p: np.ndarray) -> tuple[list[set], np.ndarray]:
        """The key sets and group codes of the rows at positions ``p``."""
        source, row = self._rows(epoch, p)
        keys: list[set] = [set()] * len(p)
        groups = np.zeros(len(p), dtype=np.int64)
        names: dict[str, int] = {}
        for i in np.unique(source):
            at = np.flatnonzero(source == i)
            for j, k in zip(at, self.rows.keys(int(i), row[at])):
                keys[j] = set(k.tolist())
            if self.arrangement.group_by == "source":
                groups[at] = i
            elif self.arrangement.group_by == "task":
                groups[at] = [names.setdefault(t, len(names)) for t in self.rows.tasks(int(i), row[at])]
        return keys, groups

    def _order(self, epoch: int) -> np.ndarray:
        """The arranged order of an epoch: positions of the mixture, step after step (held per epoch)."""
        if epoch not in self._arranged:
            q = np.arange(self.rows_per_epoch, dtype=np.int64)
            p = permute(q, self.rows_per_epoch, _keys(self.seed, _ORDER, epoch)) if self.shuffle else q
            keys, groups = self._read(epoch, p)
            size = self.batch_size * self.world_size
            full, rest = [], []
            for g in np.unique(groups):
                members = np.flatnonzero(groups == g)  # in the epoch's order
                if self.arrangement.no_duplicates:
                    members = _greedy(members, keys, size)
                cut = len(members) // size * size
                full += [(k, int(g), members[k * size : (k + 1) * size]) for k in range(cut // size)]
                rest.append(members[cut:])
            if self.arrangement.group_by != "none" and self.arrangement.order == "proportional":
                shuffled = np.random.default_rng([self.seed, 2, epoch]).permutation(len(full))
                full = [full[i] for i in shuffled]
            elif self.arrangement.group_by != "none":  # round-robin: the k-th step of every group, in turn
                full.sort(key=lambda c: (c[0], c[1]))
            tail = np.concatenate(rest) if rest else np.empty(0, np.int64)
            if self.arrangement.no_duplicates and len(rest) > 1:
                tail = _greedy(tail, keys, size)  # the groups' remainders: the epoch's last steps
            chosen = np.concatenate([c[2] for c in full] + [tail])
            self._arranged = {epoch: p[chosen]}  # one epoch at a time
        return self._arranged[epoch]

    def step_rows(self, epoch: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, row)`` of one step, every rank's batch in rank order (what one contrastive loss sees)."""
        parts = [self.batch(epoch, step, r) for r in range(self.world_size)]
        return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])

    def collisions(self, epoch: int = 0, steps: int | None = None) -> dict:
        """In-step collisions of an epoch (``shared/cases/C34``): rows whose query text (or id) is
        another row's document (positive or negative) in the same step, rows that share their query
        with another row of the step, and the steps that hold either. With in-batch negatives such a
        row meets its own text, or another row's relevant document, as a negative unless the loss
        masks it (:func:`obliq.loss.info_nce` does).

        Args:
            epoch: the epoch.
            steps: count its first ``steps`` steps only (default: all).

        Returns:
            ``{"epoch", "steps", "rows", "rows_own_text_as_document", "rows_sharing_a_query",
            "steps_affected"}`` (``rows``: rows in the counted steps).

        Raises:
            ValueError: the plan has no access to the rows' keys.
        """
        if self.rows is None:
            raise ValueError("counting collisions needs the rows' keys (rows=...)")
        own = shared = affected = counted = 0
        steps = self.steps_per_epoch if steps is None else min(steps, self.steps_per_epoch)
        for step in range(steps):
            source, row = self.step_rows(epoch, step)
            counted += len(row)
            keys = [k for i in np.unique(source) for k in self.rows.keys(int(i), row[source == i])]
            queries = [tuple(k[:2].tolist()) for k in keys]
            docs: dict[int, int] = {}  # key → how many rows hold it as a document
            for k in keys:
                for key in set(k[2:].tolist()):
                    docs[key] = docs.get(key, 0) + 1
            qcount: dict[int, int] = {}
            for q in queries:
                for key in set(q):
                    qcount[key] = qcount.get(key, 0) + 1
            hit = False
            for k, q in zip(keys, queries):
                own_docs = set(k[2:].tolist())
                if any(docs.get(key, 0) - (key in own_docs) > 0 for key in q):
                    own += 1
                    hit = True
                if any(qcount[key] > 1 for key in set(q)):
                    shared += 1
                    hit = True
            affected += hit
        return {
            "epoch": epoch,
            "steps": steps,
            "rows": counted,
            "rows_own_text_as_document": own,
            "rows_sharing_a_query": shared,
            "steps_affected": affected,
        }

    def fingerprint(self) -> dict:
        """What a saved position depends on; resuming under a different fingerprint cannot be exact."""
        return {
            "sources": [
                {"rows": n, "per_epoch": c, "weight": s.weight, "count": s.count, "content": d}
                for s, n, c, d in zip(self.sources, self.sizes, self.per_epoch, self.content)
            ],
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "arrangement": asdict(self.arrangement),
            "seed": self.seed,
            "shuffle": self.shuffle,
        }
