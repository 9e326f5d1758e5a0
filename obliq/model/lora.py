"""LoRA's settings (peft's ``LoraConfig``, Hu et al., 2022) and their application to a backbone: what a trained
or imported adapter needs to be rebuilt as the same model."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

DECODER_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
BERT_LORA_TARGETS = ["query", "key", "value", "dense"]


@dataclass
class LoraSettings:
    """LoRA hyper-parameters (the model card: r=16, alpha=32, dropout 0.05 on the 7 projections), as peft's
    ``LoraConfig`` takes them: what a trained or imported adapter needs to be rebuilt as the same model
    (:func:`obliq.model.adapter.lora_settings` reads them from an adapter's ``adapter_config.json``)."""

    r: int = 16
    """LoRA rank."""
    alpha: float = 32
    """LoRA alpha (the update is scaled by alpha / r, or alpha / √r with ``use_rslora``)."""
    dropout: float = 0.05
    """Dropout on the LoRA input."""
    target_modules: list[str] | str | None = None
    """Module name suffixes to wrap, or a regular expression peft matches against whole module names (or
    ``all-linear``); None picks q/k/v/o/gate/up/down for decoders and query/key/value/dense for BERT-style
    encoders."""
    use_rslora: bool = False
    """Rank-stabilised LoRA (Kalajdzievski, 2023): the update is scaled by alpha / √r."""
    use_dora: bool = False
    """DoRA (Liu et al., 2024): a trained magnitude per output feature of each wrapped weight."""
    rank_pattern: dict[str, int] = field(default_factory=dict)
    """Another rank for the modules whose names match a key (peft's ``rank_pattern``)."""
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    """Another alpha for the modules whose names match a key (peft's ``alpha_pattern``)."""
    exclude_modules: list[str] | str | None = None
    """Modules never wrapped, though ``target_modules`` matches them (names or a regular expression)."""

    def __post_init__(self):
        if self.r <= 0 or not self.alpha > 0:
            raise ValueError(f"LoRA rank and alpha must be positive, got r={self.r}, alpha={self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        bad = {k: v for k, v in {**self.rank_pattern, **self.alpha_pattern}.items() if not v > 0}
        if bad:
            raise ValueError(f"LoRA rank_pattern / alpha_pattern values must be positive, got {bad}")

    def peft_config(self, default_targets: list[str] | None = None):
        """This LoRA as peft's ``LoraConfig``, every setting carried (``default_targets`` when
        ``target_modules`` is None)."""
        from peft import LoraConfig

        targets = self.target_modules or default_targets
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=sorted(targets) if isinstance(targets, list | tuple | set) else targets,
            exclude_modules=self.exclude_modules,
            use_rslora=self.use_rslora,
            use_dora=self.use_dora,
            rank_pattern=dict(self.rank_pattern),
            alpha_pattern=dict(self.alpha_pattern),
            bias="none",
        )


def default_targets(model: nn.Module) -> list[str]:
    """The LoRA targets obliq picks for a backbone: a decoder's seven projections, else BERT's four layers.

    Raises:
        ValueError: the backbone has linear layers of neither kind.
    """
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for targets in (DECODER_LORA_TARGETS, BERT_LORA_TARGETS):
        found = [t for t in targets if t in names]
        if found:
            return found
    raise ValueError(
        f"no default LoRA targets in this backbone; set lora.target_modules (linear layers: {sorted(names)})"
    )


def apply_lora(model: nn.Module, lora: LoraSettings) -> nn.Module:
    """``model`` wrapped by peft with a fresh LoRA of these settings (``get_peft_model``)."""
    from peft import get_peft_model

    targets = None if lora.target_modules else default_targets(model)
    return get_peft_model(model, lora.peft_config(targets))
