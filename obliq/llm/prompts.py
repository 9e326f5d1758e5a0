"""Prompt templates kept as data files, their checks, and the chat messages they render to.

A prompt file is YAML: optional ``system``, ``user`` (both ``str.format`` templates with ``{name}``
fields) and whatever header keys its stage defines (``stage`` and ``lens`` for synthetic queries,
``method`` and ``task`` for reranking). :func:`read_prompt` checks a file once, when it is loaded:
unknown keys, an empty ``user``, a field the stage does not fill, a field it needs that is missing,
or a malformed template each raise one error naming the file and the key. Rendering cannot fail
afterwards: :meth:`PromptTemplate.render` fills the fields and returns chat messages.

Files are found by :func:`find_prompt`: in a user's ``prompt_dir`` first, then among the files a
package ships (``obliq/synth/prompts``, ``obliq/rerank/prompts``).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from obliq.files import read_text
from obliq.yaml_checks import check_yaml

Messages = list[dict[str, str]]
"""A chat: ``[{"role": "system" | "user", "content": ...}, ...]``, as chat templates and vLLM take it."""


@dataclass(frozen=True)
class PromptTemplate:
    """One checked prompt file.

    Attributes:
        path: where it came from (a path, or ``obliq/<package>/prompts/<name>`` for a packaged file).
        system: the system template, or None.
        user: the user template.
        header: the file's other keys (``stage``, ``lens``, ``method``, ``task`` …).
    """

    path: str
    system: str | None
    user: str
    header: dict = field(default_factory=dict, compare=False)

    def render(self, values: dict) -> Messages:
        """Fill the templates: an optional system message, then the user message. Braces inside the
        values are kept as they are (values are not templates)."""
        messages = []
        if self.system:
            messages.append({"role": "system", "content": self.system.format_map(values)})
        messages.append({"role": "user", "content": self.user.format_map(values)})
        return messages

    def instructions(self) -> str:
        """The templates' fixed text, the filled-in fields left out: what the prompt itself says (a
        reply that only repeats it is no answer, :func:`obliq.llm.reply.echoes_prompt`)."""
        parts = [
            literal for template in (self.system or "", self.user) for literal, *_ in string.Formatter().parse(template)
        ]
        return " ".join(parts)


def template_fields(template: str, path: str, key: str) -> set[str]:
    """The ``{field}`` names of a template.

    Raises:
        ValueError: a field with a format spec, conversion or index, or unbalanced braces (file and
            key named).
    """
    names = set()
    try:
        for _, name, spec, conv in string.Formatter().parse(template):
            if name is None:
                continue
            if not name.isidentifier() or spec or conv:
                raise ValueError(
                    f"{path}: {key}: field {{{name}}} must be a plain name (no format spec, index or conversion)"
                )
            names.add(name)
    except ValueError as err:
        if str(err).startswith(path):
            raise
        raise ValueError(f"{path}: {key}: bad template ({err}); write literal braces as {{{{ and }}}}") from None
    return names


def read_prompt(
    path: str, text: str, keys: Sequence[str], allowed: set[str], needed: set[str], kind: str
) -> PromptTemplate:
    """Parse and check a prompt file.

    Args:
        path: the file's name for messages.
        text: its content.
        keys: the header keys a prompt may have besides ``system`` and ``user``.
        allowed: the ``{fields}`` its templates may use.
        needed: the fields ``user`` must use.
        kind: what the prompt is for, in messages (``stage A``, ``tourrank``…).

    Returns:
        The :class:`PromptTemplate` (``system`` and ``user`` stripped).

    Raises:
        ValueError: not a YAML mapping, an unknown key, ``user`` missing or empty, ``system`` not a
            string, a bad template, a field not allowed, or a needed field missing (file and key named).
    """
    keys = (*keys, "system", "user")
    try:
        check_yaml(text, path)  # a key given twice, a nested-alias bomb: refused before loading
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with keys {', '.join(keys)}")
    for key in data:
        if key not in keys:
            raise ValueError(f"{path}: {key}: unknown key (a prompt has {', '.join(keys)})")
    user, system = data.get("user"), data.get("system")
    if not isinstance(user, str) or not user.strip():
        raise ValueError(f"{path}: user: missing or empty")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"{path}: system: expected a string")
    used = template_fields(user, path, "user") | (template_fields(system, path, "system") if system else set())
    if used - allowed:
        raise ValueError(f"{path}: unknown field(s) {sorted(used - allowed)}; {kind} allows {sorted(allowed)}")
    if needed - used:
        raise ValueError(f"{path}: user: must contain {', '.join('{' + n + '}' for n in sorted(needed - used))}")
    header = {k: v for k, v in data.items() if k not in ("system", "user")}
    return PromptTemplate(path, system.strip() if system else None, user.strip(), header)


def find_prompt(names: Sequence[str], prompt_dir: str | Path | None, package: str) -> tuple[str, str] | None:
    """The first prompt file found: each name in ``prompt_dir`` (when given), then each name among
    ``package``'s packaged ``prompts/`` files.

    Returns:
        ``(path label, text)``, or None when no file matches.
    """
    if prompt_dir is not None:
        for name in names:
            file = Path(prompt_dir) / name
            if file.is_file():
                return str(file), read_text(file)
    for name in names:
        source = resources.files(package) / "prompts" / name
        if source.is_file():
            return f"{package.replace('.', '/')}/prompts/{name}", source.read_text(encoding="utf-8")
    return None


def cut_words(text: str, max_words: int) -> tuple[str, bool]:
    """``text`` cut to its first ``max_words`` whitespace words (an ellipsis marks a cut); and whether it was cut."""
    parts = text.split()
    if len(parts) <= max_words:
        return text, False
    return " ".join(parts[:max_words]) + " …", True
