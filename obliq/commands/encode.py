"""``obliq encode``: a corpus's embeddings as a stage (Tevatron's ``encode`` driver; their search is
``obliq search``, :mod:`obliq.commands.search`).

``obliq encode`` writes each task's corpus embeddings into its store (:mod:`obliq.search.store`, under
``--retrieval.cache_dir``, where ``evaluate`` and ``obliq search`` look for them), one shard per
process: ``--shard.index i --shard.count n``, or a SLURM array's task, or a torchrun rank. A shard
already written is skipped, so a rerun after a killed process encodes only the shards it lacks::

    # four processes (or: sbatch --array=0-3 …, or: torchrun --nproc-per-node 4 -m obliq.cli encode …)
    for i in 0 1 2 3; do
        obliq encode --model M --tasks ../shared/data/tasks/hearings-exchanges --shard.index $i --shard.count 4 &
    done; wait
    obliq search --model M --tasks ../shared/data/tasks/hearings-exchanges --output runs/search \\
        --retrieval.index hnsw
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from time import perf_counter

from obliq.claims import claim_outputs
from obliq.search.encoders import load_encoder
from obliq.search.retrieval import ENCODE_BLOCK, encode_shard
from obliq.search.settings import RetrievalSettings
from obliq.search.store import Store
from obliq.shards import Shard
from obliq.tasks import find_tasks, load_task

log = logging.getLogger(__name__)


def encode(
    model: str,
    tasks: list[str],
    retrieval: RetrievalSettings = RetrievalSettings(),
    shard: Shard = Shard(),
    block_size: int = ENCODE_BLOCK,
    overwrite: bool = False,
) -> dict:
    """Encode one shard of each task's corpus into the task's embedding store (docs/formats.md).

    Args:
        model: a dense encoder: an alias, a folder saved by obliq, an adapter, a sentence-transformers
            or transformers folder, a hub id (as ``evaluate``'s ``--model``).
        tasks: task folders in BEIR layout, or folders holding task folders.
        retrieval: how the passages are read (``encoder``, ``batch_size``, ``passage_max_length``,
            ``trust_remote_code``) and where the stores are (``cache_dir``); the rest is search's.
        shard: this process's shard (``--shard.index i --shard.count n``; unset: a SLURM array's task,
            or torchrun's rank and world size, or the whole corpus). Shard ``i`` takes documents
            ``i, i + n, …``.
        block_size: passages encoded then written at a time (memory: one block of vectors).
        overwrite: encode the shard again even when it is already written (and start a store again
            that was split into another number of shards).

    Returns:
        ``{"shard": {"index", "count"}, "tasks": {task: {"store", "status" (encoded | done), "rows",
        "seconds", "complete", "missing"}}}``: ``missing`` are the shards still to encode.

    Raises:
        ValueError: the store was split into another number of shards (without ``overwrite``), bad vectors;
            ``retrieval.windows`` with ``reduce`` maxsim (a store holds one vector a text);
            a store that would lie inside (or hold) a task or the model folder, or another command's output.
        FileNotFoundError / OSError: the model or a task cannot be found.
    """
    shard = shard.resolved()
    if retrieval.windows is not None and retrieval.windows.reduce == "maxsim":  # refused before a store is claimed
        raise ValueError(
            "retrieval.windows.reduce maxsim: a store holds one vector a text, and MaxSim scores a text by its windows "
            "(obliq evaluate and obliq search read them in memory): use windows.reduce mean to store them"
        )
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    loaded = [load_task(p) for p in find_tasks(tasks)]
    if "LOCAL_RANK" in os.environ:  # torchrun: each rank on its own GPU
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model_file = Path(model) if Path(model).exists() else None
    stores = [(task, Store.of(model, retrieval, task)) for task in loaded]
    # every store through the one claim, before any encoding: never an input; a store is resumed shard by
    # shard, never emptied (``overwrite`` re-encodes this shard only)
    with claim_outputs(
        {str(store.folder): store.folder for _, store in stores},
        command="encode",
        inputs=[*(task.path for task in loaded), model_file],
        what="corpus embeddings",
        append=True,
        shared=True,  # the shards of one store write it at once
    ):
        # the model is loaded only when a shard is to be encoded: a rerun over written shards loads none
        to_encode = overwrite or any(store.done(shard) is None for _, store in stores)
        encoder = load_encoder(model, retrieval.encoder, retrieval.trust_remote_code) if to_encode else None
        report = {}
        for task, store in stores:
            t0 = perf_counter()
            record = None if overwrite else store.done(shard)
            status = "done" if record is not None else "encoded"
            if record is None:
                if encoder is None:  # the shard was removed since the check above
                    encoder = load_encoder(model, retrieval.encoder, retrieval.trust_remote_code)
                record = encode_shard(encoder, task, retrieval, store, shard, block_size, overwrite)
            count, missing = store.status()
            report[task.name] = {
                "store": str(store.folder),
                "status": status,
                "rows": record["rows"],
                "seconds": round(perf_counter() - t0, 3),
                "complete": not missing,
                "missing": sorted(missing),
            }
            log.info(
                "%s: shard %d of %d %s (%d passages) in %s; %s",
                task.name,
                shard.index,
                count,
                "already written" if status == "done" else "encoded",
                record["rows"],
                store.folder,
                "the store is complete" if not missing else f"shards still to encode: {sorted(missing)}",
            )
        return {"shard": {"index": shard.index, "count": shard.count}, "tasks": report}
