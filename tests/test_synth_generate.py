"""The generation pipeline: retries and skips (scripted LLM), resume after a kill, sampling, row validity,
end to end with negatives, the task configs, and one real generation with SmolLM2 (slow)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from obliq.data.rows import RowError, parse_row
from obliq.synth.generate import GenerationConfig, read_done, sample_documents, synthesize
from obliq.synth.prompts import TaskSpec
from obliq.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
SPEC = TaskSpec(
    name="math-theoremqa",
    lens="analogue",
    unit="a math problem",
    units="math problems",
    attribute="the reasoning technique needed to solve it",
    attribute_short="reasoning technique",
    instruction="Retrieve problems solved with the same technique.",
)
GOOD_A = "<description>Counting arrangements of objects with a classic combinatorial identity.</description>"
GOOD_B = "<query>problems where you count ways to arrange or split objects into groups</query>"


class ScriptedBackend:
    """A test double of the LLM (the only mock in these tests): replies come from a script keyed by
    document id and stage, one reply per attempt; the stage is read from the prompt's output tag.
    A reply given as ``(text, False)`` is one cut by the token limit; a callable reply is called with
    the prompt's user message (e.g. to copy a few-shot example it shows). The source document is the
    one after the prompt's last "Here is" (few-shot examples come before it)."""

    name = "scripted"

    def __init__(self, task, script: dict[str, dict[str, list[str]]] | None = None, default=(GOOD_A, GOOD_B)):
        self.texts = {doc_id: text for doc_id, text in zip(task.doc_ids, task.doc_texts)}
        self.script = {k: {s: list(v) for s, v in d.items()} for k, d in (script or {}).items()}
        self.default = dict(zip("AB", default))
        self.calls: list[tuple[str, str]] = []
        self.prompts: list[tuple[str, str, str, int]] = []  # (document, stage, user message, seed)
        self.new_tokens, self.seconds, self.finished = 0, 0.0, []

    def _doc(self, content: str) -> str:
        content = content[content.rfind("Here is ") :]
        hits = [d for d, t in self.texts.items() if " ".join(t.split()[:12]) in content]
        assert len(hits) == 1, "the prompt must hold exactly one corpus document after its examples"
        return hits[0]

    def generate(self, prompts, max_new_tokens, temperature, seed):
        out, self.finished = [], []
        seeds = [seed] * len(prompts) if isinstance(seed, int) else list(seed)
        for messages, one_seed in zip(prompts, seeds):
            content = messages[-1]["content"]
            stage = "B" if "<query>" in content[content.rfind("Here is ") :] else "A"
            doc = self._doc(content)
            self.calls.append((doc, stage))
            self.prompts.append((doc, stage, content, one_seed))
            queue = self.script.get(doc, {}).get(stage)
            reply = queue.pop(0) if queue else self.default[stage]
            reply = reply(content) if callable(reply) else reply
            reply, done = reply if isinstance(reply, tuple) else (reply, True)
            self.finished.append(done)
            self.new_tokens += len(reply.split())
            self.seconds += 0.01
            out.append(reply)
        return out


@pytest.fixture(scope="module")
def math_task(tasks_dir):
    return load_task(tasks_dir / "math-theoremqa")


def _rows(path):
    return [parse_row(line, str(path), n) for n, line in enumerate(Path(path).read_bytes().splitlines(), 1)]


