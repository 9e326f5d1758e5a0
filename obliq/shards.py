"""Splitting work over many processes: one shard of a list of work items (documents to generate
queries for, rows to mine negatives for), chosen deterministically, and the merge back.

A run with ``Shard(index=i, count=n)`` takes items ``i, i + n, i + 2n, …`` of the full, seeded list
and writes to its own file (:meth:`Shard.path`: ``rows.jsonl`` → ``rows.shard-2-of-8.jsonl``), so
each shard resumes on its own; a merge command checks that the shards cover every item exactly once
and writes the items in the order a single run would have. On a SLURM array job, leave ``index`` and
``count`` unset: they come from ``SLURM_ARRAY_TASK_ID`` (less ``SLURM_ARRAY_TASK_MIN``) and
``SLURM_ARRAY_TASK_COUNT``; under ``torchrun`` (no SLURM array), from ``RANK`` and ``WORLD_SIZE``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """One of ``count`` shards (``index`` from 0).

    Attributes:
        index: this shard; None reads it from SLURM (``SLURM_ARRAY_TASK_ID`` − ``SLURM_ARRAY_TASK_MIN``),
            else from torchrun (``RANK``), else 0.
        count: how many shards; None reads ``SLURM_ARRAY_TASK_COUNT``, else torchrun's ``WORLD_SIZE``, else 1.

    Raises:
        ValueError: ``count`` < 1 or ``index`` outside ``[0, count)``.
    """

    index: int | None = None
    count: int | None = None

    def resolved(self) -> Shard:
        """The shard with SLURM's values filled in where unset (see the attributes).

        Raises:
            ValueError: ``count`` < 1 or ``index`` outside ``[0, count)``.
        """
        slurm = "SLURM_ARRAY_TASK_ID" in os.environ
        torchrun = not slurm and "RANK" in os.environ and "WORLD_SIZE" in os.environ
        if self.count is not None:
            count = self.count
        else:
            count = int(os.environ.get("SLURM_ARRAY_TASK_COUNT", os.environ["WORLD_SIZE"] if torchrun else 1))
        if self.index is not None:
            index = self.index
        elif slurm:
            index = int(os.environ["SLURM_ARRAY_TASK_ID"]) - int(os.environ.get("SLURM_ARRAY_TASK_MIN", 0))
        elif torchrun:
            index = int(os.environ["RANK"])
        else:
            index = 0
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"shard: need 0 <= index < count, got index {index} of {count}")
        return Shard(index, count)

    def select(self, items: Sequence[T]) -> list[T]:
        """This shard's items: every ``count``-th from ``index`` (the shard must be :meth:`resolved`)."""
        return list(items[self.index :: self.count])

    def path(self, out: str | os.PathLike) -> Path:
        """This shard's output file: ``out`` itself for one shard, else ``<stem>.shard-<i>-of-<n><suffix>``."""
        out = Path(out)
        return out if self.count == 1 else out.with_name(f"{out.stem}.shard-{self.index}-of-{self.count}{out.suffix}")


def check_same_run(reports: Sequence[tuple[object, dict]], ignore: Sequence[str] = ("shard", "out")) -> None:
    """Refuse shards that were not made by one run: every setting a shard's report records (``args``)
    must be the same in all of them, but those in ``ignore`` (its own index and file).

    Args:
        reports: ``(file, args)`` per shard, ``args`` as its report saved them (with the digests of the
            inputs the command recorded: the task's corpus, the rows).

    Raises:
        ValueError: the first setting that differs, with its values and the two shards named.
    """
    first_file, first = reports[0]
    for file, args in reports[1:]:
        for key in sorted(set(first) | set(args)):
            if key not in ignore and first.get(key) != args.get(key):
                raise ValueError(
                    f"the shards are not one run: {key} is {first.get(key)!r} in {first_file} but "
                    f"{args.get(key)!r} in {file}; merge only the shards of one run"
                )


def check_cover(expected: Sequence[str], shards: dict[int, Sequence[str]], count: int, what: str) -> None:
    """Refuse a set of shards that does not cover ``expected`` exactly once.

    Args:
        expected: every item of the full list.
        shards: shard index → the items that shard took.
        count: the number of shards the run was split into.
        what: the items' name, for messages.

    Raises:
        ValueError: a shard missing or given twice, an item in two shards, or items no shard took or
            that are not in the list (counts and examples named).
    """
    if sorted(shards) != list(range(count)):
        raise ValueError(f"shards {sorted(shards)} given, a run of {count} shards needs each of 0..{count - 1} once")
    seen: dict[str, int] = {}
    for index, items in shards.items():
        for item in items:
            if item in seen:
                raise ValueError(f"{what} {item!r} is in shards {seen[item]} and {index}")
            seen[item] = index
    missing = [i for i in expected if i not in seen]
    wanted = set(expected)
    extra = [i for i in seen if i not in wanted]
    if missing or extra:
        raise ValueError(
            f"the shards cover {len(seen)} {what}s of {len(expected)}: {len(missing)} missing "
            f"(e.g. {missing[:1]}), {len(extra)} not in the run (e.g. {extra[:1]})"
        )
