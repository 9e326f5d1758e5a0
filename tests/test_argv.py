"""obliq.argv.options: keyword arguments → ``--name value`` tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from obliq.argv import options


def test_options_writes_each_kind_of_value_in_the_order_given():
    argv = options(
        {"shard.index": 0, "num-workers": 2},
        task=Path("runs/t"),
        k=4,
        dev_fraction=0.5,
        skipped=None,
        overwrite=True,
        cache=False,
        tasks=[Path("a"), "b"],
        retrieval={"batch_size": 64, "index": {"nlist": 8}, "top_k": None},
    )
    assert argv == [
        "--shard.index", "0", "--num-workers", "2",
        "--task", "runs/t", "--k", "4", "--dev_fraction", "0.5",
        "--overwrite", "true", "--cache", "false",
        "--tasks", "a", "b",
        "--retrieval.batch_size", "64", "--retrieval.index.nlist", "8",
    ]  # fmt: skip
    assert options() == [] and options(trainer={"max_steps": 40}) == options({"trainer.max_steps": 40})


def test_options_refuses_an_empty_list_and_a_name_given_twice():
    with pytest.raises(ValueError, match="--tasks: an empty list"):
        options(tasks=[])
    with pytest.raises(ValueError, match="--k: given twice"):
        options({"k": 3}, k=4)
