"""An encoder's settings as a saved model or a checkpoint records them, read as data: a file names the
backbone and how it reads texts, and can never ask for code to run (``trust_remote_code``, a fetched
attention kernel)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

SETTINGS = (
    "backbone",
    "bidirectional",
    "query_prefix",
    "passage_prefix",
    "use_instructions",
    "query_max_length",
    "passage_max_length",
    "dtype",
    "attn_implementation",
    "windows",
)
"""The encoder settings a saved model or checkpoint records (``BiEncoder.settings``); nothing else read
from such a file reaches the encoder (never ``trust_remote_code``)."""


FILE_ATTENTION = (None, "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
"""The attention implementations a saved model or checkpoint may name: transformers' own. Anything else
(a Hub kernel repository such as ``kernels-community/…``, fetched and run) is a choice of code that only
the user's command line or config makes."""


def stored_settings(saved, source: object) -> dict:
    """The encoder settings of a file being loaded (``obliq_encoder.json``, a checkpoint's ``obliq``
    section), keeping only :data:`SETTINGS`: a file is data and cannot ask for code to run.

    Raises:
        ValueError: not a mapping, or no ``backbone``; an ``attn_implementation`` outside
            :data:`FILE_ATTENTION`; bad ``windows`` (``source`` named).
    """
    if not isinstance(saved, dict) or not isinstance(saved.get("backbone"), str):
        raise ValueError(f"{source}: not an obliq encoder's settings (no backbone)")
    if saved.get("attn_implementation") not in FILE_ATTENTION:
        raise ValueError(
            f"{source}: asks for the attention kernel {saved['attn_implementation']!r}, which a file cannot "
            f"choose (code to fetch and run; a file may name {', '.join(k for k in FILE_ATTENTION if k)}): give "
            "attn_implementation yourself (e.g. --model.encoder.init_args.attn_implementation) or edit the file"
        )
    ignored = sorted(set(saved) - set(SETTINGS) - {"lora", "is_adapter", "backbone_sha256"})
    if ignored:
        log.warning(
            "%s: ignored settings %s (a file cannot set them; trust_remote_code comes from your command "
            "line or config only)",
            source,
            ", ".join(ignored),
        )
    out = {k: saved[k] for k in SETTINGS if k in saved}
    if "windows" in out:
        from obliq.windows import Windows

        out["windows"] = Windows.of(out["windows"], f"{source}: windows")
    return out
