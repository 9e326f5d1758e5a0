"""Query audit (the OBLIQ-IR paper, §3.1 and Appendix J, Table J.1): do queries leak their sources?

For each (query, source document) pair:

- **entity leak**: the query contains a named entity of the source. No well-kept NER installs
  offline from PyPI with its model inside a package (spaCy's English models are published on
  GitHub, not PyPI; the PyPI copies are third-party re-uploads), so obliq uses a documented
  **capitalised-token heuristic**: the source's entity tokens are its ``\\w+`` tokens (after Unicode
  NFKC, :func:`obliq.text.nfkc`, so that NFD accents and ligatures do not cut words, C50) of at least two
  characters, containing a letter, whose first character is upper case, that are not the first
  token of a sentence (text start, or after ``.``, ``!``, ``?``, ``:``, a newline or an opening
  quote/bracket; a ``.`` after a title such as ``Ms`` or ``Dr`` or after an initial does not end a
  sentence) unless they are written all in capitals (acronyms: ``IRS``), and whose lower-case
  form is not an English function word (``obliq/function_words/english.txt``). The query
  leaks when one of those tokens appears in it with the same spelling (case-sensitive). Known
  limits: it misses lower-case entities (``@user``, hashtags) and single letters, and counts
  mid-sentence capitalised common words (titles such as ``Chairman``, ``Court``).
- **token Jaccard**: ``|Q ∩ D| / |Q ∪ D|`` over the sets of tokens of query and source from obliq's
  one lexical tokenizer, BM25's (:func:`obliq.text.words`: NFKC, case folding, ``\\w+``; no stemming,
  no stop-word removal).
- **BM25 rank of the source** for the query over the whole task corpus (obliq's one BM25,
  :class:`obliq.search.bm25.BM25`): 1 + the number of documents scoring strictly higher; ``None``
  when the source shares no term with the query (never retrieved).

A query with several sources (real queries: every relevant document of the qrels) gets the mean of
its pairs' values; the table then averages over queries (macro), so generated queries (one source
each) and real queries compare on the same footing.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from obliq.search.bm25 import BM25
from obliq.text import WORD, load_function_words, nfkc, words

_SENTENCE_START = set(".!?:\n\"“‘'([{")
_TITLES = frozenset("mr mrs ms dr prof sen rep gov gen lt col sgt capt st jr sr rev hon mt ft".split())


@functools.cache
def function_words() -> frozenset[str]:
    """English function words, lowercase (:func:`obliq.text.load_function_words`)."""
    return frozenset(load_function_words("english"))


def entity_tokens(text: str) -> set[str]:
    """Capitalised-token entities of a text (see the module notes for the exact rule)."""
    stop = function_words()
    found = set()
    text = nfkc(text)
    for m in WORD.finditer(text):
        tok = m.group()
        if len(tok) < 2 or not tok[0].isupper() or not any(c.isalpha() for c in tok):
            continue
        if tok.lower() in stop:
            continue
        before = text[: m.start()].rstrip(" \t")
        initial = not before or before[-1] in _SENTENCE_START
        if initial and before.endswith("."):  # "Ms. Ingram", "J. Smith": an abbreviation, not a sentence end
            prev = WORD.findall(before[-12:])
            initial = not prev or not (prev[-1].lower() in _TITLES or (len(prev[-1]) == 1 and prev[-1].isupper()))
        if initial and not (tok.isupper() and sum(c.isalpha() for c in tok) >= 2):
            continue
        found.add(tok)
    return found


def leaked(query: str, source: str) -> set[str]:
    """The source's entity tokens that the query contains (case-sensitive, whole tokens, both NFKC)."""
    ents = entity_tokens(source)
    return ents & set(WORD.findall(nfkc(query))) if ents else set()


def leaks(query: str, source: str) -> bool:
    """Whether the query contains one of the source's entity tokens (case-sensitive, whole tokens)."""
    return bool(leaked(query, source))


def jaccard(query: str, source: str) -> float:
    """Token Jaccard of :func:`obliq.text.words` token sets (BM25's tokens, unstemmed); 0.0 when both are empty."""
    a, b = set(words(query)), set(words(source))
    return len(a & b) / len(a | b) if a | b else 0.0


