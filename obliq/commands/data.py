"""``obliq data convert``: training data in a sentence-transformers, Tevatron or ReasonIR layout as obliq's
training rows (the conversion and its checks: :mod:`obliq.data.convert`; the inputs it reads:
:mod:`obliq.data.convert_inputs`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from time import perf_counter
from typing import Literal

from obliq.claims import claim_outputs
from obliq.data.convert import COUNTED, FORMATS, detect_format, write_rows
from obliq.data.convert_inputs import open_input
from obliq.data.rows import ROW_SOURCES
from obliq.files import atomic_write

log = logging.getLogger(__name__)


def convert(
    input: Path,
    out: Path,
    task: str,
    format: Literal["auto", "sentence-transformers", "tevatron", "reasonir"] = "auto",
    source: Literal["public", "synthetic", "knn", "random-control"] = "public",
    split: str | None = None,
    subset: str | None = None,
    id_prefix: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Convert training data in a sentence-transformers, Tevatron or ReasonIR layout into obliq's training rows.

    The formats, told apart by their positive column (docs/formats.md, "Converting training data"):

    - ``sentence-transformers`` (https://sbert.net/docs/sentence_transformer/dataset_overview.html): text columns
      ``anchor`` (or ``query``, ``question``), ``positive``, and ``negative`` or ``negative_1``, ``negative_2``…;
    - ``tevatron`` (https://github.com/texttron/tevatron): ``query_id``, ``query``, ``positive_passages`` and
      ``negative_passages``, lists of ``{docid, title, text}`` (a passage's text: ``title + " " + text``);
    - ``reasonir`` (https://github.com/facebookresearch/ReasonIR, ``reasonir/reasonir-data``; GritLM's layout):
      ``query`` = ``[instruction, text]``, ``pos`` / ``neg`` = lists of ``[instruction, text]`` (a plain string:
      a text without instruction, as FlagEmbedding's ``{query, pos, neg}``).

    One row per record, in input order: id ``<id_prefix>:<n>`` (n: the 1-based line of a JSONL file, or the
    0-based row index over the files read or the data set); one ``positive`` or several ``positives``; the
    negatives in input order; a ReasonIR query's instruction as ``instruction``, its documents' own in
    ``meta.document_instructions``; ``meta.query_id``: Tevatron's ``query_id``, else ``q:`` + 16 hex digits of
    the query's SHA-256. Document ids: Tevatron's ``docid``, else ``doc:`` + 16 hex digits of the text's SHA-256
    (one text, one id: obliq masks false negatives by id).

    Args:
        input: a JSONL file (``.jsonl``, ``.json``: one record a line), a Parquet or Arrow file, a
            ``save_to_disk`` folder (``Dataset`` or ``DatasetDict``), or a dataset folder: the data files of one
            configuration and split as ``datasets.load_dataset(input, name=subset, split=split)`` finds them
            (README.md ``configs:``, files named by split; Parquet, Arrow or JSONL), read in datasets' order.
        out: the training rows to write (JSONL, docs/formats.md).
        task: the task the rows belong to (each row's ``task``).
        format: the records' format; ``auto``: told by the column ``positive``, ``positive_passages`` or ``pos``.
        source: each row's ``source``: ``public`` (published data), unless the rows are of obliq's other kinds.
        split: the split to read from a folder of several (a ``DatasetDict``, or a dataset folder's).
        subset: the configuration to read from a dataset folder of several (README.md ``configs:``): datasets'
            ``name``, the hub's "subset" (``--config`` is a file of settings, as for every command).
        id_prefix: the row ids' prefix (default ``<task>:<input name>``, plus ``:<subset>`` when not
            ``default``, plus ``:<split>``: those read from a folder).
        overwrite: replace an existing ``out`` (refused otherwise).

    Returns:
        The report: ``rows``, ``format``, ``detected`` (whether ``auto`` chose it), ``inputs`` (the files read),
        ``out``, ``task``, ``source``, ``subset``, ``split``, ``positives``, ``negatives``,
        ``rows_with_several_positives``, ``missing_negatives`` (empty negative cells, skipped),
        ``document_instructions``, ``repaired_characters``, ``ignored_columns``, ``seconds``.

    Raises:
        FileNotFoundError: no input.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        ~obliq.data.convert.ConvertError: a bad record (file, line or row, and column named): a text missing, not
            a string or empty; no positive; a negative equal to a positive, or two equal positives (id or normalised
            text); a Tevatron ``docid`` with two different texts (both places named).
        ValueError: ``out`` is the input or inside it; an input of another kind, or one that cannot be read (the
            file named); columns that fit no format or several, or lack one (the columns present named); a
            column the format does not read named like one it does (``negatives``:
            :func:`~obliq.data.convert.near_column`); a configuration or split not chosen or not found (those there
            named); no record; every ReasonIR positive a single word (``reasonir-data``'s ``hq`` data holds
            document ids, not texts).
        ImportError: a Parquet or Arrow input, or a folder, without the ``datasets`` package.
    """
    t0 = perf_counter()
    input, out = Path(input), Path(out)
    if not isinstance(task, str) or not task.strip():
        raise ValueError("--task: give the name of the task the rows belong to")
    if source not in ROW_SOURCES:
        raise ValueError(f"--source: {source!r} is not one of {', '.join(ROW_SOURCES)}")
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"--format: {format!r} is not one of auto, {', '.join(FORMATS)}")
    with claim_outputs({"out": out}, command="data convert", inputs=[input], overwrite=overwrite, what="rows"):
        opened = open_input(input, split, subset)
        same = next((f for f in opened.files if out.exists() and os.path.samefile(f, out)), None)
        if same is not None:  # a file the folder resolves to (a hub snapshot's symlinked blob, a configs: path)
            raise ValueError(f"output {out} is the input file {same} (read through {input}): give another --out")
        fmt = detect_format(opened.columns, input) if format == "auto" else format
        name = input.stem if input.is_file() else input.resolve().name  # `--input .` names its folder
        config = opened.config if opened.config != "default" else None
        parts = [id_prefix] if id_prefix is not None else [task, name, config, opened.split]
        prefix = ":".join(p for p in parts if p is not None)
        with atomic_write(out) as f:  # a refusal in the block leaves no file and what was there before
            counts, ignored, ids_like = write_rows(f, opened.records, fmt, f"{prefix}:", task, source)
            if counts["rows"] == 0:
                raise ValueError(f"{input}: no record to convert")
            if ids_like:
                raise ValueError(
                    f"{input}: every positive is a single word without spaces (first: {ids_like}): document ids, "
                    "not texts? ReasonIR's hq data stores BRIGHT document ids in pos: replace them by their texts first"
                )
        report = {"rows": counts["rows"], "format": fmt, "detected": format == "auto", "inputs": opened.files}
        report |= {"out": str(out), "task": task, "source": source, "subset": opened.config, "split": opened.split}
        report |= {k: counts[k] for k in COUNTED.split()} | {"ignored_columns": sorted(ignored)}
        report["seconds"] = round(perf_counter() - t0, 3)
        log.info("%d rows (%s) from %s written to %s", counts["rows"], fmt, input, out)
        return report
