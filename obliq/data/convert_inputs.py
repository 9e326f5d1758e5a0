"""The inputs of ``obliq data convert`` (:mod:`obliq.commands.data`, :mod:`obliq.data.convert`): a JSONL, Parquet
or Arrow file, a folder that ``datasets``' ``save_to_disk`` wrote, or a dataset folder as the hub keeps one, whose
configurations, splits and data files ``datasets`` itself resolves, as ``datasets.load_dataset(folder, name=config,
split=split)`` does (a README.md ``configs:`` header, ``<config>/<split>-*.parquet``, files named by split such
as ``train.parquet`` / ``test.jsonl``); obliq then reads those files in that order, itself, so that a refusal
names the file and its line (JSONL) or ``row <i>`` (Parquet, Arrow).

A folder of several configurations needs ``--subset`` (datasets' ``name``; the hub calls a configuration a
subset) unless its README names a default (datasets' rule), and
one of several splits needs ``--split``: each refusal names what there is. Every file that cannot be read (a
damaged Parquet page, a cut ``.arrow`` file, a ``dataset_info.json`` that is not datasets', a README header
that is not YAML) is refused in one line naming the file.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from obliq.files import open_text

_BATCH = 1024
_READ = {"parquet": (".parquet",), "json": (".jsonl", ".json", ".ndjson"), "arrow": (".arrow",)}
"""datasets' builders obliq follows, and the suffixes of the files obliq reads for each."""
_APPLIED = {"name", "version", "data_dir", "data_files", "description", "features", "batch_size", "chunksize"}
_APPLIED |= {"use_threads", "block_size", "fragment_scan_options", "on_mixed_types", "parse_agent_traces"}
"""The settings of a datasets builder configuration that change no row obliq reads (any other one set in a
README's ``configs:`` entry, ``columns``, ``filters``, JSON's ``field``…, is refused, not ignored)."""


class ConvertError(ValueError):
    """A record that cannot be converted: ``str(err)`` is ``"<file>:<where>:<field>: <reason>"``.

    Attributes:
        path: the input file (or, for a ``save_to_disk`` folder, the folder of the split read).
        where: the 1-based line of a JSONL file, or ``row <i>`` (0-based) of a Parquet file or Arrow data set.
        field: the input's column or field, e.g. ``positive_passages[0].text``, ``negative_2``, ``pos[1][1]``.
        kind: :data:`obliq.data.rows.ERROR_KINDS`, ``json`` (not a JSON object, a key twice), or ``conflict``
            (one document id with two texts).
        reason: what is wrong, in words.
    """

    def __init__(self, path: str, where: str, field: str, kind: str, reason: str):
        self.path, self.where, self.field, self.kind, self.reason = str(path), str(where), field, kind, reason
        super().__init__(f"{self.path}:{self.where}:{field}: {reason}")


@dataclass(frozen=True)
class Record:
    """One input record: its values, where it is (file, line or ``row i``) and its number in the row ids."""

    values: dict
    path: str
    where: str
    number: int


@dataclass
class Input:
    """An opened input: its files (in reading order), its columns (its first record's or table's), its
    records each with its table's columns (None: a JSONL record, whose own keys are its columns), and the
    configuration and split read (None: a file, or a ``save_to_disk`` folder without either)."""

    files: list[str]
    columns: list[str]
    records: Iterator[tuple[Record, list[str] | None]]
    split: str | None = None
    config: str | None = None


def need(package: str, what: str):
    """The module ``package``, imported (``datasets``, ``pyarrow``).

    Raises:
        ImportError: not installed, naming what needs it and how to install it.
    """
    try:
        return __import__(package)
    except ImportError:  # datasets brings pyarrow; both are what sentence-transformers trains from
        raise ImportError(f"reading {what} needs the {package!r} package: pip install datasets") from None


class _KeyTwice(ValueError):
    """A JSON object that gives one key twice (``args[0]``: the key)."""


