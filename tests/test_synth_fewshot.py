"""Few-shot Stage B and best-of-n samples (issue 23), on real split tasks: the examples are the
development side's real (document, query) pairs, read back from the files the split wrote, never a test
query, never a query relevant to the source; copies of an example are rejected; samples have their own
ids and seeds, resume, merge and report their cost."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import re
from pathlib import Path

import pytest
from test_synth_generate import GOOD_B, SPEC, ScriptedBackend

from obliq.commands.task import split_task
from obliq.synth.fewshot import ExamplePool, FewShotConfig
from obliq.synth.generate import GenerationConfig, sample_documents, synthesize
from obliq.synth.parse import parse_reply
from obliq.synth.prompts import TaskSpec, load_stage_prompt, render_stage
from obliq.tasks import load_task
from obliq.text import normalise_text

REPO = Path(__file__).resolve().parents[1]
STANCE = TaskSpec(**__import__("yaml").safe_load((REPO / "configs/synth/stance-tweets.yaml").read_text())["spec"])


@pytest.fixture(scope="module")
def split(tasks_dir, tmp_path_factory):
    """stance-tweets and math-theoremqa split as the obliq-ir-mini chain splits them (dev 0.5, seed 0)."""
    root = tmp_path_factory.mktemp("split")
    for t in ("stance-tweets", "math-theoremqa"):
        split_task(tasks_dir / t, root / t, 0.5, 0)
    return root


def _side(folder: Path, queries: str, qrels: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """A side of a split task read straight from its files: query id → text, query id → gold doc ids."""
    texts = {o["_id"]: o["text"] for o in map(json.loads, (folder / queries).read_text().splitlines())}
    gold: dict[str, set[str]] = {}
    with (folder / "qrels" / qrels).open() as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if int(row["score"]) > 0:
                gold.setdefault(row["query-id"], set()).add(row["corpus-id"])
    return texts, gold


def _cut(text: str, n: int) -> str:
    parts = text.split()
    return " ".join(parts) if len(parts) <= n else " ".join(parts[:n]) + " …"


def test_examples_are_development_pairs_never_relevant_to_the_source(split):
    folder = split / "stance-tweets"
    task = load_task(folder)
    dev_texts, dev_gold = _side(folder, "queries-dev.jsonl", "dev.tsv")
    test_texts, _ = _side(folder, "queries.jsonl", "test.tsv")
    assert len(dev_texts) == 5 and len(test_texts) == 5 and not set(dev_texts) & set(test_texts)
    pool = ExamplePool(task, "dev", max_doc_words=12)
    assert [q for q, _, _ in pool.queries] == sorted(dev_texts)
    text_of = dict(zip(task.doc_ids, task.doc_texts))
    gold_texts = {q: {normalise_text(text_of[d]) for d in docs} for q, docs in dev_gold.items()}
    order, _ = sample_documents(task, 60, seed=13)
    in_a_gold_set = 0
    for n, i in enumerate(order):
        doc_id = task.doc_ids[i]
        # the queries relevant to the source, or to a copy of its text
        relevant_to = {
            q for q, docs in dev_gold.items() if doc_id in docs or normalise_text(text_of[doc_id]) in gold_texts[q]
        }
        in_a_gold_set += bool(relevant_to)
        shown = pool.choose(i, 3, seed=n)
        assert len(shown) == min(3, 5 - len(relevant_to))
        assert len({e.query_id for e in shown}) == len(shown)  # distinct queries
        for e in shown:
            assert e.query_id in dev_texts and e.query_id not in relevant_to  # never a query relevant to the source
            assert e.doc_id in dev_gold[e.query_id] and e.doc_id != doc_id
            assert e.query == _cut(dev_texts[e.query_id], 12)
            assert e.document == _cut(task.doc_texts[task.doc_ids.index(e.doc_id)], 12)
        assert pool.choose(i, 3, seed=n) == shown  # the same seed, the same examples
    assert in_a_gold_set > 10  # stance's dev queries are relevant to a third of the tweets: the rule is exercised
    draws = {tuple(e.doc_id for e in pool.choose(order[0], 2, seed=s)) for s in range(20)}
    assert len(draws) > 10  # the seed changes them


def test_a_few_shot_prompt_shows_exactly_its_examples_and_no_test_query(split):
    folder = split / "stance-tweets"
    task = load_task(folder)
    dev_texts, _ = _side(folder, "queries-dev.jsonl", "dev.tsv")
    test_texts, _ = _side(folder, "queries.jsonl", "test.tsv")
    prompt = load_stage_prompt("B", STANCE.lens)
    pool = ExamplePool(task, "dev", max_doc_words=80)
    i = sample_documents(task, 1, seed=13)[0][0]
    doc, shown = task.doc_texts[i], pool.choose(i, 2, seed=5)
    messages = render_stage(prompt, STANCE, doc, "a stance", [(e.document, e.query) for e in shown])
    user = messages[-1]["content"]
    pairs = re.findall(r"Example (\d+):\n(.*?)\nQuery: <query>(.*?)</query>", user, re.DOTALL)
    assert pairs == [(str(n), e.document, e.query) for n, e in enumerate(shown, 1)]
    assert all(dev_texts[e.query_id] in user for e in shown)  # stance queries are under 80 words: shown whole
    assert [q for q, t in dev_texts.items() if t in user] == sorted(e.query_id for e in shown)
    assert not [q for q, t in test_texts.items() if normalise_text(t) in normalise_text(user)]
    assert user.index("Example 2:") < user.index("Here is a tweet:\n\n" + doc)
    # zero-shot: the prompt of before (the examples field renders to nothing)
    plain = render_stage(prompt, STANCE, doc, "a stance")[-1]["content"]
    assert plain.startswith("Here is a tweet:") and "Example" not in plain and plain == user[user.index("Here is") :]


def test_few_shot_needs_the_development_side_and_refuses_the_test_side(split, tasks_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"queries-dev.jsonl: few-shot examples come from .*obliq task split"):
        ExamplePool(load_task(tasks_dir / "math-theoremqa"), "dev")
    with pytest.raises(ValueError, match="never come from the test side"):
        FewShotConfig(k=2, split="test")
    import shutil

    copy = tmp_path / "leaky"
    shutil.copytree(split / "math-theoremqa", copy)
    test_line = (copy / "queries.jsonl").read_text().splitlines()[0]
    with (copy / "queries-dev.jsonl").open("a") as f:  # a test query also on the development side
        f.write(json.dumps({"_id": "dev-copy", "text": json.loads(test_line)["text"].upper()}) + "\n")
    with pytest.raises(ValueError, match="'dev-copy' is also a test query"):
        ExamplePool(load_task(copy), "dev")


def test_a_reply_copying_an_example_is_rejected_like_a_copy_of_its_source():
    doc = "The witness said the agency would review the email and answer the committee next week."
    example_query = "someone was asked about a memo and promised to look into it before the next hearing"
    assert parse_reply(f"<query>{example_query}</query>", "query", 4, 40, doc, 8, examples=[example_query]).reason == (
        "copied-example"
    )
    near = "a memo came up and she promised to look into it before the next hearing, right"
    # "promised to look into it before the next hearing": 9 words in a row
    assert parse_reply(near, "query", 4, 40, doc, 9, examples=[example_query]).reason == "copied-example"
    assert parse_reply(near, "query", 4, 40, doc, 10, examples=[example_query]).ok
    short = "Equal Pay Now!"  # a short text: only equality (normalised) can copy it
    assert parse_reply("equal pay, now", "query", 3, 40, short, 8).reason == "copied"
    assert parse_reply("equal pay, now", "query", 3, 40, doc, 8, examples=[short]).reason == "copied-example"
    assert parse_reply("equal pay for all, now", "query", 3, 40, doc, 8, examples=[short]).ok


def test_few_shot_rows_record_their_examples_and_copies_are_retried(split, tmp_path):
    folder = split / "math-theoremqa"
    task = load_task(folder)
    dev_texts, dev_gold = _side(folder, "queries-dev.jsonl", "dev.tsv")
    order, _ = sample_documents(task, 3, seed=13)
    first = task.doc_ids[order[0]]

    def copy_example(user: str) -> str:  # the reply a small model gives: the first example's query
        return "<query>" + re.search(r"Query: <query>(.*?)</query>", user, re.DOTALL).group(1) + "</query>"

    backend = ScriptedBackend(task, {first: {"B": [copy_example]}})
    out = tmp_path / "rows.jsonl"
    rep = synthesize(
        task,
        SPEC,
        backend,
        out,
        n_docs=3,
        seed=13,
        generation=GenerationConfig(candidates_per_round=2),
        fewshot=FewShotConfig(2),
    )
    assert rep.generated == 3 and rep.rejected == {"B:copied-example": 1}
    assert rep.fewshot == {"k": 2, "split": "dev", "queries": len(dev_gold), "short": 0}
    rejects = [json.loads(line) for line in (tmp_path / "rows.jsonl.rejects.jsonl").read_text().splitlines()]
    assert [(r["doc_id"], r["sample"], r["reason"]) for r in rejects] == [(first, 0, "copied-example")]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    b_prompts = {(d, c) for d, stage, c, _ in backend.prompts if stage == "B"}
    for row in rows:
        shown = row["meta"]["fewshot"]
        assert len(shown) == 2
        prompts = [c for d, c in b_prompts if d == row["positive"]["id"]]
        assert prompts and all(c == prompts[0] for c in prompts)  # a retry shows the same examples
        for e in shown:
            assert row["positive"]["id"] not in dev_gold[e["query_id"]] and e["doc_id"] in dev_gold[e["query_id"]]
            assert _cut(dev_texts[e["query_id"]], 80) in prompts[0]
    assert rows[0]["meta"]["attempts"] == {"A": 1, "B": 2} and rows[0]["query"] == GOOD_B[7:-8]
    with pytest.raises(ValueError, match="cannot show examples"):
        (tmp_path / "prompts").mkdir()
        for name in ("stage_a.yaml", "stage_b_analogue.yaml"):
            text = (REPO / "obliq/synth/prompts" / name).read_text()
            (tmp_path / "prompts" / name).write_text(text.replace("{examples}", ""))
        synthesize(
            task,
            SPEC,
            backend,
            tmp_path / "x.jsonl",
            n_docs=1,
            fewshot=FewShotConfig(1),
            prompt_dir=tmp_path / "prompts",
        )


def test_samples_have_their_own_ids_and_seeds_resume_and_report_their_cost(split, tmp_path):
    task = load_task(split / "math-theoremqa")
    order, _ = sample_documents(task, 2, seed=13)
    d1, d2 = (task.doc_ids[i] for i in order)
    out = tmp_path / "rows.jsonl"
    one = ScriptedBackend(task)
    rep = synthesize(task, SPEC, one, out, n_docs=2, seed=13, generation=GenerationConfig(candidates_per_round=4))
    single = out.read_bytes()
    assert [json.loads(x)["id"] for x in single.splitlines()] == [f"synth:math-theoremqa:{d}" for d in (d1, d2)]
    assert rep.candidates == 2 and rep.samples == 1

    three = ScriptedBackend(task, {d2: {"B": ["", "", "", ""]}})  # d2's sample 1 is skipped after 3 retries
    rep = synthesize(
        task, SPEC, three, out, n_docs=2, seed=13, samples=3, generation=GenerationConfig(candidates_per_round=1)
    )
    assert out.read_bytes().startswith(single)  # the single-sample rows are sample 0: kept, not redone
    assert (rep.candidates, rep.already_done, rep.generated, rep.skipped) == (6, 2, 3, {"A": 0, "B": 1})
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == 5 and f"synth:math-theoremqa:{d1}:2" in ids and f"synth:math-theoremqa:{d2}:1" not in ids
    assert {(r["positive"]["id"], r["meta"]["sample"]) for r in rows} == {(d1, 0), (d1, 1), (d1, 2), (d2, 0), (d2, 2)}
    seeds = {(d, s) for d, stage, _, s in one.prompts + three.prompts if stage == "A" and d == d1}
    assert len({s for _, s in seeds}) == 3  # samples 0, 1, 2 of d1: three different Stage A seeds
    assert rep.new_tokens_per_row == pytest.approx(three.new_tokens / 3)
    assert rep.seconds_per_row == pytest.approx(three.seconds / 3)

    again = ScriptedBackend(task)  # resume: only the skipped candidate is generated
    rep = synthesize(task, SPEC, again, out, n_docs=2, seed=13, samples=3)
    assert rep.already_done == 5 and rep.generated == 1 and {d for d, _ in again.calls} == {d2}
    assert synthesize(task, SPEC, ScriptedBackend(task), out, n_docs=2, samples=3).generated == 0


def test_sharded_samples_merge_into_the_single_runs_rows(split, tmp_path, monkeypatch):
    from obliq.commands.synth import generate, merge
    from obliq.llm.backends import BackendConfig
    from obliq.shards import Shard

    folder = split / "math-theoremqa"
    task = load_task(folder)
    monkeypatch.setattr(BackendConfig, "build", lambda self: ScriptedBackend(task))
    common = dict(task=folder, spec=SPEC, n_docs=5, seed=13, samples=2, fewshot=FewShotConfig(k=1))
    generate(out=tmp_path / "one.jsonl", **common)
    for index in (0, 1):
        generate(out=tmp_path / "sharded.jsonl", shard=Shard(index, 2), **common)
    shards = [tmp_path / f"sharded.shard-{i}-of-2.jsonl" for i in (0, 1)]
    assert merge(shards, tmp_path / "merged.jsonl")["rows"] == 10
    assert (tmp_path / "merged.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    generate(out=tmp_path / "other.jsonl", shard=Shard(1, 2), **dict(common, samples=3))
    with pytest.raises(ValueError, match="not one run: samples is 2 .* but 3"):  # the setting that differs, named
        merge([shards[0], tmp_path / "other.shard-1-of-2.jsonl"], tmp_path / "mixed.jsonl")

    # a rerun into an output extends it when only n_docs or samples grew, and refuses other settings
    report = generate(out=tmp_path / "one.jsonl", **dict(common, n_docs=6, samples=3))
    assert report["already_done"] == 10 and report["generated"] == 8
    with pytest.raises(ValueError, match=r"one.jsonl: its rows were generated with other fewshot \("):
        generate(out=tmp_path / "one.jsonl", **dict(common, fewshot=FewShotConfig(k=2)))
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name in ("stage_a.yaml", "stage_b_analogue.yaml"):
        (prompts / name).write_text((REPO / "obliq/synth/prompts" / name).read_text())
    generate(out=tmp_path / "p.jsonl", **dict(common, prompt_dir=prompts))
    text = (prompts / "stage_b_analogue.yaml").read_text()
    (prompts / "stage_b_analogue.yaml").write_text(text.replace("Write only the", "Now write only the"))
    with pytest.raises(ValueError, match=r"p.jsonl: its rows were generated with other prompts \("):
        generate(out=tmp_path / "p.jsonl", **dict(common, prompt_dir=prompts))
    with pytest.raises(ValueError, match="other seed, prompt_dir, prompts"):
        generate(out=tmp_path / "one.jsonl", **dict(common, seed=14, prompt_dir=prompts))


def test_a_killed_run_resumed_with_other_settings_is_refused(split, tmp_path, monkeypatch):
    """Issue 53 §3: the settings record is written before the first row, so a run killed midway (no final report)
    still refuses a resume with another seed, temperature or model, and an output holding rows without any record
    is refused (its making unknown); the same settings resume it."""
    from obliq.commands.synth import generate
    from obliq.llm.backends import BackendConfig
    from obliq.synth.generate import GenerationConfig

    folder = split / "math-theoremqa"
    task = load_task(folder)
    calls, parent = {"n": 0}, os.getpid()

    class Killed(ScriptedBackend):
        def generate(self, *a, **k):
            calls["n"] += 1
            if calls["n"] > 2:  # Stage A and B of the first batch, then the process is killed (no clean-up)
                if os.getpid() != parent:
                    os._exit(9)
                raise AssertionError("a resume with other settings generated rows")
            return super().generate(*a, **k)

    monkeypatch.setattr(BackendConfig, "build", lambda self: Killed(task))
    common = dict(task=folder, spec=SPEC, n_docs=4, seed=13, generation=GenerationConfig(candidates_per_round=1))
    out = tmp_path / "rows.jsonl"
    child = multiprocessing.get_context("fork").Process(target=generate, kwargs=dict(out=out, **common))
    child.start()
    child.join(120)
    assert child.exitcode == 9 and len(out.read_text().splitlines()) == 1  # one row written before the kill
    for other, named in (
        (dict(seed=14), "seed"),
        (dict(generation=GenerationConfig(candidates_per_round=1, temperature=0.3)), "generation"),
        (dict(backend={"model": "minilm"}), "backend.model"),
    ):
        with pytest.raises(ValueError, match=rf"rows.jsonl: its rows were generated with other {named}"):
            generate(out=out, **{**common, **other})
    calls["n"] = -100
    assert generate(out=out, **common)["already_done"] == 1
    lone = tmp_path / "lone.jsonl"
    lone.write_text(out.read_text())
    with pytest.raises(ValueError, match=r"lone.jsonl: holds rows but no lone.jsonl.report.json"):
        generate(out=lone, **common)
