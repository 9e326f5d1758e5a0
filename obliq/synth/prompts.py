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
may edit them or point ``prompt_dir`` at a copy. ``{name}`` fields are filled by :func:`render_stage` from
a :class:`TaskSpec` (which lives in the task's config, ``configs/synth/<task>.yaml``) and the document.

**Few-shot Stage B** (Promptagator, Dai et al. 2022, §3; InPars, Bonifacio et al. 2022): a Stage B file
may hold ``examples_intro`` (a sentence introducing the examples) and ``example`` (one example's
template, with ``{number}``, ``{example_document}`` and ``{example_query}``). When examples are given,
the ``{examples}`` field of ``user`` becomes the intro, the examples, and a blank line; without
examples it is empty, so a prompt written ``{examples}Here is {unit}: …`` reads exactly as before.
The examples are real (document, query) pairs of the task's development side
(:mod:`obliq.synth.generate` chooses them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from obliq.llm.prompts import Messages, PromptTemplate, find_prompt, read_prompt, template_fields

Lens = Literal["descriptive", "analogue", "tip-of-the-tongue"]
LENSES: tuple[str, ...] = ("descriptive", "analogue", "tip-of-the-tongue")
"""The three Stage B lenses (the OBLIQ-IR paper, §3.1; the task mechanisms of the data README)."""

STAGE_FIELDS = {
    "A": {"document", "unit", "units", "attribute", "attribute_short"},
    "B": {"document", "unit", "units", "attribute", "attribute_short", "description", "examples"},
}
"""The ``{fields}`` a prompt of each stage may use; ``document`` (and ``description`` in Stage B) must appear."""
EXAMPLE_FIELDS = {
    "examples_intro": ({"unit", "units", "attribute_short"}, set()),
    "example": (
        {"number", "example_document", "example_query", "unit", "units", "attribute_short"},
        {"example_document", "example_query"},
    ),
}
"""A Stage B file's few-shot keys: ``key → (fields it may use, fields it must use)``."""


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


def prompt_file(stage: str, lens: str | None = None) -> str:
    """File name of a stage's prompt: ``stage_a.yaml`` or ``stage_b_<lens>.yaml`` (dashes → underscores)."""
    if stage == "A":
        return "stage_a.yaml"
    if stage != "B" or lens not in LENSES:
        raise ValueError(f"no prompt for stage {stage!r} and lens {lens!r} (stages A, B; lenses {', '.join(LENSES)})")
    return f"stage_b_{lens.replace('-', '_')}.yaml"


def load_stage_prompt(stage: str, lens: str | None = None, prompt_dir: str | Path | None = None) -> PromptTemplate:
    """Read and check one stage's prompt file (:func:`obliq.llm.prompts.read_prompt`).

    Args:
        stage: ``A`` or ``B``.
        lens: the lens (Stage B only).
        prompt_dir: a folder of prompt files replacing the packaged ones (``obliq/synth/prompts``):
            every stage's file must be there.

    Returns:
        The checked template; its ``header`` holds ``stage``, ``lens`` and, for a few-shot Stage B
        file, ``examples_intro`` and ``example``.

    Raises:
        FileNotFoundError: no such prompt file.
        ValueError: the file is not a YAML mapping, lacks ``user``, has an unknown key, a field that
            is not allowed for its stage, lacks ``{document}`` (or ``{description}`` in Stage B), its
            ``stage``/``lens`` disagree with its name, or a few-shot key is not a string, uses a field it
            may not or lacks one it must (the message names the file and key).
    """
    name = prompt_file(stage, lens)
    if prompt_dir is not None and not (Path(prompt_dir) / name).is_file():
        raise FileNotFoundError(f"{Path(prompt_dir) / name}: prompt file not found")
    path, text = find_prompt([name], prompt_dir, "obliq.synth")
    prompt = read_prompt(
        path,
        text,
        ("stage", "lens", *(EXAMPLE_FIELDS if stage == "B" else ())),
        STAGE_FIELDS[stage],
        {"document"} | ({"description"} if stage == "B" else set()),
        f"stage {stage}",
    )
    if str(prompt.header.get("stage")) != stage:
        raise ValueError(f"{path}: stage: is {prompt.header.get('stage')!r}, expected {stage!r}")
    if stage == "B" and prompt.header.get("lens") != lens:
        raise ValueError(f"{path}: lens: is {prompt.header.get('lens')!r}, expected {lens!r}")
    for key, (allowed, needed) in EXAMPLE_FIELDS.items():
        template = prompt.header.get(key)
        if template is None:
            continue
        if not isinstance(template, str) or not template.strip():
            raise ValueError(f"{path}: {key}: expected a non-empty string")
        used = template_fields(template, path, key)
        if used - allowed:
            raise ValueError(f"{path}: {key}: unknown field(s) {sorted(used - allowed)}; it allows {sorted(allowed)}")
        if needed - used:
            raise ValueError(f"{path}: {key}: must contain {', '.join('{' + n + '}' for n in sorted(needed - used))}")
        prompt.header[key] = template.strip()
    return prompt


def takes_examples(prompt: PromptTemplate) -> bool:
    """Whether a Stage B prompt can show few-shot examples: its ``user`` has ``{examples}`` and the file
    an ``example`` template."""
    return "examples" in template_fields(prompt.user, prompt.path, "user") and "example" in prompt.header


def render_examples(prompt: PromptTemplate, spec: TaskSpec, examples: Sequence[tuple[str, str]]) -> str:
    """The ``{examples}`` block of a Stage B prompt: ``examples_intro``, then each ``(document, query)``
    pair through ``example`` (numbered from 1), each followed by a blank line; ``""`` for no example.

    Raises:
        ValueError: examples for a prompt that cannot show them (:func:`takes_examples`).
    """
    if not examples:
        return ""
    if not takes_examples(prompt):
        raise ValueError(
            f"{prompt.path}: few-shot examples need an `example` template and an {{examples}} field in user"
        )
    words = {"unit": spec.unit, "units": spec.units, "attribute_short": spec.attribute_short}
    parts = [prompt.header["examples_intro"].format_map(words)] if prompt.header.get("examples_intro") else []
    for number, (document, query) in enumerate(examples, 1):
        parts.append(
            prompt.header["example"].format_map(
                {**words, "number": number, "example_document": document, "example_query": query}
            )
        )
    return "\n\n".join(parts) + "\n\n"


def render_stage(
    prompt: PromptTemplate,
    spec: TaskSpec,
    document: str,
    description: str | None = None,
    examples: Sequence[tuple[str, str]] = (),
) -> Messages:
    """Fill a stage's prompt for one document.

    Args:
        prompt: from :func:`load_stage_prompt`.
        spec: the task's wording.
        document: the document text (braces in it are kept as is).
        description: the Stage A description (Stage B only).
        examples: few-shot ``(document, query)`` pairs shown before the document (Stage B only;
            :func:`render_examples`).

    Returns:
        Chat messages: an optional system message, then the user message.

    Raises:
        ValueError: a Stage B prompt without a description; examples the prompt cannot show.
    """
    if prompt.header.get("stage") == "B" and not description:
        raise ValueError(f"{prompt.path}: Stage B needs the Stage A description")
    return prompt.render(
        {
            "document": document,
            "unit": spec.unit,
            "units": spec.units,
            "attribute": spec.attribute,
            "attribute_short": spec.attribute_short,
            "description": description or "",
            "examples": render_examples(prompt, spec, examples),
        }
    )
