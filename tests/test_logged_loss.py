"""Issue 49 §1 (b): every logged training loss is the objective whose gradient the step applies, the same on 1 and
N processes. Two CPU processes (gloo, DDP) train 2 steps on 4 rows each; one process trains the same steps on the
concatenated 8 rows. Every logged term (InfoNCE and its Matryoshka parts, the teacher-score KL, the relational
term, the total) and the gradient norm are the one process's, and so are the trained weights. Issue 47: the rows
without teacher scores carry two positives (multi-positive InfoNCE, SupCon form, over every rank's rows), and the
teacher-guided mask is on: both, with the relational term, give one process's gradients on two."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch
import yaml
from support import fit_here, lora_weights, torchrun_commands, write_config, write_rows

from obliq.data.teacher_table import write_teacher_table

TERMS = ["train/infonce", "train/infonce_dim32", "train/infonce_dim16", "train/teacher", "train/relational"]
WEIGHTS = {"teacher": 0.7, "relational": 0.5, "dims": [32, 16], "dim_weights": [1.0, 0.5]}
GUIDE_MARGIN = 0.05
SCORED = {0, 1, 2, 4, 8, 9, 10, 12}
"""Rows with the teacher's scores: 3 of rank 0's 4 rows at each step, 1 of rank 1's, so the mean over the step's
scored rows (what one process takes) is not the mean of the two ranks' means."""


def _corpus(folder):
    """16 kNN rows (anchor k, neighbour k+1 — and k+2 too where the row has no teacher scores —, negatives k+5 and
    k+9) over 16 passages, the teacher's vectors of the passages (seeded, unit), and its scores of the rows in
    :data:`SCORED`."""
    texts = [f"passage {k}: {' '.join(['alpha', 'beta', 'gamma', 'delta'][: 1 + k % 4])} number {k * 7 % 11}"
             for k in range(16)]  # fmt: skip
    ids = [f"D{k}" for k in range(16)]
    vectors = np.random.default_rng(0).normal(size=(16, 8))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    write_teacher_table(folder / "teacher.npz", ids, vectors, texts)
    rows = []
    for k in range(16):
        docs = [(k + 1) % 16, (k + 5) % 16, (k + 9) % 16]
        positives = [docs[0]] if k in SCORED else [docs[0], (k + 2) % 16]
        row = {
            "id": f"knn/{k}",
            "task": "t",
            "source": "knn",
            "query": texts[k],
            "positives": [{"id": ids[j], "text": texts[j]} for j in positives],
            "negatives": [{"id": ids[j], "text": texts[j]} for j in docs[1:]],
            "meta": {"anchor_id": ids[k]},
        }
        if k in SCORED:
            row["meta"]["teacher_scores"] = [round(float(vectors[k] @ vectors[j]), 6) for j in docs]
        rows.append(row)
    return write_rows(folder / "rows.jsonl", rows), folder / "teacher.npz"


def _config(folder, rows, teacher, backbone, devices: int):
    """The tiny recipe (support.write_config), 2 steps of 8 rows in file order, on ``devices`` processes; no
    dropout anywhere (the processes then draw nothing at random), every term of the objective on."""
    path = write_config(folder, rows, backbone, max_steps=2, trainer__devices=devices)
    cfg = yaml.safe_load(path.read_text())
    if devices > 1:
        cfg["trainer"]["strategy"] = "ddp"
    cfg["model"]["encoder"]["init_args"]["lora"]["dropout"] = 0.0
    supcon = {"class_path": "obliq.losses.SupCon", "init_args": cfg["model"]["loss"]["init_args"]}
    symmetric = {"class_path": "obliq.losses.Symmetric", "init_args": {"loss": supcon}}
    cfg["model"]["loss"] = {
        "class_path": "obliq.losses.Matryoshka",
        "init_args": {"loss": symmetric, "dims": WEIGHTS["dims"], "weights": WEIGHTS["dim_weights"]},
    }
    cfg["model"]["terms"] = [
        {"class_path": "obliq.losses.TeacherScores", "init_args": {"kind": "kl", "weight": WEIGHTS["teacher"]}},
        {"class_path": "obliq.losses.Relational", "init_args": {"weight": WEIGHTS["relational"]}},
        {"class_path": "obliq.losses.GuidedMask", "init_args": {"margin": GUIDE_MARGIN}},
    ]
    cfg["data"].update(
        batch_size=8 // devices, shuffle=False, no_duplicates=False, max_negatives=2, teacher_vectors=str(teacher)
    )
    path.write_text(yaml.safe_dump(cfg))
    return path


