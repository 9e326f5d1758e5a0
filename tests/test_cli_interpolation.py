"""C51: ``${work_dir}`` in a command-line override means what it means in the recipe file, in ``train.py
fit``, ``--print_config`` and :func:`obliq.recipes.recipe_config` alike (jsonargparse #864)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO, task_rows, write_config, write_rows

QUICKSTART = REPO / "configs" / "quickstart.yaml"


def _as_read(read, parsed, run_dir: str, version: str) -> bool:
    """Every value ``read`` (recipe_config) sets is ``parsed``'s (which adds defaults), with the recipe's
    ``run_dir`` being the run's version folder in ``parsed``."""
    if isinstance(read, dict):
        return isinstance(parsed, dict) and all(
            k in parsed and _as_read(v, parsed[k], run_dir, version) for k, v in read.items()
        )
    if isinstance(read, list):
        return (
            isinstance(parsed, list)
            and len(read) == len(parsed)
            and all(_as_read(*p, run_dir, version) for p in zip(read, parsed))
        )
    if isinstance(read, str) and (read == run_dir or read.startswith(run_dir + "/")):
        read = version + read[len(run_dir) :]
    return read == parsed


def test_work_dir_on_the_command_line_reads_as_in_the_recipe(tmp_path):
    """`train.py fit --config quickstart.yaml --run_dir='${work_dir}/sweep' --print_config` (the user's
    command, its own process) and train_config of the same argv give the run folder <work_dir>/sweep/version_0,
    and every setting as recipe_config reads the recipe with that override."""
    from obliq.commands.train import train_config
    from obliq.recipes import recipe_config

    argv = ["fit", "--config", str(QUICKSTART), f"--work_dir={tmp_path}", "--run_dir=${work_dir}/sweep"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *argv, "--print_config"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = yaml.safe_load(done.stdout)  # the fit subcommand's config
    parsed = train_config(argv).as_dict()
    read = recipe_config(QUICKSTART, work_dir=str(tmp_path), run_dir="${work_dir}/sweep")
    version = str(tmp_path / "sweep" / "version_0")
    assert read["run_dir"] == str(tmp_path / "sweep")
    for config in (printed, parsed):
        assert config["run_dir"] == config["trainer"]["logger"]["init_args"]["save_dir"] == version
        assert _as_read(read, config, read["run_dir"], version)
    assert not (tmp_path / "sweep").exists()  # parsing and printing claimed nothing


@pytest.mark.slow
def test_a_one_step_fit_with_work_dir_on_the_command_line(tiny_llama_dir, tasks_dir, tmp_path):
    from obliq.commands.train import cli

    rows = write_rows(tmp_path / "rows.jsonl", task_rows(tasks_dir, "math-theoremqa", limit=8))
    config = write_config(tmp_path / "recipe", rows, tiny_llama_dir, max_steps=1)
    cfg = yaml.safe_load(config.read_text())
    cfg.update(work_dir=str(tmp_path / "W"), run_dir="${work_dir}/train")
    cfg["trainer"]["default_root_dir"] = cfg["trainer"]["logger"]["init_args"]["save_dir"] = "${run_dir}"
    cfg["trainer"]["callbacks"][0]["init_args"]["dirpath"] = "${run_dir}/ckpt"
    config.write_text(yaml.safe_dump(cfg))
    run = cli(["fit", "--config", str(config), "--run_dir=${work_dir}/sweep"])
    version = tmp_path / "W" / "sweep" / "version_0"
    assert run.trainer.global_step == 1 and Path(run.config.fit.run_dir) == version
    assert (version / "ckpt" / "last.ckpt").is_file() and list(version.rglob("metrics.csv"))
    assert not (tmp_path / "W" / "train").exists()


def test_every_form_of_a_command_line_value_reads_as_in_the_recipe(tmp_path):
    """`--name value`, a nested key, a mapping value and an appended list item: each ``${…}`` from the top of
    the recipe, ``${run_dir}`` the run's version folder."""
    from obliq.commands.train import train_config

    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": "${run_dir}/x"}}
    config = train_config(
        ["fit", "--config", str(QUICKSTART), f"--work_dir={tmp_path}", "--run_dir", "${work_dir}/sweep"]
        + ["--trainer.logger.init_args.save_dir=${run_dir}/logs", f"--trainer.callbacks+={json.dumps(checkpoint)}"]
        + ['--trainer.logger.init_args={"name": "${work_dir}"}']
    )
    version = tmp_path / "sweep" / "version_0"
    assert Path(config.run_dir) == version and Path(config.trainer.logger.init_args.save_dir) == version / "logs"
    assert Path(config.trainer.callbacks[-1].init_args.dirpath) == version / "x"
    assert config.trainer.logger.init_args.name == str(tmp_path)
