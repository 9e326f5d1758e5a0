"""InfoNCE over in-batch positives and hard negatives, with in-batch false negatives masked by key
and cross-device negatives.

The objective is the contrastive log-likelihood of the OBLIQ-IR paper (Eq. 1, §3.3), i.e.
sentence-transformers' MultipleNegativesRankingLoss with scale 1/τ = 50 (the model card); with
``symmetric``, the mean of that loss and its reverse (each row's positive against every query of the
batch), as sentence-transformers' ``MultipleNegativesSymmetricRankingLoss`` — for passage↔passage
pairs, where either side can be the query.

**No query is scored against its own text, or against another relevant document of its own query**
(``shared/cases/C05``, ``C06``, ``C34``). Every text of a batch has identity keys (the id's hash and
the normalised text's hash; a query that is a corpus document, a kNN anchor, has its id's too). For
query ``i`` a document column is masked when its keys equal the query's own (a passage↔passage row's
query is another row's positive), or those of the positive of any row with the same query (a copy of
its own positive included); its own positive stays the target. In the reverse direction, for row
``i``'s positive a query column is masked when it is the positive's own text, another query of that
positive, or another row's copy of query ``i``. The masks are built on the whole gathered batch, so
they hold in one process, across devices and across GradCache chunks. With ``matryoshka_dims`` the
loss is taken at several nested dimensions and summed (:func:`matryoshka`).

A row whose every candidate is masked adds 0 (C05's right value). A step in which no row has a negative
left trains nothing (loss 0, gradient 0): :func:`check_negatives` refuses it, counting with these masks
(:func:`negatives_left`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from obliq.distributed import gather, world


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(X, Y) bool: rows of ``a`` (X, K) and ``b`` (Y, K) that share a key in any column."""
    return (a[:, None, :] == b[None, :, :]).any(-1)


def _keys(keys: torch.Tensor | None) -> torch.Tensor | None:
    return keys if keys is None or keys.dim() == 2 else keys[:, None]


