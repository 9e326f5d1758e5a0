"""Reading a language model's reply: when it is finished, what the answer is, whether it is an answer.

Every LLM caller (synthetic queries, reranking) reads replies through :func:`obliq.llm.backends.ask`,
which comes here:

- **Finished** (:func:`end_ids`): a reply is finished when it ends on *any* of the model's end ids:
  the tokenizer's eos, every id of the generation config's ``eos_token_id`` (Llama-3, Gemma and Phi
  list several) and the chat template's end-of-turn token. Otherwise the token budget cut it.
- **Reasoning removed** (:func:`clean_reply`): reasoning models write their thoughts first, between
  delimiters (``<think> … </think>``, and the others of :data:`REASONING_DELIMITERS` that a chat
  template declares). The answer is what is left once every such block is removed; a block the
  template opened in the prompt leaves only its closing tag in the reply (everything before it is
  reasoning). A reply whose reasoning never closes has **no answer**: the caller counts it as a
  failure and retries or falls back — it is never parsed (``shared/cases/C18``, ``C19``).
- **An answer, not an echo** (:func:`echoes_prompt`): a reply that repeats the prompt's own
  instructions ("The following query is a single sentence of at most 30 words…") or only talks
  about the task ("This is not a question. Here is a question.") is not an answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from obliq.text import load_function_words, words

REASONING_DELIMITERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),  # Qwen3, DeepSeek-R1, QwQ, most open reasoning models
    ("<thinking>", "</thinking>"),
    ("<reasoning>", "</reasoning>"),
    ("<|begin_of_thought|>", "<|end_of_thought|>"),
    ("[THINK]", "[/THINK]"),  # Magistral
    ("<|channel|>analysis", "<|end|>"),  # gpt-oss (harmony)
)
"""Reasoning delimiters obliq knows. ``<think>`` is always removed; the others when the model's chat
template or vocabulary declares them (:func:`reasoning_delimiters`)."""

ECHO_RUN = 5
"""A reply sharing this many consecutive words with the prompt's own instructions echoes them."""
META_WORDS = frozenset(
    "query queries question questions answer answers sentence sentences word words text texts ask asked "
    "requested provided below above "
    "document documents request task example description following here".split()
)
"""Words of a reply that talks about the task instead of doing it."""


@dataclass(frozen=True)
class Reply:
    """One reply, read.

    Attributes:
        text: the answer (reasoning removed, stripped), or None when there is none (reasoning that
            never closed).
        raw: the reply as generated.
        finished: it ended on one of the model's end ids (False: the token budget cut it).
        reasoning: it held a reasoning block (removed from ``text``).
    """

    text: str | None
    raw: str
    finished: bool = True
    reasoning: bool = False


def reasoning_delimiters(tokenizer=None) -> tuple[tuple[str, str], ...]:
    """The delimiters to remove for a model: ``<think>`` always, and every other pair of
    :data:`REASONING_DELIMITERS` whose opening or closing tag its chat template or vocabulary holds."""
    if tokenizer is None:
        return REASONING_DELIMITERS[:1]
    declared = str(getattr(tokenizer, "chat_template", "") or "")
    vocab = getattr(tokenizer, "get_vocab", dict)()
    return REASONING_DELIMITERS[:1] + tuple(
        pair for pair in REASONING_DELIMITERS[1:] if any(tag in declared or tag in vocab for tag in pair)
    )


def clean_reply(
    raw: str | None, finished: bool = True, delimiters: tuple[tuple[str, str], ...] = REASONING_DELIMITERS[:1]
) -> Reply:
    """The answer of one reply, its reasoning removed (see the module notes).

    Args:
        raw: the generated text (None or empty: no answer).
        finished: whether the reply ended on an end id.
        delimiters: ``(open, close)`` pairs of reasoning blocks.

    Returns:
        :class:`Reply`; ``text`` is None when a reasoning block never closes.
    """
    raw = raw or ""
    text, found = raw, False
    for open_tag, close_tag in delimiters:
        head, sep, tail = text.rpartition(close_tag)
        if sep and open_tag not in head:  # the template opened the block in the prompt
            text, found = tail, True
        while open_tag in text:
            start = text.index(open_tag)
            end = text.find(close_tag, start + len(open_tag))
            if end < 0:  # the reasoning never closed: no answer
                return Reply(None, raw, finished, True)
            text, found = text[:start] + text[end + len(close_tag) :], True
    return Reply(text.strip(), raw, finished, found)


def end_ids(tokenizer, generation_config=None) -> list[int]:
    """Every id that ends a reply: the tokenizer's eos, the generation config's ``eos_token_id`` (an id
    or a list) and the chat template's end-of-turn token (the special token the template writes
    right after an assistant message).

    Returns:
        The ids, sorted, without duplicates.
    """
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(generation_config, "eos_token_id", None)
    ids |= set(configured if isinstance(configured, (list, tuple)) else [configured] if configured is not None else [])
    if getattr(tokenizer, "chat_template", None):
        mark = "OBLIQ-END-OF-ANSWER"
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}], tokenize=False
            )
        except Exception:  # a template that cannot render a plain exchange: eos ids only
            text = ""
        after = text.split(mark, 1)[1] if mark in text else ""
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        first = tokenizer(after, add_special_tokens=False)["input_ids"][:1] if after.strip() else []
        ids |= {i for i in first if i in special}
    return sorted(i for i in ids if i is not None)


def chat_markers(tokenizer) -> tuple[str, ...]:
    """The special tokens of a generator's tokenizer, as text (``<|im_start|>``, ``<|im_end|>``, ``</s>``…): what
    a reply may never hold. A reply decoded with its special tokens that holds one is a turn the template did not
    close (a template that ignores ``add_generation_prompt`` makes the model write the assistant marker first), or
    the model writing a next turn; its answer is never a query or a description (issue 53 §3). () without a
    tokenizer (a backend that has none)."""
    if tokenizer is None:
        return ()
    special = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    special |= {str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", 0)}
    return tuple(sorted(m for m in special if len(m.strip()) > 1))


def echoes_prompt(answer: str, instructions: str) -> bool:
    """Whether an answer repeats the prompt's own instructions or only talks about the task.

    Args:
        answer: the parsed answer.
        instructions: the prompt's fixed text (its templates without the filled-in fields:
            :meth:`obliq.llm.prompts.PromptTemplate.instructions`).

    Returns:
        True when the answer shares :data:`ECHO_RUN` consecutive words with the instructions, or when
        every word of it that is not a function word or a number is a word about the task
        (:data:`META_WORDS`) or one of the instructions' own words.
    """
    said, told = words(answer), words(instructions)
    runs = {tuple(told[i : i + ECHO_RUN]) for i in range(len(told) - ECHO_RUN + 1)}
    if any(tuple(said[i : i + ECHO_RUN]) in runs for i in range(len(said) - ECHO_RUN + 1)):
        return True
    function = set(load_function_words("english"))
    content = [w for w in said if w not in function and not w.isdigit()]
    told_set = set(told)
    return bool(content) and all(w in META_WORDS or w in told_set for w in content)
