"""The reranking policy file: which reranker each task gets, and how the rerankers run.

A policy (the OBLIQ-IR paper's π*, §5 "When language-model reranking helps") is one YAML file,
read by ``python evaluate.py --rerank FILE``, ``obliq rerank run --policy FILE`` and ``obliq rerank
policy --base FILE`` (which writes one). Every key is optional::

    tasks:                      # task name -> identity | tourrank | listwise; tasks not named: identity
      math-theoremqa: tourrank
      writing-news: identity
    depth: 100                  # N: the dense top-N is reranked; documents below keep their order
    backend: {name: vllm, model: Qwen/Qwen2.5-32B-Instruct, tensor_parallel_size: 1}
    tourrank: {stages: [50, 20, 10, 5, 2], group_size: 20, tournaments: 5}
    listwise: {window: 100, step: 50}
    max_query_words: 200        # prompts cut queries and documents to this many words
    max_doc_words: 100
    temperature: 0.0
    tokens_per_id: 6            # reply budget: tokens_per_id * identifiers asked for + 16
    seed: 13
    prompt_dir: null            # a folder of prompt files that wins over obliq/rerank/prompts
    dev: {}                     # written by `obliq rerank policy`: the development numbers behind each choice

Relative paths in a policy file (``prompt_dir``; ``backend.model`` when it starts with ``.`` or names
something next to the file) are resolved against the file's folder, not the current directory.
:func:`load_policy` checks every value (the backend's too) and reads and checks every prompt file
the policy will use, so nothing fails later. Bad input fails with one line naming the file, the line
and the key (``policy.yaml:7:tourrank.stages: must be strictly decreasing``); a bad prompt file is
named itself (``prompts/tourrank.yaml: user: must contain {query}``). Ready-made files:
``configs/rerank/``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from obliq.errors import check_int
from obliq.files import read_text
from obliq.llm.backends import BackendConfig, backend_config
from obliq.llm.prompts import PromptTemplate
from obliq.rerank.prompts import load_rerank_prompt
from obliq.yaml_checks import check_yaml

log = logging.getLogger(__name__)

METHODS = ("identity", "tourrank", "listwise")
"""Per-task choices: keep the dense order, TourRank, or the task-aware listwise reranker."""


@dataclass
class TourRankConfig:
    """TourRank's shape (:mod:`obliq.rerank.tourrank`).

    Attributes:
        stages: how many candidates advance out of each stage, strictly decreasing (the paper's
            100 → 50 → 20 → 10 → 5 → 2 is depth 100 with stages ``[50, 20, 10, 5, 2]``); stages not
            smaller than the number of candidates are skipped (a top-20 runs 20 → 10 → 5 → 2).
        group_size: most candidates in one group, i.e. in one call (``g``).
        tournaments: tournaments run with different groupings, points summed (``Y``; the paper: 5).
    """

    stages: list[int] = field(default_factory=lambda: [50, 20, 10, 5, 2])
    group_size: int = 20
    tournaments: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.stages, (list, tuple)) or not self.stages:
            raise ValueError(f"stages: must be a non-empty list of integers, got {self.stages!r}")
        for s in self.stages:
            check_int("stages", s, 1)
        if any(a <= b for a, b in zip(self.stages, self.stages[1:])):
            raise ValueError(f"stages: must be strictly decreasing, got {list(self.stages)}")
        self.stages = list(self.stages)
        check_int("group_size", self.group_size, 2)
        check_int("tournaments", self.tournaments, 1)


@dataclass
class ListwiseConfig:
    """The listwise reranker's sliding window (:mod:`obliq.rerank.listwise`).

    Attributes:
        window: most candidates in one prompt (one call); a top-N of at most ``window`` is one call.
        step: how far the window moves up after each call (``step < window`` makes windows overlap,
            so a good candidate can climb from the bottom window to the top).
    """

    window: int = 20
    step: int = 10

    def __post_init__(self) -> None:
        check_int("window", self.window, 2)
        check_int("step", self.step, 1)
        if self.step > self.window:
            raise ValueError(f"step: must be at most window ({self.window}), got {self.step}")


@dataclass
class RerankConfig:
    """A reranking policy and the settings of its rerankers (the module notes list the keys)."""

    tasks: dict[str, str] = field(default_factory=dict)
    depth: int = 100
    backend: BackendConfig = field(default_factory=backend_config)
    tourrank: TourRankConfig = field(default_factory=TourRankConfig)
    listwise: ListwiseConfig = field(default_factory=ListwiseConfig)
    max_query_words: int = 200
    max_doc_words: int = 100
    temperature: float = 0.0
    tokens_per_id: int = 6
    seed: int = 13
    prompt_dir: str | None = None
    dev: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.tasks, dict):
            raise ValueError(f"tasks: must map task names to one of {', '.join(METHODS)}")
        for name, method in self.tasks.items():
            if method not in METHODS:
                raise ValueError(f"tasks.{name}: must be one of {', '.join(METHODS)}, got {method!r}")
        for key in ("depth", "max_query_words", "max_doc_words", "tokens_per_id"):
            check_int(key, getattr(self, key), 1)
        check_int("seed", self.seed, 0)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature: must be a number >= 0, got {self.temperature!r}")
        if self.prompt_dir is not None and not Path(self.prompt_dir).is_dir():
            raise ValueError(f"prompt_dir: not a folder: {self.prompt_dir}")
        if not isinstance(self.dev, dict):
            raise ValueError("dev: must be a mapping (written by `obliq rerank policy`)")
        self._prompts: dict[tuple[str, str], PromptTemplate] = {}

    def method(self, task: str) -> str:
        """The reranker a task gets: its entry in ``tasks``, else ``identity``."""
        return self.tasks.get(task, "identity")

    def prompt(self, method: str, task: str) -> PromptTemplate:
        """The prompt ``method`` (``tourrank`` or ``listwise``) uses on ``task``: read and checked
        by :func:`obliq.rerank.prompts.load_rerank_prompt` (``prompt_dir`` first), logged (INFO), then kept."""
        if (method, task) not in self._prompts:
            self._prompts[method, task] = load_rerank_prompt(method, task, self.prompt_dir)
            log.info("%s: %s prompt %s", task, method, self._prompts[method, task].path)
        return self._prompts[method, task]


_SECTIONS = {"backend": backend_config, "tourrank": TourRankConfig, "listwise": ListwiseConfig}


def _key_lines(node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """1-based line of every mapping key of a composed YAML document, by key path."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = path + (str(key.value),)
            out[here] = key.start_mark.line + 1
            _key_lines(value, here, out)
    return out


