"""The LLM layer: reasoning blocks removed before any reply is read (C18, C19), end-of-turn ids,
echoes of the prompt rejected, the reasoning switch and its budget (issue 14)."""

from __future__ import annotations

import json

import pytest
import torch

from obliq.llm.backends import ask
from obliq.llm.reply import clean_reply, echoes_prompt, end_ids
from obliq.rerank.judge import Judge, RerankStats
from obliq.synth.parse import parse_reply
from obliq.synth.prompts import load_stage_prompt


class Canned:
    """A test double of the LLM: each call answers with the next canned replies; records the budgets."""

    name = "canned"

    def __init__(self, replies, finished=None, reasoning=False, reasoning_tokens=0):
        self.replies, self.finished_script = list(replies), list(finished or [])
        self.reasoning, self.reasoning_tokens = reasoning, reasoning_tokens
        self.calls = self.prompt_tokens = self.new_tokens = 0
        self.seconds, self.finished, self.budgets = 0.0, [], []

    def generate(self, prompts, max_new_tokens, temperature, seed):
        self.budgets.append(max_new_tokens)
        out = [self.replies.pop(0) for _ in prompts]
        self.finished = [self.finished_script.pop(0) if self.finished_script else True for _ in prompts]
        self.calls += len(prompts)
        return out


# --- C18: a reranker reading a reasoning model's thoughts -------------------------------------

C18 = (
    "<think>\nPassage [1] is on topic but neutral. [2] restates the claim. Comparing [1] and [4]: [4]\n"
    "is sarcastic, so it opposes.\n</think>\n\n[4] > [3] > [2] > [1]"
)


def test_c18_the_ranking_is_read_after_the_reasoning_block():
    stats = RerankStats()
    assert Judge(lambda: Canned([C18]), stats).order([{"role": "user", "content": "rank"}], 4, seed=0) == [3, 2, 1, 0]
    assert stats.failed_calls == 0 and stats.repaired_calls == 0 and sum(stats.repairs.values()) == 0
    stats = RerankStats()  # a selection of the best 2 reads the same answer: its first two ids
    assert Judge(lambda: Canned([C18]), stats).select([[{"role": "user", "content": "pick 2"}]], [4], [2], 0) == [
        [3, 2]
    ]
    assert stats.failed_calls == 0 and stats.repairs["duplicate"] == stats.repairs["out_of_range"] == 0


def test_c18_a_reply_cut_inside_its_reasoning_is_a_failed_call_never_a_ranking():
    cut = C18.split("</think>")[0]
    stats = RerankStats()
    order = Judge(lambda: Canned([cut], finished=[False]), stats).order([{"role": "user", "content": "rank"}], 4, 0)
    assert order == [0, 1, 2, 3]  # the fallback: the input order
    assert stats.failed_calls == 1 and stats.reasoning_unclosed == 1 and stats.calls == 1


# --- C19: a generated query that is the model's reasoning -------------------------------------

QUERY = "posts that quietly back the city's transit expansion"
DOC = "The new bus lanes on Main Street are finally here, and my commute has never been calmer."


@pytest.mark.parametrize(
    "raw",
    [
        "<think>The author likes it. Maybe <query>bus lanes</query>? Too literal.</think>\n<query>"
        + QUERY
        + "</query>",
        "<think>The document supports the bus lanes without saying so.</think>\n\n" + QUERY,
    ],
)
def test_c19_the_query_is_the_answer_not_the_reasoning(raw):
    reply = clean_reply(raw)
    assert reply.reasoning and parse_reply(reply.text, "query", 3, 40, DOC).text == QUERY


def test_c19_a_reply_whose_reasoning_never_closes_has_no_answer_and_is_retried(tasks_dir, tmp_path):
    from test_synth_generate import GOOD_A, GOOD_B, SPEC, ScriptedBackend

    from obliq.synth.generate import GenerationConfig, sample_documents, synthesize
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "math-theoremqa")
    order, _ = sample_documents(task, 2, seed=13)
    first = task.doc_ids[order[0]]
    backend = ScriptedBackend(task, {first: {"B": ["<think>The problem counts arrangements, so maybe", GOOD_B]}})
    report = synthesize(
        task, SPEC, backend, tmp_path / "rows.jsonl", n_docs=2, seed=13, generation=GenerationConfig(max_retries=1)
    )
    assert report.rejected == {"B:unclosed-reasoning": 1} and report.retries == 1 and report.generated == 2
    assert report.reasoning_replies == 1 and report.replies == {"A": 2, "B": 3}
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and "<think>" not in "".join(r["query"] + r["meta"]["description"] for r in rows)
    assert rows[0]["meta"]["description"] in GOOD_A
    rejects = [json.loads(line) for line in (tmp_path / "rows.jsonl.rejects.jsonl").read_text().splitlines()]
    assert rejects[0]["reason"] == "unclosed-reasoning" and rejects[0]["reply"].startswith("<think>")


