"""Files at the bottom of every stage: how text files are opened, written atomically, and named.

- :func:`open_text` is how obliq opens every text input (JSONL, TSV, TREC, YAML): UTF-8 with a
  leading byte-order mark removed (spreadsheet tools and some editors write one, and it would
  otherwise become part of the first id); :func:`strip_bom` does the same for readers that work on
  bytes (the training-row index keeps byte offsets).
- :func:`publish` writes a file or folder through a temporary one beside it, renamed into place, so a
  killed process leaves the old one or the new one, never half of one; :func:`atomic_write` is the
  same for a file written through an open handle.
- :func:`read_id_table` reads the ``id<TAB>value`` tables tasks carry (attributes, sources).
- :func:`safe_name` turns a name found in a file (a task's name) into a folder name that cannot
  leave the output folder.
- the claim of every command's outputs (never an input, never another command's, one transaction) is
  :mod:`obliq.claims`.
- :func:`json_text` / :func:`write_json` are how obliq writes JSON: strict (a NaN or infinity
  becomes ``null``), so any JSON reader can read it back; paths and dataclasses become plain values.
- :func:`cache_dir` is where obliq caches what it computes (``$OBLIQ_CACHE``, default ``~/.cache/obliq``).
- :func:`check_yaml` / :func:`load_yaml`: every YAML obliq reads (configs, recipes, policies, prompt
  files) is refused when a key is given twice in one mapping (a plain loader keeps the last silently)
  or when its aliases expand past :data:`MAX_YAML_NODES` (a nested-alias "billion laughs" would run
  until killed); :func:`install_yaml_checks` puts the check in front of jsonargparse's loaders.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

BOM = codecs.BOM_UTF8
"""The UTF-8 byte-order mark (EF BB BF)."""


def cache_dir() -> Path:
    """The folder where obliq caches converted models, embeddings and row indexes
    (``$OBLIQ_CACHE`` or ``~/.cache/obliq``)."""
    return Path(os.environ.get("OBLIQ_CACHE", Path.home() / ".cache" / "obliq"))


def open_text(path: str | os.PathLike) -> IO[str]:
    """Open a text file for reading as UTF-8, dropping a leading byte-order mark (C28).

    Raises:
        FileNotFoundError: no such file.
    """
    return open(path, encoding="utf-8-sig")


def read_text(path: str | os.PathLike) -> str:
    """The whole of a text file, as :func:`open_text` reads it."""
    with open_text(path) as f:
        return f.read()


def strip_bom(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 byte-order mark (for readers of the first line of a file in bytes)."""
    return data[len(BOM) :] if data.startswith(BOM) else data


@contextmanager
def publish(path: str | os.PathLike, folder: bool = False) -> Iterator[Path]:
    """Publish ``path`` all at once: the block writes the temporary file (or, with ``folder``, the
    temporary folder) it is given, beside ``path`` (``.<name>.<random>.tmp``); it is renamed onto
    ``path`` when the block ends without an error and removed otherwise, so a killed process leaves the
    old ``path`` or the new one, never half of one (a killed process's temporary file may stay: it is
    named so that its writer can find it). A published file is readable by all (0644); ``path``'s
    folder is created.

    Raises:
        FileExistsError: (``folder``) ``path`` is a folder that is not empty, e.g. one another process
            published first: a folder is never replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    else:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if not folder:
            os.chmod(tmp, 0o644)
        try:
            os.replace(tmp, path)
        except OSError as err:
            if folder and path.is_dir():
                raise FileExistsError(f"{path}: a folder is there already (published by another process?)") from err
            raise
    finally:
        if folder:
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Write ``path`` all at once (:func:`publish`): the block writes an open temporary file beside it,
    renamed over ``path`` when the block ends without an error (the temporary file is removed otherwise).

    Args:
        path: the file to write; its folder is created.
        mode: ``"w"`` (UTF-8 text) or ``"wb"``.
    """
    with publish(path) as tmp, open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        yield f


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file atomically (:func:`atomic_write`)."""
    with atomic_write(path) as f:
        f.write(text)


def _plain(obj):
    """``obj`` with non-finite floats as None, dataclasses as dicts, paths and other objects as strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # a numpy or torch scalar
        return _plain(obj.item())
    return str(obj)


