"""GradCache: a contrastive step over a large batch at the memory of one chunk.

Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup"
(the method behind sentence-transformers' CachedMultipleNegativesRankingLoss, which the model card
names). The step:

1. encode every chunk of queries and documents without gradient, recording the random state
   (CPU and CUDA) before each chunk;
2. compute the loss over all embeddings (gathered across devices by the loss) and its gradient
   with respect to the embeddings only;
3. re-encode each chunk with gradient, replaying its recorded random state so dropout (LoRA
   dropout included) draws the same masks, and back-propagate the cached embedding gradient.

The result equals one forward/backward over the whole batch (C04). A side read in token windows
(:mod:`obliq.windows`) is chunked by windows, each window a row: a long document never puts more than
``chunk_size`` windows in one forward pass, and the loss reduces the windows to documents (tests/test_windows.py).
Under DDP every re-encoding but the last runs inside ``no_sync`` so gradients are all-reduced once. Autocast's
weight cache is disabled in step 1: a cast cached under ``no_grad`` would be reused by step 3 without a grad path.

Two savings that leave the result unchanged:

- the last chunk of step 1 is encoded *with* gradient and its graph is kept for step 3 instead of
  being encoded twice: one forward fewer per step, and the memory peak is still one chunk's graph
  (it is the last forward before the loss and the first backward after it);
- ``sort_by_length``: each side's rows are grouped into chunks by length (shortest first), so each
  chunk is padded only to its own longest row (the encoder trims all-padding columns); the
  embeddings are put back in the input order before the loss, so ``positive_index`` and document
  keys are untouched. The loss does not depend on how rows are grouped; dropout masks do (they are
  drawn per chunk), so the reference for a sorted step is a plain pass over the same sorted chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack, contextmanager, nullcontext

import torch

Batch = dict[str, torch.Tensor]


class RandState:
    """The CPU and CUDA random states at construction, replayable later (dropout masks match)."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = (
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )

    @contextmanager
    def replay(self):
        """Run the block from the recorded state; the global state is restored afterwards."""
        devices = list(range(len(self.cuda))) if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)
            yield


@contextmanager
def _autocast_without_cache():
    """Re-enter any active autocast with its weight cache off."""
    with ExitStack() as stack:
        for device in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
                stack.enter_context(torch.autocast(device, dtype=dtype, cache_enabled=False))
        yield


def split(batch: Batch, chunk_size: int | None) -> list[Batch]:
    """Split a tokenized batch into row chunks of at most ``chunk_size`` (None: one chunk)."""
    n = batch["input_ids"].shape[0]
    size = n if not chunk_size or chunk_size >= n else chunk_size
    return [{k: v[s : s + size] for k, v in batch.items()} for s in range(0, n, size)]


def length_order(batch: Batch) -> torch.Tensor:
    """Row order by number of real tokens, shortest first (stable: equal lengths keep their order).

    Args:
        batch: ``attention_mask`` of shape (n, L).

    Returns:
        (n,) int64 permutation: ``batch[order]`` is sorted by length.
    """
    lengths = batch["attention_mask"].sum(dim=1)
    return torch.sort(lengths, stable=True).indices


def sorted_chunks(batch: Batch, chunk_size: int | None) -> tuple[list[Batch], torch.Tensor]:
    """Chunks of rows grouped by length, and the permutation that restores the input order.

    Returns:
        ``(chunks, inverse)``: ``torch.cat([encode(c) for c in chunks])[inverse]`` holds the rows'
        embeddings in the input order.
    """
    order = length_order(batch)
    return split({k: v[order] for k, v in batch.items()}, chunk_size), torch.argsort(order)