def false_negative_masks(
    positive_index: torch.Tensor, doc_keys: torch.Tensor | None, query_keys: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The in-batch false negatives of a batch (module notes).

    Args:
        positive_index: (B,) index into the documents of each query's positive.
        doc_keys: (M,) or (M, K) int64 identity keys of the documents; None masks nothing.
        query_keys: (B,) or (B, K) int64 keys of the queries, in the documents' key columns; None: the
            queries are not compared with the documents, and rows with the same query are not found.

    Returns:
        ``(forward, reverse)``: (B, M) bool, True where query i must not meet document j; (B, B) bool,
        True where row i's positive must not meet query r (the symmetric loss's). Both None when
        ``doc_keys`` is None. The targets (i, positive_index[i]) and (i, i) are never masked.
    """
    doc_keys, query_keys = _keys(doc_keys), _keys(query_keys)
    if doc_keys is None:
        return None, None
    rows = torch.arange(len(positive_index), device=positive_index.device)
    positive_keys = doc_keys[positive_index]  # (B, K)
    copies = _same(positive_keys, doc_keys)  # (B, M): column j is a copy of row r's positive
    if query_keys is None:
        forward, same_query = copies.clone(), torch.eye(len(rows), dtype=torch.bool, device=rows.device)
    else:
        same_query = _same(query_keys, query_keys)  # (B, B), the diagonal included
        forward = _same(query_keys, doc_keys) | ((same_query.double() @ copies.double()) > 0)
    forward[rows, positive_index] = False
    reverse = _same(positive_keys, positive_keys) | same_query
    if query_keys is not None:
        reverse |= _same(positive_keys, query_keys)
    reverse[rows, rows] = False
    return forward, reverse


def negatives_left(
    positive_index: torch.Tensor,
    doc_keys: torch.Tensor,
    query_keys: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    symmetric: bool = False,
) -> torch.Tensor:
    """(B,) the candidates each row's contrastive loss still scores beside its target, once the in-batch
    false negatives (:func:`false_negative_masks`) and ``mask`` are left out: the documents its query
    meets and, with ``symmetric``, the queries its positive meets. A row at 0 adds loss 0 and no gradient.

    Args:
        positive_index, doc_keys, query_keys, mask, symmetric: as :func:`info_nce` takes them.
    """
    rows = torch.arange(len(positive_index), device=positive_index.device)
    forward, reverse = false_negative_masks(positive_index, doc_keys, query_keys)
    if mask is not None:
        forward = forward | mask.to(forward.device)
        forward[rows, positive_index] = False
    left = (~forward).sum(1) - 1
    if symmetric:
        left = left + (~reverse).sum(1) - 1
    return left


def info_nce(
    queries: torch.Tensor,
    docs: torch.Tensor,
    positive_index: torch.Tensor,
    doc_keys: torch.Tensor | None = None,
    temperature: float = 0.02,
    query_keys: torch.Tensor | None = None,
    symmetric: bool = False,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of each query against all documents, its own positive the target, with the
    in-batch false negatives masked (:func:`false_negative_masks`); with ``symmetric``, averaged with the
    reverse loss of each row's positive against all queries.

    Args:
        queries: (B, h) unit query vectors.
        docs: (M, h) unit document vectors (positives and hard negatives of the whole batch).
        positive_index: (B,) index into ``docs`` of each query's positive.
        doc_keys: (M,) or (M, K) int64 identity keys of the documents (an id hash and a text hash);
            None masks nothing.
        temperature: τ; scores are q·d / τ (0.02 → scale 50).
        query_keys: (B,) or (B, K) int64 keys of the queries, in the same columns as ``doc_keys``.
        symmetric: add the documents → queries direction (sentence-transformers'
            ``MultipleNegativesSymmetricRankingLoss``); the loss is the mean of both directions.
        mask: (B, M) bool, more in-batch candidates to leave out (:func:`guided_mask`); never a row's positive.

    Returns:
        Scalar float32 loss (computed in float64).

    Raises:
        ValueError: a temperature that is not positive.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    # float64: the (B, M) matrix is small, and float32 rounds a near-zero loss at scale 50 away
    # (log(1 + e^-16) = 1.1254e-7 comes out as 1.19e-7, C06).
    q, d = queries.double(), docs.double()
    scores = q @ d.T / temperature  # (B, M)
    forward, reverse = false_negative_masks(positive_index, doc_keys, query_keys)
    if mask is not None:
        mask = mask.clone()
        mask[torch.arange(len(positive_index), device=mask.device), positive_index] = False
        forward = mask if forward is None else forward | mask
    if forward is not None:
        scores = scores.masked_fill(forward, float("-inf"))
    loss = F.cross_entropy(scores, positive_index)
    if symmetric:
        back = d[positive_index] @ q.T / temperature  # (B, B): row i's positive against every query
        if reverse is not None:
            back = back.masked_fill(reverse, float("-inf"))
        loss = (loss + F.cross_entropy(back, torch.arange(len(positive_index), device=back.device))) / 2
    return loss.float()


def teacher_distillation(
    queries: torch.Tensor,
    docs: torch.Tensor,
    positive_index: torch.Tensor,
    doc_row: torch.Tensor,
    teacher_scores: torch.Tensor,
    kind: str = "kl",
    temperature: float = 0.05,
    teacher_temperature: float = 0.05,
    reduction: str = "mean",
) -> torch.Tensor:
    """Distillation of a teacher's scores over each row's own candidates (its positive, then its hard
    negatives, as the batch holds them): the listwise KL divergence of the student's softmax from the
    teacher's (sentence-transformers' ``DistillKLDivLoss``, Tevatron's distillation), or MarginMSE
    (Hofstätter et al. 2020: the student's positive − negative margins regress on the teacher's).

    Args:
        queries: (B, h) unit query vectors (this rank's).
        docs: (M, h) unit document vectors (this rank's).
        positive_index: (B,) index into ``docs`` of each row's positive.
        doc_row: (M,) the row each document came with.
        teacher_scores: (B, 1 + k) the teacher's scores of each row's positive and negatives, NaN where
            absent; rows without a positive and at least one negative score are left out.
        kind: ``kl`` or ``margin-mse``.
        temperature: τ of the student's softmax (kl).
        teacher_temperature: τ of the teacher's softmax (kl).
        reduction: ``mean``, or ``none``: each scored row's term (what a mean over several ranks' rows
            needs, :meth:`obliq.model.RetrieverModule.objective`).

    Returns:
        Scalar float32: the mean over the rows with scores (0 when none has); with ``none``, (n_scored,)
        float32, one term per row with scores.

    Raises:
        ValueError: an unknown ``kind`` or ``reduction``, or a non-positive temperature.
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if kind not in ("kl", "margin-mse"):
        raise ValueError(f"teacher loss must be 'kl' or 'margin-mse', got {kind!r}")
    if temperature <= 0 or teacher_temperature <= 0:
        raise ValueError("temperatures must be positive")
    terms = []
    for i in range(len(positive_index)):
        negatives = [j for j in torch.nonzero(doc_row == i).flatten().tolist() if j != int(positive_index[i])]
        cols = [int(positive_index[i]), *negatives]
        t = teacher_scores[i, : len(cols)].double()
        if len(cols) < 2 or torch.isnan(t).any():
            continue
        s = docs[cols].double() @ queries[i].double()  # (1 + k,) the student's cosines
        if kind == "kl":
            # from log-probabilities: a teacher probability that underflows to 0 (scores 0–100 at a small
            # teacher temperature) adds 0, as 0 · log 0 = 0 says, not 0 · −inf = NaN
            log_p = torch.log_softmax(t / teacher_temperature, 0)
            p = log_p.exp()
            gap = torch.where(p > 0, log_p - torch.log_softmax(s / temperature, 0), torch.zeros_like(log_p))
            terms.append((p * gap).sum())
        else:
            terms.append((((s[0] - s[1:]) - (t[0] - t[1:])) ** 2).mean())
    if reduction == "none":
        return torch.stack(terms).float() if terms else queries.new_zeros(0)
    if not terms:
        return queries.sum() * 0.0  # keeps the graph: a step without scores contributes nothing
    return torch.stack(terms).mean().float()


def guided_mask(teacher: torch.Tensor, positive_index: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """(B, M) bool: the in-batch candidates a guide model scores above the row's positive, less ``margin``
    (sentence-transformers' ``GISTEmbedLoss``, Solatorio 2024, its ``absolute`` margin strategy): likely
    false negatives, left out of the contrastive loss. Here the guide is the frozen teacher.

    Args:
        teacher: (B, M) the guide's cosine of each query with each document; NaN where it has none (never
            masked).
        positive_index: (B,) each row's positive (never masked).
        margin: how far below the positive's score a candidate is still masked (>= 0).
    """
    rows = torch.arange(len(positive_index), device=teacher.device)
    positive = teacher[rows, positive_index]
    out = teacher > (positive - margin)[:, None]  # a NaN on either side compares False
    out[rows, positive_index] = False
    return out


def relational_distillation(
    queries: torch.Tensor,
    docs: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 0.05,
    teacher_temperature: float | None = None,
) -> torch.Tensor:
    """In-batch relational distillation: for each query, the KL divergence of the student's softmax over the
    step's documents from the teacher's (NeMo's ``InfoNCEDistillLoss``; Jasper's relative-similarity loss
    compares the same in-batch matrices). Unlike :func:`teacher_distillation`, it needs no stored scores of a
    row's own candidates, so kNN rows (no mined negatives) get a teacher term: the teacher's view of every
    in-batch pair.

    Args:
        queries: (B, h) unit query vectors; docs: (M, h) unit document vectors.
        teacher: (B, M) the teacher's cosines (:meth:`obliq.data.teacher_table.TeacherTable.cosines`); NaN
            entries are left out of both distributions.
        mask: (B, M) bool, entries left out of both (the in-batch false negatives by identity).
        temperature: τ of the student's softmax.
        teacher_temperature: τ of the teacher's; None: set from the teacher's score spread, per step, so
            its logits are as spread as the student's: ``τ · std(teacher) / std(student)`` over the
            entries used (the student's scores detached).

    Returns:
        Scalar float32: the mean over rows with at least two usable entries (0 when none has, or when the
        teacher's scores do not vary).

    Raises:
        ValueError: a non-positive temperature.
    """
    if temperature <= 0 or (teacher_temperature is not None and teacher_temperature <= 0):
        raise ValueError("temperatures must be positive")
    s = queries.double() @ docs.double().T  # (B, M) the student's cosines
    t = teacher.to(s.device).double()
    usable = torch.isfinite(t) if mask is None else torch.isfinite(t) & ~mask
    rows = usable.sum(1) >= 2
    zero = queries.sum() * 0.0  # keeps the graph
    if not rows.any():
        return zero
    s, t, usable = s[rows], t[rows], usable[rows]
    if teacher_temperature is None:
        spread_t, spread_s = t[usable].std(), s.detach()[usable].std()
        if not (spread_t > 0 and spread_s > 0):
            return zero
        teacher_temperature = float(temperature * spread_t / spread_s)
    inf = float("-inf")
    log_p = torch.log_softmax(torch.where(usable, t / teacher_temperature, inf), 1)
    log_q = torch.log_softmax(torch.where(usable, s / temperature, inf), 1)
    p = log_p.exp()
    gap = torch.where(p > 0, log_p - log_q, torch.zeros_like(log_p))
    return (p * gap).sum(1).mean().float()


def matryoshka(loss_fn, queries: torch.Tensor, docs: torch.Tensor, dims, weights=None, parts=None) -> torch.Tensor:
    """A loss at nested dimensions: Σ_i w_i · loss_fn(q[:, :d_i] / ‖·‖, docs[:, :d_i] / ‖·‖).

    Matryoshka representation learning (Kusupati et al., 2022), as sentence-transformers'
    ``MatryoshkaLoss`` takes it: at every dimension (the full one too) the embeddings are truncated,
    then re-normalised (in float64), and the inner loss sees unit vectors. It is a function of the
    full embedding matrices, so GradCache (which back-propagates the loss's gradient with respect to
    the embeddings) and cross-device gathering (done before) need nothing more.

    Args:
        loss_fn: ``(q (B, d), docs (M, d)) -> scalar``.
        queries: (B, h) and docs: (M, h) embeddings.
        dims: the dimensions, each in 1 … h.
        weights: one per dimension (default 1 each).
        parts: None, or a list to which each dimension's loss (unweighted, detached) is appended.

    Returns:
        The weighted sum, float32.

    Raises:
        ValueError: a dimension outside 1 … h, or weights of another length.
    """
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if len(weights) != len(dims):
        raise ValueError(f"matryoshka_weights: {len(weights)} weights for {len(dims)} dimensions")
    width = queries.shape[-1]
    total = 0.0
    for dim, weight in zip(dims, weights):
        if not 1 <= dim <= width:
            raise ValueError(f"matryoshka_dims: {dim} is outside 1 … {width} (the embedding size)")
        q, d = (F.normalize(x[:, :dim].double(), dim=-1) for x in (queries, docs))
        value = loss_fn(q, d).double()
        if parts is not None:
            parts.append(value.detach().float())
        total = total + weight * value
    return total.float()


class InfoNCELoss(nn.Module):
    """InfoNCE with in-batch and hard negatives, gathered across devices.

    Args:
        temperature: τ (default 0.02, the model card's scale 50).
        gather_across_devices: use every rank's documents as negatives (and every rank's
            queries, so that all ranks compute the same global loss).
        symmetric: also the reverse direction (:func:`info_nce`), for passage↔passage pairs.
        matryoshka_dims: None, or take the loss at each of these embedding dimensions (truncated and
            re-normalised) and sum them (:func:`matryoshka`); include the full size to train it too.
        matryoshka_weights: one weight per dimension (default 1 each).

    Call it with the local shard: ``loss(queries (B,h), docs (M,h), positive_index (B,),
    doc_keys (M,K) | None, query_keys (B,K) | None)``; ``positive_index`` indexes the local ``docs``.
    """

    def __init__(
        self,
        temperature: float = 0.02,
        gather_across_devices: bool = True,
        symmetric: bool = False,
        matryoshka_dims: list[int] | None = None,
        matryoshka_weights: list[float] | None = None,
    ):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature
        self.gather_across_devices = gather_across_devices
        self.symmetric = symmetric
        if matryoshka_dims is not None:
            if not matryoshka_dims or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in matryoshka_dims
            ):
                raise ValueError(f"matryoshka_dims: positive integers, got {matryoshka_dims!r}")
            if len(set(matryoshka_dims)) != len(matryoshka_dims):
                raise ValueError(f"matryoshka_dims: a dimension given twice in {matryoshka_dims!r}")
        if matryoshka_weights is not None:
            if matryoshka_dims is None or len(matryoshka_weights) != len(matryoshka_dims):
                raise ValueError("matryoshka_weights: one weight per matryoshka_dims entry")
            if any(not w > 0 for w in matryoshka_weights):
                raise ValueError(f"matryoshka_weights: positive numbers, got {matryoshka_weights!r}")
        self.matryoshka_dims = list(matryoshka_dims) if matryoshka_dims else None
        self.matryoshka_weights = list(matryoshka_weights) if matryoshka_weights else None

    @property
    def backward_scale(self) -> float:
        """Factor for the backward pass: DDP/FSDP average the ranks' gradients, and each rank's
        gradient already is its share of the global loss's, so the average is scaled back up."""
        return float(world()[1]) if self.gather_across_devices else 1.0

    def forward(
        self, queries, docs, positive_index, doc_keys=None, query_keys=None, mask=None, parts=None
    ) -> torch.Tensor:
        """The loss (module notes); ``parts``: a list for each Matryoshka dimension's loss (:func:`matryoshka`)."""
        if self.gather_across_devices and world()[1] > 1:
            if mask is not None:
                raise ValueError("a guided mask (model.guided_margin) is not gathered across devices: train on one")
            counts = gather(torch.tensor([docs.shape[0]], device=docs.device))  # (world,)
            positive_index = gather(positive_index + counts[: world()[0]].sum())
            queries, docs = gather(queries), gather(docs)
            doc_keys = gather(doc_keys) if doc_keys is not None else None
            query_keys = gather(query_keys) if query_keys is not None else None

        def nce(q, d):
            return info_nce(q, d, positive_index, doc_keys, self.temperature, query_keys, self.symmetric, mask)

        if self.matryoshka_dims:
            return matryoshka(nce, queries, docs, self.matryoshka_dims, self.matryoshka_weights, parts)
        return nce(queries, docs)

    def citation(self) -> dict:
        """What a model card needs to describe the trained objective: its name, settings and references
        (as sentence-transformers' losses describe themselves)."""
        out = {
            "loss": ("symmetric " if self.symmetric else "")
            + "InfoNCE over in-batch positives and hard negatives (GradCache), in-batch false negatives masked",
            "temperature": self.temperature,
            "scale": 1.0 / self.temperature,
            "gather_across_devices": self.gather_across_devices,
            "symmetric": self.symmetric,
            "references": ["van den Oord et al. 2018 (InfoNCE)", "Gao et al. 2021 (GradCache)"],
        }
        if self.matryoshka_dims:
            out["matryoshka_dims"] = self.matryoshka_dims
            out["matryoshka_weights"] = self.matryoshka_weights or [1.0] * len(self.matryoshka_dims)
            out["references"].append("Kusupati et al. 2022 (Matryoshka)")
        return out


def check_negatives(loss: InfoNCELoss, batch: dict, step: int, mask: torch.Tensor | None = None, data=None) -> None:
    """Refuse a training step in which no row has a negative left (issue 49 §4): every row's loss is then 0
    with gradient 0 (one row and no hard negative; every in-batch document a copy of the row's positive,
    e.g. rows that all share one positive), so the step, and a run made of such steps, trains nothing.
    Counted with the loss's own masks (:func:`negatives_left`) on the step's whole batch: every rank's
    documents when the loss gathers them; without gathering, the step trains when any rank's rows do.

    Args:
        loss: the step's :class:`InfoNCELoss` (its ``symmetric`` and ``gather_across_devices``; a wrapper
            without them counts as InfoNCELoss's defaults).
        batch: the collated batch (:class:`obliq.data.collate.Collator`): ``positive_index``, ``doc_keys``,
            ``query_keys`` and ``row_ids``, on the step's device.
        step: the global step, named in the message.
        mask: the step's guided mask (``model.guided_margin``), or None.
        data: the data module whose sources the message names (``sources``), or None.

    Raises:
        ValueError: ``no negative left in step N: …``, naming the rows, the data, why and what to change.
    """
    positive_index, doc_keys, query_keys = batch["positive_index"], batch["doc_keys"], batch["query_keys"]
    rank, size = world()
    symmetric = getattr(loss, "symmetric", False)  # a wrapper loss: InfoNCELoss's defaults
    gathered = size > 1 and getattr(loss, "gather_across_devices", True)
    if gathered and mask is not None:
        return  # the loss refuses a guided mask across devices itself
    if gathered:
        counts = gather(torch.tensor([len(doc_keys)], device=doc_keys.device))
        positive_index = gather(positive_index + counts[:rank].sum())
        doc_keys, query_keys = gather(doc_keys), gather(query_keys)
    left = negatives_left(positive_index, doc_keys, query_keys, mask, symmetric).sum().reshape(1)
    if size > 1 and not gathered:
        left = gather(left).sum()
    if int(left):
        return
    n_rows, hard = len(positive_index), len(doc_keys) - len(positive_index)
    if n_rows == 1 and hard == 0:
        why = "its one row has no hard negative and no other row to lend it one"
    else:
        why = (
            f"its {n_rows} rows hold {hard} hard negatives, and every document beside a row's own positive is "
            "masked for it (the same id or text as its positive or its query, or the positive of a row with the "
            "same query" + (", or scored above it by the guide, model.guided_margin)" if mask is not None else ")")
        )
    ids = [str(i) for i in batch.get("row_ids", [])]
    rows = ", ".join(map(repr, ids[:3])) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    sources = ", ".join(str(getattr(s, "path", s)) for s in getattr(data, "sources", None) or [])
    raise ValueError(
        f"no negative left in step {step}: {why}; rows {rows}"
        + (f" of {sources}" if sources else "")
        + ". Such a step trains at loss 0 with gradient 0: give the rows hard negatives (data.max_negatives, "
        "obliq negatives mine), raise data.batch_size, or mix in rows with other positives"
    )
