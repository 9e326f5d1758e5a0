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
"""

from __future__ import annotations

import functools
import glob
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

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
        q = np.arange(lo, hi, dtype=np.int64)
        p = permute(q, self.rows_per_epoch, _keys(self.seed, _ORDER, epoch)) if self.shuffle else q
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

    def fingerprint(self) -> dict:
        """What a saved position depends on; resuming under a different fingerprint cannot be exact."""
        return {
            "sources": [
                {"rows": n, "per_epoch": c, "weight": s.weight, "count": s.count, "content": d}
                for s, n, c, d in zip(self.sources, self.sizes, self.per_epoch, self.content)
            ],
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }
