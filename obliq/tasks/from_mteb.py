"""An mteb retrieval task, loaded by mteb itself, written as an obliq task folder (``obliq task from-mteb``,
:func:`obliq.commands.task.from_mteb`).

mteb does the loading (its dataset loader, its cache, the revision its task definition pins); obliq
writes what mteb would score (docs/formats.md):

- ``corpus.jsonl``: every document's text as mteb's encoders read it (``title + " " + text``,
  stripped; the title is folded in, so obliq reads the very same string);
- ``queries.jsonl``: the queries mteb keeps (those with judgements), with a per-query ``instruction``
  column appended as mteb appends it (``text + " " + instruction``);
- ``qrels/test.tsv``: mteb's qrels, every grade (0 included) — for OBLIQ-Bench Twitter, WildChat and
  Math these are pooled judgements, and ``task.json`` says so (``judgements``);
- ``top_ranked/test.jsonl``: the candidate sets, when the task has them;
- ``task.json``: name, mechanism, instruction (the OBLIQ-IR paper's B.3 prefix for the OBLIQ tasks,
  else mteb's task prompt), ``prompt_name`` (the mteb task name: what a model's per-task prompts
  are keyed by), ``judgements``, and where it came from (mteb version, dataset, revision, subset, split).

Offline (``HF_HUB_OFFLINE=1``) two failures are caught:

- the data is not cached: :func:`load_mteb_task` refuses in one line naming the dataset, revision and subset;
- the data sits only in ``datasets``' Arrow cache: ``datasets`` then lists only its ``default`` config,
  so mteb's loader silently drops ``top_ranked`` (a candidate-set task would run over the whole
  corpus). mteb's published statistics of the task say whether it has candidate sets; when they do and
  none were loaded, :func:`write_mteb_task` refuses. ``--dataset_path`` (a local copy in hub layout: its
  ``README.md`` lists the configs) is the safe offline route.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from obliq.files import atomic_write, publish, write_json
from obliq.tasks.format import check_id
from obliq.tasks.obliq_bench import OBLIQ_BENCH

log = logging.getLogger(__name__)

INSTALL = "pip install -e '.[mteb]'"


def import_mteb():
    """The ``mteb`` package.

    Raises:
        ImportError: mteb is not installed (the message names the extra).
    """
    try:
        import mteb
    except ImportError as err:
        raise ImportError(f"mteb is an optional extra of obliq: {INSTALL}") from err
    return mteb


def _pick(what: str, given: str | None, available: list[str], name: str) -> str:
    if given is None and len(available) == 1:
        return available[0]
    if given in available:
        return given
    raise ValueError(f"mteb task {name}: give --{what} as one of {available} (got {given!r})")


def _published_candidates(task, split: str, subset: str) -> bool:
    """Whether mteb's published statistics of the task (``descriptive_stats/…json``) give its
    queries candidate sets (``top_ranked``) in this split and subset."""
    stats = (task.metadata.descriptive_stats or {}).get(split) or {}
    stats = (stats.get("hf_subset_descriptive_stats") or {}).get(subset, stats)
    return bool(stats.get("top_ranked_statistics"))


def _hub_snapshot(dataset: dict) -> Path | None:
    """The hub cache's snapshot folder of a dataset at its pinned revision, when it is there."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"datasets--{dataset['path'].replace('/', '--')}" / "snapshots"
    folder = folder / str(dataset["revision"])
    return folder if (folder / "README.md").is_file() else None


def _against_published(task, split: str, subset: str, counts: dict) -> dict:
    """What the written counts disagree on with mteb's published statistics of the task (documents +
    queries, judgements, candidate lists), {} when they agree or none are published."""
    stats = (task.metadata.descriptive_stats or {}).get(split) or {}
    stats = (stats.get("hf_subset_descriptive_stats") or {}).get(subset, stats)
    if not stats:
        return {}
    got = {
        "num_samples": counts["docs"] + counts["queries"],
        "num_relevant_docs": counts["relevant"],
        "num_top_ranked": (counts["candidates"] or {}).get("total"),
    }
    want = {
        "num_samples": stats.get("num_samples"),
        "num_relevant_docs": (stats.get("relevant_docs_statistics") or {}).get("num_relevant_docs"),
        "num_top_ranked": (stats.get("top_ranked_statistics") or {}).get("num_top_ranked"),
    }
    return {k: {"loaded": got[k], "published": want[k]} for k in got if want[k] is not None and got[k] != want[k]}


