"""Frozen teachers (kNN-graph distillation, teacher-mined negatives, the teacher as a retriever): one
interface, texts → (n, d) unit float32 vectors.

The paper's teacher (§3.2) is a frozen authorship encoder (LUAR, Rivera-Soto et al., 2021) whose
neighbour structure separates authors from topics; only the topology of its kNN graph is used.
Two kinds are provided:

- :class:`EncoderTeacher`: any model that :func:`obliq.search.encoders.load_encoder` loads (a
  sentence-transformers or transformers folder, an alias such as ``minilm``, a hub id when the hub
  is reachable, or an obliq model folder), encoded as passages.
- :class:`StylometricTeacher`: an offline stylometric space on scikit-learn that needs no weights:
  character n-gram TF-IDF plus z-scored function-word frequencies (Burrows' Delta features), each
  block L2-normalised, weighted and concatenated, then L2-normalised again (see
  :class:`StylometricConfig` and ``docs/distill.md`` for how the defaults were chosen).

:func:`load_teacher` maps a name to a teacher: ``stylometric`` or anything else for an encoder.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from obliq.errors import check_int
from obliq.search.exact import unit_float32
from obliq.text import load_function_words

TEACHER_MAX_LENGTH = 512
"""Tokens an encoder teacher reads of a text (further capped by the model's own maximum)."""

STYLOMETRIC = "stylometric"
"""The name :func:`load_teacher` maps to :class:`StylometricTeacher`."""

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


class Teacher(Protocol):
    """What distillation needs from a teacher."""

    name: str
    """A short name for tables and reports."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 unit vectors for n texts, row i for ``texts[i]``."""
        ...

    def describe(self) -> dict:
        """The teacher's settings, for the JSON reports."""
        ...


class EncoderTeacher:
    """A neural encoder as a frozen teacher (the paper's setting, §3.2).

    Texts are encoded as passages (``kind="passage"``: sentence-transformers' ``encode_document``,
    or obliq's ``passage: `` prefix for an obliq model) and renormalised in float32
    (:func:`obliq.search.exact.unit_float32`).

    Args:
        model: an alias (``minilm``), a local folder, or a hub id (needs the hub or its cache).
        encoder: ``auto`` | ``sentence-transformers`` | ``obliq``, as in
            :func:`obliq.search.encoders.load_encoder`.
        max_length: token limit for a text (further capped by the model's own maximum, e.g. 256
            for all-MiniLM-L6-v2).
        batch_size: texts per forward pass.
        trust_remote_code: run a hub model's own Python code (e.g. an authorship encoder with a
            custom architecture). Off by default; only turn it on for a model you trust.

    Raises:
        OSError / FileNotFoundError: from the loaders when the model cannot be found offline.
    """

    def __init__(
        self,
        model: str,
        encoder: Literal["auto", "sentence-transformers", "obliq"] = "auto",
        max_length: int = TEACHER_MAX_LENGTH,
        batch_size: int = 32,
        trust_remote_code: bool = False,
    ):
        from obliq.search.encoders import load_encoder

        self.model, self.encoder_kind, self.max_length = str(model), encoder, max_length
        self.batch_size, self.trust_remote_code = batch_size, trust_remote_code
        self.encoder = load_encoder(self.model, encoder, trust_remote_code=trust_remote_code)
        self.name = Path(self.model).name if Path(self.model).exists() else self.model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 unit vectors of ``texts`` encoded as passages.

        Raises:
            ValueError: the encoder returned a zero or non-finite vector.
        """
        if not len(texts):
            raise ValueError("no texts to encode")
        vectors = self.encoder.encode(
            list(texts), kind="passage", batch_size=self.batch_size, max_length=self.max_length
        )
        return unit_float32(vectors, f"{self.name} embeddings")

    def describe(self) -> dict:
        return {
            "kind": "encoder",
            "model": self.model,
            "encoder": self.encoder_kind,
            "max_length": self.max_length,
            "trust_remote_code": self.trust_remote_code,
        }


@dataclass
class StylometricConfig:
    """Settings of :class:`StylometricTeacher`; the defaults were chosen by the purity diagnostic on
    the authorship tasks (``docs/distill.md``)."""

    analyzer: Literal["char", "char_wb"] = "char"
    """scikit-learn's n-gram analyzer: ``char`` (n-grams across word boundaries, punctuation and
    spacing included) or ``char_wb`` (n-grams inside word boundaries only)."""
    ngram_min: int = 1
    """Shortest character n-gram."""
    ngram_max: int = 4
    """Longest character n-gram."""
    max_features: int | None = 20000
    """Character n-gram vocabulary size: the most frequent n-grams over the corpus, a tie at the cut
    decided by the n-gram itself (None: all). Memory is n_texts × (max_features + function words) × 4
    bytes."""
    min_df: int = 2
    """Drop n-grams found in fewer documents than this (1 keeps all)."""
    lowercase: bool = False
    """Lowercase before taking n-grams (False keeps capitalisation habits as a feature)."""
    sublinear_tf: bool = True
    """Use 1 + log(tf) instead of raw counts."""
    function_words: str = "english"
    """A built-in list (``english``: 236 words; ``mosteller-wallace``: Mosteller & Wallace's 70) or a
    text file with one word a line (``#`` starts a comment); an empty string disables the block."""
    function_word_weight: float = 0.05
    """Weight w of the function-word block: the teacher's cosine is (1 − w) · cos(char n-grams) +
    w · cos(z-scored function-word frequencies); 0 uses character n-grams only."""

    def __post_init__(self):
        if self.analyzer not in ("char", "char_wb"):
            raise ValueError(f"analyzer must be 'char' or 'char_wb', got {self.analyzer!r}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.max_features is not None and self.max_features < 1:
            raise ValueError(f"max_features must be positive or None, got {self.max_features}")
        if self.min_df < 1:
            raise ValueError(f"min_df must be at least 1, got {self.min_df}")
        if not 0.0 <= self.function_word_weight <= 1.0:
            raise ValueError(f"function_word_weight must lie in [0, 1], got {self.function_word_weight}")
        if self.function_word_weight > 0 and not self.function_words:
            raise ValueError("function_word_weight > 0 needs a function-word list")


def _top_terms(terms: np.ndarray, counts: np.ndarray, limit: int | None) -> list[str]:
    """The ``limit`` most frequent of ``terms`` (corpus counts ``counts``), in term order, chosen by a
    rule without ties: count descending, then the term itself ascending.

    scikit-learn's ``max_features`` keeps the top terms by an unstable ``argsort`` of the counts, so
    when many n-grams share the count at the cut (811 at rank 20,000 on the quickstart corpus) the ones
    it keeps depend on numpy's vector kernels, i.e. on the CPU (issue 31 §0).
    """
    if limit is None or limit >= len(terms):
        return list(terms)
    keep = np.lexsort((terms, -counts))[:limit]  # last key first: count descending, then the term
    return [str(t) for t in np.sort(terms[keep])]


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


class StylometricTeacher:
    """An offline stylometric teacher on scikit-learn; no weights, no GPU.

    Features (classic authorship-attribution features):

    - character n-gram TF-IDF (Stamatatos, 2009; scikit-learn's ``TfidfVectorizer``), rows L2-normalised;
    - relative frequencies of function words (Mosteller & Wallace, 1964) — word count over the number
      of ``[a-z]+('[a-z]+)?`` tokens of the lowercased text — z-scored per word over the corpus as in
      Burrows' Delta (Burrows, 2002), rows L2-normalised.

    The two blocks are scaled by sqrt(1 − w) and sqrt(w) and concatenated, so the cosine of two texts
    is (1 − w) · char cosine + w · function-word cosine; the result is L2-normalised.

    The vocabulary, idf and z-score statistics are fitted on a corpus: :meth:`fit`, or the first
    call of :meth:`encode` fits on the texts it is given (the kNN graph encodes the whole corpus in
    one call, so the teacher sees exactly the corpus it organises). Labels are never used.

    Args:
        config: the settings (defaults: :class:`StylometricConfig`).
    """

    name = STYLOMETRIC

    def __init__(self, config: StylometricConfig | None = None):
        self.config = config or StylometricConfig()
        self.function_words = load_function_words(self.config.function_words) if self.config.function_words else []
        self._vectorizer = None
        self._fw_mean = self._fw_std = None

    @property
    def fitted(self) -> bool:
        return self._vectorizer is not None

    def _function_word_frequencies(self, texts: Sequence[str]) -> np.ndarray:
        col = {w: j for j, w in enumerate(self.function_words)}
        out = np.zeros((len(texts), len(col)), dtype=np.float64)
        for i, text in enumerate(texts):
            tokens = _WORD.findall(text.lower())
            for tok in tokens:
                j = col.get(tok)
                if j is not None:
                    out[i, j] += 1
            if tokens:
                out[i] /= len(tokens)
        return out

    def fit(self, texts: Sequence[str]) -> StylometricTeacher:
        """Fit the n-gram vocabulary, idf weights and function-word means/deviations on ``texts``.

        Raises:
            ValueError: no texts, or no n-gram survives ``min_df`` / the vocabulary is empty.
        """
        from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

        texts = list(texts)
        if not texts:
            raise ValueError("no texts to fit the stylometric teacher on")
        c = self.config
        min_df = c.min_df if len(texts) >= c.min_df else 1
        reading = dict(analyzer=c.analyzer, ngram_range=(c.ngram_min, c.ngram_max), lowercase=c.lowercase)
        counter = CountVectorizer(**reading, min_df=min_df, dtype=np.int64)
        try:
            counts = np.asarray(counter.fit_transform(texts).sum(axis=0)).ravel()
        except ValueError as e:  # scikit-learn: "empty vocabulary" / "After pruning, no terms remain"
            raise ValueError(f"stylometric teacher: {e}") from None
        self._vectorizer = TfidfVectorizer(
            **reading,
            vocabulary=_top_terms(counter.get_feature_names_out(), counts, c.max_features),
            sublinear_tf=c.sublinear_tf,
            dtype=np.float64,
        )
        self._vectorizer.fit(texts)
        if self.function_words:
            freq = self._function_word_frequencies(texts)
            self._fw_mean, self._fw_std = freq.mean(axis=0), freq.std(axis=0)
        return self

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 unit vectors, d = n-gram vocabulary + number of function words.

        Fits on ``texts`` first when :meth:`fit` has not been called.

        Raises:
            ValueError: no texts, or a text without any n-gram of the vocabulary (e.g. an empty
                text; with ``function_word_weight=1``: without any word) — its index is named.
        """
        texts = list(texts)
        if not texts:
            raise ValueError("no texts to encode")
        if not self.fitted:
            self.fit(texts)
        w = self.config.function_word_weight
        raw = self._vectorizer.transform(texts)
        # a text without any character n-gram of the vocabulary (e.g. an empty one) has no style to
        # measure; its function-word z-scores alone would place it at the corpus's "absent words" corner
        zero = (
            np.flatnonzero(raw.getnnz(axis=1) == 0)
            if w < 1
            else np.flatnonzero([not _WORD.search(t.lower()) for t in texts])
        )
        if len(zero):
            raise ValueError(
                f"{len(zero)} texts have no stylometric signal (no known character n-gram), "
                f"e.g. text {int(zero[0])}: {texts[int(zero[0])][:60]!r}"
            )
        fw = None
        if self.function_words and w > 0:
            z = self._function_word_frequencies(texts) - self._fw_mean
            std = self._fw_std
            fw = np.sqrt(w) * _unit_rows(np.divide(z, std, out=np.zeros_like(z), where=std > 0))
        # float64 throughout, rounded to float32 once (unit_float32), a block of rows at a time: the
        # vectors then do not depend on the CPU's vector kernels (issue 31 §0)
        out = np.empty((len(texts), raw.shape[1] + (0 if fw is None else fw.shape[1])), dtype=np.float32)
        step = max(1, (1 << 22) // out.shape[1])
        for start in range(0, len(texts), step):
            rows = slice(start, start + step)
            block = np.sqrt(1.0 - w) * _unit_rows(raw[rows].toarray())
            if fw is not None:
                block = np.hstack([block, fw[rows]])
            out[rows] = unit_float32(block, "stylometric vectors")
        return out

    def describe(self) -> dict:
        return {"kind": "stylometric", **asdict(self.config), "n_function_words": len(self.function_words)}


class TeacherEncoder:
    """A teacher used directly as a retriever: the ``encode(texts, kind, batch_size, max_length)`` that
    :func:`obliq.search.retrieval.make_retriever` takes. Queries and passages are encoded alike, and whole
    (a teacher has no token limit: ``max_length`` does not apply).

    Args:
        teacher: a :class:`Teacher`.

    Use :meth:`stylometric` for the stylometric teacher fitted on a task's corpus, as the kNN graph
    fits it (the quickstart's and the distillation benches' "teacher" row).
    """

    def __init__(self, teacher: Teacher):
        self.teacher = teacher
        self.name_or_path = teacher.name

    @classmethod
    def stylometric(cls, corpus: Sequence[str], config: StylometricConfig | None = None) -> TeacherEncoder:
        """The stylometric teacher fitted on ``corpus`` (a task's document texts)."""
        return cls(StylometricTeacher(config).fit(list(corpus)))

    def encode(
        self, texts: Sequence[str], kind: str = "query", batch_size: int = 32, max_length: int | None = None
    ) -> np.ndarray:
        """(n, d) float32 unit vectors of ``texts`` (``kind``, ``batch_size`` and ``max_length`` are unused)."""
        return self.teacher.encode(list(texts))


def load_teacher(
    name: str,
    stylometric: StylometricConfig | None = None,
    batch_size: int = 32,
    max_length: int = TEACHER_MAX_LENGTH,
    trust_remote_code: bool = False,
) -> Teacher:
    """The teacher called ``name``.

    Args:
        name: ``stylometric`` for :class:`StylometricTeacher`; anything else is a model for
            :class:`EncoderTeacher` (alias, folder or hub id).
        stylometric: settings of the stylometric teacher (ignored for encoders).
        batch_size, max_length, trust_remote_code: encoder settings (see :class:`EncoderTeacher`).

    Raises:
        ValueError: a near miss of ``stylometric`` (a typo, not a model); ``max_length`` or ``batch_size`` < 1.
        FileNotFoundError: a bare name that is no alias or folder (:func:`obliq.aliases.resolve_model`).
        See also :class:`EncoderTeacher` and :class:`StylometricConfig`.
    """
    check_int("max_length", max_length, 1)
    check_int("batch_size", batch_size, 1)
    if name.lower() == STYLOMETRIC:
        return StylometricTeacher(stylometric)
    if difflib.get_close_matches(name.lower(), [STYLOMETRIC], cutoff=0.75):
        raise ValueError(f"unknown teacher {name!r}: did you mean {STYLOMETRIC!r}?")
    return EncoderTeacher(name, max_length=max_length, batch_size=batch_size, trust_remote_code=trust_remote_code)
