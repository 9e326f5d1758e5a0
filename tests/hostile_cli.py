"""The hostile-input pass of issue 24, as a new user meets obliq: bad but realistic inputs given to the
installed ``obliq`` / ``train.py`` commands in a scratch folder. Each class of input is tried once; it
is handled when the command refuses it in one ``error:`` line (exit 2, the file and cause named, no
traceback) and leaves its inputs as they were, or does the right thing.

    .venv/bin/python tests/hostile_cli.py [--keep DIR]

Prints one line per class and the count handled; exits 1 if any is not. Uses ../shared/data (or
$OBLIQ_DATA) and the models shipped in PyPI packages; no network. Takes a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hostile_round_53 import round_53

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", WANDB_MODE="offline")
RESULTS: list[tuple[str, str, bool, str]] = []


def run(*argv: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``obliq <argv>`` (or ``train.py``); a command that outlives ``timeout`` is killed and reported."""
    exe = [str(BIN / "obliq")] if argv[0] != "train.py" else [sys.executable, str(REPO / "train.py")]
    command = [*exe, *argv[argv[0] == "train.py" :]]
    try:
        return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, -9, "", f"killed after {timeout:.0f} s")


def read(path: Path) -> bytes:
    """A file's bytes, or b"" when a command did not write it."""
    return path.read_bytes() if path.is_file() else b""


def case(
    kind: str,
    name: str,
    done: subprocess.CompletedProcess | None,
    *needles: str,
    ok: bool = True,
    exit_code: int = 2,
    detail: str = "",
) -> None:
    """Record a class: refused in one line naming every needle (exit 2), or succeeded (exit_code 0)."""
    if done is None:
        RESULTS.append((kind, name, ok, detail[-300:]))
        return
    err = done.stderr
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    good = done.returncode == exit_code and "Traceback" not in err and ok
    if exit_code == 2:
        good = good and len(lines) == 1 and all(n in lines[0] for n in needles)
    else:
        good = good and all(n in err + done.stdout for n in needles)
    RESULTS.append((kind, name, good, (lines or err.strip().splitlines()[-1:] or [""])[0][:160]))


def checkpoint(path: Path, backbone: str, seed: int = 0) -> Path:
    code = f"""
import torch
from obliq.model.encoder import BiEncoder, LoraSettings
enc = BiEncoder({backbone!r}, lora=LoraSettings(r=4, alpha=8, dropout=0.0), query_max_length=32, passage_max_length=32)
g = torch.Generator().manual_seed({seed})
with torch.no_grad():
    for n, p in enc.named_parameters():
        if "lora_B" in n:
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
ckpt = {{"obliq": {{"encoder": enc.settings, "lora": vars(enc.lora), "loss": {{}}}},
        "state_dict": {{"encoder." + n: p.detach().clone() for n, p in enc.named_parameters() if p.requires_grad}},
        "hyper_parameters": {{}}, "global_step": 1, "epoch": 0}}
torch.save(ckpt, {str(path)!r})
"""
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True, capture_output=True)
    return path


def task(root: Path, n: int = 10) -> Path:
    root.mkdir(parents=True)
    docs = [{"_id": f"d{i}", "text": f"text number {i} about apples and pears"} for i in range(n)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "apples"}\n{"_id": "q2", "text": "pears"}\n')
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    w = args.keep or Path(tempfile.mkdtemp(prefix="obliq-hostile-"))
    w.mkdir(parents=True, exist_ok=True)
    data = Path(os.environ.get("OBLIQ_DATA", REPO.parent / "shared" / "data")) / "tasks"
    try:
        cases(w, data)
    except Exception as err:  # a version that fails a case so badly that the next cannot be set up
        RESULTS.append(("script", f"stopped: {type(err).__name__}: {err}"[:200], False, ""))
    handled = sum(ok for *_, ok, _ in RESULTS)
    for kind, name, ok, line in RESULTS:
        print(f"{'handled' if ok else 'NOT HANDLED':12} {kind:12} {name}" + ("" if ok else f"  [{line}]"))
    kinds = sorted({k for k, *_ in RESULTS})
    print(f"\n{handled} of {len(RESULTS)} classes handled ({', '.join(kinds)}); work folder {w}")
    if not args.keep:
        shutil.rmtree(w, ignore_errors=True)
    return 0 if handled == len(RESULTS) else 1