def test_retries_and_skips_are_counted(math_task, tmp_path):
    order, _ = sample_documents(math_task, 3, seed=13)
    d1, d2, d3 = (math_task.doc_ids[i] for i in order)
    long_query = "<query>" + " ".join(["word"] * 60) + "</query>"
    cut_a = ("Counting arrangements of objects with a classic combinatorial identity. It also uses the", False)
    script = {
        d1: {"A": [cut_a], "B": ["", GOOD_B]},  # A cut by the limit: its finished sentence kept; B: 1 retry
        d2: {"A": ["<description>cut off by the token limit", "I'm sorry, I cannot help.", GOOD_A]},  # A: 2 retries
        d3: {"B": [long_query, ("problems where you count the ways to", False), long_query]},  # B: 2 retries, skipped
    }
    backend = ScriptedBackend(math_task, script)
    out = tmp_path / "rows.jsonl"
    cfg = GenerationConfig(max_retries=2, candidates_per_round=2, query_words=(4, 40))
    rep = synthesize(math_task, SPEC, backend, out, n_docs=3, seed=13, generation=cfg)

    assert rep.sampled == 3 and rep.generated == 2 and rep.already_done == 0
    assert rep.skipped == {"A": 0, "B": 1}
    assert rep.retries == 1 + 2 + 2 and rep.docs_retried == 3
    assert rep.rejected == {"A:malformed": 1, "A:refusal": 1, "B:empty": 1, "B:overlong": 3}  # one B cut by the limit
    # what the backend was asked: 3 + 2 stage-A prompts, 3 + 1 + 2 stage-B prompts
    assert sorted(backend.calls) == sorted(
        [
            (d1, "A"),
            (d2, "A"),
            (d2, "A"),
            (d2, "A"),
            (d3, "A"),
            (d1, "B"),
            (d1, "B"),
            (d2, "B"),
            (d3, "B"),
            (d3, "B"),
            (d3, "B"),
        ]
    )
    rows = _rows(out)
    assert [r.positive.id for r in rows] == [d1, d2]
    for r in rows:
        assert r.source == "synthetic" and r.task == "math-theoremqa" and r.lens == "analogue" and r.negatives == ()
        assert r.instruction == SPEC.instruction and r.id == f"synth:math-theoremqa:{r.positive.id}"
        assert r.query == "problems where you count ways to arrange or split objects into groups"
        assert r.meta["description"] == "Counting arrangements of objects with a classic combinatorial identity."
        assert r.positive.text == math_task.doc_texts[math_task.doc_ids.index(r.positive.id)]
    assert rows[0].meta["attempts"] == {"A": 1, "B": 2} and rows[1].meta["attempts"] == {"A": 3, "B": 1}
    assert rep.mean_query_words == 12 and rep.mean_description_words == 9
    rejects = [json.loads(line) for line in (tmp_path / "rows.jsonl.rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == 6 and {r["reason"] for r in rejects} == {"malformed", "refusal", "empty", "overlong"}
    assert rep.new_tokens == backend.new_tokens and rep.tokens_per_s == pytest.approx(backend.new_tokens / 0.11)


def test_resume_skips_done_documents_and_cuts_a_half_written_line(math_task, tmp_path):
    out = tmp_path / "rows.jsonl"
    first = ScriptedBackend(math_task)
    rep = synthesize(
        math_task, SPEC, first, out, n_docs=2, seed=13, generation=GenerationConfig(candidates_per_round=1)
    )
    assert rep.generated == 2
    done = out.read_bytes()
    out.write_bytes(done + b'{"id": "synth:math-theoremqa:tqa-0')  # a run killed mid-write

    second = ScriptedBackend(math_task)
    rep = synthesize(
        math_task, SPEC, second, out, n_docs=4, seed=13, generation=GenerationConfig(candidates_per_round=1)
    )
    order, _ = sample_documents(math_task, 4, seed=13)
    assert rep.already_done == 2 and rep.generated == 2 and rep.dropped_partial_line
    assert {d for d, _ in second.calls} == {math_task.doc_ids[i] for i in order[2:]}
    assert out.read_bytes().startswith(done)
    assert [r.positive.id for r in _rows(out)] == [math_task.doc_ids[i] for i in order]

    rep = synthesize(math_task, SPEC, ScriptedBackend(math_task), out, n_docs=4, seed=13)
    assert rep.already_done == 4 and rep.generated == 0


def test_resume_refuses_a_corrupt_line_or_another_task(math_task, tmp_path):
    out = tmp_path / "rows.jsonl"
    synthesize(math_task, SPEC, ScriptedBackend(math_task), out, n_docs=2, seed=13)
    lines = out.read_text().splitlines()
    bad = {**json.loads(lines[1]), "query": 7}
    out.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RowError, match=r"rows.jsonl:2:query"):
        read_done(out, "math-theoremqa")
    out.write_text(lines[0] + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:1:task: row of task 'math-theoremqa'"):
        read_done(out, "stance-tweets")


def test_sampling_is_seeded_nested_and_skips_empty_documents(tmp_path):
    folder = tmp_path / "tiny"
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": "" if i in (3, 7) else f"document number {i}"} for i in range(12)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "document"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td0\t1\n")
    task = load_task(folder)
    five, empty = sample_documents(task, 5, seed=1)
    ten, _ = sample_documents(task, 10, seed=1)
    every, _ = sample_documents(task, None, seed=1)
    assert empty == 2 and ten[:5] == five and sorted(every) == [i for i in range(12) if i not in (3, 7)]
    assert sample_documents(task, 5, seed=2)[0] != five
    assert sample_documents(task, 50, seed=1)[0] == every
    with pytest.raises(ValueError, match="n_docs"):
        sample_documents(task, 0, seed=1)


def test_end_to_end_with_negatives_rows_validate(math_task, tasks_dir, tmp_path):
    from obliq.cli import main

    synth = tmp_path / "synth.jsonl"
    synthesize(math_task, SPEC, ScriptedBackend(math_task), synth, n_docs=5, seed=3)
    train = tmp_path / "train.jsonl"
    main(["negatives", "mine", "--rows", str(synth), "--task", str(tasks_dir / "math-theoremqa"), "--out", str(train)])
    rows = _rows(train)
    assert len(rows) == 5
    for r in rows:
        assert len(r.negatives) == 4
        assert all(n.id != r.positive.id and n.text_hash != r.positive.text_hash for n in r.negatives)
        assert r.meta["description"] and r.meta["mined_negatives"]["backend"].startswith("bm25s")


def test_task_configs_load_against_the_command(tasks_dir):
    """Every configs/synth YAML opens with its command, parses against `obliq synth generate`, names a
    real task, and uses the lens of that task's mechanism (task.json)."""
    from jsonargparse import ArgumentParser

    from obliq.commands.synth import generate

    files = sorted((REPO / "configs" / "synth").glob("*.yaml"))
    assert {f.stem for f in files} >= {"writing-news", "math-theoremqa", "stance-tweets", "hearings-exchanges"}
    for file in files:
        assert file.read_text().splitlines()[0] == f"# obliq synth generate --config configs/synth/{file.name}"
        parser = ArgumentParser(exit_on_error=False)
        parser.add_function_arguments(generate)
        cfg = parser.instantiate_classes(parser.parse_path(str(file)))
        assert cfg.spec.name == file.stem and Path(str(cfg.task)).name == file.stem
        meta = json.loads((tasks_dir / file.stem / "task.json").read_text())
        assert cfg.spec.lens == meta["mechanism"], file


def test_vllm_backend_missing_names_the_extra():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here")
    from obliq.llm.backends import backend_config

    with pytest.raises(ImportError, match=re.escape("pip install -e '.[gen]'")):
        backend_config(name="vllm").build()


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"dtype": "fp16"}, "dtype: must be one of auto, bfloat16, float16, float32, got 'fp16'"),
        ({"enforce_eager": "yes"}, "enforce_eager: must be true or false, got 'yes'"),
        ({"kv_cache_gib": 0}, "kv_cache_gib"),
    ],
)
def test_vllm_cpu_settings_are_checked_without_vllm(setting, message):
    """The settings a CPU build of vLLM reads (tests/test_vllm.py runs them) are refused in one line before
    anything loads, in any environment."""
    from obliq.llm.backends import backend_config

    with pytest.raises(ValueError, match=re.escape(message)):
        backend_config(name="vllm", **setting)