def json_text(obj, indent: int | None = 2) -> str:
    """Strict JSON for ``obj`` (see the module notes); one line when ``indent`` is None."""
    return json.dumps(_plain(obj), indent=indent, ensure_ascii=False, allow_nan=False)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (what a merge compares to know its shards read the same input)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as strict JSON (:func:`json_text`), atomically, with a final newline."""
    write_text(path, json_text(obj) + "\n")


MAX_YAML_NODES = 200_000
"""The most nodes a YAML document may hold once its aliases are expanded (a recipe holds a few hundred)."""


def check_yaml(text: str, source: object = "YAML") -> None:
    """Refuse a YAML document that a loader would read wrongly or forever, before it is loaded.

    Raises:
        ValueError: a key given twice in one mapping (file, line and key named); aliases that expand
            to more than :data:`MAX_YAML_NODES` nodes (refused in time linear in the document's size).
        yaml.YAMLError: not YAML at all.
    """
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return
    size: dict[int, int] = {}
    visiting: set[int] = set()
    stack = [(root, False)]
    while stack:  # expanded sizes bottom-up over the node graph (aliases are shared nodes)
        node, done = stack.pop()
        if id(node) in size:
            continue
        if not done and id(node) in visiting:
            raise ValueError(f"{source}: an alias refers to a node that holds it (a recursive YAML structure)")
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            size[id(node)] = 1
            continue
        if done:
            visiting.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            if size[id(node)] > MAX_YAML_NODES:
                raise ValueError(
                    f"{source}: its aliases expand to more than {MAX_YAML_NODES:,} nodes (a nested-alias bomb?); "
                    "refused before loading"
                )
            continue
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        raise ValueError(
                            f"{source}:{line}: key {key.value!r} given twice in one mapping (first on line "
                            f"{seen[key.value]}); a loader would keep the last silently: remove one"
                        )
                    seen[key.value] = line
        visiting.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    if isinstance(root, yaml.MappingNode):
        _check_dotted_keys(root, source)


def _check_dotted_keys(root, source: object) -> None:
    """Refuse a setting given twice through a dotted key and a nested one (``trainer.max_steps: 5`` beside
    ``trainer: {max_steps: 10}``): jsonargparse reads both as one key and keeps one silently."""
    import yaml

    seen: dict[tuple[str, ...], int] = {}  # leaf path → line
    below: set[tuple[str, ...]] = set()  # the proper prefixes of the leaf paths
    stack = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            path = prefix + tuple(str(key.value).split("."))
            line = key.start_mark.line + 1
            if isinstance(value, yaml.MappingNode) and value.value:
                stack.append((value, path))
                continue
            clash = [path] if path in seen or path in below else []
            clash += [path[:i] for i in range(1, len(path)) if path[:i] in seen]
            if clash:
                other = next((o for o in seen if o[: len(path)] == path or path[: len(o)] == o), clash[0])
                raise ValueError(
                    f"{source}:{line}: {'.'.join(path)!r} is also set on line {seen[other]} "
                    f"(as {'.'.join(other)!r}, dotted or nested): a loader would keep one silently: remove one"
                )
            seen[path] = line
            below.update(path[:i] for i in range(1, len(path)))


def load_yaml(text: str, source: object = "YAML"):
    """``yaml.safe_load`` of ``text`` after :func:`check_yaml`.

    Raises:
        ValueError: see :func:`check_yaml`, and a YAML syntax error (``source`` named).
    """
    import yaml

    try:
        check_yaml(text, source)
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not valid YAML ({str(err).splitlines()[0]})") from None


def install_yaml_checks() -> None:
    """Put :func:`check_yaml` in front of jsonargparse's YAML loaders (modes ``yaml`` and ``omegaconf+``),
    so ``obliq --config``, ``train.py --config`` and every YAML value on a command line are checked."""
    from jsonargparse import _loaders_dumpers as loaders

    for mode in ("yaml", "omegaconf+"):
        if mode not in loaders.loaders and mode.startswith("omegaconf"):
            loaders.set_omegaconf_loader(mode)
        base = loaders.loaders[mode]
        if getattr(base, "_obliq_checked", False):
            continue

        def checked(text, *args, _base=base, **kwargs):
            if isinstance(text, str):
                check_yaml(text, "config")
            return _base(text, *args, **kwargs)

        checked._obliq_checked = True
        loaders.loaders[mode] = checked


def read_id_table(path: str | os.PathLike, value: str = "attribute") -> dict[str, str]:
    """Read a two-column TSV with a header line: ``corpus-id<TAB><value>`` (a task's ``attributes.tsv``,
    ``sources.tsv``, a lean table).

    Returns:
        corpus id → value.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line without exactly two tab-separated columns, an empty field, or an id listed
            twice (file, line and field named).
    """
    path = Path(path)
    out: dict[str, str] = {}
    where: dict[str, int] = {}
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) != 2:
                raise ValueError(
                    f"{path}:{lineno}: expected 2 tab-separated columns (corpus-id, {value}), got {len(cols)}"
                )
            if lineno == 1 and cols[0].strip().lower() in ("corpus-id", "doc-id", "id", "_id"):
                continue
            doc, val = cols[0].strip(), cols[1].strip()
            if not doc:
                raise ValueError(f"{path}:{lineno}: field 'corpus-id' is empty")
            if not val:
                raise ValueError(f"{path}:{lineno}: field {value!r} is empty")
            if doc in out:
                raise ValueError(f"{path}:{lineno}: corpus-id {doc!r} already given on line {where[doc]}")
            out[doc], where[doc] = val, lineno
    return out


_UNSAFE = re.compile(r"[^\w.\-]+")
MAX_NAME_BYTES = 200
"""The longest folder name :func:`safe_name` makes, in UTF-8 bytes: a longer one is cut and ends in a
digest of the whole name, so two long names stay two folders."""


def safe_name(name: str, what: str = "name") -> str:
    """A folder name made from ``name``: runs of characters other than letters, digits, ``_``, ``.``
    and ``-`` (path separators among them) and runs of two or more dots become ``_``, and leading or
    trailing ``.``, ``_`` and ``-`` go, so the folder can never leave the folder it is made in
    (``../../x`` → ``x``, ``a/b`` → ``a_b``); a name over :data:`MAX_NAME_BYTES` is cut and given
    a digest of the whole name.

    Raises:
        ValueError: nothing usable is left (``..``, ``/``; the message names ``what``).
    """
    out = re.sub(r"_+", "_", re.sub(r"\.{2,}", "_", _UNSAFE.sub("_", str(name)))).strip("._-")
    if not out:
        raise ValueError(f"{what} {name!r} cannot be used as a folder name")
    if len(out.encode()) > MAX_NAME_BYTES:  # a file name holds 255 bytes ([Errno 36] beyond)
        digest = hashlib.sha256(str(name).encode()).hexdigest()[:12]
        cut = out.encode()[: MAX_NAME_BYTES - 13].decode(errors="ignore").rstrip("._-")
        out = f"{cut}-{digest}"
    return out
