"""The llama.cpp backend against the transformers backend on the same chats (issue 48 §1).

Two subcommands:

``speed`` runs ``obliq synth generate`` once, with the task's own config and the backend named, into a
fresh folder (``runs/bench/llm/<backend>/``, removed first, so every run generates from nothing)::

    python bench/llm_backends.py speed --backend llamacpp --n_docs 24
    python bench/llm_backends.py speed --backend llamacpp:q4_0 --n_docs 24

(a backend is ``transformers``, ``llamacpp`` (the shipped GGUF) or ``llamacpp:<type>``: the shipped file
requantized to ``q4_0`` or ``q8_0``, ``backend.quantize``, the copy made once and cached; its folder
``runs/bench/llm/llamacpp-q4_0/``) and prints its rows, replies, new and prompt tokens (and how many were
evaluated), the generation time its report records, the command's wall time, and rows per generation
second. Time the backends' commands in turn, A B A B, with any whole-process timer (``/usr/bin/time``,
``hyperfine``) so that a drift of the machine's speed hits all; their ratio is the figure. Every run
prints the CPU (model and instruction sets) and how llama.cpp was built (``Made with:``, on stderr). The
table of issue 54 §4, A B A B::

    for i in 1 2; do for b in transformers llamacpp llamacpp:q8_0 llamacpp:q4_0; do
      python bench/llm_backends.py speed --backend $b --n_docs 8 --threads 1; done; done

``agree`` decodes the same chats greedily with two backends (``n_docs`` stance-tweets documents
sampled as ``synth generate`` samples them; each document's Stage A chat, then its Stage B chat built
on the first backend's Stage A reply, so both backends see identical prompts) and prints the share
of replies that are equal, and the mean share of reply tokens before the first difference::

    python bench/llm_backends.py agree --n_docs 24                            # transformers, llamacpp
    python bench/llm_backends.py agree --n_docs 24 --pair llamacpp llamacpp:q4_0   # the faster file

The two runtimes compute with other kernels (llama.cpp's quantized dot products against transformers'
float32 matmuls over the dequantized weights), so a greedy reply may part where two tokens are near a tie;
the figure says how often. A benchmark prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from obliq.eval.results import made_with

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("transformers", "llamacpp", "llamacpp:q4_0", "llamacpp:q8_0")
"""``--backend`` / ``--pair``: llamacpp on the shipped GGUF, or on it requantized (``backend.quantize``)."""
TASKS = Path(os.environ.get("OBLIQ_DATA", REPO.parent / "shared" / "data")) / "tasks"


def split_task(root: Path, task: str) -> Path:
    """The task split as the mini chain splits it (dev half for the few-shot examples), made once."""
    from obliq.commands.task import split_task as split

    out = root / "tasks" / task
    if not (out / "queries-dev.jsonl").is_file():
        split(TASKS / task, out, 0.5, 0)
    return out


def backend(spec: str, threads: int):
    """The backend a ``--pair`` entry names: ``transformers`` (on the CPU), ``llamacpp`` or ``llamacpp:<type>``."""
    from obliq.llm.backends import backend_config

    name, _, kind = spec.partition(":")
    settings = {"device": "cpu"} if name == "transformers" else {"quantize": kind} if kind else {}
    return backend_config(name=name, threads=threads, **settings).build()


def speed(args) -> None:
    from obliq.cli import main

    root = REPO / "runs" / "bench" / "llm"
    task = split_task(root, args.task)
    name, _, kind = args.backend.partition(":")
    label = args.backend.replace(":", "-")
    out = root / label
    shutil.rmtree(out, ignore_errors=True)
    options = ["--backend.name", name, "--backend.threads", str(args.threads)]
    if name == "transformers":
        options += ["--backend.device", "cpu"]
    if kind:
        options += ["--backend.quantize", kind]
    start = time.perf_counter()
    main(
        ["synth", "generate", "--config", f"configs/synth/{args.task}.yaml", "--task", str(task)]
        + ["--out", str(out / "rows.jsonl"), "--n_docs", str(args.n_docs)]
        + options
    )
    wall = time.perf_counter() - start
    report = json.loads((out / "rows.jsonl.report.json").read_text())["report"]
    replies = sum(report["replies"].values())
    evaluated = report["prompt_tokens_evaluated"] or "all"
    print(
        f"{label}: {report['generated']} rows of {report['candidates']} candidates, {replies} replies, "
        f"{report['new_tokens']} new tokens, {report['prompt_tokens']} prompt tokens ({evaluated} evaluated); "
        f"generation {report['generation_seconds']:.1f} s, command {wall:.1f} s; "
        f"{report['generated'] / report['generation_seconds']:.3f} rows per generation second, "
        f"{report['tokens_per_s']:.1f} new tokens/s"
    )
    print(made_with(), file=sys.stderr)  # the CPU and llama.cpp's build beside the figure (stdout may be parsed)


def agree(args) -> None:
    import yaml

    from obliq.llm.backends import ask
    from obliq.llm.prompts import cut_words
    from obliq.synth.generate import sample_documents
    from obliq.synth.prompts import TaskSpec, load_stage_prompt, render_stage
    from obliq.tasks import load_task

    root = REPO / "runs" / "bench" / "llm"
    data = load_task(split_task(root, args.task))
    config = yaml.safe_load((REPO / "configs" / "synth" / f"{args.task}.yaml").read_text())
    spec = TaskSpec(**config["spec"])
    order, _ = sample_documents(data, args.n_docs, config["seed"])
    docs = [cut_words(data.doc_texts[i], config["generation"]["max_doc_words"])[0] for i in order]
    first, second = args.pair
    if first == second:
        raise SystemExit(f"--pair: two different backends, got {first} twice")
    backends = {name: backend(name, args.threads) for name in args.pair}
    stage_a, stage_b = load_stage_prompt("A"), load_stage_prompt("B", spec.lens)
    chats_a = [render_stage(stage_a, spec, d) for d in docs]
    replies = {n: [r.raw for r in ask(b, chats_a, 96, 0.0, 0)] for n, b in backends.items()}
    chats_b = [render_stage(stage_b, spec, d, description=a or "-") for d, a in zip(docs, replies[first])]
    for n, b in backends.items():
        replies[n] += [r.raw for r in ask(b, chats_b, 64, 0.0, 0)]
    tokenizer = backends[first].tokenizer
    equal, shared = 0, []
    for a, b in zip(replies[first], replies[second]):
        ta, tb = tokenizer(a)["input_ids"], tokenizer(b)["input_ids"]
        same = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        equal += a == b
        shared.append(same / max(len(ta), len(tb), 1))
    n = len(shared)
    print(
        f"{first} against {second}, greedy replies on the same {n} chats ({args.n_docs} {args.task} documents, "
        f"Stage A + Stage B): {equal} equal ({equal / n:.1%}), {n - equal} differ; mean share of reply tokens "
        f"before the first difference {sum(shared) / n:.1%}"
    )
    print(made_with(), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("speed", "agree"):
        p = sub.add_parser(name)
        p.add_argument("--task", default="stance-tweets")
        p.add_argument("--n_docs", type=int, default=24)
        p.add_argument("--threads", type=int, default=2, help="CPU threads of each backend")
        if name == "speed":
            p.add_argument("--backend", choices=BACKENDS, required=True)
        else:
            p.add_argument("--pair", nargs=2, choices=BACKENDS, default=["transformers", "llamacpp"])
    args = parser.parse_args()
    speed(args) if args.command == "speed" else agree(args)


if __name__ == "__main__":
    main()
