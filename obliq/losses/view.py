"""The step's batch as the loss and its terms see it (:class:`StepView`): which documents are each row's
positives, the identity keys the masks compare, the teacher's data, for this rank's rows or, gathered, for
every rank's — one place that gathers, so every part of the objective is computed over the same rows."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from obliq.distributed import gather, world
from obliq.windows import maxsim_scores, mean_of_windows

ADDED_BY = "set data.teacher_vectors (obliq distill graph --vectors_out writes them)"
"""What adds the teacher's vectors (:meth:`StepView.teacher_cosines`) to a batch."""


def teacher_vectors_problem(data: dict) -> str | None:
    """Why the ``data`` settings leave a term of the teacher's vectors (the relational KL, the guided mask) nothing
    to read, said as a term's refusal (:meth:`obliq.losses.Term.data_problem`); None when they add them."""
    return None if data.get("teacher_vectors") else f"needs the batch key teacher_query_vectors: {ADDED_BY}"


def positive_mask(positives: torch.Tensor, n_docs: int) -> torch.Tensor:
    """(B, M) bool, True at each of row i's positives.

    Args:
        positives: (B,) int64, the index into the documents of each row's one positive, or (B, M) bool
            (returned as it is, after its checks).
        n_docs: M, the number of documents.

    Raises:
        ValueError: a mask of another width, a row without a positive, or a document that is the positive
            of two rows (each document of a batch came with one row).
    """
    if positives.dtype != torch.bool:
        out = torch.zeros(len(positives), n_docs, dtype=torch.bool, device=positives.device)
        out[torch.arange(len(positives), device=positives.device), positives] = True
        return out
    if positives.dim() != 2 or positives.shape[1] != n_docs:
        raise ValueError(f"positives: a (B, {n_docs}) mask expected, got shape {tuple(positives.shape)}")
    if not positives.any(1).all():
        raise ValueError(f"positives: row {int((~positives.any(1)).nonzero()[0])} has no positive")
    if (positives.sum(0) > 1).any():
        raise ValueError(f"positives: document {int((positives.sum(0) > 1).nonzero()[0])} is the positive of two rows")
    return positives


