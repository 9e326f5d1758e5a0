"""What a resume changes: a checkpoint's stored settings compared with the user's config, never merged over
them (Lightning's own ``_parse_ckpt_path`` would; C58, Lightning #20801). Every module, loss, term and encoder
setting the checkpoint records is compared; what the trained weights depend on (:data:`REFUSED`) is refused,
the rest applied and said so. The training command (:mod:`obliq.commands.train`) calls it."""

from __future__ import annotations

import inspect

from obliq.losses.settings import objective_differences

REFUSED = ("backbone", "bidirectional", "query_prefix", "passage_prefix", "use_instructions", "lora")
"""Encoder settings the trained weights depend on: a resume that changes one is refused. Every other
setting a checkpoint records is applied from the user's config, and said so (:func:`resume_differences`)."""
UNRECORDED = {
    "trust_remote_code": "never taken from a file: the command line's alone",
    "adapter": "a resume's weights are the checkpoint's",
    "gradient_checkpointing": "not in BiEncoder.settings",
    "quantization": "not in BiEncoder.settings",
}
"""BiEncoder settings a checkpoint does not record (``obliq.encoder`` holds ``BiEncoder.settings``), so a
resume has nothing to compare them with: the user's value is used."""


def _defaults(cls) -> dict:
    return {n: p.default for n, p in inspect.signature(cls).parameters.items() if p.default is not p.empty}


def resume_differences(ckpt: dict, model: dict, source: object) -> list[str]:
    """What the user asks that differs from the checkpoint's own settings: every ``RetrieverModule``
    setting (its saved hyper-parameters, key by key) and every encoder setting the checkpoint records,
    derived from the settings themselves, so a new one is never left out (C58; Lightning #20801, PR #21455
    applies the command line's values on a resume). A setting the checkpoint predates is compared with its
    default, what the checkpoint was trained with.

    Args:
        ckpt: the checkpoint (read with ``weights_only=True``).
        model: the user's ``model`` config section (``encoder`` with its ``init_args``, and the module's
            settings).
        source: the checkpoint's path, for messages.

    Returns:
        One line per applied difference (``model.lr: 0.001 in the checkpoint, 0.0005 now: applied``).

    Raises:
        ValueError: a difference in what the trained weights depend on (:data:`REFUSED`), listing every
            such difference.
    """
    from obliq.aliases import portable_name
    from obliq.model.encoder import BiEncoder
    from obliq.model.module import RetrieverModule

    saved = ckpt.get("obliq") or {}
    stored = {**_defaults(RetrieverModule), **(ckpt.get("hyper_parameters") or {})}
    asked = dict((model.get("encoder") or {}).get("init_args") or {})
    lora = saved.get("lora")
    if isinstance(lora, dict):  # a LoRA setting the checkpoint predates: its default, what it was trained with
        from dataclasses import asdict

        from obliq.model.lora import LoraSettings

        lora = {**asdict(LoraSettings()), **lora}
    encoder = {**_defaults(BiEncoder), **(saved.get("encoder") or {}), "lora": lora}
    pairs = [(f"model.{k}", stored.get(k), v) for k, v in model.items() if k not in ("encoder", "loss", "terms")]
    pairs += objective_differences(stored, model)  # obliq.losses.settings
    for key, value in asked.items():
        if key == "lora" and isinstance(value, dict) and isinstance(encoder["lora"], dict):
            pairs += [
                (f"model.encoder.init_args.lora.{k}", encoder["lora"][k], value[k])
                for k in value
                if k in encoder["lora"]
            ]
        elif key not in UNRECORDED:
            pairs.append((f"model.encoder.init_args.{key}", encoder.get(key), value))
    applied, refused = [], []
    for name, before, now in pairs:
        same = portable_name(before) == portable_name(now) if name.endswith(".backbone") else before == now
        if same:
            continue
        line = f"{name}: {before!r} in the checkpoint, {now!r} now"
        if name.startswith("model.encoder.") and name.split(".")[3] in REFUSED:
            refused.append(line)
        else:
            applied.append(line + ": applied")
    if refused:
        raise ValueError(
            f"{source}: cannot resume with another model: "
            + "; ".join(refused)
            + " (start a new run, or resume with the checkpoint's settings)"
        )
    return applied
