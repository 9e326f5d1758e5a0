"""Command lines from keyword arguments: :func:`options` writes ``--name value`` tokens, so a script that
runs obliq's commands (the quickstart, examples/, bench/) says ``options(task=t, k=4)`` rather than one
token a line."""

from __future__ import annotations

from collections.abc import Mapping


def options(values: Mapping[str, object] | None = None, /, **kw: object) -> list[str]:
    """argv tokens for options: ``--name value`` per item, in the order given (``values``, then ``kw``).

    >>> options({"shard.index": 0}, task="t", trainer={"max_steps": 40}, tasks=["a", "b"], overwrite=True)
    ['--shard.index', '0', '--task', 't', '--trainer.max_steps', '40', '--tasks', 'a', 'b', '--overwrite', 'true']

    Names are written as given: ``values`` holds those that are not Python names (dotted ``trainer.max_steps``,
    dashed ``num-workers``). Values:

    - a mapping: its items, each name prefixed with this one and a dot (``--trainer.max_steps 40``);
    - ``None``: left out (the command's default);
    - ``True`` / ``False``: ``true`` / ``false`` (jsonargparse's spelling: ``--overwrite true``);
    - a list or tuple: ``--name a b c`` (each item as ``str``; obliq's cli reads several values so);
    - anything else (str, int, float, Path): ``str(value)``.

    Raises:
        ValueError: an empty list or tuple (leave the option out with ``None`` instead); a name both in
            ``values`` and in ``kw``.
    """
    twice = sorted(set(values or {}) & set(kw))
    if twice:
        raise ValueError(f"--{twice[0]}: given twice (in the mapping and as a keyword)")
    out: list[str] = []
    for name, value in {**(values or {}), **kw}.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            out += options({f"{name}.{k}": v for k, v in value.items()})
        elif isinstance(value, bool):
            out += [f"--{name}", "true" if value else "false"]
        elif isinstance(value, (list, tuple)):
            if not value:
                raise ValueError(f"--{name}: an empty list (give None to leave the option out)")
            out += [f"--{name}", *(str(v) for v in value)]
        else:
            out += [f"--{name}", str(value)]
    return out
