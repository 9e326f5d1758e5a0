"""Prompt files: every task config x every lens renders with a real document; bad prompt files fail clearly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from obliq.synth.prompts import LENSES, TaskSpec, load_stage_prompt, prompt_file, render_stage
from obliq.tasks import read_jsonl

REPO = Path(__file__).resolve().parents[1]
TASKS = ("writing-news", "math-theoremqa", "stance-tweets", "hearings-exchanges")
AVOID = {  # each lens's explicit instruction to keep names and rare words of the document out
    "descriptive": "Do not use any name, place, date, number, hashtag or rare word from the text.",
    "analogue": "Do not use any name, place, date, number or rare word from the text.",
    "tip-of-the-tongue": "Leave out every name, title, place, date, number and quoted phrase.",
}


def _spec(task: str) -> TaskSpec:
    cfg = yaml.safe_load((REPO / "configs" / "synth" / f"{task}.yaml").read_text())
    return TaskSpec(**cfg["spec"])


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("lens", LENSES)
def test_every_task_renders_through_every_lens(task, lens, tasks_dir):
    spec = _spec(task)
    # a real document with braces if the corpus has one (LaTeX in math), else the first
    docs = [obj["text"] for _, obj in read_jsonl(tasks_dir / task / "corpus.jsonl")[:300]]
    doc = next((d for d in docs if "{" in d), docs[0])
    a = render_stage(load_stage_prompt("A"), spec, doc)
    b = render_stage(load_stage_prompt("B", lens), spec, doc, "a described latent attribute")
    for messages in (a, b):
        assert [m["role"] for m in messages] == ["system", "user"]
        user = messages[-1]["content"]
        assert doc in user and spec.unit in user
        assert not re.search(r"\{(document|unit|units|attribute|attribute_short|description)\}", user)
    assert spec.attribute in a[-1]["content"] and "<description>" in a[-1]["content"]
    assert "do not name any person" in a[-1]["content"]
    user_b = b[-1]["content"]
    assert "a described latent attribute" in user_b and spec.attribute_short in user_b and "<query>" in user_b
    assert AVOID[lens] in user_b


def test_the_three_lenses_ask_for_different_queries():
    users = {lens: load_stage_prompt("B", lens).user for lens in LENSES}
    assert "say what such {units} imply" in users["descriptive"]
    assert "whatever their topic" in users["analogue"]
    assert "conversational, vague and lossy" in users["tip-of-the-tongue"]
    assert prompt_file("B", "tip-of-the-tongue") == "stage_b_tip_of_the_tongue.yaml"


@pytest.mark.parametrize(
    "text, message",
    [
        ("stage: A\nuser: Here is {document} by {author}\n", r"unknown field\(s\) \['author'\]"),
        ("stage: A\nuser: no document here\n", r"user: must contain \{document\}"),
        ("stage: B\nlens: analogue\nuser: '{document}'\n", "stage: is 'B', expected 'A'"),
        ("stage: A\nuser: '{document!r}'\n", "must be a plain name"),
        ("stage: A\nuser: '{document'\n", "bad template"),
        ("stage: A\nprompt: x\nuser: '{document}'\n", "prompt: unknown key"),
        ("- a list\n", "expected a mapping"),
    ],
)
def test_bad_prompt_files_name_file_and_key(tmp_path, text, message):
    (tmp_path / "stage_a.yaml").write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        load_stage_prompt("A", prompt_dir=tmp_path)
    assert str(tmp_path / "stage_a.yaml") in str(err.value)


def test_stage_b_needs_description_and_known_lens(tmp_path):
    (tmp_path / "stage_b_analogue.yaml").write_text("stage: B\nlens: analogue\nuser: '{document}'\n")
    with pytest.raises(ValueError, match=r"must contain \{description\}"):
        load_stage_prompt("B", "analogue", prompt_dir=tmp_path)
    with pytest.raises(ValueError, match="no prompt for stage"):
        load_stage_prompt("B", "sideways")
    with pytest.raises(FileNotFoundError, match="stage_b_descriptive.yaml"):
        load_stage_prompt("B", "descriptive", prompt_dir=tmp_path)
    with pytest.raises(ValueError, match="Stage B needs"):
        render_stage(load_stage_prompt("B", "analogue"), _spec("math-theoremqa"), "doc")
    with pytest.raises(ValueError, match="spec.lens"):
        TaskSpec("t", "sideways", "a", "b", "c", "d")


@pytest.mark.parametrize("lens", LENSES)
def test_every_lens_can_show_few_shot_examples(lens):
    from obliq.synth.prompts import takes_examples

    prompt = load_stage_prompt("B", lens)
    assert takes_examples(prompt) and prompt.user.startswith("{examples}Here is {unit}:")
    spec = _spec("hearings-exchanges")
    shown = [("a first document {with braces}", "a first query"), ("a second document", "a second query")]
    user = render_stage(prompt, spec, "the document", "its description", shown)[-1]["content"]
    assert user.count("Example ") == 2 and "Example 1:\na first document {with braces}" in user
    assert "Query: <query>a second query</query>\n\nHere is an exchange" in user
    assert render_stage(prompt, spec, "the document", "its description")[-1]["content"].startswith(
        "Here is an exchange"
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        ("example: 'Example {number}: {example_document}'\n", r"example: must contain \{example_query\}"),
        ("example: '{example_document} {example_query} {author}'\n", r"example: unknown field\(s\) \['author'\]"),
        ("examples_intro: '{document}'\n", r"examples_intro: unknown field\(s\) \['document'\]"),
        ("example: 7\n", "example: expected a non-empty string"),
    ],
)
def test_bad_few_shot_keys_name_file_and_key(tmp_path, extra, message):
    (tmp_path / "stage_b_analogue.yaml").write_text(
        "stage: B\nlens: analogue\n" + extra + "user: '{examples}{document} {description}'\n"
    )
    with pytest.raises(ValueError, match=message) as err:
        load_stage_prompt("B", "analogue", prompt_dir=tmp_path)
    assert str(tmp_path / "stage_b_analogue.yaml") in str(err.value)
    (tmp_path / "stage_a.yaml").write_text("stage: A\nuser: '{examples}{document}'\n")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['examples'\]"):  # Stage A shows no examples
        load_stage_prompt("A", prompt_dir=tmp_path)