def cases(w: Path, data: Path) -> None:
    """Try every class (see the module notes), recording each in :data:`RESULTS`."""
    t = task(w / "t")
    corpus = (t / "corpus.jsonl").read_bytes()
    (t / "attributes.tsv").write_text("".join(f"d{i}\ta{i % 2}\n" for i in range(10)))
    common = ["--retrieval.top_k", "5", "--measures", "[NDCG@5]", "--latency_queries", "0"]
    spec = [
        "--spec.name",
        "t",
        "--spec.lens",
        "descriptive",
        "--spec.unit",
        "a text",
        "--spec.units",
        "texts",
        "--spec.attribute",
        "its topic",
        "--spec.attribute_short",
        "topic",
    ]

    # --- outputs claimed one way
    case(
        "outputs",
        "purity --out <task>/corpus.jsonl",
        run("distill", "purity", "--task", str(t), "--out", str(t / "corpus.jsonl"), cwd=w),
        "the input",
        ok=(t / "corpus.jsonl").read_bytes() == corpus,
    )
    run("distill", "graph", "--task", str(t), "--out", str(w / "g.json"), "--k", "2", cwd=w)
    case(
        "outputs",
        "graph --out <task>/qrels/test.tsv",
        run("distill", "graph", "--task", str(t), "--out", str(t / "qrels" / "test.tsv"), "--overwrite", "true", cwd=w),
        "the input",
    )
    case(
        "outputs",
        "pairs --control_out = the default report",
        run(
            "distill",
            "pairs",
            "--task",
            str(t),
            "--graph",
            str(w / "g.json"),
            "--out",
            str(w / "p.jsonl"),
            "--control_out",
            str(w / "p.report.json"),
            cwd=w,
        ),
        "are the same file",
    )
    run("distill", "pairs", "--task", str(t), "--graph", str(w / "g.json"), "--out", str(w / "knn.jsonl"), cwd=w)
    knn = read(w / "knn.jsonl")
    case(
        "outputs",
        "synth generate --out <kNN rows>",
        run("synth", "generate", "--task", str(t), "--out", str(w / "knn.jsonl"), *spec, cwd=w),
        "'distill pairs' output",
        ok=read(w / "knn.jsonl") == knn,
    )
    (w / "notes.txt").write_text("my notes\nthe last line")
    case(
        "outputs",
        "synth generate --out <a non-row file>",
        run("synth", "generate", "--task", str(t), "--out", str(w / "notes.txt"), *spec, cwd=w),
        "notes.txt:1",
        ok=(w / "notes.txt").read_text() == "my notes\nthe last line",
    )
    run("evaluate", "--model", "bm25", "--tasks", str(t), "--output", str(w / "ev"), *common, cwd=w)
    trec = read(w / "ev" / "t" / "run.trec")
    case(
        "outputs",
        "evaluate --overwrite, --model a run file inside the output",
        run(
            "evaluate",
            "--model",
            str(w / "ev" / "t" / "run.trec"),
            "--tasks",
            str(t),
            "--output",
            str(w / "ev"),
            "--overwrite",
            "true",
            *common,
            cwd=w,
        ),
        "holds the input",
        ok=read(w / "ev" / "t" / "run.trec") == trec,
    )
    case(
        "outputs",
        "evaluate --output <the task folder>",
        run(
            "evaluate", "--model", "bm25", "--tasks", str(t), "--output", str(t), "--overwrite", "true", *common, cwd=w
        ),
        "the input",
    )
    case(
        "outputs",
        "evaluate into earlier results without --overwrite",
        run("evaluate", "--model", "bm25", "--tasks", str(t), "--output", str(w / "ev"), *common, cwd=w),
        "--overwrite true",
    )
    other = task(w / "other")
    run(
        "evaluate",
        "--model",
        "bm25",
        "--tasks",
        str(other),
        "--output",
        str(w / "ev"),
        "--overwrite",
        "true",
        *common,
        cwd=w,
    )
    case(
        "outputs",
        "evaluate --overwrite leaves no earlier task folder",
        None,
        ok=sorted(p.parent.name for p in (w / "ev").glob("*/summary.json")) == ["other"],
    )
    (w / "mine").mkdir()
    (w / "mine" / "keep.txt").write_text("x")
    case(
        "outputs",
        "evaluate --overwrite into a folder obliq did not write",
        run(
            "evaluate",
            "--model",
            "bm25",
            "--tasks",
            str(t),
            "--output",
            str(w / "mine"),
            "--overwrite",
            "true",
            *common,
            cwd=w,
        ),
        "did not record",
        ok=(w / "mine" / "keep.txt").exists(),
    )
    rows = w / "rows.jsonl"
    rows.write_bytes(knn)
    case(
        "outputs",
        "negatives mine --out = --rows",
        run(
            "negatives", "mine", "--rows", str(rows), "--task", str(t), "--out", str(rows), "--overwrite", "true", cwd=w
        ),
        "is the input",
    )
    case(
        "outputs",
        "task split --out inside the task",
        run("task", "split", "--task", str(t), "--out", str(t / "split"), cwd=w),
        "the input",
    )
    case(
        "outputs",
        "rerank run --out = the dense run",
        run(
            "rerank",
            "run",
            "--task",
            str(t),
            "--run",
            str(w / "ev" / "t" / "run.trec") if (w / "ev" / "t").exists() else str(w / "x.trec"),
            "--out",
            str(t / "qrels" / "test.tsv"),
            "--method",
            "identity",
            "--overwrite",
            "true",
            cwd=w,
        ),
        "the input",
    )
    qs = (
        (REPO / "configs" / "quickstart.yaml")
        .read_text()
        .replace("work_dir: runs/quickstart ", f"work_dir: {w / 'qs'} ")
    )
    (w / "glob.yaml").write_text(qs.replace("path: ${work_dir}/rows/knn.jsonl", "path: ${work_dir}/rows/*.jsonl"))
    case(
        "outputs",
        "quickstart --recipe with a glob source",
        run("quickstart", "--recipe", str(w / "glob.yaml"), cwd=w),
        "a pattern",
        ok=not list(w.rglob("[*].jsonl")),
    )
    (w / "qs" / "rows").mkdir(parents=True, exist_ok=True)
    (w / "qs" / "rows" / "knn.jsonl").write_text('{"mine": 1}\n')
    (w / "own.yaml").write_text(qs)
    case(
        "outputs",
        "quickstart over a file it did not write",
        run("quickstart", "--recipe", str(w / "own.yaml"), cwd=w),
        "did not write",
        ok=(w / "qs" / "rows" / "knn.jsonl").read_text() == '{"mine": 1}\n',
    )
    claim = f"""
import multiprocessing as mp
from obliq.runs import run_folder
def go(b, q):
    b.wait(); q.put(str(run_folder({str(w / "runs")!r}, None)[0]))
if __name__ == "__main__":
    ctx = mp.get_context("spawn"); b, q = ctx.Barrier(4), ctx.Queue()
    ps = [ctx.Process(target=go, args=(b, q)) for _ in range(4)]
    [p.start() for p in ps]; got = sorted(q.get() for _ in ps); [p.join() for p in ps]
    print(len(set(got)))
"""
    (w / "claim.py").write_text(claim)  # spawned processes import their function from a file
    done = subprocess.run([sys.executable, str(w / "claim.py")], env=ENV, capture_output=True, text=True, timeout=300)
    case("runs", "four trainings claim one run_dir at once", None, ok=done.stdout.strip() == "4")

    # --- comparisons of unlike things
    (w / "a.trec").write_text("".join(f"q{i} Q0 d{i} 1 1.0 a\n" for i in (1, 2)))
    (w / "b.trec").write_text("q1 Q0 d1 1 1.0 b\n")
    case(
        "comparisons",
        "compare against a run missing queries",
        run(
            "compare",
            str(w / "a.trec"),
            str(w / "b.trec"),
            "--qrels",
            str(t / "qrels" / "test.tsv"),
            "--whole_ranking",
            "true",
            cwd=w,
        ),
        "has no result for 1 of the 2 judged queries",
    )
    done = run(
        "compare",
        str(w / "a.trec"),
        str(w / "b.trec"),
        "--qrels",
        str(t / "qrels" / "test.tsv"),
        "--missing",
        "drop",
        "--whole_ranking",
        "true",
        cwd=w,
    )
    case("comparisons", "compare --missing drop names what it compares", done, '"queries_compared": 1', exit_code=0)
    (w / "x.trec").write_text("z1 Q0 d1 1 1.0 x\n")
    case(
        "comparisons",
        "compare a run of another task",
        run("compare", str(w / "a.trec"), str(w / "x.trec"), "--qrels", str(t / "qrels" / "test.tsv"), cwd=w),
        "another task",
    )
    ck, ck2 = checkpoint(w / "m.ckpt", "minilm"), checkpoint(w / "o.ckpt", "minilm", seed=1)
    run("export", "--checkpoint", str(ck2), "--out", str(w / "theirs"), cwd=w)
    run(
        "evaluate",
        "--model",
        str(w / "theirs" / "adapter"),
        "--tasks",
        str(t),
        "--output",
        str(w / "ev-theirs"),
        *common,
        cwd=w,
    )
    case(
        "comparisons",
        "export --results of another model",
        run("export", "--checkpoint", str(ck), "--out", str(w / "card"), "--results", str(w / "ev-theirs"), cwd=w),
        "not an export of this checkpoint",
    )

    # --- inputs that change under a resume or a merge
    for shard, k in ((0, "2"), (1, "3")):
        run(
            "negatives",
            "mine",
            "--rows",
            str(rows),
            "--task",
            str(t),
            "--out",
            str(w / "neg.jsonl"),
            "--k",
            k,
            "--shard.index",
            str(shard),
            "--shard.count",
            "2",
            cwd=w,
        )
    case(
        "inputs",
        "negatives merge of shards with other settings",
        run(
            "negatives",
            "merge",
            "--rows",
            str(rows),
            "--shards",
            str(w / "neg.shard-0-of-2.jsonl"),
            str(w / "neg.shard-1-of-2.jsonl"),
            "--out",
            str(w / "neg.jsonl"),
            cwd=w,
        ),
        "not one run: k is 2",
    )
    (w / "h.tsv").write_text("q1\td1\t1.0\nq2\td2\t1\n")
    done = run("metrics", "--qrels", str(w / "h.tsv"), "--run", str(w / "a.trec"), "--measures", "NDCG@1", cwd=w)
    case("inputs", "headerless qrels whose first grade is 1.0", done, '"n_queries": 2', exit_code=0)
    dose = f"""
from obliq.data import Source, TrainingDataModule
try:
    TrainingDataModule([Source({str(rows)!r}, count=10**6)], batch_size=4, index_dir={str(w / "idx")!r}).setup()
except ValueError as err:
    print("refused:", err)
"""
    done = subprocess.run([sys.executable, "-c", dose], env=ENV, capture_output=True, text=True)
    case("inputs", "a dose above the rows available", None, ok="is more than its" in done.stdout)

    # --- configs
    (w / "dup.yaml").write_text(f"model: bm25\ntasks: [{t}]\noutput: {w / 'o'}\nmodel: minilm\n")
    case(
        "configs",
        "obliq --config with a key given twice",
        run("evaluate", "--config", str(w / "dup.yaml"), cwd=w),
        "key 'model' given twice",
    )
    (w / "duprecipe.yaml").write_text(qs + "seed_everything: 1\n")
    done = run("train.py", "fit", "--config", str(w / "duprecipe.yaml"), "--print_config", cwd=w)
    case(
        "configs",
        "train.py recipe with a key given twice",
        None,
        ok=done.returncode != 0 and "given twice" in done.stderr and "Traceback" not in done.stderr,
    )
    (w / "duppolicy.yaml").write_text("depth: 10\ndepth: 20\n")
    case(
        "configs",
        "rerank policy with a key given twice",
        run(
            "evaluate",
            "--model",
            "bm25",
            "--tasks",
            str(t),
            "--output",
            str(w / "o2"),
            "--rerank",
            str(w / "duppolicy.yaml"),
            *common,
            cwd=w,
        ),
        "key 'depth' given twice",
    )
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
    )
    (w / "bomb.yaml").write_text(bomb)
    start = time.perf_counter()
    case(
        "configs",
        "nested-alias bomb as obliq --config",
        run("evaluate", "--config", str(w / "bomb.yaml"), cwd=w, timeout=30),
        "nested-alias bomb",
    )
    case(
        "configs",
        "nested-alias bomb as a rerank policy",
        run(
            "evaluate",
            "--model",
            "bm25",
            "--tasks",
            str(t),
            "--output",
            str(w / "o3"),
            "--rerank",
            str(w / "bomb.yaml"),
            *common,
            cwd=w,
            timeout=30,
        ),
        "nested-alias bomb",
    )
    done = run("train.py", "fit", "--config", str(w / "bomb.yaml"), cwd=w, timeout=30)
    case(
        "configs",
        "nested-alias bomb as a recipe",
        None,
        ok=done.returncode != 0 and "nested-alias bomb" in done.stderr and time.perf_counter() - start < 120,
    )
    (w / "evil_cb.py").write_text("import pathlib\npathlib.Path('RAN').write_text('x')\nclass Evil: ...\n")
    (w / "evil.yaml").write_text("trainer:\n  callbacks:\n    - class_path: evil_cb.Evil\n")
    done = run(
        "train.py", "fit", "--config", str(w / "own.yaml"), "--config", str(w / "evil.yaml"), "--print_config", cwd=w
    )
    case(
        "configs",
        "recipe class_path naming a .py file of the project tree",
        None,
        ok=done.returncode != 0 and "is not allowed" in done.stderr and not (w / "RAN").exists(),
    )
    (w / "rec.yaml").write_text("a: &a [1, *a]\n")
    case("configs", "a recursive alias", run("evaluate", "--config", str(w / "rec.yaml"), cwd=w), "recursive")

    # --- errors that name the file and the cause
    pick = w / "pickled-model"
    code = f"""
import shutil, torch, collections
from obliq.aliases import minilm_dir
shutil.copytree(minilm_dir(), {str(pick)!r}); (__import__("pathlib").Path({str(pick)!r}) / "model.safetensors").unlink()
class Evil:
    def __reduce__(self): return (print, ("code ran",))
sd = collections.OrderedDict(x=torch.zeros(1)); sd["evil"] = Evil()
torch.save(sd, {str(pick / "pytorch_model.bin")!r})
"""
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True)
    done = run("evaluate", "--model", str(pick), "--tasks", str(t), "--output", str(w / "o4"), *common, cwd=w)
    case(
        "errors",
        "a model folder with a pickled pytorch_model.bin",
        done,
        "pickled-model",
        "holds more than weights",
        ok="weights_only=False" not in done.stderr and "code ran" not in done.stdout,
    )
    kern = f"""
import torch
c = torch.load({str(ck)!r}, weights_only=True); c["obliq"]["encoder"]["attn_implementation"] = "kernels-community/x"
torch.save(c, {str(w / "kernel.ckpt")!r})
"""
    subprocess.run([sys.executable, "-c", kern], env=ENV, check=True)
    case(
        "errors",
        "a checkpoint asking for an attention kernel",
        run("export", "--checkpoint", str(w / "kernel.ckpt"), "--out", str(w / "e1"), cwd=w),
        "kernel.ckpt",
        "a file cannot",
    )
    base = w / "local-base"
    code = f"import shutil; from obliq.aliases import minilm_dir; shutil.copytree(minilm_dir(), {str(base)!r})"
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True)
    local = checkpoint(w / "l.ckpt", str(base))
    run("export", "--checkpoint", str(local), "--out", str(w / "lexp"), cwd=w)
    card = read(w / "lexp" / "adapter" / "README.md").decode()
    case(
        "errors",
        "card of a local base: no path, no base_model",
        None,
        ok=str(w) not in card and "base_model" not in card,
    )
    shutil.rmtree(base)
    case(
        "errors",
        "an adapter on a local base loaded elsewhere",
        run(
            "evaluate",
            "--model",
            str(w / "lexp" / "adapter"),
            "--tasks",
            str(t),
            "--output",
            str(w / "o5"),
            *common,
            cwd=w,
        ),
        "machine it was trained on",
    )
    case(
        "errors",
        "export --checkpoint <a JSONL file>",
        run("export", "--checkpoint", str(rows), "--out", str(w / "e2"), cwd=w),
        "rows.jsonl: not a readable checkpoint",
    )
    (w / "probe.txt").write_text("\n")
    case(
        "errors",
        "export with an empty --probe_file",
        run(
            "export",
            "--checkpoint",
            str(ck),
            "--out",
            str(w / "e3"),
            "--merge",
            "true",
            "--probe_file",
            str(w / "probe.txt"),
            cwd=w,
        ),
        "no probe text",
        ok=not (w / "e3" / "merged").exists(),
    )
    case(
        "errors",
        "export --min_cosine 1.5",
        run("export", "--checkpoint", str(ck), "--out", str(w / "e4"), "--merge", "true", "--min_cosine", "1.5", cwd=w),
        "min_cosine",
    )
    case(
        "errors",
        "compare --resamples 0",
        run(
            "compare",
            str(w / "a.trec"),
            str(w / "a.trec"),
            "--qrels",
            str(t / "qrels" / "test.tsv"),
            "--resamples",
            "0",
            cwd=w,
        ),
        "resamples",
    )
    (w / "empty").mkdir()
    case(
        "errors",
        "a task folder without corpus.jsonl",
        run("evaluate", "--model", "bm25", "--tasks", str(w / "empty"), "--output", str(w / "o6"), cwd=w),
        "no corpus.jsonl",
    )
    case(
        "errors",
        "task split --dev_fraction that rounds to zero",
        run(
            "task",
            "split",
            "--task",
            str(data / "math-theoremqa"),
            "--out",
            str(w / "sp"),
            "--dev_fraction",
            "0.001",
            cwd=w,
        ),
        "rounds to 0",
    )
    case("errors", "obliq fit (a training subcommand)", run("fit", "--help", cwd=w), "obliq train fit")
    done = run("train", "fit", "--bad", cwd=w)
    case("errors", "the CLI tip names a command that exists", None, ok="run: obliq train fit --help" in done.stderr)
    emb = f"""
import numpy as np, logging
logging.basicConfig()
from obliq.search.retrieval import RetrievalSettings, make_retriever
from obliq.tasks import load_task
t = load_task({str(t)!r}); s = RetrievalSettings(top_k=5, cache_dir={str(w / "cache")!r})
a = make_retriever("minilm", s)(t).run
[f] = __import__("pathlib").Path({str(w / "cache")!r}).glob("*/shard-0-of-1.npy"); f.write_bytes(b"garbage")
b = make_retriever("minilm", s)(t)
print(b.corpus_cache, b.run == a)
"""
    done = subprocess.run([sys.executable, "-c", emb], env=ENV, capture_output=True, text=True)
    case(
        "errors",
        "a corrupt embedding cache",
        None,
        ok=done.stdout.strip().splitlines()[-1:] == ["miss True"] and "unusable cached" in done.stderr,
        detail=done.stdout + done.stderr,
    )
    round_four(w, t, common, qs, ck)
    round_five(w, t, common)
    round_53(w, t, common, case, run)  # issue 53 §3: tests/hostile_round_53.py


