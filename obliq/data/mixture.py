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
  normalised text; sentence-transformers' ``NoDuplicatesBatchSampler``), the steps keeping their sizes
  and number (:func:`_arrange`). Guarantees: (i) a row is put with a text of its own only if, at its
  turn, every step with room held one (first fit, most shared rows first, smaller steps first);
  (ii) when one text must repeat (in ``m`` rows, more than the ``S`` steps: a query with more positives
  than steps, a passage that is one kNN row's anchor and many rows' neighbour), the steps holding it
  twice are the fewest possible, the least ``k`` whose ``k`` largest steps, less one row each, hold
  ``m - S`` rows (at most once in the others). Tested against a brute force on small cases (one such
  text, or two in disjoint rows); more texts sharing rows make it a packing problem, where first fit
  is a heuristic. :meth:`MixturePlan.collisions` counts what remains, every role pair, in any plan.
"""

from __future__ import annotations

import functools
import glob
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal, Protocol

import numpy as np

from obliq.data.collisions import plan_collisions

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
    """What an arranged plan reads of the rows (:class:`obliq.data.reader.RowReader` provides it); a reader of
    rows with several positives also has ``positives(source, rows) -> list[int]``, each row's kept positives
    (how :meth:`MixturePlan.collisions` tells their keys from the negatives'; without it: one per row)."""

    def keys(self, source: int, rows: np.ndarray) -> list[np.ndarray]:
        """The identity keys of each row (int64 arrays, :meth:`obliq.data.rows.TrainingRow.keys`)."""
        ...

    def tasks(self, source: int, rows: np.ndarray) -> list[str]:
        """The ``task`` field of each row."""
        ...


def _arrange(members: np.ndarray, keys: list[set], caps: Sequence[int]) -> np.ndarray:
    """``members`` laid out in consecutive blocks of ``caps[0], caps[1], …`` rows (``sum(caps) == len(members)``),
    keeping keys apart (module docstring, "Arranged steps", for the guarantees).

    1. Rows are taken by how many rows hold their most shared key (most first, ties in the given order),
       blocks by size (smallest first, ties in step order); each row goes to the first block with room
       holding none of its keys (first fit), or is deferred.
    2. The deferred rows fill the room left: each meets a key in every block with room (blocks only fill)
       and goes where it makes the fewest pairs (ties: the most room). So the blocks with a collision are
       those with room after 1: when one key is in more rows than there are blocks, its rows take one block
       each, the others fill the smaller blocks first, and what is left is the fewest largest blocks.
    """
    shared: dict[int, int] = {}
    for i in members.tolist():
        for k in keys[i]:
            shared[k] = shared.get(k, 0) + 1
    rows = sorted(members.tolist(), key=lambda i: -max((shared[k] for k in keys[i]), default=0))
    visit = sorted(range(len(caps)), key=lambda b: caps[b])
    n = len(visit)
    room, held = [caps[b] for b in visit], [Counter() for _ in visit]  # a block's keys, with their rows
    blocks: list[list[int]] = [[] for _ in visit]
    parent = list(range(n + 1))  # union-find over full blocks: find(b) is the first block >= b with room

    def find(b: int) -> int:
        root = b
        while parent[root] != root:
            root = parent[root]
        while parent[b] != root:
            parent[b], b = root, parent[b]
        return root

    def put(i: int, b: int) -> None:
        blocks[b].append(i)
        held[b].update(keys[i])
        room[b] -= 1
        if not room[b]:
            parent[b] = b + 1

    deferred = []
    for i in rows:
        b = find(0)
        while b < n and not held[b].keys().isdisjoint(keys[i]):
            b = find(b + 1)
        put(i, b) if b < n else deferred.append(i)

    def with_room():
        b = find(0)
        while b < n:
            yield b
            b = find(b + 1)

    for i in deferred:  # every block with room meets it: the one where it adds fewest pairs, then the most room
        put(i, min(with_room(), key=lambda b: (sum(held[b][k] for k in keys[i]), -room[b])))
    order = [None] * n
    for b, block in zip(visit, blocks):
        order[b] = block
    return np.asarray([i for block in order for i in block], dtype=np.int64)


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

    def _caps(self, first: int) -> list[int]:
        """Rows of every step from step ``first`` on, all ranks together (the epoch's tail is dealt unevenly)."""
        return [
            self.bounds(s, self.world_size - 1)[1] - self.bounds(s, 0)[0] for s in range(first, self.steps_per_epoch)
        ]

    def _order(self, epoch: int) -> np.ndarray:
        """The arranged order of an epoch: positions of the mixture, step after step (held per epoch)."""
        if epoch not in self._arranged:
            q = np.arange(self.rows_per_epoch, dtype=np.int64)
            p = permute(q, self.rows_per_epoch, _keys(self.seed, _ORDER, epoch)) if self.shuffle else q
            keys, groups = self._read(epoch, p)
            size = self.batch_size * self.world_size
            no_duplicates = self.arrangement.no_duplicates
            full, rest = [], []
            for g in np.unique(groups) if self.arrangement.group_by != "none" else []:
                members = np.flatnonzero(groups == g)  # in the epoch's order
                cut = len(members) // size * size
                if no_duplicates:  # the group's own steps, then its remainder (a block of the tail)
                    members = _arrange(
                        members, keys, [size] * (cut // size) + [len(members) - cut] * (cut < len(members))
                    )
                full += [(k, int(g), members[k * size : (k + 1) * size]) for k in range(cut // size)]
                rest.append(members[cut:])
            if self.arrangement.group_by == "none":
                rest = [q]
            elif self.arrangement.order == "proportional":
                shuffled = np.random.default_rng([self.seed, 2, epoch]).permutation(len(full))
                full = [full[i] for i in shuffled]
            else:  # round-robin: the k-th step of every group, in turn
                full.sort(key=lambda c: (c[0], c[1]))
            chosen = np.concatenate([c[2] for c in full] + rest)
            if no_duplicates:  # the steps not wholly one group's: all of them without group_by
                first = min(len(full), self._head_steps)
                chosen[first * size :] = _arrange(chosen[first * size :], keys, self._caps(first))
            self._arranged = {epoch: p[chosen]}  # one epoch at a time
        return self._arranged[epoch]

    def step_rows(self, epoch: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, row)`` of one step, every rank's batch in rank order (what one contrastive loss sees)."""
        parts = [self.batch(epoch, step, r) for r in range(self.world_size)]
        return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])

    def collisions(self, epoch: int = 0, steps: int | None = None) -> dict:
        """In-step collisions of an epoch's first ``steps`` steps (default all): a text twice in one step, in any
        roles of two rows (:func:`obliq.data.collisions.plan_collisions`, which documents the counts).

        Raises:
            ValueError: the plan has no access to the rows' keys.
        """
        return plan_collisions(self, epoch, steps)

    def fingerprint(self) -> dict:
        """What a saved position depends on; resuming under a different fingerprint cannot be exact. A plan that
        keeps texts apart (``no_duplicates``) also depends on the texts each row brings, so on the reader's
        caps (:class:`~obliq.data.rows.RowCaps`; issue 53: a resume under other caps re-arranged the epoch, rows
        twice and never)."""
        out = {
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
        if self.arrangement.no_duplicates and self.rows is not None:
            caps = getattr(self.rows, "caps", None)
            out["row_caps"] = asdict(caps) if caps is not None else dict.fromkeys(("max_negatives", "max_positives"))
        return out
