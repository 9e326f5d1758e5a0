"""Every YAML obliq reads (configs, recipes, policies, prompt files), checked before it is loaded.

:func:`check_yaml` / :func:`load_yaml` refuse a document that is not YAML (:class:`NotYaml`: file and line
named), longer than :data:`MAX_YAML_SIZE`, with a key given twice in one mapping (a plain loader keeps the
last silently) or a setting given both dotted and nested, or whose aliases expand past :data:`MAX_YAML_NODES`
(a nested-alias "billion laughs" would run until killed); :func:`install_yaml_checks` puts the check in
front of jsonargparse's loaders, and :func:`check_config` checks each ``--config`` file by its name (a
mapping of settings).
"""

from __future__ import annotations

import os

from obliq.files import read_text

MAX_YAML_NODES = 200_000
"""The most nodes a YAML document may hold once its aliases are expanded (a recipe holds a few hundred)."""


MAX_YAML_SIZE = 4 * 2**20
"""The longest YAML document obliq parses (a config, recipe, policy or prompt file): 4 MiB (4,194,304
characters of text, or bytes of a ``--config`` file, checked before it is read); a recipe is a few kB, and a
YAML parser reads about a megabyte a second."""


class NotYaml(ValueError):
    """Text that is not YAML: the file (or source), line and the parser's problem in one line."""


def _not_yaml(err, source: object) -> NotYaml:
    """:class:`NotYaml` for a ``yaml.YAMLError``: where it is (``file:line``) and what, with a hint for a tab."""
    mark = getattr(err, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else f"{source}"
    what = getattr(err, "problem", None) or str(err).splitlines()[0]
    col = f", column {mark.column + 1}" if mark is not None else ""
    hint = "; indent with spaces: YAML refuses tabs" if "\\t" in what else ""
    return NotYaml(f"{where}: not valid YAML ({what}{col}){hint}")


def check_yaml(text: str, source: object = "YAML"):
    """Refuse a YAML document that a loader would read wrongly or forever, before it is loaded.

    Returns:
        Its composed root node (``yaml.Node``; None for an empty document).

    Raises:
        NotYaml: not YAML at all (a ValueError: ``source``, line and problem named).
        ValueError: longer than :data:`MAX_YAML_SIZE`; a key given twice in one mapping (file, line and key
            named); aliases that expand to more than :data:`MAX_YAML_NODES` nodes (refused in time linear in
            the document's size).
    """
    import yaml

    if len(text) > MAX_YAML_SIZE:
        raise ValueError(
            f"{source}: {len(text):,} characters of YAML, more than the {MAX_YAML_SIZE:,} obliq reads "
            "(a config is a few kB): refused before parsing"
        )
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        raise _not_yaml(err, source) from None
    if root is None:
        return None
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
    return root


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
        ValueError: see :func:`check_yaml` (a YAML syntax error is a :class:`NotYaml`, ``source`` named).
    """
    import yaml

    check_yaml(text, source)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:  # a construction error (an unknown tag): the composer let it through
        raise _not_yaml(err, source) from None


def check_config(path: str | os.PathLike) -> None:
    """Check a ``--config`` file by its name before jsonargparse reads it (:func:`obliq.cli.check_config_files`):
    at most :data:`MAX_YAML_SIZE` (checked on its size, before reading), UTF-8 (:func:`obliq.files.read_text`), YAML
    (:func:`check_yaml`) and a mapping of settings (``key: value``), as jsonargparse reads one.

    Raises:
        ValueError: the first of these it is not, in one line naming the file (and line where there is one).
    """
    import yaml

    size = os.path.getsize(path)
    if size > MAX_YAML_SIZE:
        raise ValueError(
            f"{path}: {size:,} bytes of YAML, more than the {MAX_YAML_SIZE:,} obliq reads (a config is a few kB)"
        )
    root = check_yaml(read_text(path), path)
    if not isinstance(root, yaml.MappingNode):
        kind = (
            "an empty file (or only comments)"
            if root is None
            else "a list"
            if isinstance(root, yaml.SequenceNode)
            else f"the single value {root.value[:40]!r}"
        )
        raise ValueError(f"{path}: a config is a YAML mapping of settings (key: value), not {kind}")


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
                try:
                    check_yaml(text, "config")
                except NotYaml:  # not YAML: the loader raises its own error, and jsonargparse reads a string
                    pass
            return _base(text, *args, **kwargs)

        checked._obliq_checked = True
        loaders.loaders[mode] = checked