def _logged(folder) -> list[dict[str, float]]:
    with open(next(folder.rglob("metrics.csv"))) as f:
        return [{k: float(v) for k, v in r.items() if v} for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.slow
@pytest.mark.distributed
def test_every_logged_term_is_the_objective_on_one_and_two_processes(tiny_llama_dir, tmp_path):
    """2 steps, batch 8: one process, and two processes of 4 rows each. Each logged term equals the one process's
    (which logs the loss it back-propagates), the total is the weighted sum of the logged terms, the gradient norm
    and the weights after the 2 steps are the one process's: the logged objective is the one whose gradient the
    step applies. (Before: two processes logged rank 0's loss, its teacher and relational terms halved, 8.2008 and
    8.3304 against one process's 9.6658 and 9.3816, and followed another objective, the mean of the ranks' teacher
    means and each rank's relational term over its own 4 rows: gradient norm 36.023 against 36.631.)"""
    backbone = tmp_path / "llama"
    shutil.copytree(tiny_llama_dir, backbone)
    config = json.loads((backbone / "config.json").read_text())
    (backbone / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.0}))
    rows, teacher = _corpus(tmp_path)
    one_cfg = _config(tmp_path / "one", rows, teacher, str(backbone), devices=1)
    two_cfg = _config(tmp_path / "two", rows, teacher, str(backbone), devices=2)
    torchrun_commands(tmp_path / "launch", [["train", "fit", "--config", str(two_cfg)]])
    fit_here(one_cfg)

    one, two = _logged(tmp_path / "one"), _logged(tmp_path / "two")
    assert len(one) == len(two) == 2
    for a, b in zip(one, two):
        for name in ["train/loss", *TERMS, "train/grad_norm"]:
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-7), name
        for logged in (a, b):  # the total is the weighted sum of its logged parts
            dims = [logged[f"train/infonce_dim{d}"] for d in WEIGHTS["dims"]]
            assert logged["train/infonce"] == pytest.approx(np.dot(WEIGHTS["dim_weights"], dims), rel=1e-6)
            total = (
                logged["train/infonce"]
                + WEIGHTS["teacher"] * logged["train/teacher"]
                + WEIGHTS["relational"] * logged["train/relational"]
            )
            assert logged["train/loss"] == pytest.approx(total, rel=1e-6)
        assert a["train/teacher"] > 0 and a["train/relational"] > 0
    w_one, w_two = (lora_weights(tmp_path / name / "ckpt" / "last.ckpt") for name in ("one", "two"))
    for key, value in w_one.items():
        assert (w_two[key] - value).norm() <= 1e-5 * value.norm() + 1e-8, key
    assert any(not torch.equal(v, torch.zeros_like(v)) for v in w_one.values())


def test_the_two_process_steps_hold_several_positives_and_a_guided_mask_that_masks(tmp_path):
    """The steps of the test above are not vacuous for issue 47: each of its two 8-row steps (as one process
    builds it) holds rows with two positives, and the teacher-guided mask leaves out some in-batch candidates of
    the whole step (all of some rows' negatives), while the step keeps negatives to train on."""
    from obliq.data.collate import Collator
    from obliq.data.rows import RowCaps, parse_row
    from obliq.data.teacher_table import TeacherTable
    from obliq.losses import GuidedMask, StepView, negatives_left

    rows_file, teacher = _corpus(tmp_path)
    rows = [parse_row(line, str(rows_file), n) for n, line in enumerate(rows_file.read_bytes().splitlines(), 1)]
    dummy = lambda texts, kind, instructions=None: {"input_ids": torch.zeros(len(texts), 1, dtype=torch.long)}  # noqa: E731
    collate = Collator(dummy, RowCaps(max_negatives=2), TeacherTable(teacher))
    for step in range(2):
        view = StepView.of(collate(rows[8 * step : 8 * step + 8]))
        assert (view.positives.sum(1) == 2).sum() == 4
        mask = GuidedMask(GUIDE_MARGIN).mask(view)
        assert 0 < int(mask.sum()) < mask.numel()
        left = negatives_left(view.positives, view.doc_keys, view.query_keys, mask)
        assert int(left.sum()) > 0 and int((left == 0).sum()) > 0  # the step trains; the mask empties some rows
