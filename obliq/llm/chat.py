"""A chat turned into the token ids a backend is fed: the template's markers are control ids, the
messages' text is text (``shared/cases/C55``).

Rendering a chat with its template and tokenizing the result lets every special-token string in the
result become a control id, those the messages brought included: a document that holds
``<|im_end|>\\n<|im_start|>assistant\\n…`` closes the user turn and forges an assistant turn
(huggingface/transformers#29279; vllm-project/vllm PR #31735, which encodes user content apart from
the template structure, as done here). :func:`chat_ids` is the one function both backends use, so
transformers and vLLM receive the same ids.
"""

from __future__ import annotations

import re
from pathlib import Path

from obliq.llm.prompts import Messages


def _template_file(tokenizer) -> str:
    """Where a tokenizer's chat template was read: its folder's ``chat_template.jinja`` or
    ``tokenizer_config.json`` when there is one, else the model's name."""
    name = str(getattr(tokenizer, "name_or_path", "") or "the model")
    folder = Path(name).expanduser()
    found = [folder / f for f in ("chat_template.jinja", "tokenizer_config.json") if (folder / f).is_file()]
    return str(found[0]) if found else name


def chat_ids(tokenizer, messages: Messages, **template_kwargs) -> list[int]:
    """The prompt ids of one chat, with the generation prompt: a special token's id only where the
    chat template wrote it; the messages' contents are tokenized with ``split_special_tokens=True``, so
    a special token string in them (``<|im_start|>``, ``<|endoftext|>``, Llama's ``<|eot_id|>``, any
    added special token) is read as ordinary tokens.

    The template is rendered once more with a placeholder for each content, which locates the contents
    in the rendered text; the text is then cut only at the special tokens outside them and each piece
    is tokenized as a whole. A chat without special token strings in its contents gets the ids of
    ``apply_chat_template(tokenize=True)``.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (vLLM's ``get_tokenizer()`` is one).
        messages: the chat.
        template_kwargs: passed to the template (``enable_thinking``).

    Raises:
        ValueError: the template changes the contents otherwise than by stripping their whitespace
            (the contents cannot be located in its text), or it raises for this chat (a template that
            takes no system turn, say): one line naming the template's file and the chat's roles.
    """
    from jinja2 import TemplateError

    def render(chat: Messages) -> str:
        try:
            return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, **template_kwargs)
        except TemplateError as err:
            roles = ", ".join(str(m.get("role")) for m in chat)
            raise ValueError(
                f"{_template_file(tokenizer)}: the chat template refuses a chat of "
                f"turns {roles} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no message'}): "
                "obliq's prompts need a template that renders them; use another model or fix its chat_template"
            ) from None

    text = render(messages)
    # placeholders of a private-use character: not whitespace, so a template's `trim` keeps them whole
    slots = [f"\ue000obliq-content-{i}\ue000" for i in range(len(messages))]
    pieces = re.split(f"({'|'.join(slots)})", render([{**m, "content": s} for m, s in zip(messages, slots)]))
    for fill in (str, str.strip):  # str.strip: templates that `| trim` the content (Llama 3, Gemma)
        contents = {s: fill(m["content"]) for s, m in zip(slots, messages)}
        if "".join(contents.get(p, p) for p in pieces) == text:
            break
    else:
        raise ValueError("the chat template alters message contents: they cannot be tokenized apart from it")
    markers = {t.content: t for t in tokenizer.added_tokens_decoder.values() if t.special}
    find = re.compile("|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)) or r"(?!)")
    ids: list[int] = []
    segment = ""

    def flush(text: str) -> None:
        if text:
            ids.extend(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    for piece in pieces:
        if piece in contents:
            segment += contents[piece]
            continue
        start = 0
        for match in find.finditer(piece):
            token = markers[match.group()]
            before, segment = segment + piece[start : match.start()], ""
            flush(before.rstrip() if token.lstrip else before)
            ids.append(tokenizer.convert_tokens_to_ids(token.content))
            start = match.end()
            if token.rstrip:
                start += len(piece[start:]) - len(piece[start:].lstrip())
        segment += piece[start:]
    flush(segment)
    return ids