def round_four(w: Path, t: Path, common: list[str], qs: str, ck: Path) -> None:
    """The classes of issue 32 (trust, round four), each tried once like the others."""
    (w / "r4" / "qs" / "rows").mkdir(parents=True)
    (w / "r4" / "train.yaml").write_text(qs.replace(f"work_dir: {w / 'qs'} ", f"work_dir: {w / 'r4' / 'qs'} "))
    shutil.copy(w / "knn.jsonl", w / "r4" / "qs" / "rows" / "knn.jsonl")  # its data exists: only max_steps is wrong
    case(
        "settings",
        "train.py fit --trainer.max_steps -5",
        run("train.py", "fit", "--config", str(w / "r4" / "train.yaml"), "--trainer.max_steps=-5", cwd=w),
        "max_steps",
        ok=not list((w / "r4" / "qs").rglob("version_*")),
    )
    case(
        "settings",
        "search --retrieval.index IVF64,Flat on a 10-document task (C42)",
        run(
            "search",
            "--model",
            "minilm",
            "--tasks",
            str(t),
            "--output",
            str(w / "r4" / "s"),
            "--retrieval.index",
            "IVF64,Flat",
            cwd=w,
        ),
        "64 inverted lists",
        "10 documents",
        ok=not (w / "r4" / "s").exists(),
    )
    case(
        "settings",
        "evaluate --retrieval.bm25_b 1.5",
        run(
            "evaluate",
            "--model",
            "bm25",
            "--tasks",
            str(t),
            "--output",
            str(w / "r4" / "b"),
            "--retrieval.bm25_b",
            "1.5",
            *common,
            cwd=w,
        ),
        "retrieval.bm25_b",
    )
    case(
        "settings",
        "distill graph --max_length 0",
        run(
            "distill",
            "graph",
            "--task",
            str(t),
            "--out",
            str(w / "r4" / "g.json"),
            "--teacher",
            "minilm",
            "--max_length",
            "0",
            cwd=w,
        ),
        "max_length",
    )
    bad = task(w / "r4" / "noheader")
    (bad / "qrels" / "test.tsv").write_text("q1\td1\tyes\nq2\td2\t1\n")
    case(
        "inputs",
        "a headerless qrels file whose first grade is no number",
        run("evaluate", "--model", "bm25", "--tasks", str(bad), "--output", str(w / "r4" / "h"), *common, cwd=w),
        "test.tsv:1",
        "score",
    )
    (w / "r4" / "dotted.yaml").write_text("trainer:\n  max_steps: 10\ntrainer.max_steps: 5\n")
    case(
        "configs",
        "the second of two stacked configs sets a key dotted and nested",
        run(
            "train.py",
            "fit",
            "--config",
            str(w / "r4" / "train.yaml"),
            "--config",
            str(w / "r4" / "dotted.yaml"),
            "--print_config",
            cwd=w,
        ),
        "dotted.yaml:",
    )
    long = task(w / "r4" / "long")
    (long / "task.json").write_text(json.dumps({"name": "x" * 300 + "|\n"}))
    done = run("evaluate", "--model", "bm25", "--tasks", str(long), "--output", str(w / "r4" / "l"), *common, cwd=w)
    table = read(w / "r4" / "l" / "results.md").decode()
    case(
        "names",
        "a 300-character task name with | and a newline",
        done,
        exit_code=0,
        ok="\\|" in table and len(table.splitlines()) > 3,
    )
    export = run("export", "--checkpoint", str(ck), "--out", str(w / "r4" / "e"), cwd=w)
    import torch

    from obliq.model.checkpoint import read_checkpoint

    state = read_checkpoint(ck)
    name = next(n for n in state["state_dict"] if "lora_B" in n)
    state["state_dict"][name] = state["state_dict"][name][:, :1]
    torch.save(state, w / "r4" / "resized.ckpt")
    case(
        "errors",
        "export of a checkpoint with a resized weight",
        run("export", "--checkpoint", str(w / "r4" / "resized.ckpt"), "--out", str(w / "r4" / "e2"), cwd=w),
        "has shape",
        ok=export.returncode == 0 and not (w / "r4" / "e2").exists(),
    )