def load_policy(path: str | Path) -> RerankConfig:
    """Read and check a policy file, and the prompt file of every task it names with a reranker.

    Relative paths (``prompt_dir``; ``backend.model`` when it starts with ``.`` or names something in
    the file's folder) are resolved against the file's folder and kept absolute.

    Raises:
        FileNotFoundError: no such file; no prompt file for a named task.
        ValueError: not YAML, not a mapping, an unknown key or a bad value; the message is
            ``<file>:<line>:<key>: <what is wrong>``. A bad prompt file: the message names it
            (:func:`obliq.rerank.prompts.load_rerank_prompt`).
    """
    path = Path(path)
    text = read_text(path)
    try:
        check_yaml(text, path)  # a key given twice, a nested-alias bomb: refused before loading
        data, lines = yaml.safe_load(text), _key_lines(yaml.compose(text))
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from None
    data = {} if data is None else data

    def where(*keys: str) -> str:
        found = [lines[keys[:i]] for i in range(len(keys), 0, -1) if keys[:i] in lines]
        return f"{path}:{found[0] if found else 1}:{'.'.join(keys) or '(top)'}"

    def build(cls, values, prefix: tuple):
        if not isinstance(values, dict):
            raise ValueError(f"{where(*prefix)}: expected a mapping, got {type(values).__name__}")
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else values
        for key in values:  # backend_config checks its keys itself: they are those of the backend it names
            if key not in names:
                raise ValueError(f"{where(*prefix, str(key))}: unknown key (expected one of {', '.join(names)})")
        try:
            return cls(**values)
        except ValueError as err:
            key, _, message = str(err).partition(": ")
            raise ValueError(f"{where(*prefix, *key.split('.'))}: {message}") from None

    if isinstance(data, dict):

        def near(value: str) -> str:  # a relative path in the file: from the file's folder
            return str((path.parent / Path(value).expanduser()).resolve())

        if isinstance(data.get("prompt_dir"), str):
            data = {**data, "prompt_dir": near(data["prompt_dir"])}
        model = data["backend"].get("model") if isinstance(data.get("backend"), dict) else None
        if isinstance(model, str) and model and (model.startswith((".", "~")) or (path.parent / model).exists()):
            data = {**data, "backend": {**data["backend"], "model": near(model)}}
        data = {**data, **{k: build(c, data[k], (k,)) for k, c in _SECTIONS.items() if k in data}}
    config = build(RerankConfig, data, ())
    for task, method in config.tasks.items():
        if method != "identity":
            config.prompt(method, task)
    return config


def dump_policy(config: RerankConfig, path: str | Path, header: str = "") -> None:
    """Write a policy file (``header``: comment lines put on top, e.g. the command that made it)."""
    body = yaml.safe_dump(asdict(config), sort_keys=False, allow_unicode=True)
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(comments + body, encoding="utf-8")
