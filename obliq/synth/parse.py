"""Parsing a generator's reply into a Stage A description or a Stage B query, or a reason to retry.

Prompts ask for the answer between tags (``<query>…</query>``); a model may instead answer with a
JSON object (``{"query": "…"}``, possibly in a code fence) or plain text, sometimes after a preamble
("Sure! Here is a query:") or under a label ("Query: …"). :func:`parse_reply` accepts all three
forms, in that order, and returns the cleaned text or the reason it was rejected:

- ``empty``: nothing left after cleaning;
- ``malformed``: a tag opened and never closed, a closing tag without an opening one, or a JSON
  object that does not parse or lacks the key;
- ``refusal``: the model declined ("I'm sorry", "As an AI", "I cannot");
- ``too-short`` / ``overlong``: fewer than ``min_words`` or more than ``max_words`` words, or (overlong)
  the reply was cut by the token limit inside the answer (an answer from an earlier paragraph, or the
  finished sentences kept from a cut description, are fine);
- ``copied``: the text repeats ``copy_ngram`` or more consecutive words of the document, or is the
  document itself (the same normalised text, :func:`obliq.text.normalise_text`: a short document);
- ``copied-example``: the same copy rule against a few-shot example the prompt showed (its query or
  its document, as shown);
- ``echo``: the text repeats the prompt's own instructions or only talks about the task
  (:func:`obliq.llm.reply.echoes_prompt`);
- ``unclosed-reasoning``: a reasoning model's thoughts never closed, so the reply has no answer
  (its reasoning blocks are removed before anything here, :func:`obliq.llm.reply.clean_reply`);
- ``chat-marker``: the reply holds a special token of the generator's chat format (``<|im_start|>`` …,
  :func:`obliq.llm.reply.chat_markers`): a turn its template left open, never a query.

A rejected reply is retried by the pipeline (:mod:`obliq.synth.generate`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from obliq.llm.reply import echoes_prompt
from obliq.text import normalise_text, words

REJECT_REASONS = (
    "empty",
    "malformed",
    "refusal",
    "too-short",
    "overlong",
    "copied",
    "copied-example",
    "echo",
    "unclosed-reasoning",
    "chat-marker",
)
"""Why a reply was rejected (keys of the run report's reject counts)."""

_REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|i apologi[sz]e|as an ai|i cannot|i can'?t|i can not|i'?m (?:afraid|unable|not able)"
    r"|i am (?:afraid|unable|not able)|unfortunately,? i)",
    re.IGNORECASE,
)
_PREAMBLE = re.compile(
    r"^\s*(sure|certainly|of course|okay|ok|here(?:'s| is| are)|below is)\b[^\n:]{0,80}:\s*", re.IGNORECASE
)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
_QUOTES = "\"'“”‘’`*_ "


@dataclass(frozen=True)
class ParsedReply:
    """The outcome of :func:`parse_reply`: ``text`` when accepted, else ``reason`` (:data:`REJECT_REASONS`)."""

    text: str | None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.text is not None


def _label(tag: str) -> re.Pattern:
    # "Query:", "**Search query:**", "Description -" at the start of a line
    return re.compile(rf"^\W*(?:\w+\s+)?{tag}\s*\**\s*[:\-–]\s*\**", re.IGNORECASE)


def _from_json(text: str, tag: str) -> ParsedReply | None:
    fenced = _FENCE.search(text)
    body = fenced.group(1).strip() if fenced else text.strip()
    if not body.startswith("{"):
        return None
    end = body.rfind("}")
    try:
        obj = json.loads(body[: end + 1] if end >= 0 else body)
    except json.JSONDecodeError:
        return ParsedReply(None, "malformed")
    if not isinstance(obj, dict):
        return ParsedReply(None, "malformed")
    value = obj.get(tag, obj.get("text"))
    if not isinstance(value, str):
        return ParsedReply(None, "malformed")
    return ParsedReply(value)


