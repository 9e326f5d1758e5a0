"""Nothing lost, nothing executed (issue 15): checkpoints as untrusted input, resume never ignoring the
command line, no silent overwrites, inputs checked against each other, names from files kept inside
the output, and one-line errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from support import csv_column, make_task, task_rows, write_config, write_rows

from obliq.cli import main as obliq_main

EVIL = """import pathlib
pathlib.Path(__file__).with_name("RAN").write_text("code from a model folder ran")
from transformers import LlamaConfig as EvilConfig
"""


def _evil_backbone(folder: Path, tiny_llama_dir: str) -> Path:
    """A model folder whose config asks for its own Python code (which leaves a marker file when run)."""
    import shutil

    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(EVIL)
    return folder


@pytest.fixture(scope="module")
def rows_file(tasks_dir, tmp_path_factory) -> Path:
    return write_rows(tmp_path_factory.mktemp("rows") / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=40))


@pytest.fixture(scope="module")
def trained(tiny_llama_dir, rows_file, tmp_path_factory) -> Path:
    """A 3-step run of the tiny Llama: its last checkpoint."""
    from obliq.commands.train import cli

    folder = tmp_path_factory.mktemp("trained")
    cli(["fit", "--config", str(write_config(folder, rows_file, tiny_llama_dir, max_steps=3))])
    return folder


# --- 1. a checkpoint cannot make obliq run code -------------------------------------------------


@pytest.mark.slow
def test_a_crafted_checkpoint_runs_no_code_on_export_or_resume(trained, tiny_llama_dir, rows_file, tmp_path):
    from obliq.commands.export import export
    from obliq.commands.train import cli
    from obliq.model.checkpoint import load_checkpoint, read_checkpoint

    evil = _evil_backbone(tmp_path / "evil-model", tiny_llama_dir)
    ckpt = read_checkpoint(trained / "ckpt" / "last.ckpt")  # as data, as obliq reads it
    ckpt["obliq"]["encoder"].update(backbone=str(evil), trust_remote_code=True)
    ckpt["hyper_parameters"]["encoder"] = {
        "class_path": "obliq.model.BiEncoder",
        "init_args": {"backbone": str(evil), "trust_remote_code": True},
    }
    crafted = tmp_path / "crafted.ckpt"
    torch.save(ckpt, crafted)

    with pytest.raises(ValueError, match="trained on backbone"):  # the user's backbone is checked
        export(crafted, tmp_path / "out", backbone=tiny_llama_dir)
    # the checkpoint's own backbone asks for code obliq does not have: refused, never loaded as another class
    with pytest.raises(ValueError, match="auto_map names the model's own class 'evil.EvilConfig'.*trust_remote_code"):
        load_checkpoint(crafted)
    with pytest.raises(ValueError, match="cannot resume with another model: model.encoder.init_args.backbone"):
        cli(
            [
                "fit",
                "--config",
                str(write_config(tmp_path / "resume", rows_file, tiny_llama_dir, max_steps=4)),
                "--ckpt_path",
                str(crafted),
            ]
        )
    assert not (evil / "RAN").exists()  # no code of the model folder ran


# --- 2. a resume never silently ignores what the user asked -------------------------------------


@pytest.mark.slow
def test_a_resume_applies_a_new_lr_and_refuses_a_new_prefix(trained, tiny_llama_dir, rows_file, tmp_path, caplog):
    import shutil

    from obliq.commands.train import cli

    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    config = write_config(folder, rows_file, tiny_llama_dir, max_steps=5)
    cli(["fit", "--config", str(config), "--model.lr=5e-4", "--ckpt_path", str(folder / "ckpt" / "last.ckpt")])
    assert "model.lr: 0.001 in the checkpoint, 0.0005 now: applied" in caplog.text
    second = sorted(folder.rglob("metrics.csv"))[-1].read_text()
    lrs = [float(x) for x in csv_column(second, "train/lr")][-2:]
    assert lrs == pytest.approx([5e-4 * 2 / 4, 5e-4 * 1 / 4])  # steps 3 and 4 of the 5-step schedule, new peak
    with pytest.raises(ValueError, match=r"query_prefix: 'query: ' in the checkpoint, '' now"):
        cli(
            [
                "fit",
                "--config",
                str(config),
                "--model.encoder.init_args.query_prefix=",
                "--trainer.max_steps=6",
                "--ckpt_path",
                str(folder / "ckpt" / "last.ckpt"),
            ]
        )


# --- 3. nothing is overwritten without being asked -----------------------------------------------


@pytest.mark.slow
def test_each_run_of_a_recipe_gets_its_own_folder_and_last_finds_the_newest(tiny_llama_dir, rows_file, tmp_path):
    from obliq.commands.train import cli

    config = write_config(tmp_path / "recipe", rows_file, tiny_llama_dir, max_steps=2)
    cfg = yaml.safe_load(config.read_text())
    cfg["run_dir"] = str(tmp_path / "runs")
    cfg["trainer"]["default_root_dir"] = cfg["trainer"]["logger"]["init_args"]["save_dir"] = "${run_dir}"
    cfg["trainer"]["callbacks"][0]["init_args"]["dirpath"] = "${run_dir}/ckpt"
    config.write_text(yaml.safe_dump(cfg))
    first = cli(["fit", "--config", str(config)])
    second = cli(["fit", "--config", str(config)])
    assert Path(first.trainer.default_root_dir).name == "version_0"
    assert Path(second.trainer.default_root_dir).name == "version_1"
    assert (tmp_path / "runs" / "version_0" / "ckpt" / "last.ckpt").is_file()  # the first run's, kept
    resumed = cli(["fit", "--config", str(config), "--trainer.max_steps=3", "--ckpt_path", "last"])
    assert Path(resumed.trainer.default_root_dir).name == "version_1" and resumed.trainer.global_step == 3
    # issue 32 §3: a refused fit (a data source that matches no file; max_steps -5) leaves no empty version_2
    missing = json.dumps([{"name": "x", "path": str(tmp_path / "nothing.jsonl")}])
    with pytest.raises((FileNotFoundError, ValueError)):
        cli(["fit", "--config", str(config), f"--data.sources={missing}"])
    with pytest.raises(Exception, match="max_steps"):
        cli(["fit", "--config", str(config), "--trainer.max_steps=-5"])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["version_0", "version_1"], [
        str(p) for p in (tmp_path / "runs").rglob("*") if "version_2" in str(p)
    ]


def test_a_sweep_trial_gets_a_folder_named_by_its_wandb_run(tmp_path, monkeypatch):
    from obliq.runs import run_folder

    monkeypatch.setenv("WANDB_RUN_ID", "abc123")
    assert run_folder(tmp_path, None) == (tmp_path / "wandb-abc123", None)


def test_evaluate_refuses_to_write_over_earlier_results_unless_asked(tmp_path, capsys):
    task = make_task(
        tmp_path / "t", [{"_id": "d1", "text": "apple pie"}], [{"_id": "q1", "text": "apple"}], [("q1", "d1", 1)]
    )
    args = [
        "evaluate",
        "--model",
        "bm25",
        "--tasks",
        str(task),
        "--output",
        str(tmp_path / "out"),
        "--measures",
        "[NDCG@10]",
        "--latency_queries",
        "0",
    ]
    obliq_main(args)
    before = (tmp_path / "out" / "t" / "summary.json").read_text()
    with pytest.raises(SystemExit) as stop:
        obliq_main(args)
    assert stop.value.code == 2 and "already holds evaluation results: pass --overwrite true" in capsys.readouterr().err
    assert (tmp_path / "out" / "t" / "summary.json").read_text() == before
    obliq_main(args + ["--overwrite", "true"])


def test_an_output_that_is_an_input_is_always_refused(tmp_path, tasks_dir):
    from obliq.commands.distill import graph, pairs
    from obliq.commands.negatives import mine
    from obliq.commands.rerank import run as rerank_run
    from obliq.commands.synth import generate
    from obliq.synth.prompts import TaskSpec

    task = make_task(
        tmp_path / "t",
        [{"_id": f"d{i}", "text": f"text number {i} about apples"} for i in range(8)],
        [{"_id": "q1", "text": "apple"}],
        [("q1", "d1", 1)],
    )
    graph(task, tmp_path / "graph.json", k=2)
    for out in (task / "corpus.jsonl", tmp_path / "graph.json"):
        with pytest.raises(ValueError, match="the input"):
            pairs(task, tmp_path / "graph.json", out, overwrite=True)
    rows = write_rows(
        tmp_path / "rows.jsonl",
        [
            {
                "id": "r1",
                "task": "t",
                "source": "public",
                "query": "apple",
                "positive": {"id": "d1", "text": "text number 1 about apples"},
                "negatives": [],
            }
        ],
    )
    with pytest.raises(ValueError, match="is the input"):
        mine(rows, task, rows, overwrite=True)
    (tmp_path / "link.jsonl").symlink_to(task / "queries.jsonl")
    spec = TaskSpec("t", "descriptive", "a text", "texts", "its topic", "topic")
    with pytest.raises(ValueError, match="the input"):  # the same file through a link
        generate(task, tmp_path / "link.jsonl", spec)
    qrels = (task / "qrels" / "test.tsv").read_text()
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.0 dense\n")
    with pytest.raises(ValueError, match="the input"):  # a task file, even with --overwrite
        rerank_run(task, tmp_path / "run.trec", task / "qrels" / "test.tsv", method="identity", overwrite=True)
    assert (task / "qrels" / "test.tsv").read_text() == qrels
    with pytest.raises(ValueError, match="are the same file"):  # two outputs of one command
        pairs(task, tmp_path / "graph.json", tmp_path / "p.jsonl", control_out=tmp_path / "p.jsonl")
    assert not (tmp_path / "p.jsonl").exists()


def test_synth_resume_keeps_a_complete_last_line_and_cuts_a_partial_one(tmp_path):
    from obliq.synth.generate import read_done

    row = {
        "id": "synth:t:d1",
        "task": "t",
        "source": "synthetic",
        "query": "q",
        "positive": {"id": "d1", "text": "x"},
        "negatives": [],
    }
    out = tmp_path / "rows.jsonl"
    out.write_text(json.dumps(row) + "\n" + json.dumps(dict(row, id="synth:t:d2", positive={"id": "d2", "text": "y"})))
    assert read_done(out, "t") == ({("d1", 0), ("d2", 0)}, False)  # complete but for its newline: kept
    assert out.read_text().endswith("}\n")
    out.write_text(out.read_text() + '{"id": "synth:t:d3", "task": "t", "sou')
    assert read_done(out, "t") == ({("d1", 0), ("d2", 0)}, True)  # a half-written line: cut (sample 0 each)
    assert out.read_text().count("\n") == 2


# --- 4. inputs checked against each other ----------------------------------------------------------


def test_rows_runs_and_tasks_of_another_task_are_refused(tmp_path, tasks_dir):
    from obliq.commands.evaluate import evaluate
    from obliq.commands.negatives import mine
    from obliq.search.retrieval import retrieve_run_file
    from obliq.tasks import find_tasks, load_task

    math = tasks_dir / "math-theoremqa"
    foreign = write_rows(tmp_path / "rows.jsonl", task_rows(tasks_dir, "writing-news", limit=3))
    with pytest.raises(ValueError, match="rows have a positive that is not a document of math-theoremqa"):
        mine(foreign, math, tmp_path / "out.jsonl")
    (tmp_path / "other.trec").write_text("q-x Q0 d1 1 1.0 t\n")
    with pytest.raises(ValueError, match="holds no query of task math-theoremqa"):
        retrieve_run_file(tmp_path / "other.trec", load_task(math))
    for _ in range(2):  # a refused evaluation leaves nothing behind: the retry is refused for the same reason
        with pytest.raises(ValueError, match="holds no query of task math-theoremqa"):
            evaluate(str(tmp_path / "other.trec"), [str(math)], tmp_path / "refused")
    assert not [p for p in (tmp_path / "refused").rglob("*") if p.is_file()]
    folder = tmp_path / "tasks"
    make_task(folder / "good", [{"_id": "d1", "text": "a"}], [{"_id": "q1", "text": "a"}], [("q1", "d1", 1)])
    (folder / "broken").mkdir()
    (folder / "broken" / "queries.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="broken: in the folder of tasks .* but not a task"):
        find_tasks([folder])


# --- 5. names from files -------------------------------------------------------------------------


def test_a_task_name_never_leaves_the_output_folder(tmp_path):
    task = make_task(
        tmp_path / "t", [{"_id": "d1", "text": "apple pie"}], [{"_id": "q1", "text": "apple"}], [("q1", "d1", 1)]
    )
    long = "long-" + "x" * 300  # issue 32 §3: [Errno 36] before; a control character broke results.md's table
    for name, folder in (
        ("../../escaped", "escaped"),
        ("a/b", "a_b"),
        (long, "long-" + "x" * 182 + "-" + __import__("hashlib").sha256(long.encode()).hexdigest()[:12]),
        ("tab\tand|pipe\nline", "tab_and_pipe_line"),
    ):
        (task / "task.json").write_text(json.dumps({"name": name}))
        out = tmp_path / f"out-{folder}"
        obliq_main(
            [
                "evaluate",
                "--model",
                "bm25",
                "--tasks",
                str(task),
                "--output",
                str(out),
                "--measures",
                "[NDCG@10]",
                "--latency_queries",
                "0",
            ]
        )
        assert (out / folder / "summary.json").is_file()
        assert all(p.parent.parent.name.startswith("out-") for p in tmp_path.rglob("summary.json"))
        rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| ")]
        assert all(line.replace("\\|", "").count("|") == rows[0].count("|") for line in rows[:2])  # one cell each
    from obliq.commands.evaluate import evaluate

    (task / "task.json").write_text(json.dumps({"name": ".."}))
    with pytest.raises(ValueError, match="task name '..' cannot be used as a folder name"):
        evaluate("bm25", [str(task)], tmp_path / "x", measures=["NDCG@10"], latency_queries=0)


# --- 6. errors name the file ----------------------------------------------------------------------


def test_bad_files_are_one_line_errors_naming_them(tmp_path, capsys):
    import pickle

    cases = []
    pickled = tmp_path / "pickled.ckpt"
    pickled.write_bytes(pickle.dumps({"obliq": object()}))
    cases.append(
        (
            ["export", "--checkpoint", str(pickled), "--out", str(tmp_path / "e")],
            "pickled.ckpt: a pickle that holds more than weights",
        )
    )
    whole = tmp_path / "whole.ckpt"
    torch.save({"obliq": {}, "state_dict": {"w": torch.zeros(4096)}}, whole)
    (tmp_path / "cut.ckpt").write_bytes(whole.read_bytes()[:5000])  # a copy that stopped halfway
    (tmp_path / "text.ckpt").write_text("not a checkpoint\n")
    for name in ("cut.ckpt", "text.ckpt"):
        cases.append(
            (
                ["export", "--checkpoint", str(tmp_path / name), "--out", str(tmp_path / "e")],
                f"{name}: not a readable checkpoint",
            )
        )
    task = make_task(
        tmp_path / "t", [{"_id": "d1", "text": "apple pie"}], [{"_id": "q1", "text": "apple"}], [("q1", "d1", 1)]
    )
    (task / "task.json").write_text("{name: t")
    cases.append(
        (
            ["evaluate", "--model", "bm25", "--tasks", str(task), "--output", str(tmp_path / "o")],
            "task.json:1: not valid JSON",
        )
    )
    big = make_task(
        tmp_path / "big", [{"_id": "d1", "text": "apple pie"}], [{"_id": "q1", "text": "apple"}], [("q1", "d1", 1)]
    )
    (big / "qrels" / "test.tsv").write_text("q1\td1\t99999999999\n")
    cases.append(
        (
            ["evaluate", "--model", "bm25", "--tasks", str(big), "--output", str(tmp_path / "b")],
            "outside trec_eval's integer range",
        )
    )
    cases.append(
        (
            [
                "audit",
                "--task",
                str(big),
                "--output",
                str(tmp_path / "a"),
                "--groups",
                "[[x, y]]",
                "--confidence",
                "1.5",
            ],
            "confidence must lie strictly between 0 and 1",
        )
    )
    for argv, message in cases:
        with pytest.raises(SystemExit) as stop:
            obliq_main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and "Traceback" not in err, (argv, err)


def test_a_corrupt_embedding_cache_is_named_discarded_and_rebuilt(tmp_path, caplog):
    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings
    from obliq.search.store import Store
    from obliq.tasks import load_task

    task = load_task(
        make_task(
            tmp_path / "t",
            [{"_id": "d1", "text": "apple pie"}, {"_id": "d2", "text": "sky"}],
            [{"_id": "q1", "text": "apple"}],
            [("q1", "d1", 1)],
        )
    )
    settings = RetrievalSettings(cache_dir=tmp_path / "cache")
    first = make_retriever("minilm", settings)(task)
    [cache] = (tmp_path / "cache").glob("*/shard-0-of-1.npy")
    cache.write_bytes(b"\x93NUMPY garbage")
    again = make_retriever("minilm", settings)(task)
    assert (
        again.corpus_cache == "miss" and f"{cache.parent}: unusable cached embeddings ({cache}: 14 bytes" in caplog.text
    )
    assert all(again.run[q] == pytest.approx(first.run[q]) for q in first.run) and cache.stat().st_size > 100
    assert Store.of("minilm", settings, task).folder == cache.parent


def _claim_at_once(path, barrier, done, results):
    from obliq.claims import claim_output

    barrier.wait()
    try:
        claim_output(path, folder=True, command="evaluate", what="evaluation results")
        results.put("ok")
    except ValueError as err:
        results.put(str(err))
    done.wait()  # alive until both have tried: a claim is held while its process runs


def test_of_two_commands_claiming_one_output_at_once_one_wins(tmp_path):
    """Issue 32 §3: two evaluates into one new output could both succeed and leave a mixed folder. The claim is
    made with os.link and taken over only from a process that has ended: one wins, the other refuses in one
    line, whatever the timing; a finished command's claim is taken over."""
    import multiprocessing
    import os
    import subprocess
    import sys

    from obliq.claims import claim_output
    from obliq.process import process_start

    ctx = multiprocessing.get_context("fork")
    for trial in range(6):
        barrier, done, results = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
        path = tmp_path / f"out{trial}"
        procs = [ctx.Process(target=_claim_at_once, args=(path, barrier, done, results)) for _ in range(2)]
        for proc in procs:
            proc.start()
        got = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(60)
        assert got.count("ok") == 1 and any("is writing it now" in g for g in got), got
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import time

        time.sleep(0.2)
        path = tmp_path / "held"
        claim_output(path, folder=True, command="evaluate")
        record = tmp_path / ".held.obliq"
        held = json.loads(record.read_text())
        record.write_text(json.dumps({**held, "pid": sleeper.pid, "process_start": process_start(sleeper.pid)}))
        with pytest.raises(ValueError, match=f"'evaluate' in process {sleeper.pid} on host \\S+ is writing it now"):
            claim_output(path, True, folder=True, command="evaluate")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert claim_output(path, True, folder=True, command="evaluate") == path  # its process ended: taken over
    assert json.loads(record.read_text())["pid"] == os.getpid()


def test_a_damaged_adapter_is_named_before_anything_is_encoded(tiny_llama_dir, tmp_path):
    """Clean-clone findings 10, 11: an adapter whose weights file is cut short, or holds NaN, is refused with one
    line naming the adapter (not a safetensors traceback, not a cache shard after encoding began)."""
    from safetensors.torch import load_file, save_file

    from obliq.model.encoder import BiEncoder, LoraSettings
    from obliq.search.encoders import load_encoder

    BiEncoder(tiny_llama_dir, lora=LoraSettings(r=2, alpha=4, dropout=0.0)).save_pretrained(tmp_path / "adapter")
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    whole = weights.read_bytes()
    assert load_encoder(str(tmp_path / "adapter")) is not None
    state = load_file(weights)
    name = sorted(n for n in state if "lora_A" in n)[0]
    state[name][0, 0] = float("nan")
    save_file(state, weights)
    with pytest.raises(ValueError, match=r"adapter: the adapter's weight .*lora_A.* holds NaN or infinite values"):
        load_encoder(str(tmp_path / "adapter"))
    weights.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"adapter_model\.safetensors: a safetensors file cut short"):
        load_encoder(str(tmp_path / "adapter"))