def _query_instruction(metadata) -> str | None:
    """mteb's task prompt for queries (a string, or a dict with a ``query`` entry)."""
    prompt = metadata.prompt
    if isinstance(prompt, dict):
        prompt = prompt.get("query")
    return prompt if isinstance(prompt, str) and prompt.strip() else None


@dataclass
class MtebSplit:
    """One split and subset of an mteb retrieval task, loaded (:func:`load_mteb_task`)."""

    name: str
    """The mteb task name."""
    task: object
    """mteb's task object, its data loaded."""
    subset: str
    split: str
    dataset: dict
    """mteb's dataset metadata of the task (``path``, ``revision``), as its definition pins it."""
    source: str
    """Where the data was read from: the dataset's path, or the ``dataset_path`` given."""


def load_mteb_task(
    name: str, split: str | None = None, subset: str | None = None, dataset_path: Path | None = None
) -> MtebSplit:
    """Load one split and subset of an mteb retrieval task through mteb (arguments: see
    :func:`obliq.commands.task.from_mteb`).

    Raises:
        ImportError: mteb is not installed.
        FileNotFoundError: ``dataset_path`` is no folder.
        ValueError: not an mteb retrieval task; an unknown split or subset; the data cannot be loaded
            (offline and not cached: dataset, revision and subset named).
    """
    mteb = import_mteb()
    from mteb.abstasks.retrieval import AbsTaskRetrieval

    try:
        task = mteb.get_task(name)
    except KeyError as err:
        raise ValueError(f"{name}: not an mteb task ({err.args[0] if err.args else err})") from None
    if not isinstance(task, AbsTaskRetrieval):
        raise ValueError(f"{name}: an mteb {task.metadata.type} task, not a retrieval task")
    subset = _pick("subset", subset, list(task.hf_subsets), name)
    split = _pick("split", split, list(task.eval_splits), name)
    task = mteb.get_task(name, eval_splits=[split], hf_subsets=[subset])
    dataset = dict(task.metadata.dataset)
    if dataset_path is not None:
        dataset_path = Path(dataset_path).resolve()
        if not dataset_path.is_dir():
            raise FileNotFoundError(f"--dataset_path {dataset_path}: no such folder (a local copy in hub layout)")
        task.metadata = task.metadata.model_copy(update={"dataset": {**dataset, "path": str(dataset_path)}})
    source = task.metadata.dataset["path"]
    try:
        task.load_data()
    except OSError as err:  # ConnectionError (offline, not cached), FileNotFoundError, DatasetNotFoundError
        import datasets

        offline = datasets.config.HF_HUB_OFFLINE
        snapshot = _hub_snapshot(dataset)
        where = (
            f"pass --dataset_path {snapshot} (its hub snapshot)"
            if snapshot is not None and dataset_path is None
            else "pass --dataset_path with a local copy in hub layout"
        )
        raise ValueError(
            f"mteb task {name}: dataset {source} at revision {dataset['revision']} (subset {subset}, split "
            f"{split}) could not be loaded{' offline: it is not in the cache' if offline else ''} "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); run once where the hub is "
            f"reachable, or {where}"
        ) from None
    return MtebSplit(name, task, subset, split, dataset, source)


def write_mteb_task(out: Path, loaded: MtebSplit, task_name: str | None = None) -> dict:
    """Write a loaded mteb split into the task folder ``out`` (the module notes say what); returns its
    ``task.json`` content (its counts under ``stats``).

    Raises:
        ValueError: candidate sets that mteb's statistics promise but the loaded data lacks; an id obliq
            cannot write (whitespace) or a candidate that is not in the corpus.
    """
    name, task, subset, split, source = loaded.name, loaded.task, loaded.subset, loaded.split, loaded.source
    task.convert_v1_dataset_format_to_v2(num_proc=None)
    data = task.dataset[subset][split]
    top_ranked = data.get("top_ranked")
    bench = OBLIQ_BENCH.get(name)
    if top_ranked is None and (_published_candidates(task, split, subset) or (bench and bench.candidates)):
        raise ValueError(
            f"mteb task {name}: mteb's statistics give its queries candidate sets (top_ranked), but none were "
            f"loaded from {source} (offline, datasets serves only its Arrow cache's 'default' config and mteb "
            "then drops top_ranked): run where the hub is reachable, or pass --dataset_path with a local copy"
        )
    # a task needs qrels: they are published last, so a killed call leaves no task that loads (a refused
    # one, nothing: the command's claim is withdrawn)
    with publish(out / "qrels", folder=True) as qrels:
        counts = _write(out, qrels, name, data, top_ranked)
        mismatch = _against_published(task, split, subset, counts)
        if mismatch:  # offline, datasets serves the latest cached version whatever the pinned revision
            log.warning("mteb task %s: loaded data differs from mteb's published statistics: %s", name, mismatch)
        meta = {
            "name": task_name or name,
            "mechanism": bench.mechanism if bench else None,
            "instruction": bench.instruction if bench else _query_instruction(task.metadata),
            "prompt_name": name,
            "judgements": bench.judgements if bench else "gold",
            "description": task.metadata.description,
            "reference": task.metadata.reference,
            "licence": task.metadata.license,
            "source": {
                "mteb_task": name,
                "mteb_version": import_mteb().__version__,
                "dataset": loaded.dataset["path"],
                "revision": loaded.dataset["revision"],
                "loaded_from": source,
                "subset": subset,
                "split": split,
                **({"differs_from_published_statistics": mismatch} if mismatch else {}),
            },
            "stats": counts,
        }
        meta = {k: v for k, v in meta.items() if v is not None}
        write_json(out / "task.json", meta)
    return meta


def _write(out: Path, qrels_dir: Path, name: str, data, top_ranked) -> dict:
    """Write corpus, queries and candidates of one loaded mteb split into ``out`` (a fresh folder), its
    qrels into ``qrels_dir``; returns the counts."""
    docs: set[str] = set()
    duplicates = 0
    with atomic_write(out / "corpus.jsonl") as f:
        for row in data["corpus"]:
            doc = check_id(str(row["id"]), f"mteb task {name}: corpus")
            if doc in docs:
                duplicates += 1
                continue
            docs.add(doc)
            title, body = row.get("title") or "", row.get("text") or ""
            text = f"{title} {body}".strip() if title else body.strip()  # what mteb's encoders read
            f.write(json.dumps({"_id": doc, "title": "", "text": text}, ensure_ascii=False) + "\n")
    if duplicates:
        log.warning("mteb task %s: %d duplicate document ids, the first kept", name, duplicates)
    qrels = {str(q): judged for q, judged in data["relevant_docs"].items()}
    queries = []
    with atomic_write(out / "queries.jsonl") as f:
        for row in data["queries"]:
            qid = check_id(str(row["id"]), f"mteb task {name}: queries")
            if qid not in qrels:
                continue
            text = row["text"] + (" " + row["instruction"] if row.get("instruction") is not None else "")
            queries.append(qid)
            f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    with atomic_write(qrels_dir / "test.tsv") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q in queries:
            for d, g in qrels[q].items():
                f.write(f"{q}\t{check_id(str(d), f'mteb task {name}: qrels of {q}')}\t{int(g)}\n")
    counts = {
        "docs": len(docs),
        "queries": len(queries),
        "qrels": sum(len(qrels[q]) for q in queries),
        "relevant": sum(g != 0 for q in queries for g in qrels[q].values()),  # as mteb's statistics count
    }
    counts["candidates"] = None
    if top_ranked is not None:
        sizes = []
        with atomic_write(out / "top_ranked" / "test.jsonl") as f:
            for q in queries:
                if q not in top_ranked:
                    continue
                ids = [str(d) for d in top_ranked[q]]
                unknown = next((d for d in ids if d not in docs), None)
                if unknown is not None:
                    raise ValueError(f"mteb task {name}: candidate {unknown!r} of query {q!r} is not in the corpus")
                sizes.append(len(ids))
                f.write(json.dumps({"query-id": q, "corpus-ids": ids}, ensure_ascii=False) + "\n")
        counts["candidates"] = {
            "queries": len(sizes),
            "total": sum(sizes),
            "min": min(sizes, default=0),
            "max": max(sizes, default=0),
        }
    return counts
