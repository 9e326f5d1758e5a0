"""Reading a reranker's reply: the candidates it selected (TourRank) or its permutation (listwise).

Prompts number the candidates ``[1]`` … ``[n]`` and ask for identifiers only (``[3], [1]`` or
``[3] > [1] > [2]``). Models answer loosely, so the parse is tolerant:

- identifiers are the bracketed numbers of the reply (``[3]``); when it has none, its bare numbers
  (``3, 1, 2``, ``Passage 3``);
- an identifier outside ``1…n`` is dropped (repair ``out_of_range``), a repeated one is dropped
  (``duplicate``);
- a selection of ``k`` keeps the first ``k`` (the rest: ``extra``) and fills a short one with the
  unselected candidates in input order (``missing``, one per filled place); a permutation appends
  the candidates it left out, in input order (``missing``, one per candidate);
- a reply with no usable identifier at all (or no reply: the backend failed) is a **failed call**:
  the result is the input order (the first ``k`` for a selection).

Every result is therefore a valid selection or permutation of the input: no candidate is lost or
repeated, whatever the model wrote. Repairs are counted per kind (:data:`REPAIRS`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

REPAIRS = ("out_of_range", "duplicate", "extra", "missing")
"""Kinds of repair, counted per identifier (see the module notes)."""

_BRACKETED = re.compile(r"\[\s*(\d+)\s*\]")
_BARE = re.compile(r"(?<![\w.])(\d+)(?!\w|\.\d)")  # a whole number: not in "x12", "3.5"


@dataclass
class ParsedOrder:
    """A repaired reply: ``order`` holds 0-based input positions (the selection, or the whole
    permutation); ``failed`` when nothing usable was found and ``order`` is the input order."""

    order: list[int]
    repairs: Counter = field(default_factory=Counter)
    failed: bool = False


def _identifiers(reply: str | None, n: int, repairs: Counter) -> list[int]:
    """0-based positions named by the reply, in its order, without out-of-range ids or repeats."""
    if not reply:
        return []
    found = _BRACKETED.findall(reply) or _BARE.findall(reply)
    out: list[int] = []
    for token in found:
        i = int(token) - 1
        if not 0 <= i < n:
            repairs["out_of_range"] += 1
        elif i in out:
            repairs["duplicate"] += 1
        else:
            out.append(i)
    return out


def parse_selection(reply: str | None, n: int, k: int) -> ParsedOrder:
    """The ``k`` candidates (of ``n``) a reply selects, repaired.

    Args:
        reply: the model's text, or None when the call failed.
        n: candidates shown, numbered 1…n.
        k: how many the prompt asked for (1 ≤ k ≤ n).

    Returns:
        :class:`ParsedOrder` with exactly ``k`` distinct positions in ``0…n-1``, in the reply's order.

    Raises:
        ValueError: ``k`` outside ``1…n`` (a caller's bug, not the model's).
    """
    if not 1 <= k <= n:
        raise ValueError(f"cannot select {k} of {n} candidates")
    repairs: Counter = Counter()
    chosen = _identifiers(reply, n, repairs)
    if not chosen:
        return ParsedOrder(list(range(k)), repairs, failed=True)
    if len(chosen) > k:
        repairs["extra"] += len(chosen) - k
        chosen = chosen[:k]
    fill = [i for i in range(n) if i not in chosen][: k - len(chosen)]
    if fill:
        repairs["missing"] += len(fill)
    return ParsedOrder(chosen + fill, repairs)


def parse_permutation(reply: str | None, n: int) -> ParsedOrder:
    """The order of ``n`` candidates a reply gives, repaired into a permutation of ``0…n-1``.

    Args:
        reply: the model's text, or None when the call failed.
        n: candidates shown, numbered 1…n.

    Returns:
        :class:`ParsedOrder` whose ``order`` is a permutation: the reply's identifiers first, then the
        candidates it left out, in input order.
    """
    repairs: Counter = Counter()
    ranked = _identifiers(reply, n, repairs)
    if not ranked:
        return ParsedOrder(list(range(n)), repairs, failed=True)
    rest = [i for i in range(n) if i not in ranked]
    if rest:
        repairs["missing"] += len(rest)
    return ParsedOrder(ranked + rest, repairs)