def round_five(w: Path, t: Path, common: list[str]) -> None:
    """The classes of issue 49 (trust, round five), each tried once like the others."""
    import unicodedata

    r = w / "r5"
    r.mkdir()
    # C50: a corpus in another Unicode form (NFD, ligatures) is found by BM25, not scored 0
    u = r / "unicode"
    (u / "qrels").mkdir(parents=True)
    docs = {"d1": unicodedata.normalize("NFD", "café crème au lait"), "d2": "the ﬁnancial ﬁrm", "d3": "plain text"}
    (u / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items()))
    (u / "queries.jsonl").write_text('{"_id": "q1", "text": "café crème"}\n{"_id": "q2", "text": "financial firm"}\n')
    (u / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    done = run("evaluate", "--model", "bm25", "--tasks", str(u), "--output", str(r / "u"), *common, cwd=w)
    summary = json.loads(read(next((r / "u").glob("*/summary.json"), r / "none")) or b"{}")
    case("numbers", "BM25 over NFD and ligature text", done, exit_code=0,
         ok=(summary.get("metrics") or {}).get("NDCG@5") == 1.0)  # fmt: skip
    # a config that is not YAML, qrels not in UTF-8, a cut of 0, unbounded resamples, a cut deeper than the run
    (r / "bad.yaml").write_bytes(b"\x00\x01binary\xff")
    case("configs", "a --config that is not YAML", run("evaluate", "--config", str(r / "bad.yaml"), cwd=w), "bad.yaml")
    (r / "latin1.tsv").write_bytes("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\tcaf\xe9\t1\n".encode("latin-1"))
    (r / "run.trec").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d2 2 1.0 x\nq2 Q0 d2 1 2.0 x\n")
    case("inputs", "qrels in Latin-1", run("metrics", "--qrels", str(r / "latin1.tsv"), "--run", str(r / "run.trec"),
         cwd=w), "latin1.tsv:3", "not UTF-8")  # fmt: skip
    qrels = str(t / "qrels" / "test.tsv")
    case("numbers", "a measure cut at 0", run("metrics", "--qrels", qrels, "--run", str(r / "run.trec"),
         "--measures", "NDCG@0", cwd=w), "NDCG@0")  # fmt: skip
    case("numbers", "NDCG@10 of a run 2 deep", run("metrics", "--qrels", qrels, "--run", str(r / "run.trec"),
         "--measures", "NDCG@10", cwd=w), "NDCG@10")  # fmt: skip
    case("resources", "compare --resamples 10^12", run("compare", str(r / "run.trec"), str(r / "run.trec"),
         "--qrels", qrels, "--resamples", "1000000000000", cwd=w), "resamples")  # fmt: skip
    # models: an empty weights file, a hub id typo offline, a file of the wrong kind
    from obliq.aliases import minilm_dir

    empty = r / "empty-model"
    shutil.copytree(minilm_dir(), empty)
    (empty / "model.safetensors").write_bytes(b"")
    case("models", "an empty model.safetensors", run("evaluate", "--model", str(empty), "--tasks", str(t),
         "--output", str(r / "e1"), *common, cwd=w), "model.safetensors")  # fmt: skip
    case("models", "a hub id typo offline", run("evaluate", "--model", "sentence-transformers/all-MiniLM-L6-v3",
         "--tasks", str(t), "--output", str(r / "e2"), *common, cwd=w), "not in the local cache")  # fmt: skip
    case("models", "a corpus file as --model", run("evaluate", "--model", str(t / "corpus.jsonl"), "--tasks", str(t),
         "--output", str(r / "e3"), *common, cwd=w), "corpus.jsonl")  # fmt: skip
    # a run file scored against a corpus that lost a document it ranks
    shrunk = r / "shrunk"
    shutil.copytree(t, shrunk)
    kept = [line for line in (t / "corpus.jsonl").read_text().splitlines() if '"d2"' not in line]
    (shrunk / "corpus.jsonl").write_text("\n".join(kept) + "\n")
    (shrunk / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    case("numbers", "a run ranking a document the corpus lost", run("evaluate", "--model", str(r / "run.trec"),
         "--tasks", str(shrunk), "--output", str(r / "e4"), *common, cwd=w), "d2")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
