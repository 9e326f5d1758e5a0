"""examples/obliq-ir-mini: `obliq task split` on real tasks, the chain's stages and its report."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from obliq.cli import main as obliq_main
from obliq.commands.task import split_task
from obliq.tasks import load_query_split, load_task, split_queries

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chain():
    """run.py loaded as ``python examples/obliq-ir-mini/run.py`` loads it: its folder first on the path, where
    its parts (``mini_systems``, ``mini_report``) lie."""
    folder = str(REPO / "examples" / "obliq-ir-mini")
    spec = importlib.util.spec_from_file_location("obliq_ir_mini", f"{folder}/run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


@pytest.fixture(scope="module")
def split_tasks(tasks_dir, tmp_path_factory, chain):
    """The four paper tasks split as the chain splits them (dev 0.5, seed 0)."""
    root = tmp_path_factory.mktemp("split")
    for t in chain.TASKS:
        split_task(tasks_dir / t, root / t, 0.5, 0)
    return root


def test_task_split_writes_a_test_side_and_a_dev_side(tasks_dir, split_tasks):
    source, out = load_task(tasks_dir / "writing-news"), split_tasks / "writing-news"
    dev_ref, test_ref = split_queries(source, 0.5, 0)
    test, dev = load_task(out), load_query_split(out, "dev")
    assert (test.name, test.mechanism) == ("writing-news", "analogue")  # results keep the task's folder name
    assert test.query_ids == test_ref.query_ids and dev.query_ids == dev_ref.query_ids
    assert len(test.query_ids) == len(dev.query_ids) == 60
    assert not set(test.query_ids) & set(dev.query_ids)
    assert test.qrels["test"] == {q: source.qrels["test"][q] for q in test.query_ids}
    assert dev.qrels["test"] == {q: source.qrels["test"][q] for q in dev.query_ids}
    assert test.corpus_sha256 == source.corpus_sha256  # the corpus is unchanged (same embedding cache)
    assert (out / "attributes.tsv").read_bytes() == (tasks_dir / "writing-news" / "attributes.tsv").read_bytes()
    meta = json.loads((out / "task.json").read_text())
    assert meta["split"]["dev"] == dev.query_ids and meta["split"]["seed"] == 0
    assert meta["stats"]["docs"] == 702  # the source's task.json is kept
    small = load_task(split_tasks / "stance-tweets")
    assert len(small.query_ids) == 5 and len(load_query_split(split_tasks / "stance-tweets").query_ids) == 5


def test_task_split_refuses_to_overwrite_or_to_write_into_its_input(tasks_dir, split_tasks, tmp_path, capsys):
    with pytest.raises(FileExistsError, match="--overwrite"):
        split_task(tasks_dir / "math-theoremqa", split_tasks / "math-theoremqa")
    with pytest.raises(ValueError, match="is the input"):
        split_task(split_tasks / "math-theoremqa", split_tasks / "math-theoremqa", overwrite=True)
    copy = tmp_path / "t"
    shutil.copytree(split_tasks / "math-theoremqa", copy)
    with pytest.raises(ValueError, match="inside the input"):
        split_task(copy, copy / "sub")
    report = obliq_main(["task", "split", "--task", str(copy), "--out", str(tmp_path / "again"), "--seed", "3"])
    assert report["dev_queries"] + report["test_queries"] == 89 and report["docs"] == 620


def test_the_recipe_reads_what_the_chain_writes(chain):
    from obliq.recipes import recipe_config

    cfg = recipe_config(REPO / chain.RECIPE)
    assert Path(cfg["work_dir"]) == chain.ROOT and cfg["run_dir"] == f"{chain.ROOT}/train/mixture"
    sources = {s["name"]: s for s in cfg["data"]["sources"]}
    assert sources["synthetic"]["path"] == f"{chain.ROOT}/rows/synthetic/*.jsonl"
    assert sources["knn"]["path"] == f"{chain.ROOT}/rows/knn-writing.jsonl"
    assert sources["knn"]["count"] > 0 and cfg["data"]["max_negatives"] == 4
    callbacks = {c["class_path"].rsplit(".", 1)[1]: c["init_args"] for c in cfg["trainer"]["callbacks"]}
    assert callbacks["RetrievalEvaluation"]["tasks"] == [str(chain.ROOT / "tasks")]
    assert callbacks["RetrievalEvaluation"]["split"] == "dev"  # never the test queries during training
    every = callbacks["RetrievalEvaluation"]["every_n_steps"]
    assert all(s % every == 0 for s in callbacks["StepCheckpoints"]["steps"])
    assert cfg["trainer"]["max_steps"] % every == 0  # the last step is evaluated and checkpointed
    for name, ablation in chain.RUNS.items():  # the ablations: recipes stacked on the mixture's
        if ablation is None:
            continue
        both = recipe_config(REPO / chain.RECIPE, REPO / ablation)
        [kept] = both["data"]["sources"]
        assert kept == sources[kept["name"]] and name.lower().startswith(kept["name"].lower())
        assert both["run_dir"] == f"{chain.ROOT}/train/{chain.slug(name)}"
        assert [c["class_path"].rsplit(".", 1)[1] for c in both["trainer"]["callbacks"]] == ["ModelCheckpoint"]
        assert both["trainer"]["max_steps"] == cfg["trainer"]["max_steps"] and both["model"] == cfg["model"]


def test_every_run_takes_one_epoch_of_the_mixture_rounded_to_the_evaluation_interval(chain, tmp_path, monkeypatch):
    """Issue 33: the mixture sees each kept synthetic row and each dosed kNN pair at least once."""
    monkeypatch.chdir(REPO)
    recipe = tmp_path / "recipe.yaml"
    cfg = yaml.safe_load((REPO / chain.RECIPE).read_text())
    cfg["work_dir"] = str(tmp_path)
    recipe.write_text(yaml.safe_dump(cfg))
    (tmp_path / "rows" / "synthetic").mkdir(parents=True)
    with pytest.raises(ValueError, match="'synthetic': no rows"):
        chain.epoch_steps(recipe)
    for task, n in (("a", 200), ("b", 171)):
        (tmp_path / "rows" / "synthetic" / f"{task}.jsonl").write_text('{"q": 1}\n' * n + "\n")
    knn = tmp_path / "rows" / "knn-writing.jsonl"
    knn.write_text('{"q": 1}\n' * 50)
    # 371 synthetic + min(50, dose 160) = 421 rows, 16 per step: 27 steps, evaluated every 10: 30
    assert chain.epoch_steps(recipe) == 30
    knn.write_text('{"q": 1}\n' * 1000)  # the dose caps the kNN pairs: 371 + 160 = 531 rows, 34 steps → 40
    assert chain.epoch_steps(recipe) == 40
    knn.write_text('{"q": 1}\n' * 50)  # repeat: true takes the whole dose from 50 rows: 531 rows again
    cfg["data"]["sources"][1]["repeat"] = True
    recipe.write_text(yaml.safe_dump(cfg))
    assert chain.epoch_steps(recipe) == 40


def test_a_training_stage_resumes_only_a_run_of_the_same_length(chain, tmp_path, monkeypatch):
    """``_train``: resume an unfinished run started for the same steps; a run started for other steps (the rows
    changed) or a redone stage (``--overwrite``) trains afresh; a finished run is only exported."""
    import obliq.model.checkpoint
    import obliq.runs

    run = obliq.runs.RunFolder(tmp_path / "version_0")
    run.path.mkdir()
    state = {"steps_in_config": 30, "step": 10}
    calls = []
    monkeypatch.setattr(chain, "epoch_steps", lambda recipe: 30)
    monkeypatch.setattr(chain, "_call", lambda argv, stdout=None, env=None: calls.append(argv))
    monkeypatch.setattr(obliq.runs, "latest_run", lambda run_dir: run)
    monkeypatch.setattr(type(run), "newest", property(lambda self: self.path / "last.ckpt"))
    monkeypatch.setattr(obliq.model.checkpoint, "checkpoint_info", lambda p: type("I", (), {"step": state["step"]}))
    fit = [sys.executable, "train.py", "fit", "--config", str(REPO / chain.RECIPE)]

    def trained(fresh=False) -> list[str] | None:
        (run.path / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_steps": state["steps_in_config"]}}))
        calls.clear()
        chain._train(fit, fresh)
        assert calls[-1][3] == "export"  # the newest checkpoint is always exported
        return calls[0] if len(calls) == 2 else None

    assert trained()[-4:] == ["--trainer.max_steps", "30", "--ckpt_path", "last"]  # unfinished, same length
    assert trained(fresh=True)[-2:] == ["--trainer.max_steps", "30"]  # the stage is redone: a new run
    state["steps_in_config"] = 20
    assert trained()[-2:] == ["--trainer.max_steps", "30"]  # started for 20 steps: not resumed to 30
    state.update(steps_in_config=30, step=30)
    assert trained() is None  # finished: exported only


def test_stages_call_the_existing_commands_in_order(chain, tmp_path):
    stages = chain.stages(7, tmp_path / "data", REPO / chain.RECIPE)
    names = [s.name for s in stages]
    assert names[:4] == [f"split-{t}" for t in chain.TASKS] and names[-1] == "report"
    assert names.index("knn") < names.index("train-mixture") < names.index("eval-mixture") < names.index("wise")
    assert names.index("wise") == len(names) - 2  # after every evaluation (reusing their stores)
    synth = next(s for s in stages if s.name == "synth-math-theoremqa")
    task, rows = f"{chain.ROOT}/tasks/math-theoremqa", f"{chain.ROOT}/synth/math-theoremqa.jsonl"
    assert [argv[3:] for argv in synth.parallel] == [
        [
            "synth",
            "generate",
            "--config",
            "configs/synth/math-theoremqa.yaml",
            "--task",
            task,
            "--out",
            rows,
            "--n_docs",
            "7",
            "--shard.index",
            str(i),
            "--shard.count",
            "2",
        ]
        for i in range(2)
    ]  # two shards side by side: both cores, one thread each
    assert synth.commands[0][3:5] == ["synth", "merge"] and synth.commands[0][-1] == rows
    for t in chain.TASKS:  # generate, audit every candidate, filter, audit the kept rows, then mine negatives
        at = [names.index(f"{s}-{t}") for s in ("synth", "audit", "filter", "audit-kept", "negatives")]
        assert at == sorted(at) and at[-1] < names.index("train-mixture")
    kept = f"{chain.ROOT}/filter/math-theoremqa.jsonl"
    filtered = next(s for s in stages if s.name == "filter-math-theoremqa")
    assert [argv[3:] for argv in filtered.commands] == [
        ["synth", "filter", "--rows", rows, "--task", task, "--out", kept]
    ]  # the split's task folder: its development side sets the thresholds
    assert filtered.inputs == [Path(rows)] and filtered.stdout == chain.ROOT / "filter" / "math-theoremqa.txt"
    audit_kept = next(s for s in stages if s.name == "audit-kept-math-theoremqa").commands[0]
    assert audit_kept[3:] == ["synth", "audit", "--rows", kept, "--task", task]
    mine = next(s for s in stages if s.name == "negatives-math-theoremqa").commands[0]
    assert mine[mine.index("--rows") + 1] == kept  # the kept rows, not every candidate
    assert mine[mine.index("--out") + 1] == f"{chain.ROOT}/rows/synthetic/math-theoremqa.jsonl"  # the recipe's glob
    for name, ablation in chain.RUNS.items():
        fit = next(s for s in stages if s.name == f"train-{chain.slug(name)}").commands[0]
        assert fit[1:5] == ["train.py", "fit", "--config", str(REPO / chain.RECIPE)]
        assert fit[5:] == ([] if ablation is None else ["--config", str(ablation)])
    assert not any("--overwrite" in c for s in stages for c in s.commands)
    assert any("--overwrite" in c for s in chain.stages(7, tmp_path, REPO / chain.RECIPE, True) for c in s.commands)


def test_the_chain_runs_the_command_lines_it_ran_before(chain, monkeypatch):
    """The argv of every stage for ``--docs 150`` (with and without ``--overwrite``) is token for token the one
    captured before the stages were written with :func:`obliq.argv.options` (tests/data/obliq-ir-mini-argv.json)."""
    monkeypatch.chdir(REPO)
    captured = json.loads((REPO / "tests" / "data" / "obliq-ir-mini-argv.json").read_text())

    def argvs(overwrite: bool) -> dict:
        stages = chain.stages(captured["docs"], Path("../shared/data/tasks"), chain.RECIPE, overwrite)
        python = {sys.executable: "<python>"}
        return {s.name: [[python.get(a, a) for a in argv] for argv in s.parallel + s.commands] for s in stages}

    assert argvs(False) == captured["stages"]
    assert argvs(True) == captured["stages_overwrite"]


def test_a_stage_is_done_only_when_its_outputs_are_newer_than_its_inputs(chain, tmp_path):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("x\n")
    stage = chain.Stage("s", inputs=[source], outputs=[output])
    assert stage.state() == "todo"
    output.write_text("y\n")
    assert stage.state() == "done"
    later = time.time() + 10
    os.utime(source, (later, later))
    assert stage.state() == "stale"
    rows = tmp_path / "rows.jsonl"
    report = {
        "args": {"n_docs": 5},
        "report": {"sampled": 5, "already_done": 2, "generated": 2, "skipped": {"A": 1, "B": 0}},
    }
    (tmp_path / "rows.jsonl.report.json").write_text(json.dumps(report))
    assert chain.synth_complete(rows, 5) and not chain.synth_complete(rows, 6)
    report["report"]["generated"] = 1  # killed before the end of the sample
    (tmp_path / "rows.jsonl.report.json").write_text(json.dumps(report))
    assert not chain.synth_complete(rows, 5)
    report["report"].update(generated=2, samples=3, candidates=15)  # best-of-3: 15 candidates, 5 covered
    (tmp_path / "rows.jsonl.report.json").write_text(json.dumps(report))
    assert not chain.synth_complete(rows, 5)
    report["report"].update(already_done=12)
    (tmp_path / "rows.jsonl.report.json").write_text(json.dumps(report))
    assert chain.synth_complete(rows, 5)
    # against the synth config now: an output of other samples, few-shot settings or prompts is not complete
    from obliq.commands.synth import prompts_digest
    from obliq.synth.prompts import TaskSpec

    config = REPO / "configs" / "synth" / "math-theoremqa.yaml"
    cfg = yaml.safe_load(config.read_text())
    report["args"].update(samples=cfg["samples"], fewshot=dict(cfg["fewshot"]))
    report["prompts"] = prompts_digest(TaskSpec(**cfg["spec"]))
    (tmp_path / "rows.jsonl.report.json").write_text(json.dumps(report))
    assert chain.synth_complete(rows, 5, config)
    for key, value in (("samples", cfg["samples"] + 1), ("fewshot", {**cfg["fewshot"], "k": 0})):
        (tmp_path / "rows.jsonl.report.json").write_text(json.dumps({**report, "args": {**report["args"], key: value}}))
        assert not chain.synth_complete(rows, 5, config)
    (tmp_path / "rows.jsonl.report.json").write_text(json.dumps({**report, "prompts": "an older prompt"}))
    assert not chain.synth_complete(rows, 5, config) and chain.synth_complete(rows, 5)


def test_report_tables_every_system_and_compares_them_per_task(chain, split_tasks, tmp_path):
    from obliq.commands.evaluate import evaluate
    from obliq.search.settings import RetrievalSettings

    root = tmp_path / "mini"
    tasks = [str(split_tasks / t) for t in chain.TASKS]
    # real BM25 runs stand in for the five systems: two settings, so that the differences are not all 0; top-100
    # runs scored on the report's measures (NDCG@10, Recall@100: systems_report's), not the default top-1000
    measures = ["NDCG@10", "Recall@100"]
    evaluate("bm25", tasks, root / "eval" / "bm25", RetrievalSettings(top_k=100), measures, latency_queries=0)
    flat = RetrievalSettings(top_k=100, bm25_k1=0.2, bm25_b=0.0)
    evaluate("bm25", tasks, root / "eval" / "flat", flat, measures, latency_queries=0)
    for name in chain.SYSTEMS[1:]:
        shutil.copytree(root / "eval" / ("flat" if name == "mixture" else "bm25"), root / "eval" / chain.slug(name))
    with pytest.raises(ValueError, match="stance-tweets: .*mixture reads texts as bm25_k1 0.2"):
        chain.report(root, REPO / chain.RECIPE)  # models that read texts differently are not compared
    for t in chain.TASKS:  # past that check: the table and the comparisons of two real, different runs
        file = root / "eval" / "mixture" / t / "summary.json"
        file.write_text(
            json.dumps(
                {
                    **json.loads(file.read_text()),
                    "reads": json.loads((root / "eval" / "bm25" / t / "summary.json").read_text())["reads"],
                }
            )
        )
    result = chain.report(root, REPO / chain.RECIPE)
    table = (root / "report.md").read_text()
    assert all(f"| {s} |" in table for s in chain.SYSTEMS) and (root / "curves.png").stat().st_size > 0
    for t in chain.TASKS:
        base = [json.loads(x) for x in (root / "eval" / "bm25" / t / "per_query.jsonl").read_text().splitlines()]
        flat = {
            r["query_id"]: r["NDCG@10"]
            for r in map(json.loads, (root / "eval" / "flat" / t / "per_query.jsonl").read_text().splitlines())
        }
        diff = sum(flat[r["query_id"]] - r["NDCG@10"] for r in base) / len(base)
        c = next(c for c in result["comparisons"] if c["task"] == t and c["label"] == "mixture − MiniLM (base)")
        assert c["diff"] == pytest.approx(diff) and c["n_queries"] == len(base)
        assert f"n = {c['n_nonzero']}" in c["p_text"] and c["text"] in table
        same = next(c for c in result["comparisons"] if c["task"] == t and c["label"] == "kNN only − MiniLM (base)")
        assert same["diff"] == 0  # identical runs
        assert result["carried"][t].startswith("neither")
    assert result["curves"] == {}  # no training run in this folder
    assert result["wise"] is None and "WiSE-FT" not in table  # no interpolation stage run
    assert set(result["interpolated_vs_base"]) == set(chain.TASKS)  # its row: the test side's verdicts
    assert result["filter"] == {} and "the filter" not in table  # no filter run either

    from obliq.commands.synth import filter_queries

    math = load_task(split_tasks / "math-theoremqa")
    rows = root / "synth" / "math-theoremqa.jsonl"
    rows.parent.mkdir(parents=True)
    rows.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"synth:math-theoremqa:{math.doc_ids[i]}",
                    "task": "math-theoremqa",
                    "source": "synthetic",
                    "query": q,
                    "positive": {"id": math.doc_ids[i], "text": math.doc_texts[i]},
                    "negatives": [],
                }
            )
            + "\n"
            for i, q in enumerate([math.doc_texts[0], "counting ordered partitions", "counting ordered partitions"])
        )
    )
    kept = filter_queries(
        rows, split_tasks / "math-theoremqa", root / "filter" / "math-theoremqa.jsonl", dense_quantile=None
    )
    result = chain.report(root, REPO / chain.RECIPE)
    assert result["filter"]["math-theoremqa"] == kept and kept["dropped"]["duplicate"] == 1
    line = next(x for x in (root / "report.md").read_text().splitlines() if x.startswith("| math-theoremqa | 3 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == f"{kept['kept']} ({kept['documents_kept']} of 3)" and cells[3] == "1"
    assert cells[-3:] == [
        str(kept["thresholds"]["bm25_max_rank_dropped"]),
        "–",
        f"{100 * kept['thresholds']['leak_rate']:.1f} %",
    ]


def test_wise_chooses_alpha_on_the_dev_side_and_evaluates_only_that_on_test(chain, tmp_path, monkeypatch):
    """The `wise` stage (issue 33 §3): alpha is the best mean dev NDCG@10 of the four tasks over base (0), the
    interpolations and the mixture (1), a tie going to the larger alpha; only the chosen model is then evaluated
    on the test side; the report shows the dev table. The dev evaluations are read from their folders (here
    written beforehand, so that no command runs but the one test evaluation, recorded)."""
    monkeypatch.setattr(chain, "ROOT", tmp_path)
    calls = []
    monkeypatch.setattr(chain, "_call", lambda argv, *a, **k: calls.append(argv))
    means = {0.0: 0.10, 0.5: 0.30, 0.75: 0.30, 1.0: 0.20}  # 0.5 and 0.75 tie: 0.75, the smaller change
    for alpha in chain.ALPHAS:
        (tmp_path / "wise" / f"alpha-{alpha:g}" / "adapter").mkdir(parents=True)
        (tmp_path / "wise" / f"alpha-{alpha:g}" / "adapter" / "obliq_encoder.json").write_text("{}")
    for alpha, mean in means.items():
        folder = tmp_path / "wise" / "dev" / f"alpha-{alpha:g}"
        for i, t in enumerate(chain.TASKS):
            (folder / f"{t}-dev").mkdir(parents=True)
            ndcg = mean + (i - 1.5) / 100  # the four tasks average to `mean`
            (folder / f"{t}-dev" / "summary.json").write_text(json.dumps({"metrics": {"NDCG@10": ndcg}}))
        (folder / "results.md").write_text("|")
    choice = chain.wise(REPO / chain.RECIPE)
    assert choice["alpha"] == 0.75 and choice["model"] == str(tmp_path / "wise" / "alpha-0.75" / "adapter")
    assert choice["dev_ndcg@10"]["0.5"]["mean"] == pytest.approx(0.30)
    assert json.loads((tmp_path / "wise" / "choice.json").read_text()) == choice
    (call,) = calls
    assert call[3:6] == ["evaluate", "--model", choice["model"]] and "--split" not in call
    assert call[call.index("--output") + 1] == str(tmp_path / "eval" / "mixture-interpolated")