def test_reasoning_blocks_in_every_form_are_removed():
    assert clean_reply("<think>a</think> x <think>b</think> y").text == "x  y"
    assert clean_reply("thoughts the template opened\n</think>\nanswer").text == "answer"  # DeepSeek-R1 style
    assert clean_reply("no reasoning at all").reasoning is False
    assert clean_reply("<reasoning>r</reasoning>ans", delimiters=(("<reasoning>", "</reasoning>"),)).text == "ans"
    assert clean_reply("<think>never closes").text is None
    assert clean_reply(None).text == "" and clean_reply("").text == ""


# --- echoes of the prompt ------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "The following query is a single sentence of at most 30 words that conveys the property of the text.",
        "This is not a question. Here is a question.",
        "Here is the search query you asked for.",  # invented: talks about the task
        "Write one search query that would find any text.",  # invented: repeats the instructions
    ],
)
def test_replies_that_echo_the_prompt_or_talk_about_the_task_are_rejected(answer):
    prompt = load_stage_prompt("B", "descriptive")
    assert echoes_prompt(answer, prompt.instructions())
    parsed = parse_reply(answer, "query", 3, 40, DOC, instructions=prompt.instructions())
    assert parsed.reason == "echo"


@pytest.mark.parametrize(
    "answer",
    [
        QUERY,
        "problems solved by counting arrangements of objects",
        "tweets that mock a policy while seeming to praise it",
        "texts that imply quiet support",
    ],
)
def test_real_queries_are_not_echoes(answer):
    assert not echoes_prompt(answer, load_stage_prompt("B", "descriptive").instructions())


# --- when is a reply finished --------------------------------------------------------------


@pytest.fixture(scope="module")
def two_end_ids_model(tmp_path_factory, smollm2_path):
    """A tiny Llama chat model whose generation config ends a turn on eos or on id 0, and whose
    zeroed output layer makes greedy decoding emit id 0 (the second end id) at once."""
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("two-end-ids")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    assert tokenizer.eos_token_id != 0 and tokenizer.pad_token_id != 0
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # every logit 0: greedy picks id 0
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, 0], pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), tokenizer


def test_a_reply_ending_on_the_second_end_id_is_finished(two_end_ids_model):
    from obliq.llm.transformers import TransformersBackend

    folder, tokenizer = two_end_ids_model
    backend = TransformersBackend(folder, device="cpu")
    assert backend.end_ids == sorted({tokenizer.eos_token_id, 0})
    [reply] = ask(backend, [[{"role": "user", "content": "hello"}]], 8, 0.0, 0)
    assert reply.finished and backend.new_tokens == 1 and reply.text == ""
    # the old rule (eos and pad only) would have run to the budget and called the reply cut
    assert 0 not in {tokenizer.eos_token_id, tokenizer.pad_token_id}


def test_the_chat_templates_end_of_turn_token_counts_even_when_eos_is_another(smollm2_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    turn_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token = "<|endoftext|>"  # eos no longer the end of a turn, as in Llama-3 or Gemma
    assert tokenizer.eos_token_id != turn_end
    assert set(end_ids(tokenizer)) == {tokenizer.eos_token_id, turn_end}


# --- the reasoning switch and its budget ----------------------------------------------------


def test_the_budget_grows_by_the_reasoning_tokens_only_when_the_model_reasons():
    off, on = Canned(["a"]), Canned(["a"], reasoning=True, reasoning_tokens=500)
    ask(off, [[{"role": "user", "content": "x"}]], 40, 0.0, 0)
    ask(on, [[{"role": "user", "content": "x"}]], 40, 0.0, 0)
    assert off.budgets == [40] and on.budgets == [540]


def test_reasoning_is_switched_off_through_the_chat_template_by_default(two_end_ids_model):
    """The backend asks the chat template for ``enable_thinking=False`` unless reasoning is asked for;
    a Qwen3-style template then writes an empty reasoning block into the prompt."""
    from obliq.llm.backends import backend_config
    from obliq.llm.transformers import TransformersBackend

    folder, _ = two_end_ids_model
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
        "{% endif %}"
    )
    assert backend_config().reasoning is False
    rendered = {}
    for reasoning in (False, True):
        backend = TransformersBackend(folder, device="cpu", reasoning=reasoning)
        backend.tokenizer.chat_template = template
        original, seen = backend.tokenizer.apply_chat_template, []
        backend.tokenizer.apply_chat_template = lambda *a, **k: seen.append(k) or original(*a, **k)
        ask(backend, [[{"role": "user", "content": "x"}]], 4, 0.0, 0)
        assert seen[0]["enable_thinking"] is reasoning
        rendered[reasoning] = original(
            [{"role": "user", "content": "x"}],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=seen[0]["enable_thinking"],
        )
    assert rendered[False].endswith("<think>\n\n</think>\n\n") and "<think>" not in rendered[True]


def test_a_null_backend_name_is_the_default_backend_and_an_empty_one_is_refused():
    """``backend.name: null`` means what an absent name means (issue 56 review); ``""`` is no backend."""
    from obliq.llm.backends import DEFAULT_BACKEND, backend_config

    assert backend_config(name=None).name == backend_config().name == DEFAULT_BACKEND
    with pytest.raises(ValueError, match=r"^name: must be one of .*, got ''"):
        backend_config(name="")