def grad_cache_step(
    encode: Callable[[Batch], torch.Tensor],
    queries: Batch,
    docs: Batch,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    chunk_size: int | None,
    backward: Callable[[torch.Tensor], None] | None = None,
    no_sync: Callable[[], ContextManager] | None = None,
    backward_scale: float = 1.0,
    pad_to: tuple[int, int] | None = None,
    sort_by_length: bool = False,
) -> torch.Tensor:
    """One GradCache forward/backward; gradients accumulate in the parameters' ``.grad``.

    Args:
        encode: maps a tokenized chunk to (n, h) embeddings (the encoder, or its DDP wrapper).
        queries: tokenized queries, tensors of shape (B, Lq).
        docs: tokenized documents, tensors of shape (M, Ld).
        loss_fn: ``(q (B,h), d (M,h)) -> scalar``, rows in the input order; may gather across devices.
        chunk_size: rows per forward pass; None, or a size that holds each side whole, makes the
            step a plain forward/backward (same result, one forward fewer).
        backward: how to back-propagate (Lightning's ``manual_backward``); default ``Tensor.backward``.
        no_sync: context factory that suspends gradient all-reduce (DDP's ``no_sync``); entered
            for every backward pass but the last (and for the forward whose graph is kept).
        backward_scale: multiplies the cached gradients (the world size when every rank computes
            the same global loss and the strategy averages gradients).
        pad_to: at least this many (query, document) chunks: the missing ones are run as idle
            passes (one row, forward and a zero-weight backward) so that every rank runs the same
            passes — FSDP gathers parameters in each forward, and ranks whose batches hold fewer
            documents would otherwise issue fewer collectives and hang (see
            :func:`chunk_counts_across_ranks`). The result is unchanged. With ``pad_to`` every
            chunk is encoded twice (no graph is kept across other passes).
        sort_by_length: group each side's rows into chunks by length (:func:`sorted_chunks`), so
            that each chunk is padded only to its own longest row. The loss and the gradients are
            those of the same rows; only the dropout masks (drawn per chunk) differ.

    Returns:
        The detached loss.

    Raises:
        FloatingPointError: the loss is NaN or infinite (nothing is back-propagated).
    """
    backward = backward or torch.Tensor.backward
    sync_off = no_sync or nullcontext
    if sort_by_length:
        (q_chunks, q_inverse), (d_chunks, d_inverse) = (
            sorted_chunks(queries, chunk_size),
            sorted_chunks(docs, chunk_size),
        )
    else:
        (q_chunks, q_inverse), (d_chunks, d_inverse) = (
            (split(queries, chunk_size), None),
            (split(docs, chunk_size), None),
        )
    want_q, want_d = pad_to or (len(q_chunks), len(d_chunks))
    idle = [{k: v[:1] for k, v in queries.items()}] * max(0, want_q - len(q_chunks)) + [
        {k: v[:1] for k, v in docs.items()}
    ] * max(0, want_d - len(d_chunks))
    if len(q_chunks) + len(d_chunks) + len(idle) == 2:  # one chunk a side: a plain step, one forward cheaper
        loss = loss_fn(encode(queries), encode(docs))
        _check_finite(loss)
        backward(loss * backward_scale)
        return loss.detach()

    chunks = q_chunks + d_chunks
    keep = pad_to is None  # the last chunk's graph is kept (FSDP: every rank runs every pass twice)
    again = chunks[:-1] if keep else chunks  # the chunks encoded a second time, with gradient
    states, reps = [], []
    with torch.no_grad(), _autocast_without_cache():
        for chunk in again:
            states.append(RandState())
            reps.append(encode(chunk))
        for chunk in idle:
            encode(chunk)
    if keep:
        with sync_off():
            kept = encode(chunks[-1])
        reps.append(kept.detach())

    reps = [r.detach().requires_grad_() for r in reps]
    with torch.enable_grad():
        q, d = torch.cat(reps[: len(q_chunks)]), torch.cat(reps[len(q_chunks) :])
        loss = loss_fn(q if q_inverse is None else q[q_inverse], d if d_inverse is None else d[d_inverse])
    _check_finite(loss)
    grads = torch.autograd.grad(loss * backward_scale, reps)

    if keep:  # its backward first: the graph is freed before any re-encoding
        with sync_off():
            backward(torch.dot(kept.flatten(), grads[-1].flatten()))
        del kept
    passes = [(c, s, g) for c, s, g in zip(again, states, grads)] + [(c, None, None) for c in idle]
    for i, (chunk, state, grad) in enumerate(passes):
        sync = nullcontext() if (i == len(passes) - 1 or no_sync is None) else no_sync()
        with sync, state.replay() if state is not None else nullcontext():
            out = encode(chunk)
            backward(torch.dot(out.flatten(), grad.flatten()) if grad is not None else out.sum() * 0.0)
    return loss.detach()


def chunk_counts_across_ranks(queries: Batch, docs: Batch, chunk_size: int | None) -> tuple[int, int]:
    """The largest (query, document) chunk counts over all ranks (``torch.distributed`` all-reduce
    MAX), for :func:`grad_cache_step`'s ``pad_to``. One process: this rank's own counts."""
    rows = [queries["input_ids"].shape[0], docs["input_ids"].shape[0]]
    counts = torch.tensor([-(-n // chunk_size) if chunk_size else 1 for n in rows])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_backend() == "nccl":
            counts = counts.cuda()  # the rank's current device
        torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.MAX)
    return int(counts[0]), int(counts[1])


def _check_finite(loss: torch.Tensor) -> None:
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite contrastive loss: {loss.item()}")
