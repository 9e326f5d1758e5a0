"""The in-batch teacher terms (issue 31 §1): relational distillation and teacher-guided false-negative masking,
checked against float64 references written here from their definitions (scipy's softmax, a per-row loop),
the teacher table against numpy, and a training run whose kNN rows get the term (the loss moves)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.special import log_softmax

from obliq.data.teacher_table import TeacherTable, write_teacher_table
from obliq.losses import StepView, guided_mask, info_nce, relational_distillation


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference_kl(s: np.ndarray, t: np.ndarray, usable: np.ndarray, tau: float, tau_t: float) -> float:
    """Mean over rows with >= 2 usable entries of KL(softmax(t/τ_t) ‖ softmax(s/τ)) over those entries."""
    terms = []
    for i in range(len(s)):
        cols = np.flatnonzero(usable[i])
        if len(cols) < 2:
            continue
        log_p, log_q = log_softmax(t[i, cols] / tau_t), log_softmax(s[i, cols] / tau)
        terms.append(float(np.sum(np.exp(log_p) * (log_p - log_q))))
    return float(np.mean(terms))


def test_relational_distillation_is_the_kl_over_usable_in_batch_entries():
    rng = np.random.default_rng(0)
    q, d = _unit(rng.normal(size=(5, 8))), _unit(rng.normal(size=(7, 8)))
    t = rng.uniform(0.2, 0.9, size=(5, 7))
    t[1, 3] = t[4, :] = np.nan  # a document without a vector; a query without one (row left out)
    mask = np.zeros((5, 7), bool)
    mask[0, 2] = mask[2, 5] = True
    usable = np.isfinite(t) & ~mask
    got = relational_distillation(
        torch.tensor(q),
        torch.tensor(d),
        torch.tensor(t),
        torch.tensor(mask),
        temperature=0.05,
        teacher_temperature=0.02,
    )
    assert float(got) == pytest.approx(_reference_kl(q @ d.T, t, usable, 0.05, 0.02), rel=1e-6)
    # τ from the spread: the teacher's logits as spread as the student's over the usable entries
    s = q @ d.T
    tau_t = 0.05 * np.std(t[usable], ddof=1) / np.std(s[usable], ddof=1)
    auto = relational_distillation(torch.tensor(q), torch.tensor(d), torch.tensor(t), torch.tensor(mask), 0.05, None)
    assert float(auto) == pytest.approx(_reference_kl(s, t, usable, 0.05, tau_t), rel=1e-6)


def test_relational_distillation_has_a_gradient_and_is_zero_when_the_student_agrees():
    rng = np.random.default_rng(1)
    q = torch.tensor(_unit(rng.normal(size=(4, 6))), requires_grad=True)
    d = torch.tensor(_unit(rng.normal(size=(4, 6))), requires_grad=True)
    teacher = (q @ d.T).detach()  # the teacher sees what the student sees
    same = relational_distillation(q, d, teacher, None, 0.05, 0.05)
    assert abs(same.item()) < 1e-7
    loss = relational_distillation(q, d, teacher.flip(1), None, 0.05, 0.05)
    loss.backward()
    assert float(loss) > 0 and q.grad.abs().sum() > 0 and d.grad.abs().sum() > 0
    nothing = relational_distillation(q, d, torch.full((4, 4), float("nan")), None, 0.05, None)
    assert float(nothing) == 0.0


def test_guided_mask_leaves_out_candidates_the_teacher_puts_above_the_positive_less_the_margin():
    t = torch.tensor([[0.5, 0.6, 0.45, float("nan")], [0.1, 0.9, 0.85, 0.7]])
    positive = torch.tensor([0, 1])
    assert guided_mask(t, positive, 0.0).tolist() == [[False, True, False, False], [False, False, False, False]]
    assert guided_mask(t, positive, 0.1).tolist() == [[False, True, True, False], [False, False, True, False]]


def test_a_masked_candidate_leaves_info_nce_as_if_it_were_not_in_the_batch():
    rng = np.random.default_rng(2)
    q, d = _unit(rng.normal(size=(3, 5))), _unit(rng.normal(size=(5, 5)))
    positive = torch.tensor([0, 1, 2])
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 3] = mask[2, 1] = mask[1, 1] = True  # the last is a positive: never masked
    got = info_nce(torch.tensor(q), torch.tensor(d), positive, temperature=0.05, mask=mask)
    losses = []
    for i in range(3):
        cols = [j for j in range(5) if j == i or not mask[i, j]]
        logits = (q[i] @ d[cols].T) / 0.05
        losses.append(-log_softmax(logits)[cols.index(i)])
    assert float(got) == pytest.approx(float(np.mean(losses)), rel=1e-6)


def test_the_teacher_vectors_give_numpys_cosines_and_nan_for_what_the_table_lacks(tmp_path):
    rng = np.random.default_rng(3)
    vectors = _unit(rng.normal(size=(4, 6))).astype(np.float32)
    write_teacher_table(tmp_path / "t.npz", ["a", "b", "c", "d"], vectors)
    table = TeacherTable(tmp_path / "t.npz")
    view = StepView(  # the teacher's cosines of a step: its vectors of the queries and documents (lookup)
        positives=torch.eye(3, dtype=torch.bool),
        positive_index=torch.arange(3),
        doc_row=torch.arange(3),
        teacher_query_vectors=table.lookup(["b", None, "zz"]),
        teacher_doc_vectors=table.lookup(["d", "a", "q"]),
    )
    got = view.teacher_cosines("the test").numpy()
    assert got[0, :2] == pytest.approx([vectors[1] @ vectors[3], vectors[1] @ vectors[0]], abs=1e-6)
    assert np.isnan(got[0, 2]) and np.isnan(got[1:]).all()
    np.savez(tmp_path / "bad.npz", ids=np.array(["a", "a"]), vectors=vectors[:2])
    with pytest.raises(ValueError, match="an id is given twice"):
        TeacherTable(tmp_path / "bad.npz")
    np.savez(tmp_path / "long.npz", ids=np.array(["a"]), vectors=vectors[:1] * 3)
    with pytest.raises(ValueError, match="not unit rows"):
        TeacherTable(tmp_path / "long.npz")
    with pytest.raises(FileNotFoundError, match="vectors_out writes them"):
        TeacherTable(tmp_path / "none.npz")


@pytest.mark.slow
def test_knn_rows_get_the_teachers_in_batch_term_when_training(tiny_llama_dir, tasks_dir, tmp_path):
    """`obliq distill graph --vectors_out` writes the graph's teacher vectors (the stylometric teacher's, checked
    against the teacher itself); a recipe with `data.teacher_vectors` and the `obliq.losses.Relational` term trains
    kNN rows with the term (the first step's loss is the same step's InfoNCE plus a positive KL), and with the
    `obliq.losses.GuidedMask` term the teacher masks candidates (at a margin above every gap, all but the
    positive: a step that would train at loss 0, refused); the checkpoint's card record names the term."""
    from support import csv_column, task_slice, write_config, write_rows

    from obliq.cli import main as obliq_main
    from obliq.commands.train import cli
    from obliq.model.checkpoint import read_checkpoint
    from obliq.search.teachers import StylometricTeacher
    from obliq.tasks import load_task

    task_dir = task_slice(tasks_dir, "writing-news", tmp_path / "news", 4, 30)  # 71 of its 702 documents: quick
    common = ["--task", str(task_dir), "--graph", str(tmp_path / "g.json")]
    obliq_main(["distill", "graph", "--task", str(task_dir), "--k", "2", "--out", str(tmp_path / "g.json"),
                "--vectors_out", str(tmp_path / "t.npz")])  # fmt: skip
    obliq_main(["distill", "pairs", *common, "--out", str(tmp_path / "knn.jsonl")])
    task = load_task(task_dir)
    table = TeacherTable(tmp_path / "t.npz")
    vectors = StylometricTeacher().encode(task.doc_texts)  # the graph's teacher, fitted on the same corpus
    assert list(table.row) == list(task.doc_ids)
    assert np.abs(table.vectors - vectors).max() < 1e-6
    rows = [json.loads(x) for x in (tmp_path / "knn.jsonl").read_text().splitlines()][:16]
    write_rows(tmp_path / "few.jsonl", rows)
    losses = {}
    for name, extra in {
        "none": [],
        "relational": ["--model.terms=[{class_path: obliq.losses.Relational, init_args: {weight: 1.0}}]"],
        # cosines >= 0: every other candidate lies within 1 of the positive
        "guided": ["--model.terms=[{class_path: obliq.losses.GuidedMask, init_args: {margin: 1.0}}]"],
    }.items():
        config = write_config(tmp_path / name, tmp_path / "few.jsonl", tiny_llama_dir, max_steps=2)
        run = cli(["--config", str(config), f"--data.teacher_vectors={tmp_path / 't.npz'}", *extra], run=False)
        if name == "guided":  # only the positive left: a step at loss 0 and gradient 0, refused (issue 49 §4)
            masked = r"no negative left in step 0: .*left out by a mask term, e\.g\. the guided mask"
            with pytest.raises(ValueError, match=masked):
                run.trainer.fit(run.model, datamodule=run.datamodule)
            continue
        run.trainer.fit(run.model, datamodule=run.datamodule)
        losses[name] = [
            float(x) for x in csv_column(next((tmp_path / name).rglob("metrics.csv")).read_text(), "train/loss")
        ]
    assert losses["relational"][0] > losses["none"][0] and losses["none"][0] > 0.1
    saved = read_checkpoint(next((tmp_path / "relational").rglob("last.ckpt")))
    [term] = saved["obliq"]["terms"]
    assert term["term"] == "relational" and term["weight"] == 1.0


