"""BM25: obliq's one lexical retriever (evaluation baseline; hard-negative mining can use it too).

Scoring is Lucene's BM25 as implemented by bm25s (Lù, 2024; ``method="lucene"``):
idf = ln(1 + (N − df + 0.5) / (df + 0.5)), term weight = tf / (tf + k1 · (1 − b + b · |d| / avgdl)),
no (k1 + 1) factor; a query term repeated in the query counts each time.

Text analysis, chosen to stay close to the data README's reference BM25: Unicode NFKC and case
folding (:func:`obliq.text.fold`, Unicode TR15: a word in decomposed form (NFD) or with a ligature
matches its plain spelling, C50), tokens are ``\\w+`` runs (Unicode letters, digits, underscore), no
stop-word list, then the Snowball English stemmer (Porter2, via PyStemmer). This one tokenizer
(:func:`obliq.text.words`) serves evaluation, hard-negative mining (both backends) and the
synthetic-query audit. Pass ``stemmer=None`` for the README's exact reference (unstemmed tokens),
which it reproduces to four decimals.

Parameters: k1 = 0.9, b = 0.4 — the Anserini / Pyserini defaults, and the README's reference.

Only documents that share a term with the query are returned (Lucene returns no others), so an
empty document is never a hit, never a hard negative (C17); an all-empty corpus does not raise.
A document without a token (empty, punctuation-only, emoji-only) is not in the index at all: N and
avgdl count only the documents that hold a term, as Lucene's collection statistics do (``docCount``,
``sumTotalTermFreq / docCount``), so adding such documents changes no score (C64).

Equal scores (the same text under two ids) are ordered by document id, descending — trec_eval's
order — before the cut at ``k`` (:func:`obliq.search.exact.ranked`), so the top ``k`` is the same
whatever depth was asked for (issue 24 §2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from obliq.search.exact import ranked, tie_keys
from obliq.text import words

K1 = 0.9
B = 0.4
BM25_STEMMER = "english"
"""The default PyStemmer language (Snowball English, Porter2)."""


class BM25:
    """A BM25 index over a list of texts.

    Args:
        texts: the documents, in index order (empty strings allowed).
        k1: term-frequency saturation (default 0.9).
        b: length normalisation (default 0.4).
        stemmer: a PyStemmer language (default ``english``) or None for no stemming.
        ids: the documents' ids, which break ties (id descending); None: the row number stands for the id.
    """

    def __init__(
        self,
        texts: Sequence[str],
        k1: float = K1,
        b: float = B,
        stemmer: str | None = BM25_STEMMER,
        ids: Sequence[str] | None = None,
    ):
        import bm25s

        self.k1, self.b, self.n_docs = k1, b, len(texts)
        self._keys = tie_keys(ids, len(texts))
        if stemmer:
            import Stemmer

            self._stemmer = Stemmer.Stemmer(stemmer)
        else:
            self._stemmer = None
        tokens = self.tokenize(texts)
        # only the documents holding a token are indexed: N and avgdl as Lucene counts them (C64)
        self._indexed = np.array([i for i, t in enumerate(tokens) if t], dtype=np.int64)
        self.n_empty = len(tokens) - len(self._indexed)
        self._bm25 = None
        if len(self._indexed):  # bm25s cannot index a corpus without a single token
            self._bm25 = bm25s.BM25(method="lucene", k1=k1, b=b)
            self._bm25.index([tokens[i] for i in self._indexed], show_progress=False)

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """The ``\\w+`` tokens of each text after NFKC and case folding (:func:`obliq.text.words`),
        stemmed when a stemmer is set."""
        out = [words(t) for t in texts]
        if self._stemmer is not None:
            out = [self._stemmer.stemWords(t) for t in out]
        return out

    def scores(self, tokens: list[str]) -> np.ndarray:
        """BM25 score of every document for one tokenized query: (n_docs,) float32 (0 = no shared term)."""
        out = np.zeros(self.n_docs, dtype=np.float32)
        ids = self._bm25.get_tokens_ids(tokens) if self._bm25 is not None else []
        if ids:
            out[self._indexed] = self._bm25.get_scores_from_ids(ids)
        return out

    def search_tokens(self, tokens: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` documents for one tokenized query, best first (score > 0 only).

        Returns:
            ``(scores, indices)``: 1-D float32 scores (descending; equal scores by id, descending) and
            int64 document indices; at most ``k`` long, empty when nothing matches.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        s = self.scores(tokens)
        hits = np.flatnonzero(s > 0)
        if len(hits) > k:  # keep the whole tie group at the k-th score, then order and cut
            kth = np.partition(s[hits], len(hits) - k)[len(hits) - k]
            hits = hits[s[hits] >= kth]
        scores, hits = ranked(s[hits], hits, self._keys)
        return scores[:k], hits[:k]

    def search(self, queries: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` documents of each query: a list of ``(scores, indices)``, see :meth:`search_tokens`."""
        return [self.search_tokens(t, k) for t in self.tokenize(queries)]