def source_rank(bm25: BM25, query: str, doc_index: int) -> int | None:
    """BM25 rank (1 = best) of one document for a query; None when it scores 0 (no shared term)."""
    return rank_of(bm25.scores(bm25.tokenize([query])[0]), doc_index)


def rank_of(scores, j: int) -> int | None:
    """The rank of document ``j`` in one query's BM25 ``scores`` (all documents): 1 + the documents
    scoring strictly higher (ties share the better rank); None when it scores 0 (no shared term)."""
    return 1 + int((scores > scores[j]).sum()) if scores[j] > 0 else None


@dataclass
class AuditRow:
    """One line of the audit table.

    Attributes:
        name: what was audited (``generated`` or ``real``).
        queries: queries audited.
        pairs: (query, source) pairs.
        entity_leak: share of queries leaking an entity of a source (mean over each query's sources).
        jaccard: mean token Jaccard.
        median_rank: median BM25 rank of the sources (pairs never retrieved count as last).
        rank1: share of pairs whose source is BM25's top document.
        top10: share of pairs whose source is in BM25's top 10.
        unretrieved: share of pairs whose source shares no term with the query.
    """

    name: str
    queries: int
    pairs: int
    entity_leak: float
    jaccard: float
    median_rank: float | None
    rank1: float
    top10: float
    unretrieved: float


def audit_pairs(
    name: str, queries: Sequence[str], sources: Sequence[Sequence[int]], doc_texts: Sequence[str], bm25: BM25
) -> AuditRow:
    """Audit queries against their source documents.

    Args:
        name: the table row's name.
        queries: the query texts.
        sources: for each query, the indices (into ``doc_texts``) of its source documents (at least one).
        doc_texts: the task corpus (the BM25 index's order).
        bm25: a :class:`obliq.search.bm25.BM25` over ``doc_texts``.

    Returns:
        An :class:`AuditRow` (rates are fractions in [0, 1]).

    Raises:
        ValueError: a query without sources, or lengths that differ.
    """
    if len(queries) != len(sources):
        raise ValueError(f"{len(queries)} queries but {len(sources)} source lists")
    leak_q, jac_q, ranks = [], [], []
    for q, src in zip(queries, sources):
        if not src:
            raise ValueError(f"query {q[:60]!r} has no source document")
        scores = bm25.scores(bm25.tokenize([q])[0])
        leak_q.append(statistics.fmean(float(leaks(q, doc_texts[j])) for j in src))
        jac_q.append(statistics.fmean(jaccard(q, doc_texts[j]) for j in src))
        ranks.extend(rank_of(scores, j) for j in src)
    n_pairs = len(ranks)
    last = len(doc_texts) + 1
    return AuditRow(
        name=name,
        queries=len(queries),
        pairs=n_pairs,
        entity_leak=statistics.fmean(leak_q) if leak_q else 0.0,
        jaccard=statistics.fmean(jac_q) if jac_q else 0.0,
        median_rank=float(statistics.median(r if r is not None else last for r in ranks)) if ranks else None,
        rank1=sum(r == 1 for r in ranks) / n_pairs if n_pairs else 0.0,
        top10=sum(r is not None and r <= 10 for r in ranks) / n_pairs if n_pairs else 0.0,
        unretrieved=sum(r is None for r in ranks) / n_pairs if n_pairs else 0.0,
    )


def format_audit(task: str, rows: Sequence[AuditRow]) -> str:
    """A plain-text table of audit rows (rates in percent)."""
    head = (
        f"{'task':<20} {'queries':<10} {'n':>6} {'pairs':>7} {'leak %':>7} {'jaccard':>8} {'med rank':>9} "
        f"{'rank1 %':>8} {'top10 %':>8} {'unret %':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        med = f"{r.median_rank:.1f}" if r.median_rank is not None else "-"
        lines.append(
            f"{task:<20} {r.name:<10} {r.queries:>6} {r.pairs:>7} {100 * r.entity_leak:>7.1f} {r.jaccard:>8.3f} "
            f"{med:>9} {100 * r.rank1:>8.1f} {100 * r.top10:>8.1f} {100 * r.unretrieved:>8.1f}"
        )
    return "\n".join(lines)