def test_teacher_vectors_that_cannot_serve_are_refused_before_training(tiny_llama_dir, tasks_dir, tmp_path):
    """Clean-clone findings: a teacher term without `data.teacher_vectors` is refused before a run folder is made;
    a text file given as the vectors is named as not an archive; vectors of another corpus (none of the rows'
    ids) are refused instead of leaving every teacher cosine NaN (no term at all)."""
    from support import write_config, write_rows

    from obliq.commands.train import cli
    from obliq.data import TrainingDataModule

    rows = [
        {
            "id": f"knn-{i}",
            "task": "t",
            "source": "knn",
            "query": f"anchor {i}",
            "positive": {"id": f"doc-{i}", "text": f"document {i}"},
            "negatives": [],
            "meta": {"anchor_id": f"anchor-{i}"},
        }
        for i in range(8)
    ]
    write_rows(tmp_path / "knn.jsonl", rows)
    config = write_config(tmp_path / "run", tmp_path / "knn.jsonl", tiny_llama_dir, max_steps=1)
    for name, args in (("Relational", "weight: 0.5"), ("GuidedMask", "margin: 0.1")):
        setting = f"--model.terms=[{{class_path: obliq.losses.{name}, init_args: {{{args}}}}}]"
        refused = rf"model\.terms\[0\] \({name}\) needs the batch key teacher_query_vectors: set data\.teacher_vectors"
        with pytest.raises(ValueError, match=refused):
            cli(["--config", str(config), setting], run=False)
    # a teacher-score term whose rows keep no negative (data.max_negatives 0) would add 0 at every step
    scores = "--model.terms=[{class_path: obliq.losses.TeacherScores, init_args: {kind: kl}}]"
    with pytest.raises(ValueError, match=r"model\.terms\[0\] \(TeacherScores\) scores each row's positive against"):
        cli(["--config", str(config), scores, "--data.max_negatives=0"], run=False)
    # rows with negatives but no meta.teacher_scores: the term would log 0 at every step (issue 53 §3), refused when
    # the fit sets up, naming the term and how to write the scores
    unscored = [dict(r, negatives=[{"id": f"neg-{r['id']}", "text": f"other {r['id']}"}]) for r in rows]
    write_rows(tmp_path / "unscored.jsonl", unscored)
    plain = write_config(tmp_path / "unscored", tmp_path / "unscored.jsonl", tiny_llama_dir, max_steps=1)
    run = cli(["--config", str(plain), scores], run=False)
    with pytest.raises(
        ValueError,
        match=r"model\.terms\[0\] \(TeacherScores\) scores rows by their meta\.teacher_scores, and none of the 8 rows",
    ):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    # the objective's flat settings of before obliq.losses: their new place, on the command line or in a recipe
    with pytest.raises(ValueError, match=r"the command line: model\.temperature is now model\.loss\.init_args\.temp"):
        cli(["--config", str(config), "--model.temperature=0.05"], run=False)
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  relational_weight: 1.0\n")
    with pytest.raises(ValueError, match=r"old\.yaml: model\.relational_weight is now model\.terms: obliq\.losses"):
        cli(["--config", str(config), "--config", str(old)], run=False)
    (tmp_path / "notes.txt").write_text("ids,vectors\n")
    with pytest.raises(ValueError, match=r"notes\.txt: not an \.npz archive"):
        TeacherTable(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match=r"notes\.txt: not an \.npz archive"):
        cli(["--config", str(config), f"--data.teacher_vectors={tmp_path / 'notes.txt'}"], run=False)
    assert not (tmp_path / "run" / "runs").exists()  # no version folder claimed by any of these
    write_teacher_table(tmp_path / "other.npz", ["x", "y"], np.eye(2, dtype=np.float32))
    data = TrainingDataModule(
        sources=[{"name": "knn", "path": str(tmp_path / "knn.jsonl")}],
        batch_size=4,
        index_dir=str(tmp_path / "index"),
        teacher_vectors=str(tmp_path / "other.npz"),
    )
    with pytest.raises(ValueError, match="holds none of the 16 document ids of the rows"):
        data.setup("fit")
    assert data.reader is None
    # issue 53 §3: a table holding a part of the rows' corpus (one of task t's 16 ids) is refused, naming the task
    write_teacher_table(tmp_path / "part.npz", ["x", "doc-3"], np.eye(2, dtype=np.float32))
    data.teacher = TeacherTable(tmp_path / "part.npz")
    with pytest.raises(ValueError, match=r"part\.npz has no vector for 15 of the 16 document ids of task 't'"):
        data.setup("fit")
    # a mixture: task t's corpus whole, another task's rows (generated elsewhere) with no vector: fine, NaN there
    ids = [f"anchor-{i}" for i in range(8)] + [f"doc-{i}" for i in range(8)]
    write_teacher_table(tmp_path / "ours.npz", ids, np.eye(16, dtype=np.float32))
    other = [
        dict(r, id=f"u-{i}", task="u", positive={"id": f"u-doc-{i}", "text": f"other {i}"}) for i, r in enumerate(rows)
    ]
    write_rows(tmp_path / "knn.jsonl", rows + [{k: v for k, v in r.items() if k != "meta"} for r in other])
    data = TrainingDataModule(
        sources=[{"name": "knn", "path": str(tmp_path / "knn.jsonl")}],
        batch_size=4,
        index_dir=str(tmp_path / "index2"),
        teacher_vectors=str(tmp_path / "ours.npz"),
    )
    data.setup("fit")
    assert data.reader is not None and data.stats["rows_per_epoch"] == 16