@pytest.mark.slow
def test_real_generation_with_smollm2_few_shot_and_two_samples(tasks_dir, tmp_path, smollm2_path):
    """SmolLM2-135M-Instruct on the CPU with the task's config (few-shot from the development side), one
    document, two samples, then BM25 negatives: every row validates and names the examples it was shown."""
    import csv

    import torch

    from obliq.cli import main
    from obliq.commands.task import split_task

    split_task(tasks_dir / "math-theoremqa", tmp_path / "task", 0.5, 0)
    threads = torch.get_num_threads()
    out = tmp_path / "synth.jsonl"
    main(
        [
            "synth",
            "generate",
            "--config",
            str(REPO / "configs" / "synth" / "math-theoremqa.yaml"),
            "--task",
            str(tmp_path / "task"),
            "--out",
            str(out),
            "--n_docs",
            "1",
            "--samples",
            "2",
            "--generation.max_new_tokens_a",
            "48",
            "--generation.max_new_tokens_b",
            "40",
            "--generation.max_retries",
            "1",
            "--backend.name",
            "transformers",
            "--backend.device",
            "cpu",
            "--backend.threads",
            "1",
        ]
    )  # robust on a CPU shared with other busy processes (see TransformersBackend)
    assert torch.get_num_threads() == threads  # the backend's thread setting is scoped to generation
    report = json.loads((tmp_path / "synth.jsonl.report.json").read_text())["report"]
    assert report["sampled"] == 1 and report["candidates"] == 2
    assert report["generated"] + sum(report["skipped"].values()) == 2
    assert report["new_tokens"] > 0 and report["tokens_per_s"] > 0 and report["prompt_tokens"] > 0
    assert report["backend"] == "transformers:smollm2" and report["fewshot"]["k"] == 2
    rows = _rows(out) if out.stat().st_size else []
    assert len(rows) == report["generated"]
    if rows:
        assert report["new_tokens_per_row"] == pytest.approx(report["new_tokens"] / len(rows))
        with (tmp_path / "task" / "qrels" / "dev.tsv").open() as f:
            dev = {(r["query-id"], r["corpus-id"]) for r in csv.DictReader(f, delimiter="\t")}
        for r in rows:
            assert len(r.meta["fewshot"]) == 2
            assert all((e["query_id"], e["doc_id"]) in dev for e in r.meta["fewshot"])
        train = tmp_path / "train.jsonl"
        main(["negatives", "mine", "--rows", str(out), "--task", str(tmp_path / "task"), "--out", str(train)])
        for r in _rows(train):
            assert len(r.negatives) == 4 and r.meta["generator"] == "transformers:smollm2"