@dataclass(frozen=True)
class StepView:
    """One training step's batch, as the loss and the terms read it (``B`` rows, ``M`` documents).

    Attributes:
        positives: (B, M) bool, True at each of a row's positives (:func:`positive_mask`).
        positive_index: (B,) each row's first positive.
        doc_row: (M,) the row each document came with.
        doc_keys: (M, K) int64 identity keys of the documents, or None (masks nothing).
        query_keys: (B, K) int64 keys of the queries, or None.
        teacher_scores: (B, 1 + k) a teacher's scores of each row's first positive and its negatives, or None.
        teacher_query_vectors: (B, t) and teacher_doc_vectors: (M, t), the teacher's vectors, or None.
        mask: (B, M) bool, more candidates the contrastive loss leaves out (a mask term's), or None.
        cut_keys: (C, K) int64 keys of the positives rows hold beyond the batch's ``data.max_positives`` (not among
            the documents), and cut_row: (C,) the row of each; None when the batch has none. Masked as a
            positive's copies are (:func:`~obliq.losses.masks.false_negative_masks`): a row's positive is never
            its negative, kept or not.
        gathered: the rows are every rank's (rank order), not this rank's.
        query_window: (Wq,) int64, the query of each query window, when queries are read in windows
            (:mod:`obliq.windows`): the query is the mean of its windows; None: one vector a query.
        doc_window: (W,) int64, the document of each document window, or None (one vector a document).
        reduce: how a document's windows become its score: ``mean`` (one vector, :meth:`embeddings` reduces
            them) or ``maxsim`` (the best window's, :meth:`similarity`).
    """

    positives: torch.Tensor
    positive_index: torch.Tensor
    doc_row: torch.Tensor
    doc_keys: torch.Tensor | None = None
    query_keys: torch.Tensor | None = None
    teacher_scores: torch.Tensor | None = None
    teacher_query_vectors: torch.Tensor | None = None
    teacher_doc_vectors: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    cut_keys: torch.Tensor | None = None
    cut_row: torch.Tensor | None = None
    gathered: bool = False
    query_window: torch.Tensor | None = None
    doc_window: torch.Tensor | None = None
    reduce: str = "mean"

    @property
    def cut(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(cut_keys, cut_row)``, or None: what the masks take (:func:`~obliq.losses.masks.false_negative_masks`)."""
        return None if self.cut_keys is None else (self.cut_keys, self.cut_row)

    @classmethod
    def of(
        cls, batch: dict, gathered: bool = False, device: torch.device | str | None = None, reduce: str = "mean"
    ) -> StepView:
        """The view of a collated batch (:mod:`obliq.data`): ``positive_index``, and where present
        ``doc_row``, ``doc_positive``, ``doc_keys``, ``query_keys``, ``cut_positive_keys``, ``cut_positive_row``,
        ``teacher_scores``, ``teacher_query_vectors``, ``teacher_doc_vectors``, ``query_window``, ``doc_window``
        (texts read in windows, reduced by ``reduce``); with ``gathered`` and several processes, every
        rank's rows concatenated in rank order (each rank's row and document indices shifted by the rows and
        documents of the ranks before it). A collective call: every rank calls it with the same arguments.
        """
        device = device or batch["positive_index"].device
        get = lambda key: batch[key].to(device) if batch.get(key) is not None else None  # noqa: E731
        positive_index = get("positive_index")
        n_rows = len(positive_index)
        query_window, doc_window = get("query_window"), get("doc_window")
        if doc_window is not None:
            n_docs = int(doc_window.max()) + 1 if len(doc_window) else 0
        elif batch.get("doc_keys") is not None:
            n_docs = len(get("doc_keys"))
        else:
            n_docs = batch["docs"]["input_ids"].shape[0]
        doc_row = get("doc_row")
        if doc_row is None:  # one positive a row and no other document known: rows by their positive
            doc_row = torch.full((n_docs,), -1, dtype=torch.long, device=device)
            doc_row[positive_index] = torch.arange(n_rows, device=device)
        is_positive = get("doc_positive")
        if is_positive is None:
            is_positive = torch.zeros(n_docs, dtype=torch.bool, device=device)
            is_positive[positive_index] = True
        fields = {k: get(k) for k in ("doc_keys", "query_keys", "teacher_scores")}
        fields |= {k: get(k) for k in ("teacher_query_vectors", "teacher_doc_vectors")}
        cut_keys, cut_row = get("cut_positive_keys"), get("cut_positive_row")
        rank, size = world()
        if gathered and size > 1:
            counts = gather(torch.tensor([[n_rows, n_docs]], device=device))  # (world, 2)
            before = counts[:rank].sum(0)
            positive_index = gather(positive_index + before[1])
            doc_row = gather(torch.where(doc_row >= 0, doc_row + before[0], doc_row))
            is_positive = gather(is_positive)
            fields = {k: None if v is None else gather(v) for k, v in fields.items()}
            if cut_keys is not None:
                cut_keys, cut_row = gather(cut_keys), gather(cut_row + before[0])
            if query_window is not None:
                query_window = gather(query_window + before[0])
            if doc_window is not None:
                doc_window = gather(doc_window + before[1])
        rows = torch.arange(len(positive_index), device=device)
        positives = (doc_row[None, :] == rows[:, None]) & is_positive[None, :]
        positives = positive_mask(positives, len(doc_row))
        cut = {"cut_keys": cut_keys, "cut_row": cut_row} if cut_keys is not None else {}
        windows = {"query_window": query_window, "doc_window": doc_window, "reduce": reduce}
        return cls(positives, positive_index, doc_row, **fields, **cut, gathered=gathered, **windows)

    def embeddings(self, queries: torch.Tensor, docs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (B_r, h) query and (M_r, h) document embeddings as the view's rows: gathered
        (:func:`obliq.distributed.gather`, the local shard keeping its gradient) when the view is. Texts read in
        windows arrive as their windows' embeddings: a query becomes the mean of its windows, a document too
        under ``reduce`` ``mean``; under ``maxsim`` the documents stay windows, scored by :meth:`similarity`."""
        if self.gathered and world()[1] > 1:
            queries, docs = gather(queries), gather(docs)
        if self.query_window is not None:
            queries = mean_of_windows(queries, self.query_window, len(self.positive_index))
        if self.doc_window is not None and self.reduce == "mean":
            docs = mean_of_windows(docs, self.doc_window, len(self.doc_row))
        return queries, docs

    def similarity(self, queries: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
        """(B, M) each query's score of each document: the inner product, or under ``maxsim`` the best of the
        document's windows' (:func:`obliq.windows.maxsim_scores`; ``docs`` then holds the W windows)."""
        if self.doc_window is not None and self.reduce == "maxsim":
            return maxsim_scores(queries, docs, self.doc_window, len(self.doc_row))
        return queries @ docs.T

    def teacher_cosines(self, needed_by: str) -> torch.Tensor:
        """(B, M) float32, the teacher's cosine of each query with each document (computed in float64), NaN
        where it has no vector of either.

        Raises:
            ValueError: the batch holds no teacher vectors, naming ``needed_by`` and the setting that adds them.
        """
        if self.teacher_query_vectors is None or self.teacher_doc_vectors is None:
            raise ValueError(
                f"{needed_by} needs the batch keys teacher_query_vectors and teacher_doc_vectors: {ADDED_BY}"
            )
        return (self.teacher_query_vectors.double() @ self.teacher_doc_vectors.double().T).float()

    def with_mask(self, mask: torch.Tensor | None) -> StepView:
        """The view with ``mask`` added to its own (logical or)."""
        if mask is None:
            return self
        return replace(self, mask=mask if self.mask is None else self.mask | mask)