def _object(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice (Python's json keeps the last silently)."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise _KeyTwice(key)
        obj[key] = value
    return obj


def _jsonl_records(path: Path) -> Iterator[Record]:
    """The records of a JSONL file, numbered by their 1-based line.

    Raises:
        ConvertError: a line that is not one JSON object, or an object that gives a key twice (line named).
    """
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line, strict=False, object_pairs_hook=_object)
            except _KeyTwice as err:
                reason = f"the key {err.args[0]!r} given twice in one object (a JSON reader keeps the last): keep one"
                raise ConvertError(str(path), lineno, str(err.args[0]), "json", reason) from None
            except json.JSONDecodeError as err:
                hint = " (a JSON array? obliq reads one record a line, JSONL)" if line.lstrip()[:1] == "[" else ""
                raise ConvertError(str(path), lineno, "(record)", "json", f"not valid JSON: {err}{hint}") from None
            if not isinstance(obj, dict):
                reason = f"expected a JSON object, got {type(obj).__name__}"
                raise ConvertError(str(path), lineno, "(record)", "json", reason)
            yield Record(obj, str(path), str(lineno), lineno)


def _jsonl(files: list[Path], by_line: bool) -> tuple[list[str], Iterator[tuple[Record, None]]]:
    """The first record's keys and the records of JSONL ``files`` in order, numbered by line (``by_line``: one
    file) or by their 0-based index over the files."""
    records = itertools.chain.from_iterable(map(_jsonl_records, files))
    if not by_line:
        records = (dataclasses.replace(rec, number=i) for i, rec in enumerate(records))
    first = next(records, None)
    return (list(first.values) if first else []), (
        (r, None) for r in itertools.chain([first] if first else [], records)
    )


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _tables(parts: Iterator[tuple[str, list[str], Iterator]]) -> Iterator[tuple[Record, list[str]]]:
    """The rows of Arrow tables: ``parts`` gives each file's name, columns and record batches.

    Raises:
        ValueError: a batch that pyarrow cannot read (a damaged page, a cut file), the file named.
    """
    number = 0
    for where, columns, batches in parts:
        index, batches = 0, iter(batches)
        while True:
            try:
                batch = next(batches, None)
                values = None if batch is None else batch.to_pylist()
            except (OSError, ValueError, ArithmeticError) as err:  # pyarrow's ArrowInvalid is a ValueError
                raise ValueError(
                    f"{where}: unreadable from row {index} on (damaged or cut?): {_one_line(err)}"
                ) from None
            if values is None:
                break
            for row in values:
                yield Record(row, where, f"row {index}", number), columns
                index, number = index + 1, number + 1


def _parquet(files: list[Path]) -> tuple[list[str], Iterator]:
    """The columns of the first of Parquet ``files`` and the rows of all, in order."""
    need("pyarrow", "Parquet files")
    import pyarrow.parquet as pq

    def opened(path: Path):
        try:
            return pq.ParquetFile(path)
        except Exception as err:  # pyarrow's ArrowInvalid and OSError alike: the file named
            raise ValueError(f"{path}: not a Parquet file that pyarrow can read ({_one_line(err)})") from None

    parts = ((str(p), (pf := opened(p)).schema_arrow.names, pf.iter_batches(batch_size=_BATCH)) for p in files)
    return list(opened(files[0]).schema_arrow.names), _tables(parts)


def _ipc(path: Path) -> tuple[list[str], Iterator]:
    """The columns and record batches of an Arrow IPC file: the stream format, else the file format (as
    datasets' ``arrow`` builder reads them)."""
    pa = need("pyarrow", "Arrow files")
    source = pa.memory_map(str(path))
    try:
        reader = pa.ipc.open_stream(source)
        return reader.schema.names, iter(reader)
    except (OSError, ValueError):
        try:
            reader = pa.ipc.open_file(source)
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not an Arrow file that pyarrow can read ({_one_line(err)})") from None
        return reader.schema.names, (reader.get_batch(i) for i in range(reader.num_record_batches))


def _arrow(files: list[Path]) -> tuple[list[str], Iterator]:
    """The columns of the first of Arrow ``files`` and the rows of all, in order."""
    columns = _ipc(files[0])[0]
    return columns, _tables((str(p), *_ipc(p)) for p in files)


def _json_object(path: Path) -> dict:
    """A JSON file that datasets writes beside its Arrow files (``state.json``, ``dataset_info.json``…).

    Raises:
        ValueError: not valid JSON or not an object, the file named.
    """
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise ValueError(f"{path}: not valid JSON ({_one_line(err)})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _check_saved(folder: Path, err: Exception) -> ValueError:
    """The error for a ``save_to_disk`` folder that datasets cannot load: the first file at fault named (a
    ``state.json`` without its files, a cut ``.arrow`` file, a ``dataset_info.json`` datasets refuses), or
    the folder with datasets' reason."""
    import datasets

    for sub in sorted({p.parent for p in folder.glob("state.json")} | {p.parent for p in folder.glob("*/state.json")}):
        entries = _json_object(sub / "state.json").get("_data_files")
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "filename" in e for e in entries):
            return ValueError(f"{sub / 'state.json'}: no _data_files list of {{filename}} objects (not datasets')")
        for entry in entries:
            try:
                for batch in _ipc(sub / entry["filename"])[1]:
                    batch.validate(full=True)
            except (OSError, ValueError) as bad:
                return ValueError(f"{sub / entry['filename']}: unreadable (damaged or cut?): {_one_line(bad)}")
        if (sub / "dataset_info.json").is_file():
            try:
                datasets.DatasetInfo.from_directory(str(sub))
            except Exception as bad:  # datasets' own parsing of features: ValueError, KeyError, TypeError…
                return ValueError(f"{sub / 'dataset_info.json'}: not datasets' dataset_info ({_one_line(bad)})")
    reason = f"{type(err).__name__}: {_one_line(err)}"
    return ValueError(f"{folder}: datasets cannot load this save_to_disk folder ({reason})")


def _saved(folder: Path, split: str | None, config: str | None) -> Input:
    """A folder that datasets' ``save_to_disk`` wrote (a ``Dataset`` or ``DatasetDict``), read with
    ``datasets.load_from_disk``."""
    datasets = need("datasets", "a save_to_disk folder")
    if config is not None:
        raise ValueError(f"{folder}: a save_to_disk folder has no configurations: leave out --subset")
    for name in ("dataset_dict.json", "state.json", "dataset_info.json", "*/state.json", "*/dataset_info.json"):
        for path in sorted(folder.glob(name)):
            _json_object(path)
    try:
        loaded = datasets.load_from_disk(str(folder))
    except FileNotFoundError as err:
        raise ValueError(f"{folder}: not a folder that datasets' save_to_disk wrote ({_one_line(err)})") from None
    except Exception as err:  # json, Arrow and features errors, none of which names its file
        raise _check_saved(folder, err) from None
    where = folder
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if split is None and len(names) == 1:
            split = names[0]
        if split is None:
            raise ValueError(f"{folder}: a DatasetDict of several splits ({', '.join(names)}): choose one with --split")
        if split not in loaded:
            raise ValueError(f"{folder}: no split {split!r} (splits: {', '.join(names)})")
        ds, where = loaded[split], folder / split
    else:
        if split is not None:
            raise ValueError(f"{folder}: a single Dataset (no dataset_dict.json): it has no splits; leave out --split")
        ds = loaded
    columns, files = list(ds.column_names), sorted({f["filename"] for f in ds.cache_files}) or [str(where)]
    parts = iter([(str(where), columns, ds.with_format("arrow").iter(batch_size=_BATCH))])
    return Input(files, columns, _tables(parts), split)


def _resolve_error(folder: Path, err: Exception) -> ValueError:
    """datasets' failure to resolve a folder, in one line naming the file at fault where one is."""
    import yaml

    readme = folder / "README.md"
    if isinstance(err, yaml.YAMLError) and readme.is_file():
        return ValueError(f"{readme}: its YAML header is not YAML that datasets reads ({_one_line(err)})")
    if type(err).__name__ == "EmptyDatasetError":
        return ValueError(
            f"{folder}: a folder with no data obliq reads: neither a save_to_disk folder (dataset_dict.json or "
            "state.json) nor data files datasets finds (Parquet, Arrow, JSONL)"
        )
    if isinstance(err, json.JSONDecodeError) and (folder / "dataset_infos.json").is_file():
        return ValueError(f"{folder / 'dataset_infos.json'}: not valid JSON ({_one_line(err)})")
    return ValueError(f"{folder}: datasets cannot resolve its data files ({type(err).__name__}: {_one_line(err)})")


def _declares_configs(folder: Path) -> bool:
    """Whether ``folder``'s README.md header (or ``.huggingface.yaml``), as datasets reads it, lists
    configurations (``configs:``)."""
    import yaml
    from huggingface_hub import DatasetCard

    header = DatasetCard.load(folder / "README.md").data.to_dict() if (folder / "README.md").is_file() else {}
    if (folder / ".huggingface.yaml").is_file():
        header |= yaml.safe_load((folder / ".huggingface.yaml").read_text(encoding="utf-8")) or {}
    return bool(header.get("configs"))


def _builder(folder: Path, config: str | None):
    """datasets' builder of ``folder``'s configuration ``config`` (None: datasets' default one), with the
    configurations there.

    Raises:
        ValueError: no such configuration, or several and none chosen (those there named); datasets' failure to
            resolve the folder, in one line naming the file at fault where one is.
    """
    import datasets

    try:
        names = datasets.get_dataset_config_names(str(folder))
        default = datasets.get_dataset_default_config_name(str(folder))
    except Exception as err:  # yaml, datasets' EmptyDatasetError, json: none names its file
        raise _resolve_error(folder, err) from None
    if config is not None and config not in names:
        raise ValueError(f"{folder}: no configuration {config!r} (configurations: {names})")
    if config is None and default is None:
        raise ValueError(f"{folder}: a dataset of several configurations {names}: choose one with --subset")
    try:
        with tempfile.TemporaryDirectory() as cache:  # the builder's lock file goes there, not in the user's cache
            return datasets.load_dataset_builder(str(folder), name=config or default, cache_dir=cache)
    except Exception as err:
        raise _resolve_error(folder, err) from None


def _dataset_folder(folder: Path, split: str | None, config: str | None) -> Input:
    """A dataset folder as ``datasets.load_dataset(folder, name=config, split=split)`` reads it: the
    configuration, split and data files that datasets resolves, read by obliq in datasets' order.

    Raises:
        ValueError: several configurations or splits and none chosen, or one that is not there (those there
            named); a format obliq does not read; a configuration setting obliq does not apply; the files of
            one split in several top-level folders without a README ``configs:`` header (configurations that
            datasets would read as one).
    """
    need("datasets", "a dataset folder")
    settings = _builder(folder, config).config
    name, kind = settings.name, type(settings).__name__.removesuffix("Config").lower()
    if kind not in _READ:
        raise ValueError(f"{folder}: datasets reads it as {kind} files; obliq converts Parquet, Arrow and JSONL")
    changed = [
        f"{f.name}={getattr(settings, f.name)!r}"
        for f in dataclasses.fields(settings)
        if f.name not in _APPLIED and f.default is not dataclasses.MISSING and getattr(settings, f.name) != f.default
    ]
    if changed:
        raise ValueError(
            f"{folder}: configuration {name!r} sets {', '.join(changed)}, which obliq does not apply: convert its "
            "files as they should be read, or without that setting"
        )
    splits = {str(s): [Path(f) for f in files] for s, files in (settings.data_files or {}).items()}
    if split is None and len(splits) > 1:
        raise ValueError(f"{folder}: configuration {name!r} has several splits {list(splits)}: choose one with --split")
    split = split if split is not None else next(iter(splits), None)
    if split not in splits:
        raise ValueError(f"{folder}: configuration {name!r} has no split {split!r} (splits: {list(splits)})")
    files = splits[split]
    tops = sorted({Path(os.path.relpath(f, folder.resolve())).parts[:-1][:1] or (".",) for f in files})
    if len(tops) > 1 and not _declares_configs(folder):
        raise ValueError(
            f"{folder}: the files of split {split!r} lie in several folders ({', '.join(t[0] for t in tops)}), as a "
            "dataset keeps one per configuration, and no README.md configs: header tells them apart: convert one "
            f"folder (--input {folder / tops[-1][0]}), or list the configurations in README.md"
        )
    odd = next((f for f in files if not f.name.lower().endswith(_READ[kind])), None)
    if odd is not None:
        raise ValueError(f"{odd}: obliq reads {kind} files named {', '.join(_READ[kind])} (uncompressed)")
    read = {"parquet": _parquet, "arrow": _arrow, "json": lambda fs: _jsonl(fs, False)}[kind]
    return Input([str(f) for f in files], *read(files), split, name)


def open_input(path: Path, split: str | None = None, config: str | None = None) -> Input:
    """The input at ``path``: a JSONL, Parquet or Arrow file, a ``save_to_disk`` folder, or a dataset folder
    (module docstring), with the split and configuration read.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: a file of another kind; a folder without data; a split or configuration not found or not
            chosen (those there named); a file that cannot be read (named).
        ImportError: a Parquet or Arrow input, or a folder, without the ``datasets`` package.
    """
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return _saved(path, split, config)
        return _dataset_folder(path, split, config)
    for option, value in (("--split", split), ("--subset", config)):
        if value is not None:
            raise ValueError(f"{path}: {option} is for a folder of several, not a single file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return Input([str(path)], *_parquet([path]))
    if suffix == ".arrow":
        return Input([str(path)], *_arrow([path]))
    if suffix in _READ["json"]:
        return Input([str(path)], *_jsonl([path], True))
    raise ValueError(
        f"{path}: a {suffix or 'suffix-less'} file; obliq converts JSONL (.jsonl, .json: one record a line), "
        "Parquet (.parquet), Arrow (.arrow) and folders (save_to_disk, or a dataset's data files)"
    )