def test_a_reply_holding_a_chat_marker_is_never_a_query(math_task, smollm2_path, tmp_path):
    """Issue 53 §3: a chat template that ignores ``add_generation_prompt`` leaves the assistant turn unopened, and the
    model writes ``<|im_start|>assistant`` before its answer; such a reply (any special token of the generator's
    tokenizer in it) is rejected as ``chat-marker`` and retried, whatever form the answer takes."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    template = tokenizer.chat_template
    assert "<|im_start|>" in template and "<|im_end|>" in template  # the markers its own template writes
    order, _ = sample_documents(math_task, 3, seed=13)
    ids = [math_task.doc_ids[i] for i in order]
    script = {
        ids[0]: {"B": ["<|im_start|>assistant\nproblems where counting arrangements decides the answer", GOOD_B]},
        ids[1]: {"A": ["<|im_start|>assistant\n" + GOOD_A, GOOD_A]},
        ids[2]: {"B": ["<query>problems about counting ways to arrange objects</query><|im_end|>"] * 3},
    }
    backend = ScriptedBackend(math_task, script)
    backend.tokenizer = tokenizer
    gen = GenerationConfig(max_retries=2)
    rep = synthesize(math_task, SPEC, backend, tmp_path / "rows.jsonl", n_docs=3, seed=13, generation=gen)
    assert rep.rejected == {"B:chat-marker": 4, "A:chat-marker": 1}
    rows = _rows(tmp_path / "rows.jsonl")
    assert [r.positive.id for r in rows] == ids[:2]
    assert not any("<|" in r.query or "<|" in r.meta["description"] for r in rows)
