"""One place where rerankers talk to the language model: batch the prompts, parse and repair the
replies, fall back on failure, and count everything (the cost of the OBLIQ-IR paper's Table 8).

A **call** is one chat sent to the backend (a TourRank group or a listwise window), however the
backend batches them; replies are read through the LLM layer's one path (:func:`obliq.llm.backends.ask`:
reasoning blocks removed, so ids in a reasoning model's thoughts are never read, C18). A call
**fails** when the backend raises (every chat of that batch fails), when its reasoning never closes
(no answer), or when its reply names no usable candidate; a failed call yields the input order of
its group, so a reranker never crashes and never loses a candidate (:mod:`obliq.rerank.parse`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from time import perf_counter

from obliq.llm.backends import Backend, ask
from obliq.llm.prompts import Messages
from obliq.rerank.parse import REPAIRS, ParsedOrder, parse_permutation, parse_selection

log = logging.getLogger(__name__)


@dataclass
class RerankStats:
    """What reranking cost, summed over the queries it covers.

    Attributes:
        queries: queries reranked, those with nothing to order (≤ 1 candidate: no call) included;
            identity queries are not counted.
        calls: language-model calls (chats sent).
        failed_calls: calls whose group kept its input order (backend error or no usable id).
        repaired_calls: calls whose reply needed at least one repair.
        repairs: repairs by kind (:data:`obliq.rerank.parse.REPAIRS`), counted per identifier.
        prompt_tokens: tokens in (the backend's count, chat template included, padding excluded).
        new_tokens: tokens out.
        seconds: wall time spent in the backend's ``generate``, seconds.
        reasoning: whether the model was let reason (each call's budget then grew by its
            ``reasoning_tokens``); None before the first call.
        reasoning_unclosed: calls whose reasoning never closed (no answer: failed calls).
    """

    queries: int = 0
    calls: int = 0
    failed_calls: int = 0
    repaired_calls: int = 0
    repairs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPAIRS, 0))
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    reasoning: bool | None = None
    reasoning_unclosed: int = 0

    def per_query(self) -> dict[str, float]:
        """Means per reranked query: ``calls``, ``prompt_tokens``, ``new_tokens``, ``seconds``."""
        n = max(self.queries, 1)
        return {
            "calls": self.calls / n,
            "prompt_tokens": self.prompt_tokens / n,
            "new_tokens": self.new_tokens / n,
            "seconds": self.seconds / n,
        }

    def as_dict(self) -> dict:
        """The totals and the per-query means (``per_query``), JSON-ready."""
        out = asdict(self)
        out["seconds"] = round(self.seconds, 4)
        out["per_query"] = {k: round(v, 4) for k, v in self.per_query().items()}
        return out


class Judge:
    """Asks a backend to select or order candidates, with repairs, fallbacks and counts.

    Args:
        backend: returns the text generator (:mod:`obliq.llm.backends`); called at each call, so a
            backend built on first use (:class:`obliq.rerank.reranker.Reranker`) is only loaded when
            a first call is needed, and its loading time is not counted.
        stats: where the counts go.
        temperature: sampling temperature (0 = greedy, the default for reranking).
        tokens_per_id: reply budget per identifier asked for; a call may generate
            ``tokens_per_id * ids + 16`` tokens (``[12], `` is about 5 tokens), plus the backend's
            ``reasoning_tokens`` when it lets the model reason.
    """

    def __init__(
        self, backend: Callable[[], Backend], stats: RerankStats, temperature: float = 0.0, tokens_per_id: int = 6
    ):
        self.backend, self.stats = backend, stats
        self.temperature, self.tokens_per_id = temperature, tokens_per_id

    def _ask(self, prompts: Sequence[Messages], ids: int, seed: int) -> list[str | None]:
        b = self.backend()
        tokens_in, tokens_out, start = b.prompt_tokens, b.new_tokens, perf_counter()
        self.stats.reasoning = bool(getattr(b, "reasoning", False))
        try:
            read = ask(b, prompts, self.tokens_per_id * ids + 16, self.temperature, seed)
            self.stats.reasoning_unclosed += sum(r.text is None for r in read)
            replies: list[str | None] = [r.text for r in read]
        except Exception as err:  # a failed call keeps its group's input order: never a crash
            log.warning(
                "%s failed on %d prompts (%s: %s); their groups keep the input order",
                getattr(b, "name", "backend"),
                len(prompts),
                type(err).__name__,
                err,
            )
            replies = [None] * len(prompts)
        self.stats.seconds += perf_counter() - start
        self.stats.calls += len(prompts)
        self.stats.prompt_tokens += b.prompt_tokens - tokens_in
        self.stats.new_tokens += b.new_tokens - tokens_out
        return replies

    def _count(self, parsed: ParsedOrder) -> list[int]:
        self.stats.failed_calls += parsed.failed
        self.stats.repaired_calls += bool(sum(parsed.repairs.values()))
        for kind, n in parsed.repairs.items():
            self.stats.repairs[kind] += n
        return parsed.order

    def select(
        self, prompts: Sequence[Messages], sizes: Sequence[int], ks: Sequence[int], seed: int
    ) -> list[list[int]]:
        """For each prompt (a group of ``sizes[i]`` candidates), the ``ks[i]`` positions it selects."""
        if not prompts:
            return []
        replies = self._ask(prompts, max(ks), seed)
        return [self._count(parse_selection(r, n, k)) for r, n, k in zip(replies, sizes, ks)]

    def order(self, prompt: Messages, size: int, seed: int) -> list[int]:
        """The permutation of ``size`` candidates one prompt (a listwise window) returns."""
        return self._count(parse_permutation(self._ask([prompt], size, seed)[0], size))
