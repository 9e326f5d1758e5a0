"""Kill anywhere: one small CPU run SIGKILLed at random points and resumed each time ends bit-identical.

A tiny random Llama (2 layers, bidirectional, LoRA) trains on 40 real rows of math-theoremqa, 4 per
step, for 40 steps (4 epochs), with a checkpoint after every step. The same run goes uninterrupted
once (the reference). Then it is started and killed with SIGKILL ``--kills`` times, each time at a
random step and a random moment inside it — or, for about a third of the kills, while a checkpoint is
being written (its temporary file is on disk) — and resumed with ``--ckpt_path last`` until
it completes. Reported per kill: the step reached, whether a checkpoint write was under way, the step
the resume started from. Then:

- the final LoRA weights against the reference's, bit for bit (``torch.equal``);
- every row seen exactly once per epoch: each step appends its (epoch, step, row ids) to a log
  (``SeenRows``); steps replayed after a kill appear twice, the later one being the one training
  kept, so the log is read keeping the last record per step.

    python bench/kill_resume.py [--kills 20] [--seed 0] [--out runs/kill-resume] [--steps 40] [--rows 40]

A benchmark, not a test: it prints its table and exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from lightning.pytorch import Callback

from obliq.eval.results import made_with

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("OBLIQ_DATA", REPO.parent / "shared" / "data"))
STEPS, BATCH, ROWS = 40, 4, 40


class SeenRows(Callback):
    """Appends ``{"epoch", "step", "rows"}`` for every training step to ``path`` (flushed and fsynced)."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(
                json.dumps({"epoch": trainer.current_epoch, "step": trainer.global_step, "rows": batch["row_ids"]})
                + "\n"
            )
            f.flush()
            os.fsync(f.fileno())


