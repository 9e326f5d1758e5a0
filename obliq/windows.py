"""Long texts as token windows: the settings (:class:`Windows`), and how a text's windows become one vector or
one score (issue 55).

A text longer than the encoder reads is split into windows of ``size`` tokens, each window starting ``stride``
tokens of the text after the one before and carrying the text's prefix (``passage: ``, an instruction) and the
model's special tokens (:meth:`obliq.model.tokenizer.TextTokenizer.windows`). Each window is encoded as a text
of its own; the text is then

- ``mean``: the mean of its windows' unit vectors, L2-normalised (:func:`mean_of_windows`): one vector a text,
  searched and trained as any other;
- ``maxsim``: the set of its windows' vectors, a query's score the best window's cosine
  (:func:`maxsim_scores`): ColBERT's MaxSim (Khattab & Zaharia, 2020) over windows instead of tokens, as
  Tevatron's chunked retrieval scores a document by its best chunk (Tevatron PR #229).

A text that fits in one window is one window: with windows on, it encodes exactly as without.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

Reduce = Literal["mean", "maxsim"]


@dataclass(frozen=True)
class Windows:
    """How a long text is read: in windows of ``size`` tokens, ``stride`` tokens apart (module notes).

    Attributes:
        size: tokens a window (special tokens and the prefix included); cut to the backbone's positions.
        stride: tokens of the text between the starts of two windows (default 128, half the default size: each
            token in two windows; it does not follow ``size``, so give both); below ``size``, and at most the text a
            window holds after its prefix and special tokens, so that no token is skipped.
        reduce: ``mean`` (one vector a text) or ``maxsim`` (a text scored by its best window).
        queries: read queries in windows too, a query then the mean of its windows whatever ``reduce`` (off: a
            query is one window of the query length, truncated).
        max_windows: windows a text at most; the rest of a longer text is cut (and counted, as truncation is).

    Raises:
        ValueError: a setting out of range (named ``windows.<field>``).
    """

    size: int = 256
    stride: int = 128
    reduce: Reduce = "mean"
    queries: bool = False
    max_windows: int = 64

    def __post_init__(self) -> None:
        for key in ("size", "stride", "max_windows"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"windows.{key}: must be an integer >= 1, got {value!r}")
        if self.stride >= self.size:
            raise ValueError(f"windows.stride: {self.stride} must be below windows.size {self.size} (no token skipped)")
        if self.reduce not in ("mean", "maxsim"):
            raise ValueError(f"windows.reduce: 'mean' or 'maxsim', got {self.reduce!r}")
        if not isinstance(self.queries, bool):
            raise ValueError(f"windows.queries: true or false, got {self.queries!r}")

    def settings(self) -> dict:
        """The settings as a plain dict (what an encoder's files, a store's key and a report record)."""
        return asdict(self)

    @classmethod
    def of(cls, value: Windows | dict | None, where: str = "windows") -> Windows | None:
        """``value`` as :class:`Windows`: an instance, a dict of its fields (a saved encoder's, a config's), or None.

        Raises:
            ValueError: an unknown field or a bad value, naming ``where``.
        """
        if value is None or isinstance(value, Windows):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{where}: a mapping of size, stride, reduce, queries, max_windows, got {value!r}")
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(cls.__dataclass_fields__)})")
        try:
            return cls(**value)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None


def check_window_doc(window_doc, n_windows: int, n_docs: int | None = None) -> tuple[np.ndarray, int]:
    """The one check of an owner index: one integer document row per window, every document owning one (the
    windows of a document need not be contiguous).

    Args:
        window_doc: (W,) integers, numpy or torch; n_windows: W; n_docs: the documents (None: ``max + 1``).

    Returns:
        ``(window_doc, n_docs)``: (W,) int64 numpy, and the number of documents.

    Raises:
        ValueError: naming ``window_doc`` and what is wrong (shape, dtype, a row out of range, a document with
            no window).
    """
    if hasattr(window_doc, "detach"):
        window_doc = window_doc.detach().cpu().numpy()
    window_doc = np.asarray(window_doc)
    if window_doc.ndim != 1 or len(window_doc) != n_windows:
        raise ValueError(
            f"window_doc: expected shape ({n_windows},) (one document row per window), got {window_doc.shape}"
        )
    if n_windows == 0:
        raise ValueError("window_doc: no windows (every document needs at least one)")
    if window_doc.dtype == bool or not np.issubdtype(window_doc.dtype, np.integer):
        raise ValueError(f"window_doc: expected integer document rows, got dtype {window_doc.dtype}")
    window_doc = window_doc.astype(np.int64)
    n_docs = int(window_doc.max()) + 1 if n_docs is None else n_docs
    if window_doc.min() < 0 or window_doc.max() >= n_docs:
        raise ValueError(
            f"window_doc: document rows must lie in 0 … {n_docs - 1}, got {window_doc.min()} … {window_doc.max()}"
        )
    empty = np.flatnonzero(np.bincount(window_doc, minlength=n_docs) == 0)
    if len(empty):
        raise ValueError(f"window_doc: {len(empty)} document(s) have no window (first: row {empty[0]})")
    return window_doc, n_docs


def mean_of_windows(vectors: torch.Tensor, window_doc: torch.Tensor, n_docs: int) -> torch.Tensor:
    """Each text's vector: the mean of its windows' vectors, L2-normalised (differentiable).

    Args:
        vectors: (W, h) the windows' unit vectors.
        window_doc: (W,) int64, the text (0 … n_docs − 1) of each window.
        n_docs: the number of texts.

    Returns:
        (n_docs, h) unit vectors, in ``vectors``' dtype; a text of one window is that window's vector.

    Raises:
        ValueError: see :func:`check_window_doc`.
    """
    check_window_doc(window_doc, len(vectors), n_docs)
    window_doc = window_doc.to(vectors.device)
    total = vectors.new_zeros(n_docs, vectors.shape[1]).index_add(0, window_doc, vectors)
    mean = F.normalize(total, p=2, dim=-1)  # the mean's direction: dividing by the count first changes nothing
    one = torch.bincount(window_doc, minlength=n_docs) == 1  # one window: its vector as it is (not renormalised)
    return torch.where(one[:, None], total, mean)


def maxsim_scores(queries: torch.Tensor, windows: torch.Tensor, window_doc: torch.Tensor, n_docs: int) -> torch.Tensor:
    """Each query's score of each text: the largest inner product with the text's windows (MaxSim).

    Args:
        queries: (B, h) query vectors; windows: (W, h) the windows' vectors (same dtype).
        window_doc: (W,) int64, the text of each window; n_docs: the number of texts.

    Returns:
        (B, n_docs) scores (differentiable: the gradient reaches each text's best window; a tie shares it).

    Raises:
        ValueError: see :func:`check_window_doc`.
    """
    check_window_doc(window_doc, len(windows), n_docs)
    s = queries @ windows.T  # (B, W)
    index = window_doc.to(s.device)[None, :].expand_as(s)
    out = s.new_full((len(queries), n_docs), float("-inf"))
    return out.scatter_reduce(1, index, s, reduce="amax", include_self=True)
