"""What a hostile new user found (issue 24 §6): bad but realistic inputs across the commands, each
refused or handled with the right value — outputs claimed one way, comparisons of unlike things,
inputs that change under a resume or a merge, configs, and one-line errors naming file and cause."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from support import cli_fails as _fails
from support import make_task, write_rows

from obliq.cli import main as obliq_main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def task(tmp_path) -> Path:
    docs = [{"_id": f"d{i}", "title": "", "text": f"text number {i} about apples and pears"} for i in range(10)]
    docs += [{"_id": "x1", "title": "", "text": "Bread with a long cold fermentation."}]
    return make_task(
        tmp_path / "t",
        docs,
        [{"_id": "q1", "text": "apples"}, {"_id": "q2", "text": "bread"}],
        [
            ("q1", "d1", 1),
            ("q2", "x1", 1),
        ],
    )


# --- outputs claimed one way -----------------------------------------------------------------------


def test_no_command_writes_into_a_task_or_over_its_inputs(task, tmp_path, capsys):
    corpus = (task / "corpus.jsonl").read_bytes()
    (task / "attributes.tsv").write_text("".join(f"d{i}\ta{i % 2}\n" for i in range(10)) + "x1\ta0\n")
    _fails(["distill", "purity", "--task", str(task), "--out", str(task / "corpus.jsonl")], capsys, "inside the input")
    assert (task / "corpus.jsonl").read_bytes() == corpus
    obliq_main(["distill", "graph", "--task", str(task), "--out", str(tmp_path / "g.json"), "--k", "2"])
    capsys.readouterr()
    # --control_out named like the default report (<out stem>.report.json): one would overwrite the other
    _fails(
        [
            "distill",
            "pairs",
            "--task",
            str(task),
            "--graph",
            str(tmp_path / "g.json"),
            "--out",
            str(tmp_path / "p.jsonl"),
            "--control_out",
            str(tmp_path / "p.report.json"),
        ],
        capsys,
        "are the same file",
    )
    assert not (tmp_path / "p.jsonl").exists()
    # evaluate --overwrite whose --model is a run file inside its output: the input is never rewritten
    out = tmp_path / "eval"
    obliq_main(
        [
            "evaluate",
            "--model",
            "bm25",
            "--tasks",
            str(task),
            "--output",
            str(out),
            "--retrieval.top_k",
            "5",
            "--measures",
            "[NDCG@5]",
            "--latency_queries",
            "0",
        ]
    )
    capsys.readouterr()
    run = out / "t" / "run.trec"
    before = run.read_bytes()
    _fails(
        [
            "evaluate",
            "--model",
            str(run),
            "--tasks",
            str(task),
            "--output",
            str(out),
            "--overwrite",
            "true",
            "--measures",
            "[NDCG@5]",
        ],
        capsys,
        "holds the input",
        "run.trec",
    )
    assert run.read_bytes() == before


def test_synth_generate_never_appends_to_or_cuts_another_commands_file(task, tmp_path, capsys):
    obliq_main(["distill", "graph", "--task", str(task), "--out", str(tmp_path / "g.json"), "--k", "2"])
    obliq_main(
        [
            "distill",
            "pairs",
            "--task",
            str(task),
            "--graph",
            str(tmp_path / "g.json"),
            "--out",
            str(tmp_path / "knn.jsonl"),
        ]
    )
    capsys.readouterr()
    knn = (tmp_path / "knn.jsonl").read_bytes()
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
    _fails(
        ["synth", "generate", "--task", str(task), "--out", str(tmp_path / "knn.jsonl"), *spec],
        capsys,
        "'distill pairs' output",
    )
    assert (tmp_path / "knn.jsonl").read_bytes() == knn
    copy = tmp_path / "copy.jsonl"  # the same rows with no record: refused by their content
    copy.write_bytes(knn)
    _fails(["synth", "generate", "--task", str(task), "--out", str(copy), *spec], capsys, "'knn' row", "not synthetic")
    assert copy.read_bytes() == knn
    notes = tmp_path / "notes.txt"  # a file of another kind, last line without its newline
    notes.write_text("my notes\nthe last line")
    _fails(["synth", "generate", "--task", str(task), "--out", str(notes), *spec], capsys, "notes.txt:1")
    assert notes.read_text() == "my notes\nthe last line"
    lone = tmp_path / "lone.txt"
    lone.write_text("only one line")
    _fails(["synth", "generate", "--task", str(task), "--out", str(lone), *spec], capsys, "refusing to cut it")
    assert lone.read_text() == "only one line"


def test_the_quickstart_never_writes_over_its_recipes_sources(tmp_path, capsys):
    text = (
        (REPO / "configs" / "quickstart.yaml")
        .read_text()
        .replace("work_dir: runs/quickstart ", f"work_dir: {tmp_path} ")
    )
    glob = tmp_path / "glob.yaml"
    glob.write_text(text.replace("path: ${work_dir}/rows/knn.jsonl", "path: ${work_dir}/rows/*.jsonl"))
    _fails(["quickstart", "--recipe", str(glob)], capsys, "a pattern")
    assert not list(tmp_path.rglob("\\*.jsonl")) and not (tmp_path / "rows").exists()
    mine = tmp_path / "rows" / "knn.jsonl"  # a file the user wrote where the recipe's knn source reads
    mine.parent.mkdir()
    mine.write_text('{"mine": true}\n')
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    _fails(["quickstart", "--recipe", str(recipe)], capsys, "did not write", "knn.jsonl")
    assert mine.read_text() == '{"mine": true}\n' and not (tmp_path / "tasks").exists()
    outside = tmp_path / "outside.yaml"
    outside.write_text(text.replace("path: ${work_dir}/rows/knn.jsonl", f"path: {tmp_path.parent}/elsewhere.jsonl"))
    _fails(["quickstart", "--recipe", str(outside)], capsys, "outside the recipe's work_dir")


def test_evaluate_overwrite_replaces_the_whole_earlier_result(task, tmp_path, capsys):
    other = make_task(
        tmp_path / "other", [{"_id": "z", "text": "zebra"}], [{"_id": "q", "text": "zebra"}], [("q", "z", 1)]
    )
    out = tmp_path / "eval"
    common = ["--model", "bm25", "--output", str(out), "--measures", "[NDCG@1]", "--latency_queries", "0"]
    obliq_main(["evaluate", "--tasks", str(task), str(other), *common])
    obliq_main(["evaluate", "--tasks", str(other), *common, "--overwrite", "true"])
    capsys.readouterr()
    assert sorted(p.parent.name for p in out.glob("*/summary.json")) == ["other"]  # t's folder went with it
    folder = tmp_path / "mine"  # a folder obliq did not write is never emptied, even when asked
    folder.mkdir()
    (folder / "keep.txt").write_text("x")
    _fails(
        ["evaluate", "--tasks", str(other), *common[:3], str(folder), *common[4:], "--overwrite", "true"],
        capsys,
        "did not record",
    )
    assert (folder / "keep.txt").read_text() == "x"
    # the record beside a folder is not enough: a user who deleted obliq's folder and made a new one of
    # that name, or a failed command that left a record, never has the new folder emptied
    shutil.rmtree(out)
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert (tmp_path / ".eval.obliq").is_file()  # evaluate's record of the folder it had made
    _fails(["evaluate", "--tasks", str(other), *common, "--overwrite", "true"], capsys, "did not record")
    assert (out / "thesis.tex").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh = tmp_path / "fresh"
    with pytest.raises(SystemExit):  # a task folder without corpus.jsonl: refused in one line, before any claim
        obliq_main(["evaluate", "--tasks", str(empty), *common[:3], str(fresh), *common[4:]])
    capsys.readouterr()
    assert not fresh.exists() and not (tmp_path / ".fresh.obliq").exists()
    notes = tmp_path / "notes.txt"  # a user's file given as the output folder: named, kept
    notes.write_text("mine")
    _fails(
        ["evaluate", "--tasks", str(other), *common[:3], str(notes), *common[4:], "--overwrite", "true"],
        capsys,
        "is a file",
    )
    assert notes.read_text() == "mine" and not (tmp_path / ".notes.txt.obliq").exists()


# --- inputs that change under a merge; qrels ------------------------------------------------------


def test_negatives_merge_refuses_shards_of_other_settings_or_another_task(task, tmp_path, capsys):
    from obliq.commands.negatives import merge, mine
    from obliq.shards import Shard

    rows = write_rows(
        tmp_path / "rows.jsonl",
        [
            {
                "id": f"r{i}",
                "task": "t",
                "source": "public",
                "query": "apples pears",
                "positive": {"id": f"d{i}", "text": f"text number {i} about apples and pears"},
                "negatives": [],
            }
            for i in range(4)
        ],
    )
    mine(rows, task, tmp_path / "m.jsonl", k=2, shard=Shard(0, 2))
    mine(rows, task, tmp_path / "m.jsonl", k=3, shard=Shard(1, 2))  # other settings
    shards = [tmp_path / "m.shard-0-of-2.jsonl", tmp_path / "m.shard-1-of-2.jsonl"]
    with pytest.raises(ValueError, match="not one run: k is 2 in .* but 3 in"):
        merge(rows, shards, tmp_path / "merged.jsonl")
    changed = shutil.copytree(task, tmp_path / "t2")
    with (changed / "corpus.jsonl").open("a") as f:
        f.write(json.dumps({"_id": "d99", "text": "apples apples pears"}) + "\n")
    mine(rows, changed, tmp_path / "m.jsonl", k=2, shard=Shard(1, 2), overwrite=True)  # another corpus
    with pytest.raises(ValueError, match="not one run: corpus_sha256"):
        merge(rows, shards, tmp_path / "merged.jsonl")
    mine(rows, task, tmp_path / "m.jsonl", k=2, shard=Shard(1, 2), overwrite=True)
    assert merge(rows, shards, tmp_path / "merged.jsonl")["rows"] == 4


def test_a_headerless_qrels_file_keeps_a_first_grade_written_1_0(tmp_path):
    from obliq.eval.metrics import evaluate_run
    from obliq.tasks import read_qrels

    path = tmp_path / "q.tsv"
    path.write_text("q1\td1\t1.0\nq1\td2\t2.0\nq2\td3\t1\n")
    assert read_qrels(path) == {"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 1}}
    with_header = tmp_path / "h.tsv"
    with_header.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1.0\n")
    assert read_qrels(with_header) == {"q1": {"d1": 1}}
    (tmp_path / "bad.tsv").write_text("q1\td1\t0.5\n")
    with pytest.raises(ValueError, match="bad.tsv:1: field 'score' must be an integer, got '0.5'"):
        read_qrels(tmp_path / "bad.tsv")
    # by hand: q1 ranks d1 then d2: DCG = 1 + 2/log2(3); ideal = 2 + 1/log2(3)
    got = evaluate_run(read_qrels(path), {"q1": {"d1": 2.0, "d2": 1.0}}, ["NDCG@10"], ["q1"]).per_query["q1"]
    assert got["NDCG@10"] == pytest.approx((1 + 2 / np.log2(3)) / (2 + 1 / np.log2(3)))


# --- configs -------------------------------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
)


def test_a_key_given_twice_is_an_error_everywhere_a_config_is_read(task, tmp_path, capsys):
    from obliq.commands.train import train_config
    from obliq.recipes import recipe_config
    from obliq.rerank.config import load_policy

    config = tmp_path / "c.yaml"
    config.write_text(f"model: bm25\ntasks: [{task}]\noutput: {tmp_path / 'o'}\nmodel: minilm\n")
    _fails(["evaluate", "--config", str(config)], capsys, "key 'model' given twice")
    recipe = tmp_path / "r.yaml"
    recipe.write_text((REPO / "configs" / "quickstart.yaml").read_text() + "seed_everything: 1\n")
    with pytest.raises(ValueError, match="r.yaml:[0-9]+: key 'seed_everything' given twice"):
        recipe_config(recipe)
    with pytest.raises((SystemExit, ValueError)):
        train_config(["fit", "--config", str(recipe), f"--work_dir={tmp_path}"])
    capsys.readouterr()
    policy = tmp_path / "p.yaml"
    policy.write_text("depth: 10\ndepth: 20\n")
    with pytest.raises(ValueError, match="p.yaml:2: key 'depth' given twice"):
        load_policy(policy)
    # issue 32 §3: a dotted key beside the nested one it names, and the second of two stacked configs named
    dotted = tmp_path / "d.yaml"
    dotted.write_text("trainer:\n  max_steps: 10\ntrainer.max_steps: 5\n")
    with pytest.raises(ValueError, match=r"d.yaml:[0-9]+: 'trainer.max_steps' is also set on line [0-9]"):
        recipe_config(dotted)
    good = tmp_path / "g.yaml"
    good.write_text("trainer:\n  max_steps: 10\n")
    _fails(["train", "fit", "--config", str(good), "--config", str(dotted)], capsys, f"{dotted}:")
    _fails(["train", "fit", "--config", str(good), "--config", str(recipe)], capsys, f"{recipe}:")


def test_a_nested_alias_bomb_is_refused_quickly_everywhere(task, tmp_path, capsys):
    from obliq.recipes import recipe_config
    from obliq.rerank.config import load_policy

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    start = time.perf_counter()
    _fails(["evaluate", "--config", str(bomb)], capsys, "nested-alias bomb")
    with pytest.raises(ValueError, match="nested-alias bomb"):
        recipe_config(bomb)
    with pytest.raises(ValueError, match="nested-alias bomb"):
        load_policy(bomb)
    with pytest.raises(SystemExit):
        obliq_main(["train", "fit", "--config", str(bomb)])
    assert "nested-alias bomb" in capsys.readouterr().err
    assert time.perf_counter() - start < 20  # before: 5 GB in 150 s, then killed


def test_a_recipe_cannot_import_a_module_outside_the_allowed_paths(tmp_path, capsys, monkeypatch):
    """jsonargparse imports a class_path's module before checking its type: a recipe may name only
    classes under obliq.recipes.RECIPE_IMPORTS; a module of the project tree is never imported."""
    from obliq.commands.train import train_config

    (tmp_path / "evil_callbacks.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('x')\nclass Evil: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer:\n  callbacks:\n    - class_path: evil_callbacks.Evil\n")
    with pytest.raises(SystemExit):
        train_config(
            [
                "fit",
                "--config",
                str(REPO / "configs" / "quickstart.yaml"),
                "--config",
                str(recipe),
                f"--work_dir={tmp_path}",
            ]
        )
    assert "is not allowed" in capsys.readouterr().err
    assert not (tmp_path / "RAN").exists()
    monkeypatch.setenv("OBLIQ_RECIPE_IMPORTS", "evil_callbacks")  # a module the user trusts, named by them
    with pytest.raises(SystemExit):  # imported now (it is no Callback, so still refused)
        train_config(
            [
                "fit",
                "--config",
                str(REPO / "configs" / "quickstart.yaml"),
                "--config",
                str(recipe),
                f"--work_dir={tmp_path}",
            ]
        )
    assert (tmp_path / "RAN").exists()


# --- one-line errors naming the file and the cause -------------------------------------------------


def test_bad_models_checkpoints_and_caches_are_named_in_one_line(task, tmp_path, capsys, minilm_path):
    import collections

    import torch

    from obliq.search.retrieval import make_retriever
    from obliq.search.settings import RetrievalSettings
    from obliq.tasks import load_task

    pickled = tmp_path / "pickled-model"  # a model folder whose weights are a pickle with code in it
    shutil.copytree(minilm_path, pickled)
    (pickled / "model.safetensors").unlink()

    class Evil:
        def __reduce__(self):
            return (print, ("code ran",))

    weights = collections.OrderedDict(x=torch.zeros(1))
    weights["evil"] = Evil()
    torch.save(weights, pickled / "pytorch_model.bin")
    base = ["--tasks", str(task), "--retrieval.top_k", "5", "--measures", "[NDCG@5]", "--latency_queries", "0"]
    for kind in ("auto", "obliq"):
        line = _fails(
            [
                "evaluate",
                "--model",
                str(pickled),
                "--retrieval.encoder",
                kind,
                "--output",
                str(tmp_path / f"o-{kind}"),
                *base,
            ],
            capsys,
            "pickled-model",
            "holds more than weights",
            "'print'",
        )
        assert "weights_only=False" not in line

    from support import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "m.ckpt", "minilm", length=32)
    crafted = torch.load(ckpt, weights_only=True)
    crafted["obliq"]["encoder"]["attn_implementation"] = "kernels-community/flash-attn"
    torch.save(crafted, tmp_path / "kernel.ckpt")
    _fails(
        ["export", "--checkpoint", str(tmp_path / "kernel.ckpt"), "--out", str(tmp_path / "e1")],
        capsys,
        "kernel.ckpt",
        "attention kernel 'kernels-community/flash-attn'",
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "r1"}\n')
    _fails(
        ["export", "--checkpoint", str(rows), "--out", str(tmp_path / "e2")],
        capsys,
        "rows.jsonl: not a readable checkpoint",
    )

    # an adapter trained on a local base, loaded where that base is not
    local = tmp_path / "base-model"
    shutil.copytree(minilm_path, local)
    adapter_ckpt = make_checkpoint(tmp_path / "a.ckpt", str(local), length=32)
    obliq_main(["export", "--checkpoint", str(adapter_ckpt), "--out", str(tmp_path / "exp")])
    capsys.readouterr()
    shutil.rmtree(local)
    _fails(
        ["evaluate", "--model", str(tmp_path / "exp" / "adapter"), "--output", str(tmp_path / "o3"), *base],
        capsys,
        "obliq_encoder.json",
        "a folder of the machine it was trained on",
    )

    # a corrupt embedding cache is named and rebuilt; the numbers are those without a cache
    loaded = load_task(task)
    settings = RetrievalSettings(top_k=5, cache_dir=tmp_path / "cache")
    fresh = make_retriever(minilm_path, RetrievalSettings(top_k=5, cache=False))(loaded).run
    make_retriever(minilm_path, settings)(loaded)
    [cache] = (tmp_path / "cache").glob("*/shard-0-of-1.npy")  # the store's one shard (issue 26)
    for corrupt in (b"", b"not numpy", None):
        if corrupt is None:
            np.savez(cache.with_suffix(".tmp.npz"), a=np.zeros(3))
            cache.write_bytes(cache.with_suffix(".tmp.npz").read_bytes())
        else:
            cache.write_bytes(corrupt)
        got = make_retriever(minilm_path, settings)(loaded)
        assert got.corpus_cache == "miss"
        # the same rankings; scores equal to float32 noise (1e-7 apart between the two encodings)
        assert {q: list(r) for q, r in got.run.items()} == {q: list(r) for q, r in fresh.items()}
        for q, ranking in fresh.items():
            assert np.allclose([got.run[q][d] for d in ranking], list(ranking.values()), rtol=0, atol=1e-6)
        assert make_retriever(minilm_path, settings)(loaded).corpus_cache == "hit"


def test_cli_mistakes_are_named_in_one_line(task, tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(
        ["evaluate", "--model", "bm25", "--tasks", str(empty), "--output", str(tmp_path / "o")],
        capsys,
        "no corpus.jsonl",
    )
    _fails(
        ["task", "split", "--task", str(task), "--out", str(tmp_path / "s"), "--dev_fraction", "0.1"],
        capsys,
        "rounds to 0 development queries",
    )
    (tmp_path / "r.trec").write_text("q1 Q0 d1 1 1.0 x\n")
    _fails(
        [
            "compare",
            str(tmp_path / "r.trec"),
            str(tmp_path / "r.trec"),
            "--qrels",
            str(task / "qrels" / "test.tsv"),
            "--resamples",
            "0",
        ],
        capsys,
        "resamples: must be an integer >= 1",
    )
    _fails(["fit", "--config", "x.yaml"], capsys, "obliq train fit")
    monkeypatch.setattr("sys.argv", ["/venv/bin/obliq", "train", "fit", "--bad"])  # as the console script runs
    with pytest.raises(SystemExit):
        obliq_main(["train", "fit", "--bad"])
    assert "run: obliq train fit --help" in capsys.readouterr().err  # before: `obliq fit --help`, no such command
