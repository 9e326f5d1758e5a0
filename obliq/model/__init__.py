"""The bi-encoder (backbone, bidirectional attention, LoRA, pooling) and its GradCache step."""

from obliq.model.tokenizer import TextTokenizer

__all__ = ["BiEncoder", "LoraSettings", "TextTokenizer", "check_bidirectional", "make_bidirectional", "mean_pool"]

_TORCH = {"BiEncoder": "encoder", "LoraSettings": "lora", "mean_pool": "pooling"}
_TORCH |= {"check_bidirectional": "bidirectional", "make_bidirectional": "bidirectional"}


def __getattr__(name: str):
    """Import the encoder and pooling (and torch, ~1 s) only when they are asked for: what reads only the
    token-length defaults (:mod:`obliq.search.settings`, the embedding store, faiss indexes) stays light."""
    if name in _TORCH:
        import importlib

        return getattr(importlib.import_module(f"obliq.model.{_TORCH[name]}"), name)
    raise AttributeError(f"module 'obliq.model' has no attribute {name!r}")
