"""Issue 49 §4: training that trains nothing. Rows that leave no negative in a step (loss 0, gradient 0)
are refused at that step, naming it, the rows, the data and why; a fit that would take no step is
refused (exit 2) before a folder is made or a model loaded, one that took none says so after, and a
resume already at its last step says "already at step N of N" and exits 0."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from support import task_rows, write_config, write_rows

from obliq.cli import main as obliq_main
from obliq.data.collate import Collator
from obliq.data.mixture import Source
from obliq.data.rows import RowCaps, parse_row
from obliq.losses import InfoNCE, StepView, check_negatives, info_nce, negatives_left

FIX = (
    ". Such a step trains at loss 0 with gradient 0: give the rows hard negatives (data.max_negatives, obliq "
    "negatives mine), raise data.batch_size, or mix in rows with other positives"
)
MASKED = (
    "hard negatives, and every document beside a row's own positives is masked for it (the same id or text as a "
    "positive or its query, or a positive of a row with the same query)"
)

ONE = "its one row has no hard negative and no other row to lend it one"


@pytest.fixture(scope="module")
def rows(tasks_dir) -> list[dict]:
    """Real rows of math-theoremqa (queries, positives and random corpus negatives)."""
    return task_rows(tasks_dir, "math-theoremqa", limit=12)


def _sharing_one_positive(rows: list[dict]) -> list[dict]:
    return [dict(r, positive=rows[0]["positive"], negatives=[]) for r in rows]


def _batch(rows: list[dict], tokenize, max_negatives: int = 2) -> dict:
    parsed = [parse_row(json.dumps(r), "rows.jsonl", i + 1) for i, r in enumerate(rows)]
    return Collator(tokenize, RowCaps(max_negatives))(parsed)


def _check(batch: dict, step: int, mask: torch.Tensor | None = None, data=None) -> None:
    """check_negatives as a training step calls it: the batch's view (with the mask terms' mask) and the loss,
    InfoNCE()."""
    check_negatives(StepView.of(batch).with_mask(mask), InfoNCE(), step, batch, data)


def _refusal(batch: dict, step: int = 7, data=None) -> str:
    with pytest.raises(ValueError) as err:
        _check(batch, step, None, data)
    return str(err.value)


# --- the count and the refusal, on collated real rows ----------------------------------------------


def test_rows_sharing_one_positive_leave_no_negative_and_the_step_is_refused(rows, tokenize):
    shared = _batch(_sharing_one_positive(rows[:4]), tokenize)
    assert negatives_left(shared["positive_index"], shared["doc_keys"], shared["query_keys"]).tolist() == [0] * 4
    data = SimpleNamespace(sources=[Source("train/rows.jsonl")])
    ids = ", ".join(repr(r["id"]) for r in rows[:3])
    assert _refusal(shared, 7, data) == (
        f"no negative left in step 7: its 4 rows hold 0 {MASKED}; rows {ids} and 1 more of train/rows.jsonl" + FIX
    )
    # the loss agrees: 0 for every row, whatever the vectors (the same document's copies are masked, C05)
    q, d = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1), torch.nn.functional.normalize(torch.randn(4, 8))
    assert info_nce(q, d, shared["positive_index"], shared["doc_keys"], 0.05, shared["query_keys"]).item() == 0.0


def test_one_row_without_a_hard_negative_is_refused(rows, tokenize):
    one = _batch([dict(rows[0], negatives=[])], tokenize)
    assert _refusal(one, 0) == (f"no negative left in step 0: {ONE}; rows {rows[0]['id']!r}" + FIX)
    with_negatives = _batch([rows[i] for i in range(len(rows)) if rows[i]["negatives"]][:1], tokenize)
    assert negatives_left(with_negatives["positive_index"], with_negatives["doc_keys"]).item() >= 1
    _check(with_negatives, 0)  # one row with a hard negative trains


def test_a_step_where_any_row_keeps_a_negative_trains(rows, tokenize):
    mixed = _sharing_one_positive(rows[:4])
    mixed[3] = rows[3]  # its own positive and hard negatives: every other row meets them as negatives
    batch = _batch(mixed, tokenize)
    left = negatives_left(batch["positive_index"], batch["doc_keys"], batch["query_keys"])
    hard = len(rows[3]["negatives"][:2])
    assert left.tolist() == [1 + hard] * 3 + [3 + hard]  # the copies of one positive are negatives of row 3
    _check(batch, 0)
    _check(_batch(rows[:4], tokenize), 0)  # the rows as mined


def test_the_symmetric_loss_and_a_guided_mask_count_as_the_loss_does(rows, tokenize):
    same_query = _batch([dict(r, negatives=[]) for r in rows[4:6]], tokenize)  # two relevant documents of one query
    assert negatives_left(same_query["positive_index"], same_query["doc_keys"], same_query["query_keys"]).sum() == 0
    batch = _batch([dict(r, negatives=[]) for r in rows[2:4]], tokenize)  # two queries, two positives
    pos, keys, qkeys = batch["positive_index"], batch["doc_keys"], batch["query_keys"]
    assert negatives_left(pos, keys, qkeys).tolist() == [1, 1]
    assert negatives_left(pos, keys, qkeys, symmetric=True).tolist() == [2, 2]  # and each positive meets a query
    guide = torch.tensor([[False, True], [True, False]])  # the guide masks each row's one negative
    assert negatives_left(pos, keys, qkeys, guide).tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"left out by a mask term, e\.g\. the guided mask\); rows"):
        _check(batch, 3, guide)


# --- through `obliq train fit`: refused at the first such step, nothing saved ----------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", ["one positive", "batch of one"])
def test_a_fit_on_rows_without_negatives_stops_at_step_0_and_saves_nothing(
    rows, tiny_llama_dir, tmp_path, capsys, case
):
    data = _sharing_one_positive(rows[:8]) if case == "one positive" else [dict(r, negatives=[]) for r in rows[:3]]
    path = write_rows(tmp_path / "rows.jsonl", data)
    extra = {"data__batch_size": 1} if case == "batch of one" else {}
    config = write_config(tmp_path / "run", path, tiny_llama_dir, max_steps=2, **extra)
    with pytest.raises(SystemExit) as stop:
        obliq_main(["train", "fit", "--config", str(config)])
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    why = ONE if case == "batch of one" else f"its 4 rows hold 0 {MASKED}"
    assert line.startswith(f"error: no negative left in step 0: {why}; rows '") and line.endswith(f"of {path}" + FIX)
    assert not list((tmp_path / "run").rglob("*.ckpt"))


@pytest.mark.slow
def test_a_later_step_without_negatives_is_refused_before_the_first_step_trains(rows, tiny_llama_dir, tmp_path, capsys):
    """Issue 53 §3: 9 rows in file order, 4 a step: the epoch's last step holds row 9 alone, without a negative.
    The plan is checked when training starts (from the rows' keys, as the loss masks them), so the fit stops
    naming step 2 and that row before step 0 trains, not after two steps (and their checkpoints)."""
    data = [r for r in rows if r["negatives"]][:8]
    data += [dict(next(r for r in rows if r not in data), negatives=[])]
    path = write_rows(tmp_path / "rows.jsonl", data)
    config = write_config(tmp_path / "run", path, tiny_llama_dir, max_steps=3, data__batch_size=4, data__shuffle=False)
    with pytest.raises(SystemExit) as stop:
        obliq_main(["train", "fit", "--config", str(config)])
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == f"error: no negative left in step 2: {ONE}; rows {data[8]['id']!r} of {path}" + FIX
    assert not list((tmp_path / "run").rglob("*.ckpt"))


# --- a fit that trains no batch --------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting, value", [("max_steps", "0"), ("limit_train_batches", "0"), ("limit_train_batches", "0.0")]
)
def test_settings_that_train_nothing_are_refused_before_a_folder_or_the_model(tmp_path, rows, capsys, setting, value):
    """The backbone does not exist: a refusal after it loads would name it instead."""
    path = write_rows(tmp_path / "rows.jsonl", rows[:8])
    config = write_config(tmp_path, path, str(tmp_path / "no-such-backbone"), max_steps=2)
    with pytest.raises(SystemExit) as stop:
        obliq_main(["train", "fit", "--config", str(config), f"--trainer.{setting}={value}"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: trainer.{setting} is {value}: the fit would train no batch (set it above 0)"
    )
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_max_epochs_0_is_refused_too(tmp_path, rows, capsys):
    path = write_rows(tmp_path / "rows.jsonl", rows[:8])
    config = write_config(tmp_path, path, str(tmp_path / "no-such-backbone"), max_steps=-1)
    with pytest.raises(SystemExit):
        obliq_main(["train", "fit", "--config", str(config), "--trainer.max_epochs=0"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: trainer.max_epochs is 0: the fit would train no batch (set it above 0)"
    )


@pytest.mark.slow
def test_a_resume_already_at_its_last_step_says_so_and_one_past_it_is_refused(
    rows, tiny_llama_dir, tmp_path, capsys, caplog
):
    from obliq.commands.train import cli

    config = write_config(tmp_path, write_rows(tmp_path / "rows.jsonl", rows[:8]), tiny_llama_dir, max_steps=2)
    assert cli(["fit", "--config", str(config)]).trainer.global_step == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="obliq.commands.train"):
        again = obliq_main(["train", "fit", "--config", str(config), "--ckpt_path", "last"])  # returns: exit 0
    assert again.trainer.global_step == 2
    assert [r.getMessage() for r in caplog.records if r.name == "obliq.commands.train"][-1] == (
        "already at step 2 of 2: nothing to train"
    )
    with pytest.raises(SystemExit) as stop:
        obliq_main(["train", "fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps=1"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: the checkpoint is at step 2, past the 1 steps of this run (trainer.max_steps): nothing to train; "
        "raise trainer.max_steps to train on"
    )


@pytest.mark.slow
def test_a_fit_whose_every_step_is_skipped_says_it_trained_nothing(rows, tiny_llama_dir, tmp_path, capsys, monkeypatch):
    """Every loss non-finite (skipped, under model.max_bad_steps): the epoch ends without an optimizer step."""
    monkeypatch.setattr(InfoNCE, "forward", lambda self, q, d, *a, **k: (q.sum() + d.sum()) * float("nan"))
    path = write_rows(tmp_path / "rows.jsonl", rows[:8])
    config = write_config(tmp_path, path, tiny_llama_dir, max_steps=-1)
    with pytest.raises(SystemExit) as stop:
        obliq_main(["train", "fit", "--config", str(config), "--trainer.max_epochs=1", "--model.max_bad_steps=10"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: the fit trained no batch: no optimizer step from step 0 of 2 (trainer.limit_train_batches 1.0; "
        "steps skipped as non-finite: 2)"
    )
