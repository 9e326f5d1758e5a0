"""The hostile pass's round of issue 53 §3 (tests/hostile_cli.py calls :func:`round_53`): inputs a new user met
as a traceback or a line naming nothing, and an unbounded setting, each tried once through the installed
commands; with three more of the issue's classes (a dataset of two configurations, BM25 over documents with
no word, ...)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
SYNTH = ["--config", str(REPO / "configs" / "synth" / "stance-tweets.yaml"), "--n_docs", "1", "--fewshot.k", "0"]


def _limited(argv: list[str], limit: int, cwd: Path) -> subprocess.CompletedProcess:
    """``obliq <argv>`` under a file-size limit of ``limit`` bytes (``ulimit -f``, set in the child)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [str(BIN / "obliq"), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )


def _model_copy(source: Path, folder: Path, **config) -> Path:
    """A copy of a model folder (weights linked) with ``config.json`` fields replaced."""
    folder.mkdir(parents=True)
    for f in source.iterdir():
        (folder / f.name).symlink_to(f) if f.suffix == ".safetensors" else shutil.copy(f, folder / f.name)
    if config:
        data = json.loads((source / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**data, **config}))
    return folder


def round_53(w: Path, t: Path, common: list[str], case: Callable, run: Callable) -> None:
    """The classes of issue 53 §3, recorded with hostile_cli's ``case`` and run with its ``run``."""
    from obliq.aliases import smollm2_dir, smollm2_gguf

    r = w / "r53"
    r.mkdir()
    task = ["--task", str(t)]
    # a GGUF file cut short (an interrupted download): struct.error before
    cut = r / "cut.gguf"
    with smollm2_gguf().open("rb") as f:
        cut.write_bytes(f.read(3_000_000))
    done = run("synth", "generate", *SYNTH, *task, "--out", str(r / "g.jsonl"), "--backend.name", "llamacpp",
               "--backend.model", str(cut), cwd=w)  # fmt: skip
    case("models", "a GGUF file cut short", done, str(cut), "cut short", ok=not (r / "g.jsonl").exists())
    # backend.context far above the model's trained context (8,192 for SmolLM2): ran without a word
    done = run("synth", "generate", *SYNTH, *task, "--out", str(r / "c.jsonl"), "--backend.name", "llamacpp",
               "--backend.context", "98304", cwd=w)  # fmt: skip
    case("resources", "backend.context 12x the trained context", done, "backend.context", "8,192")
    # a chat template that takes no system turn (Gemma's, Mistral's): a jinja2 traceback before
    nosys = _model_copy(smollm2_dir(), r / "nosys")
    (nosys / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    done = run("synth", "generate", *SYNTH, *task, "--out", str(r / "n.jsonl"), "--backend.name", "transformers",
               "--backend.model", str(nosys), "--backend.threads", "1", cwd=w)  # fmt: skip
    case("models", "a chat template that refuses a system turn", done, "chat_template.jinja", "system")
    # "auto_map": null and an unknown rope type in a model's config.json: a TypeError traceback, `error: nonexistent`
    for name, change, needle in (
        ("auto_map null", {"auto_map": None}, "auto_map"),
        ("an unknown rope_scaling type", {"rope_scaling": {"rope_type": "nonexistent", "factor": 2.0}}, "nonexistent"),
    ):
        folder = _model_copy(smollm2_dir(), r / name.replace(" ", "-"), **change)
        done = run("evaluate", "--model", str(folder), "--tasks", str(t), "--output", str(r / "e"), *common, cwd=w)
        case("models", f"config.json with {name}", done, str(folder / "config.json"), needle)
    # a file-size limit: `[Errno 27] File too large` without the file before
    done = _limited(["evaluate", "--model", "bm25", "--tasks", str(t), "--output", str(r / "f"), *common], 2048, w)
    case("resources", "evaluate under ulimit -f (2 KiB)", done, str(r / "f"), "file-size limit of 2,048 bytes")
    # a task folder without corpus.jsonl: blamed on its qrels folder before
    nocorpus = r / "nocorpus"
    shutil.copytree(t, nocorpus)
    (nocorpus / "corpus.jsonl").unlink()
    done = run("evaluate", "--model", "bm25", "--tasks", str(nocorpus), "--output", str(r / "o"), *common, cwd=w)
    case(
        "inputs", "a task folder without corpus.jsonl", done, str(nocorpus / "corpus.jsonl"), ok=not (r / "o").exists()
    )
    # task split --seed -1: `expected non-negative integer` before
    done = run("task", "split", "--task", str(t), "--out", str(r / "s"), "--seed", "-1", cwd=w)
    case("settings", "task split --seed -1", done, "seed", ok=not (r / "s").exists())
    # issue 53's other classes: a dataset of two configurations (C63), BM25 over documents with no word (C64)
    hub = r / "hub"
    header = ["---", "configs:"]
    for config in ("hq", "vl"):
        (hub / config).mkdir(parents=True)
        rows = [{"anchor": f"{config} question {i}", "positive": f"{config} answer {i}"} for i in range(3)]
        (hub / config / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        header += [f"- config_name: {config}", "  data_files:", "  - split: train", f"    path: {config}/train.jsonl"]
    (hub / "README.md").write_text("\n".join([*header, "---", ""]))
    done = run("data", "convert", "--input", str(hub), "--out", str(r / "rows.jsonl"), "--task", "t", cwd=w)
    case("inputs", "data convert of two configurations without --subset", done, "'hq'", "'vl'", "--subset",
         ok=not (r / "rows.jsonl").exists())  # fmt: skip
    wordless = r / "wordless"
    shutil.copytree(t, wordless)
    docs = [{"_id": "e1", "text": ""}, {"_id": "e2", "text": "🙂🙂 🎉"}, {"_id": "e3", "text": "!!! ..."}]
    with (wordless / "corpus.jsonl").open("a") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    done = run("evaluate", "--model", "bm25", "--tasks", str(wordless), "--output", str(r / "b"), *common, cwd=w)
    summary = next((r / "b").glob("*/summary.json"), None)
    case("numbers", "BM25 over empty and emoji-only documents", done, exit_code=0, ok=summary is not None)
