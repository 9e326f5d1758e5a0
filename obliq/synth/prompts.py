"""Prompts of the two generation stages, kept as data, and the per-task wording that fills them.

The OBLIQ-IR paper (§3.1) generates one training query per document in two steps:

- **Stage A** reads a document and writes a short abstract description of its latent attribute;
- **Stage B** reads the document and that description and writes one query through the task's
  **lens**: ``descriptive`` (an abstract paraphrase of an implicit property), ``analogue`` (asks for
  other documents sharing the abstract structure, whatever the topic) or ``tip-of-the-tongue`` (a
  conversational, lossy recollection that omits names, dates and verbatim phrases), each with an
  explicit instruction to avoid named entities and rare words of the document.

Each prompt is one YAML file in ``obliq/synth/prompts/`` (``stage_a.yaml``,
``stage_b_<lens>.yaml``) with ``stage``, optional ``lens``, optional ``system`` and ``user``; users
may edit them or point ``prompt_dir`` at a copy. ``{name}`` fields are filled by :func:`render` from
a :class:`TaskSpec` (which lives in the task's config, ``configs/synth/<task>.yaml``) and the document.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml

Lens = Literal["descriptive", "analogue", "tip-of-the-tongue"]
LENSES: tuple[str, ...] = ("descriptive", "analogue", "tip-of-the-tongue")
"""The three Stage B lenses (the OBLIQ-IR paper, §3.1; the task mechanisms of the data README)."""

STAGE_FIELDS = {
    "A": {"document", "unit", "units", "attribute", "attribute_short"},
    "B": {"document", "unit", "units", "attribute", "attribute_short", "description"},
}
"""The ``{fields}`` a prompt of each stage may use; ``document`` (and ``description`` in Stage B) must appear."""

Messages = list[dict[str, str]]
"""A chat: ``[{"role": "system" | "user", "content": ...}, ...]``, as chat templates and vLLM take it."""


@dataclass
class TaskSpec:
    """How one task's documents are described to the generator (a task's entry in ``configs/synth/``).

    Attributes:
        name: the task name written into each row's ``task`` field (e.g. ``math-theoremqa``).
        lens: the Stage B lens: ``descriptive``, ``analogue`` or ``tip-of-the-tongue``.
        unit: one document, with its article: ``a tweet``.
        units: the plural: ``tweets``.
        attribute: the latent attribute in words, as Stage A is asked to describe it.
        attribute_short: a two- or three-word name of the attribute (``implicit stance``).
        instruction: optional per-task instruction written into each row (the paper's B.3 prefix).
    """

    name: str
    lens: Lens
    unit: str
    units: str
    attribute: str
    attribute_short: str
    instruction: str | None = None

    def __post_init__(self) -> None:
        if self.lens not in LENSES:
            raise ValueError(f"spec.lens: {self.lens!r} is not one of {', '.join(LENSES)}")
        for key in ("name", "unit", "units", "attribute", "attribute_short"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key).strip():
                raise ValueError(f"spec.{key}: must be a non-empty string")


@dataclass(frozen=True)
class Prompt:
    """One prompt file: its path, stage (``A`` or ``B``), lens (Stage B only) and templates."""

    path: str
    stage: str
    lens: str | None
    system: str | None
    user: str


def prompt_file(stage: str, lens: str | None = None) -> str:
    """File name of a stage's prompt: ``stage_a.yaml`` or ``stage_b_<lens>.yaml`` (dashes → underscores)."""
    if stage == "A":
        return "stage_a.yaml"
    if stage != "B" or lens not in LENSES:
        raise ValueError(f"no prompt for stage {stage!r} and lens {lens!r} (stages A, B; lenses {', '.join(LENSES)})")
    return f"stage_b_{lens.replace('-', '_')}.yaml"


def template_fields(template: str, path: str, key: str) -> set[str]:
    names = set()
    try:
        for _, name, spec, conv in string.Formatter().parse(template):
            if name is None:
                continue
            if not name.isidentifier() or spec or conv:
                raise ValueError(f"{path}: {key}: field {{{name}}} must be a plain name (no format spec, index or conversion)")
            names.add(name)
    except ValueError as err:
        if str(err).startswith(path):
            raise
        raise ValueError(f"{path}: {key}: bad template ({err}); write literal braces as {{{{ and }}}}") from None
    return names


def check_prompt_file(path: str, text: str, keys: tuple[str, ...], allowed: set[str], needed: set[str],
                      kind: str) -> tuple[dict, str | None, str]:
    """Parse and check a prompt file (YAML; shared by the synthetic-query and reranking prompts).

    Args:
        path: the file's name for messages.
        text: its content.
        keys: the keys a prompt may have (``system`` and ``user`` among them).
        allowed: the ``{fields}`` its templates may use.
        needed: the fields ``user`` must use.
        kind: what the prompt is for, in messages (``stage A``, ``tourrank``…).

    Returns:
        ``(mapping, system, user)`` with ``system`` (or None) and ``user`` stripped.

    Raises:
        ValueError: not a YAML mapping, an unknown key, ``user`` missing or empty, ``system`` not a
            string, a bad template, a field not allowed, or a needed field missing (file and key named).
    """
    try:
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
    return data, system.strip() if system else None, user.strip()


def load_prompt(stage: str, lens: str | None = None, prompt_dir: str | Path | None = None) -> Prompt:
    """Read and check one prompt file.

    Args:
        stage: ``A`` or ``B``.
        lens: the lens (Stage B only).
        prompt_dir: a folder of prompt files; default the packaged ``obliq/synth/prompts``.

    Returns:
        The :class:`Prompt`.

    Raises:
        FileNotFoundError: no such prompt file.
        ValueError: the file is not a YAML mapping, lacks ``user``, has an unknown key, a field that
            is not allowed for its stage, lacks ``{document}`` (or ``{description}`` in Stage B), or
            its ``stage``/``lens`` disagree with its name (the message names the file and key).
    """
    name = prompt_file(stage, lens)
    if prompt_dir is None:
        source = resources.files("obliq.synth") / "prompts" / name
        path, text = f"obliq/synth/prompts/{name}", source.read_text(encoding="utf-8")
    else:
        file = Path(prompt_dir) / name
        if not file.is_file():
            raise FileNotFoundError(f"{file}: prompt file not found")
        path, text = str(file), file.read_text(encoding="utf-8")
    data, system, user = check_prompt_file(path, text, ("stage", "lens", "system", "user"), STAGE_FIELDS[stage],
                                           {"document"} | ({"description"} if stage == "B" else set()),
                                           f"stage {stage}")
    if str(data.get("stage")) != stage:
        raise ValueError(f"{path}: stage: is {data.get('stage')!r}, expected {stage!r}")
    if stage == "B" and data.get("lens") != lens:
        raise ValueError(f"{path}: lens: is {data.get('lens')!r}, expected {lens!r}")
    return Prompt(path, stage, data.get("lens"), system, user)


def render(prompt: Prompt, spec: TaskSpec, document: str, description: str | None = None) -> Messages:
    """Fill a prompt for one document.

    Args:
        prompt: from :func:`load_prompt`.
        spec: the task's wording.
        document: the document text (braces in it are kept as is).
        description: the Stage A description (Stage B only).

    Returns:
        Chat messages: an optional system message, then the user message.

    Raises:
        ValueError: a Stage B prompt without a description.
    """
    if prompt.stage == "B" and not description:
        raise ValueError(f"{prompt.path}: Stage B needs the Stage A description")
    values = {
        "document": document, "unit": spec.unit, "units": spec.units, "attribute": spec.attribute,
        "attribute_short": spec.attribute_short, "description": description or "",
    }
    messages = []
    if prompt.system:
        messages.append({"role": "system", "content": prompt.system.format_map(values)})
    messages.append({"role": "user", "content": prompt.user.format_map(values)})
    return messages