def _setup(out: Path, n_rows: int = ROWS) -> tuple[Path, Path]:
    """The tiny backbone and the rows file of ``n_rows`` rows (built once)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    from obliq.aliases import resolve_model
    from obliq.tasks import load_task

    backbone, rows = out / "tiny-llama", out / "rows.jsonl"
    if not (backbone / "config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2"))
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            attention_dropout=0.1,
        )
        torch.manual_seed(0)
        LlamaModel(config).save_pretrained(backbone)
        tokenizer.save_pretrained(backbone)
    if not rows.is_file():
        task = load_task(DATA / "tasks" / "math-theoremqa")
        text = dict(zip(task.doc_ids, task.doc_texts))
        out_rows = []
        for qid, query in zip(task.query_ids, task.query_texts):
            for doc in sorted(task.qrels["test"].get(qid, {}))[:1]:
                out_rows.append(
                    {
                        "id": f"r{len(out_rows)}",
                        "task": task.name,
                        "source": "public",
                        "query": query,
                        "positive": {"id": doc, "text": text[doc]},
                        "negatives": [],
                    }
                )
            if len(out_rows) == n_rows:
                break
        rows.write_text("".join(json.dumps(r) + "\n" for r in out_rows))
    return backbone, rows


def _config(folder: Path, backbone: Path, rows: Path, steps: int = STEPS) -> Path:
    import yaml

    cfg = {
        "seed_everything": 0,
        "run_dir": str(folder),
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": steps,
            "deterministic": True,
            "default_root_dir": "${run_dir}",
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": False,
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {
                        "dirpath": "${run_dir}/ckpt",
                        "save_last": True,
                        "every_n_train_steps": 1,
                        "save_top_k": 1,
                        "enable_version_counter": False,
                    },
                },
                {"class_path": "bench.kill_resume.SeenRows", "init_args": {"path": str(folder / "seen.jsonl")}},
            ],
        },
        "model": {
            "encoder": {
                "class_path": "obliq.model.BiEncoder",
                "init_args": {
                    "backbone": str(backbone),
                    "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
                    "query_max_length": 32,
                    "passage_max_length": 48,
                },
            },
            "loss": {"class_path": "obliq.losses.InfoNCE", "init_args": {"temperature": 0.05}},
            "chunk_size": 2,
            "lr": 1e-3,
        },
        "data": {"sources": [{"path": str(rows)}], "batch_size": BATCH, "max_negatives": 0, "num_workers": 0},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(config: Path, *extra: str) -> subprocess.Popen:
    # Lightning writes a checkpoint to a temporary file (fsspec's transaction: tempfile.mkstemp) and
    # moves it into place: a TMPDIR of the run's own makes the write visible to _writing().
    tmp = config.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    env["OBLIQ_RECIPE_IMPORTS"] = "bench.kill_resume"  # its SeenRows callback (obliq.recipes.RECIPE_IMPORTS)
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", str(config), *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lora(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def _steps_done(folder: Path) -> int:
    """The highest step with a complete checkpoint in any run of the run folder (read from the file names:
    this is polled every millisecond while the run is being killed)."""
    from obliq.runs import run_versions

    steps = [
        int(p.stem.split("step=")[1])
        for r in run_versions(folder)
        for p in (r.path / "ckpt").glob("epoch=*-step=*.ckpt")
    ]
    return max(steps, default=0)


def _writing(folder: Path) -> bool:
    """A checkpoint being written: a temporary file in the run's TMPDIR."""
    return any(p.is_file() for p in (folder / "tmp").iterdir()) if (folder / "tmp").is_dir() else False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "kill-resume")
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps (a smoke test: a few)")
    parser.add_argument("--rows", type=int, default=ROWS, help=f"rows, {BATCH} a step (a multiple of {BATCH})")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = args.out.resolve()
    backbone, rows = _setup(out, args.rows)

    whole = _config(out / f"whole-{args.seed}", backbone, rows, args.steps)
    reference = _start(whole)
    broken_dir = out / f"killed-{args.seed}"
    broken = _config(broken_dir, backbone, rows, args.steps)
    targets = sorted(rng.randint(1, args.steps - 1) for _ in range(args.kills))  # steps may repeat
    outcomes, run = [], _start(broken)
    for target in targets:
        during_write = rng.random() < 1 / 3
        deadline = time.time() + 300
        started = time.time()
        while run.poll() is None and time.time() < deadline:
            reached = _steps_done(broken_dir) >= target
            if reached and during_write and _writing(broken_dir):
                break
            if reached and not during_write:
                # a random moment: inside the next step, or (a target already passed) of the restart
                time.sleep(rng.uniform(0, 0.5) if time.time() - started > 1 else rng.uniform(0, 8))
                break
            time.sleep(0.001)
        if run.poll() is not None:  # it finished (or failed) before the kill point
            break
        writing = _writing(broken_dir)
        run.send_signal(signal.SIGKILL)
        run.wait()
        killed_at = _steps_done(broken_dir)
        run = _start(broken, "--ckpt_path", "last")
        outcomes.append(
            {
                "kill": len(outcomes) + 1,
                "target_step": target,
                "checkpointed_steps": killed_at,
                "during_checkpoint_write": writing,
            }
        )
    code = run.wait(timeout=1200)
    ref_code = reference.wait(timeout=1200)

    ok = code == 0 and ref_code == 0
    from obliq.runs import latest_run

    a = _lora(latest_run(out / f"whole-{args.seed}").last)
    b = _lora(latest_run(broken_dir).last)
    import torch

    identical = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    seen: dict[int, dict] = {}
    for line in (broken_dir / "seen.jsonl").read_text().splitlines():
        record = json.loads(line)
        seen[record["step"]] = record  # a replayed step: the later record is the one training kept
    per_epoch: dict[int, Counter] = {}
    for record in seen.values():
        per_epoch.setdefault(record["epoch"], Counter()).update(record["rows"])
    once = all(set(c) == {f"r{i}" for i in range(args.rows)} and set(c.values()) == {1} for c in per_epoch.values())

    print("| kill | target step | steps checkpointed when killed | during a checkpoint write |")
    print("|---:|---:|---:|---|")
    for o in outcomes:
        print(f"| {o['kill']} | {o['target_step']} | {o['checkpointed_steps']} | {o['during_checkpoint_write']} |")
    print(
        f"\n{len(outcomes)} kills ({sum(o['during_checkpoint_write'] for o in outcomes)} during a checkpoint write); "
        f"final run exit {code}, reference exit {ref_code}; steps logged {len(seen)} of {args.steps}; "
        f"final adapter bit-identical to the uninterrupted run: {identical}; every row exactly once in each of "
        f"{len(per_epoch)} epochs: {once}"
    )
    if not (ok and identical and once and len(seen) == args.steps):
        if code != 0:
            print(run.stderr.read()[-2000:])
        sys.exit(1)


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
