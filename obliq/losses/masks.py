"""The in-batch false negatives the contrastive loss leaves out, by identity key, and the check that a step
still has a negative to learn from.

**No query is scored against its own text, or against another relevant document of its own query**
(``shared/cases/C05``, ``C06``, ``C34``). Every text of a batch has identity keys (the id's hash and the
normalised text's hash; a query that is a corpus document, a kNN anchor, has its id's too). For query ``i``
a document column is masked when its keys equal the query's own (a passage↔passage row's query is another
row's positive), or those of a positive of any row with the same query (copies of its own positives
included, and those of the positives a row holds beyond the batch's ``data.max_positives``: a positive a cap
leaves out is still never its row's negative, issue 53); its own positives stay targets. In the reverse
direction, for a positive of row ``i`` a query column is masked when it is that document's own text, a query of
which the document is a positive (kept or not), or another row's copy of query ``i``. The masks are built on
the whole (gathered) batch, so they hold in one process, across devices and across GradCache chunks.
"""

from __future__ import annotations

import torch

from obliq.distributed import gather, world
from obliq.losses.view import StepView, positive_mask


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(X, Y) bool: rows of ``a`` (X, K) and ``b`` (Y, K) that share a key in any column."""
    return (a[:, None, :] == b[None, :, :]).any(-1)


def _keys(keys: torch.Tensor | None) -> torch.Tensor | None:
    return keys if keys is None or keys.dim() == 2 else keys[:, None]


def false_negative_masks(
    positives: torch.Tensor,
    doc_keys: torch.Tensor | None,
    query_keys: torch.Tensor | None = None,
    cut: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The in-batch false negatives of a batch (module notes).

    Args:
        positives: (B, M) bool, True at each of row i's positives, or (B,) the index of each row's one positive
            (:func:`~obliq.losses.view.positive_mask`).
        doc_keys: (M,) or (M, K) int64 identity keys of the documents; None masks nothing.
        query_keys: (B,) or (B, K) int64 keys of the queries, in the documents' key columns; None: the
            queries are not compared with the documents, and rows with the same query are not found.
        cut: ``(keys (C, K) int64, row (C,) int64)``: positives rows hold that are not among the documents (left
            out by ``data.max_positives``), in the documents' key columns, and the row of each; a document with
            one of their keys is masked for that row (and its query's other rows) as a copy of its positive is.

    Returns:
        ``(forward, reverse)``: (B, M) bool, True where query i must not meet document j (never at its own
        positives); (M, B) bool, True where document j, a positive, must not meet query r (the symmetric
        loss's; never at its own row's query; rows of other documents are unused). Both None when
        ``doc_keys`` is None.
    """
    doc_keys, query_keys = _keys(doc_keys), _keys(query_keys)
    if doc_keys is None:
        return None, None
    positives = positive_mask(positives, len(doc_keys))
    n_rows = positives.shape[0]
    owner = positives.to(torch.uint8).argmax(0)  # (M,) the row of each positive column
    copies = (positives.double() @ _same(doc_keys, doc_keys).double()) > 0  # (B, M): a copy of a row-i positive
    if cut is not None and len(cut[0]):
        cut_keys, cut_row = _keys(cut[0]).to(doc_keys.device), cut[1].to(doc_keys.device)
        held = torch.zeros(n_rows, len(cut_row), dtype=torch.double, device=doc_keys.device)
        held[cut_row, torch.arange(len(cut_row), device=doc_keys.device)] = 1.0
        copies |= (held @ _same(cut_keys, doc_keys).double()) > 0  # a document that is a cut positive of row i
    if query_keys is None:
        same_query = torch.eye(n_rows, dtype=torch.bool, device=positives.device)
        forward = copies.clone()
    else:
        same_query = _same(query_keys, query_keys)  # (B, B), the diagonal included
        forward = _same(query_keys, doc_keys) | ((same_query.double() @ copies.double()) > 0)
    forward &= ~positives
    reverse = copies.T | same_query[owner]
    if query_keys is not None:
        reverse |= _same(doc_keys, query_keys)
    reverse[torch.arange(len(owner), device=owner.device), owner] = False
    return forward, reverse


def negatives_left(
    positives: torch.Tensor,
    doc_keys: torch.Tensor,
    query_keys: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    symmetric: bool = False,
    cut: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """(B,) the negatives each row's contrastive loss still scores, once the in-batch false negatives
    (:func:`false_negative_masks`) and ``mask`` are left out: the documents its query meets beside its
    positives and, with ``symmetric``, the queries its positives meet beside its own. A row at 0 adds loss 0
    and no gradient.

    Args:
        positives, doc_keys, query_keys, mask, cut: as :func:`obliq.losses.infonce.scored` takes them.
        symmetric: count the reverse direction too (:class:`obliq.losses.Symmetric`).
    """
    positives = positive_mask(positives, len(doc_keys))
    forward, reverse = false_negative_masks(positives, doc_keys, query_keys, cut)
    if mask is not None:
        forward = forward | mask.to(forward.device)
    left = (~forward & ~positives).sum(1)
    if symmetric:
        left = left + (positives.long() * ((~reverse).sum(1) - 1)[None, :]).sum(1)
    return left


def check_negatives(view: StepView, loss, step: int, batch: dict | None = None, data=None) -> None:
    """Refuse a training step in which no row has a negative left (issue 49 §4): every row's loss is then 0
    with gradient 0 (one row and no hard negative; every in-batch document a copy of the row's positive,
    e.g. rows that all share one positive), so the step, and a run made of such steps, trains nothing.
    Counted by the loss itself (:meth:`obliq.losses.Loss.negatives_left`, with the masks of :func:`negatives_left`)
    on the view (every rank's rows when gathered; otherwise the step trains when any rank's rows do).

    Args:
        view: the step's :class:`~obliq.losses.view.StepView` (its mask terms' mask included).
        loss: the main loss (:class:`obliq.losses.Loss`).
        step: the global step, named in the message.
        batch: the rank's collated batch, whose ``row_ids`` the message names; or None.
        data: the data module whose sources the message names (``sources``), or None.

    Raises:
        ValueError: ``no negative left in step N: …``, naming the rows, the data, why and what to change; or the
            loss's refusal of the view (e.g. InfoNCE's of a row with several positives).
    """
    if view.doc_keys is None:
        return
    left = loss.negatives_left(view).sum().reshape(1)
    if world()[1] > 1 and not view.gathered:
        left = gather(left).sum()
    if int(left):
        return
    n_rows, positives = view.positives.shape[0], int(view.positives.sum())
    hard = view.positives.shape[1] - positives
    if n_rows == 1 and hard == 0:
        why = "its one row has no hard negative and no other row to lend it one"
    else:
        why = (
            f"its {n_rows} rows hold {hard} hard negatives, and every document beside a row's own positives is "
            "masked for it (the same id or text as a positive or its query, or a positive of a row with the "
            "same query" + (", or left out by a mask term, e.g. the guided mask)" if view.mask is not None else ")")
        )
    ids = [str(i) for i in (batch or {}).get("row_ids", [])]
    rows = ", ".join(map(repr, ids[:3])) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    sources = ", ".join(str(getattr(s, "path", s)) for s in getattr(data, "sources", None) or [])
    raise ValueError(
        f"no negative left in step {step}: {why}; rows {rows}"
        + (f" of {sources}" if sources else "")
        + ". Such a step trains at loss 0 with gradient 0: give the rows hard negatives (data.max_negatives, "
        "obliq negatives mine), raise data.batch_size, or mix in rows with other positives"
    )