def _plain(text: str, tag: str) -> tuple[str, bool]:
    """The answer in a plain-text reply, and whether it runs to the end of the reply."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if len(paragraphs) > 1 and paragraphs[0].endswith(":"):
        # a lead-in sentence ("..., here's a rewritten query:") announces the next paragraph: drop it, and
        # keep what came before it in the same paragraph if anything did
        before = " ".join(re.split(r"(?<=[.!?])\s+", paragraphs[0])[:-1]).strip()
        if before:
            return before, False
        paragraphs = paragraphs[1:]
    if not paragraphs:
        return "", True
    first = _PREAMBLE.sub("", paragraphs[0], count=1)
    return _label(tag).sub("", first, count=1), len(paragraphs) == 1


def copies(text: str, other: str, n: int) -> bool:
    """Whether ``text`` copies ``other``: the same normalised text (:func:`obliq.text.normalise_text`),
    or ``n`` consecutive ``\\w+`` words in common (``n`` = 0: only the first test)."""
    if normalise_text(text) == normalise_text(other):
        return True
    text_words = words(text)
    if n <= 0 or len(text_words) < n:
        return False
    doc = words(other)
    grams = {tuple(doc[i : i + n]) for i in range(len(doc) - n + 1)}
    return any(tuple(text_words[i : i + n]) in grams for i in range(len(text_words) - n + 1))


def parse_reply(
    reply: str | None,
    tag: str,
    min_words: int = 3,
    max_words: int = 60,
    document: str | None = None,
    copy_ngram: int = 8,
    whole_sentences: bool = False,
    truncated: bool = False,
    instructions: str | None = None,
    examples: Sequence[str] = (),
    markers: Sequence[str] = (),
) -> ParsedReply:
    """Extract the answer from one reply.

    Args:
        reply: the model's answer, reasoning removed (:func:`obliq.llm.reply.clean_reply`); None when
            the reply had none (its reasoning never closed).
        tag: the expected tag / JSON key / label (``query`` or ``description``).
        min_words, max_words: accepted length in ``\\w+`` words, inclusive.
        document: the source document, for the copy check (none when omitted).
        copy_ngram: a run of this many words shared with the document rejects the reply (0: only a reply
            equal to the document, normalised, is a copy).
        whole_sentences: drop an unfinished last sentence (a reply cut by the token limit) when at
            least one finished sentence comes before it (used for Stage A descriptions).
        truncated: the backend cut the reply at its token limit. The reply is then ``overlong``
            when the answer taken from it runs to its end (not when it came from an earlier paragraph,
            closed tags, or finished sentences kept by ``whole_sentences``).
        instructions: the prompt's fixed text, for the echo check (none when omitted).
        examples: the texts of the few-shot examples the prompt showed (queries and documents), for
            the ``copied-example`` check.
        markers: the generator's special tokens as text (:func:`obliq.llm.reply.chat_markers`): a reply holding
            one is rejected (``chat-marker``).

    Returns:
        :class:`ParsedReply`: the text (whitespace collapsed, wrapping quotes removed) or a reason.
    """
    if reply is None:
        return ParsedReply(None, "unclosed-reasoning")
    text = reply.strip()
    if any(m in text for m in markers):
        return ParsedReply(None, "chat-marker")
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    low = text.lower()
    at_end = False  # whether the answer runs to the end of the reply (where a token limit cuts)
    if open_tag in low or close_tag in low:
        i, j = low.find(open_tag), low.find(close_tag)
        if i < 0 or j < 0 or j < i:
            return ParsedReply(None, "malformed")
        text = text[i + len(open_tag) : j]
    else:
        parsed = _from_json(text, tag)
        if parsed is not None and not parsed.ok:
            return parsed
        text, at_end = (parsed.text, False) if parsed is not None else _plain(text, tag)
    text = " ".join(text.split()).strip(_QUOTES)
    if whole_sentences and text and text[-1] not in ".!?\"')":
        cut = max(text.rfind(". "), text.rfind("! "), text.rfind("? "))
        if cut > 0:
            text, at_end = text[: cut + 1], False
    n = len(words(text))
    if n == 0:
        return ParsedReply(None, "empty")
    if _REFUSAL.search(text):
        return ParsedReply(None, "refusal")
    if n < min_words:
        return ParsedReply(None, "too-short")
    if n > max_words or (truncated and at_end):
        return ParsedReply(None, "overlong")
    if document is not None and copies(text, document, copy_ngram):
        return ParsedReply(None, "copied")
    if any(copies(text, example, copy_ngram) for example in examples):
        return ParsedReply(None, "copied-example")
    if instructions is not None and echoes_prompt(text, instructions):
        return ParsedReply(None, "echo")
    return ParsedReply(text)
