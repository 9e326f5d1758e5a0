"""``obliq cache``: the corpus-embedding stores that ``evaluate``, ``encode`` and ``search`` keep
(:mod:`obliq.search.store`), listed, and removed with ``--prune true``.

A store is a folder ``<root>/<task>-<key>`` holding ``store.json``; ``root`` is ``$OBLIQ_CACHE/embeddings``
(``~/.cache/obliq/embeddings``) unless a command was given ``--retrieval.cache_dir``. Only folders with an
obliq ``store.json`` are ever listed or removed. A store's last use is its ``store.json``'s time, renewed
whenever a store is written or opened.

    obliq cache                                         # every store
    obliq cache --older_than 30 --prune true            # remove the stores not used for 30 days
    obliq cache --model runs/x/export/adapter           # the stores of a model (every version of the folder)
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from obliq.files import cache_dir


def _root(root: Path | None) -> Path:
    """The stores' folder: ``root``, or the default of :meth:`obliq.search.settings.RetrievalSettings.store_root`."""
    return Path(root) if root is not None else cache_dir() / "embeddings"


def _stores(root: Path) -> list[dict]:
    """Every store under ``root`` (a folder with an obliq ``store.json``), the least recently used first;
    ``days_unused`` is exact here (rounded in what is shown)."""
    from obliq.search.store import FORMAT, STORE_FILE

    out = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        head_file = folder / STORE_FILE
        try:
            head = json.loads(head_file.read_text(encoding="utf-8"))
            used = head_file.stat().st_mtime
        except (OSError, ValueError):
            continue
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            continue
        files = [f for f in folder.iterdir() if f.is_file()]
        fingerprint = head.get("fingerprint") if isinstance(head.get("fingerprint"), dict) else {}
        out.append(
            {
                "folder": str(folder),
                "model": head.get("model") or fingerprint.get("model"),
                "key": fingerprint.get("model"),
                "shards": head.get("shards"),
                "bytes": sum(f.stat().st_size for f in files),
                "last_used": datetime.fromtimestamp(used, UTC).isoformat(timespec="seconds"),
                "days_unused": (time.time() - used) / 86400,
            }
        )
    return sorted(out, key=lambda s: -s["days_unused"])


def _matches(store: dict, model: str) -> bool:
    """Whether a store was made with ``model``: the name it recorded (:func:`obliq.search.store.model_name`),
    or, for stores keyed by a folder's files, any version of that folder."""
    from obliq.search.store import model_name

    name = model_name(model)
    return store["model"] in (name, model) or str(store["key"] or "").startswith(f"{name}@")


def cache(
    older_than: float | None = None,
    model: str | None = None,
    prune: bool = False,
    root: Path | None = None,
) -> dict:
    """List the corpus-embedding stores (each one's folder, model, shards, size and last use), or those not
    used for ``older_than`` days, or those of ``model``; with ``prune``, remove them (and the indexes saved
    beside them): the next evaluation that needs one makes it again.

    Args:
        older_than: only the stores not written or opened for this many days (0: every store).
        model: only the stores of this model: a folder (any version of it), an alias or a hub id, as given
            to ``evaluate --model``.
        prune: remove the stores listed; needs ``older_than`` or ``model`` (list first, then prune).
        root: the stores' folder (default ``$OBLIQ_CACHE/embeddings``; a ``--retrieval.cache_dir`` otherwise).

    Returns:
        ``{"root", "stores": [{"folder", "model", "key", "shards", "bytes", "last_used", "days_unused"}],
        "bytes", "pruned"}``: the stores chosen (removed when ``pruned``), the least recently used first.

    Raises:
        ValueError: ``prune`` without ``older_than`` or ``model``; ``older_than`` < 0.
    """
    if older_than is not None and not older_than >= 0:
        raise ValueError(f"older_than: must be a number of days >= 0, got {older_than!r}")
    if prune and older_than is None and model is None:
        raise ValueError(
            "prune: say which stores to remove with --older_than DAYS and/or --model M "
            "(`obliq cache` lists them; --older_than 0 means every one)"
        )
    if root is not None and not Path(root).is_dir():
        raise ValueError(f"root: {root} is not a folder (the stores' folder, e.g. $OBLIQ_CACHE/embeddings)")
    root = _root(root)
    chosen = [
        s
        for s in _stores(root)
        if (older_than is None or s["days_unused"] >= older_than) and (model is None or _matches(s, model))
    ]
    if prune:
        for s in chosen:
            shutil.rmtree(s["folder"])
    stores = [{**s, "days_unused": round(s["days_unused"], 1)} for s in chosen]
    return {"root": str(root), "stores": stores, "bytes": sum(s["bytes"] for s in stores), "pruned": prune}
