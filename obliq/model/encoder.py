"""The bi-encoder: any transformers backbone, bidirectional for decoders, LoRA, mean pooling, L2 norm.

One encoder serves queries and passages (the OBLIQ-IR paper §3.3; the model card). Decoder-only
backbones (Llama, Qwen, Mistral) get bidirectional attention as NV-Embed does (Lee et al., 2025);
encoders (BERT) run as they are. LoRA comes from peft (Hu et al., 2022); QLoRA loads the base in
4 or 8 bit through bitsandbytes on a CUDA GPU. Texts become token ids in :mod:`obliq.model.tokenizer`.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import pickle
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from obliq.aliases import portable_name, resolve_model
from obliq.files import read_json_object, read_text, write_json, write_text
from obliq.model.bidirectional import check_loading, check_model_code, make_bidirectional
from obliq.model.lora import DECODER_LORA_TARGETS as DECODER_LORA_TARGETS  # re-exported: bench/gpu_check.py
from obliq.model.lora import LoraSettings, apply_lora
from obliq.model.pooling import mean_pool
from obliq.model.tokenizer import PASSAGE_MAX_LENGTH, QUERY_MAX_LENGTH, Kind, TextTokenizer, check_vocabulary

log = logging.getLogger(__name__)

CONFIG_NAME = "obliq_encoder.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class BiEncoder(nn.Module):
    """A shared query/passage encoder: backbone → masked mean pooling → L2 normalisation.

    Args:
        backbone: an alias (``minilm``, ``smollm2``, see :mod:`obliq.aliases`), a local folder or a
            hub id.
        lora: LoRA settings; None trains/uses the backbone as it is.
        adapter: a folder with a saved peft adapter to load onto the backbone (evaluation, resume).
        bidirectional: None or True makes a decoder (attention modules flagged causal)
            bidirectional; False keeps it causal. Encoders are bidirectional already. Either way a
            self-test checks the result when the encoder is built.
        query_prefix / passage_prefix: prepended to every query / passage (the model card).
        use_instructions: prepend ``Instruct: <instruction>\\n`` to queries that carry one
            (the paper's per-task instruction; off by default as in the model card).
        query_max_length / passage_max_length: truncation lengths in tokens (256 / 1024).
        dtype: weights dtype: float32, bfloat16 or float16.
        quantization: None, ``4bit`` or ``8bit`` (QLoRA; CUDA and bitsandbytes required).
        gradient_checkpointing: recompute activations in backward (non-reentrant).
        attn_implementation: ``sdpa`` or ``eager`` (or ``flash_attention_2`` on GPU).
        trust_remote_code: allow a hub model's own code; off unless asked.

    Raises:
        RuntimeError: the bidirectional self-test fails (a decoder that stayed causal, C03), or
            QLoRA is asked for without CUDA.
        ValueError: the tokenizer has no pad token and no eos/unk token to use as one (C02); the adapter's
            weights file cannot be read (truncated, damaged) or holds NaN or infinite values.
    """

    def __init__(
        self,
        backbone: str = "minilm",
        *,
        lora: LoraSettings | None = None,
        adapter: str | None = None,
        bidirectional: bool | None = None,
        query_prefix: str = "query: ",
        passage_prefix: str = "passage: ",
        use_instructions: bool = False,
        query_max_length: int = QUERY_MAX_LENGTH,
        passage_max_length: int = PASSAGE_MAX_LENGTH,
        dtype: str = "float32",
        quantization: Literal["4bit", "8bit"] | None = None,
        gradient_checkpointing: bool = False,
        attn_implementation: str | None = "sdpa",
        trust_remote_code: bool = False,
    ):
        super().__init__()
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.settings = dict(
            backbone=backbone,
            bidirectional=bidirectional,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            use_instructions=use_instructions,
            query_max_length=query_max_length,
            passage_max_length=passage_max_length,
            dtype=dtype,
            attn_implementation=attn_implementation,
        )
        self.name_or_path = backbone
        path = resolve_model(backbone)
        family = check_model_code(path, trust_remote_code)  # a published family read as data; unknown code refused
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        check_vocabulary(self.tokenizer, path)
        _ensure_pad_token(self.tokenizer)
        positions = model_capacity(path, AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
        if positions and max(query_max_length, passage_max_length) > positions:
            log.warning(
                "%s reads at most %d tokens: max lengths %d/%d cut to fit",
                backbone,
                positions,
                query_max_length,
                passage_max_length,
            )
        self.text = TextTokenizer(
            self.tokenizer,
            query_prefix,
            passage_prefix,
            query_max_length,
            passage_max_length,
            use_instructions,
            capacity=positions,
        )

        kwargs: dict = {"dtype": _DTYPES[dtype], "trust_remote_code": trust_remote_code}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        if quantization:
            kwargs["quantization_config"] = _bnb_config(quantization, _DTYPES[dtype])
        try:
            model, loading = AutoModel.from_pretrained(path, output_loading_info=True, **kwargs)
        except pickle.UnpicklingError as err:  # a pickled pytorch_model.bin holding more than tensors
            from obliq.errors import weights_only_refusal

            raise weights_only_refusal(err, f"{path} (its pytorch_model.bin or another pickle)") from None
        check_loading(path, loading, every_weight=family is not None)
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # BERT's CLS pooler is unused by mean pooling; drop it (and its LoRA)
        causal = _has_causal_attention(model)
        if causal and bidirectional is not False:
            make_bidirectional(model)
        self.bidirectional = not causal or bidirectional is not False
        self.made_bidirectional = causal and self.bidirectional
        # positions that follow the attention mask (first real token at 0), so either padding side gives the
        # same vectors; the RoBERTa family numbers positions from padding_idx + 1 from the input ids itself
        # (padding-aware): left to the model (C47)
        offset = getattr(model.config, "model_type", None) in POSITION_OFFSET_MODELS or (
            getattr(getattr(model, "embeddings", None), "padding_idx", None) is not None
        )
        self._position_ids = not offset and "position_ids" in inspect.signature(model.forward).parameters

        if quantization:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
        elif gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            if adapter is not None:
                from peft import PeftModel
                from safetensors import SafetensorError

                _check_adapter_weights(Path(adapter))
                try:
                    model = PeftModel.from_pretrained(model, adapter, is_trainable=lora is not None)
                except SafetensorError as err:  # a truncated or damaged file: named, not a traceback
                    raise ValueError(f"{adapter}: the adapter's weights cannot be read ({err})") from None
                except (RuntimeError, ValueError) as err:  # other shapes, or modules the base lacks
                    first = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()), str(err))
                    raise ValueError(
                        f"{adapter}: the adapter does not fit the base model {backbone!r} ({first[:300]}): it was "
                        "trained on another model; load it on its own base"
                    ) from None
                bad = [n for n, w in model.named_parameters() if "lora_" in n and not bool(torch.isfinite(w).all())]
                if bad:  # refused here, before a corpus is encoded into the store with them
                    raise ValueError(f"{adapter}: the adapter's weight {bad[0]} holds NaN or infinite values")
            elif lora is not None:
                model = apply_lora(model, lora)
        self.lora = lora
        self.model = model
        check_bidirectional(self, expect=self.bidirectional)
        self.train()  # nn.Module's default (from_pretrained leaves eval mode: no dropout in full fine-tuning)

    # ------------------------------------------------------------------ tokenization
    def tokenize(
        self,
        texts: list[str],
        kind: Kind,
        instructions: list[str | None] | None = None,
        max_length: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """See :class:`TextTokenizer` (``self.text``)."""
        return self.text(texts, kind, instructions, max_length)

    def text_policy(
        self, query_max_length: int | None = None, passage_max_length: int | None = None, task=None
    ) -> dict:
        """How this encoder reads texts when asked for these lengths: its prefixes (for ``task``'s
        queries: with its instruction when the encoder uses instructions) and the token lengths it
        actually keeps (cut to its capacity). What a report states of a system."""
        return {
            "query_prefix": self.text.format([""], "query", [_instruction(task)])[0],
            "passage_prefix": self.text.prefix["passage"],
            "query_max_length": self.text.cap(query_max_length) if query_max_length else self.text.max_length["query"],
            "passage_max_length": self.text.cap(passage_max_length)
            if passage_max_length
            else self.text.max_length["passage"],
        }

    @property
    def truncated(self) -> dict[str, int]:
        """Texts cut at the max length so far, per kind (in this process)."""
        return self.text.truncated

    # ------------------------------------------------------------------ encoding
    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Encode a tokenized batch.

        Position ids follow the attention mask (first real token at 0), so left and right padding
        give the same vectors (the RoBERTa family numbers them itself from its padding id, C47);
        all-padding columns are trimmed first.

        Args:
            batch: ``input_ids`` and ``attention_mask`` of shape (n, L).

        Returns:
            (n, hidden) float32 unit vectors.
        """
        input_ids, mask = batch["input_ids"], batch["attention_mask"]
        keep = mask.bool().any(dim=0)
        if not bool(keep.all()):
            input_ids, mask = input_ids[:, keep], mask[:, keep]
        device = self.device
        input_ids, mask = input_ids.to(device), mask.to(device)
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if self._position_ids:
            inputs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.model(**inputs).last_hidden_state
        return mean_pool(hidden, mask)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def hidden_size(self) -> int:
        return int(self.backbone_config.hidden_size)

    @property
    def backbone_config(self):
        return self.model.config

    @torch.no_grad()
    def encode(
        self,
        texts: list[str],
        kind: Kind = "query",
        batch_size: int = 32,
        show_progress: bool | None = None,
        instructions: list[str | None] | None = None,
        max_length: int | None = None,
        task=None,
    ) -> torch.Tensor:
        """Encode texts in batches (longest first, to pad little), in eval mode and without gradients.

        Args:
            texts: n strings.
            kind: ``query`` or ``passage`` (picks the prefix and the max length).
            batch_size: texts per forward pass.
            show_progress: a tqdm bar; None shows it when there are more than 8 batches.
            instructions: each text's instruction (queries, with ``use_instructions``).
            max_length: token limit for this call (an evaluator's setting; cut to the backbone's
                positions); None: the encoder's own length for ``kind``.
            task: the task being retrieved (:class:`obliq.tasks.Task`): its ``instruction`` is every
                query's when ``instructions`` is not given (read with ``use_instructions`` only).

        Returns:
            (n, hidden) float32 CPU tensor of unit vectors, in the input order.
        """
        from tqdm.auto import tqdm

        texts = list(texts)
        if instructions is None and kind == "query" and _instruction(task):
            instructions = [_instruction(task)] * len(texts)
        if not texts:
            return torch.empty(0, self.hidden_size)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        starts = range(0, len(texts), batch_size)
        if show_progress is None:
            show_progress = len(starts) > 8
        was_training = self.training
        self.eval()
        chunks = []
        try:
            for s in tqdm(starts, desc=f"encode {kind}", disable=not show_progress):
                idx = order[s : s + batch_size]
                instr = [instructions[i] for i in idx] if instructions is not None else None
                chunks.append(self(self.tokenize([texts[i] for i in idx], kind, instr, max_length)).cpu())
        finally:
            self.train(was_training)
        out = torch.empty(len(texts), chunks[0].shape[1])
        out[torch.tensor(order)] = torch.cat(chunks)
        return out

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, folder: str | Path) -> None:
        """Write the LoRA adapter (peft format) and the encoder settings to ``folder``.

        Without LoRA the whole backbone is saved. :meth:`from_pretrained` reads it back. The base model
        is recorded by its portable name (:func:`obliq.aliases.portable_name`: a packaged model's hub
        id, not this machine's path), so the folder loads wherever obliq is installed; a base given as a
        relative path is recorded relative to ``folder``, as :func:`obliq.model.adapter.resolve_base` reads it.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        backbone = portable_name(self.settings["backbone"])
        if self.is_peft and not os.path.isabs(os.path.expanduser(backbone)) and os.path.isdir(backbone):
            backbone = os.path.relpath(backbone, folder)  # a relative base: from the adapter's folder (resolve_base)
        if self.is_peft:  # the adapter names its base by the portable name, not this machine's path
            for config in self.model.peft_config.values():
                config.base_model_name_or_path = backbone
        if self.is_peft:  # obliq never resizes the vocabulary: no embedding layer to save, and no hub lookup
            self.model.save_pretrained(folder, save_embedding_layers=False)  # ("auto" asks the hub for the base)
            _sort_targets(folder / "adapter_config.json")
        else:
            self.model.save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
        settings = dict(
            self.settings, backbone=backbone, lora=asdict(self.lora) if self.lora else None, is_adapter=self.is_peft
        )
        if self.is_peft:  # the base by its weights, checked when the adapter is loaded (from_pretrained)
            from obliq.model.adapter import BASE_DIGEST, base_digest

            settings[BASE_DIGEST] = base_digest(self.settings["backbone"])
        write_json(folder / CONFIG_NAME, settings)

    @classmethod
    def from_pretrained(cls, folder: str | Path, trainable: bool = False, **overrides) -> BiEncoder:
        """Load an encoder written by :meth:`save_pretrained` (adapter on its backbone, or a full model).

        The folder's ``obliq_encoder.json`` is data: only the settings :meth:`save_pretrained` writes
        are read from it (:func:`stored_settings`), so it cannot switch on ``trust_remote_code`` —
        that comes from ``overrides`` (the caller's own command line or config) alone.

        An adapter's ``backbone`` given as a relative path is read from ``folder``
        (:func:`obliq.model.adapter.resolve_base`), not from the current folder.

        Raises:
            FileNotFoundError: ``folder`` has no ``obliq_encoder.json``.
            ValueError: the file is not a JSON object of encoder settings (the file named); an adapter's
                relative ``backbone`` that is ambiguous (:func:`~obliq.model.adapter.resolve_base`); an adapter
                whose recorded base weights are not the backbone's (:func:`~obliq.model.adapter.check_base`).
        """
        folder = Path(folder)
        cfg_file = folder / CONFIG_NAME
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{cfg_file} not found: not a folder written by BiEncoder.save_pretrained")
        saved = read_json_object(cfg_file, "an encoder's settings")
        settings = stored_settings(saved, cfg_file)
        lora = saved.get("lora")
        if not saved.get("is_adapter"):
            settings["backbone"] = str(folder)
        elif "backbone" not in overrides:
            from obliq.model.adapter import resolve_base

            settings["backbone"] = resolve_base(cfg_file, "backbone", settings["backbone"])
        settings.update(overrides)
        base = str(settings["backbone"])
        if saved.get("is_adapter") and _local_path(base) and not os.path.exists(os.path.expanduser(base)):
            raise FileNotFoundError(
                f"{cfg_file}: the adapter's base model {base!r} is a folder of the machine it was trained on, "
                "not found here: copy that base here and pass it (backbone=…, `obliq export --base_model` for "
                "a Hub id), or export from a base with a Hub id"
            )
        if saved.get("is_adapter") and isinstance(saved.get("backbone_sha256"), str):
            from obliq.model.adapter import check_base

            check_base(cfg_file, saved["backbone_sha256"], base)
        return cls(
            **settings,
            adapter=str(folder) if saved.get("is_adapter") else None,
            lora=LoraSettings(**lora) if (lora and trainable) else None,
        )

    @property
    def is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")


# ---------------------------------------------------------------------- helpers
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
            :data:`FILE_ATTENTION` (``source`` named).
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
    return {k: saved[k] for k in SETTINGS if k in saved}


def _local_path(name: str) -> bool:
    """Whether a model name is a path on some machine rather than an alias or a Hub id (``owner/name``)."""
    from obliq.aliases import check_model_name

    if name.startswith(("/", ".", "~")) or os.sep in name.replace("/", "", 1) or name.count("/") > 1:
        return True
    try:
        check_model_name(name)
    except FileNotFoundError:
        return "/" not in name
    return False


POSITION_OFFSET_MODELS = frozenset(
    "roberta xlm-roberta xlm-roberta-xl camembert mpnet roberta-prelayernorm data2vec-text xmod ibert longformer "
    "luke markuplm layoutlmv3".split()
)
"""transformers model types whose position ids start at ``padding_idx + 1`` (``create_position_ids_from_input_ids``):
a table of 514 position embeddings holds 512 tokens (C47; transformers #14243, #9116, #15292, #1363)."""


def model_capacity(path: str, config) -> int | None:
    """How many tokens a backbone reads: its position embeddings (less the ``padding_idx + 1`` rows the
    RoBERTa family skips, :data:`POSITION_OFFSET_MODELS`), or a sentence-transformers folder's own
    ``max_seq_length`` when that is shorter (all-MiniLM-L6-v2: 256 of 512 positions, the length it
    was trained at), so that obliq's encoder and sentence-transformers read the same text."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions and getattr(config, "model_type", None) in POSITION_OFFSET_MODELS:
        positions -= (getattr(config, "pad_token_id", None) or 0) + 1
    limits = [positions]
    st_config = Path(path) / "sentence_bert_config.json"
    if st_config.is_file():
        limits.append(json.loads(read_text(st_config)).get("max_seq_length"))
    limits = [int(n) for n in limits if n]
    return min(limits) if limits else None


def _check_adapter_weights(folder: Path) -> None:
    """Refuse an adapter folder without its weights file (peft's ``adapter_model.safetensors`` or ``.bin``),
    which peft reports as an error that reads like an adapter of another model.

    Raises:
        FileNotFoundError: a folder without either file (the folder named).
    """
    if folder.is_dir() and not any((folder / f"adapter_model.{ext}").is_file() for ext in ("safetensors", "bin")):
        raise FileNotFoundError(
            f"{folder}: no adapter weights (adapter_model.safetensors or adapter_model.bin): the folder holds the "
            "adapter's settings without its weights; copy the weights file there"
        )


def _sort_targets(file: Path) -> None:
    """Write an adapter's ``target_modules`` / ``exclude_modules`` lists sorted: peft writes them from a set, in
    an order that changes with the interpreter's hash seed, so two saves of one adapter would differ."""
    config = read_json_object(file, "a peft adapter's settings")
    keys = [k for k in ("target_modules", "exclude_modules") if isinstance(config.get(k), list)]
    if keys:
        config.update({k: sorted(config[k]) for k in keys})
        write_text(file, json.dumps(config, indent=2, sort_keys=True))


def _ensure_pad_token(tokenizer) -> None:
    """Give a tokenizer without a pad token one explicitly, at load time (C02).

    The pooling mask is always the tokenizer's attention mask, so pad = eos is safe.
    """
    if tokenizer.pad_token is not None:
        return
    for name in ("eos_token", "unk_token"):
        if getattr(tokenizer, name) is not None:
            tokenizer.pad_token = getattr(tokenizer, name)
            log.info("tokenizer has no pad token; using its %s %r", name, tokenizer.pad_token)
            return
    raise ValueError("the tokenizer has no pad, eos or unk token: set tokenizer.pad_token before encoding")


def _instruction(task) -> str | None:
    """A task's query instruction (``task.instruction``), None without a task."""
    return getattr(task, "instruction", None)


def _has_causal_attention(model: nn.Module) -> bool:
    return any(getattr(m, "is_causal", False) is True for m in model.modules())


@torch.no_grad()
def check_bidirectional(encoder: BiEncoder, expect: bool = True) -> None:
    """Self-test: changing the last token must change position 0's hidden state (C03).

    Runs with mask all ones, mask None, alone and batched with a longer, padded partner.

    Raises:
        RuntimeError: a model meant to be bidirectional behaves causally on some path.
    """
    model = encoder.model
    vocab = int(getattr(encoder.backbone_config, "vocab_size", 100))
    base = [min(5 + i, vocab - 1) for i in range(3)]
    a, b = base + [min(8, vocab - 1)], base + [min(9, vocab - 2)]
    was_training = model.training
    model.eval()
    device = encoder.device
    try:

        def first_state(ids: list[int], mask: list[int] | None, partner: bool) -> torch.Tensor:
            rows = [ids] + ([ids + ids] if partner else [])
            width = max(len(r) for r in rows)
            input_ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], device=device)
            inputs = {"input_ids": input_ids}
            if mask is not None or partner:
                m = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
                inputs["attention_mask"] = m
            return model(**inputs).last_hidden_state[0, 0].float()

        for variant in (
            {"mask": [1] * 4, "partner": False},
            {"mask": None, "partner": False},
            {"mask": [1] * 4, "partner": True},
        ):
            diff = (first_state(a, **variant) - first_state(b, **variant)).abs().max().item()
            if expect and diff == 0.0:
                raise RuntimeError(
                    f"bidirectional self-test failed ({variant}): position 0 ignores the last token, "
                    "the backbone is still causal; refusing to build a causal bi-encoder"
                )
            if not expect and diff != 0.0:
                raise RuntimeError(f"causal self-test failed ({variant}): position 0 sees a later token")
    finally:
        model.train(was_training)


def _bnb_config(quantization: str, compute_dtype: torch.dtype):
    if not torch.cuda.is_available():
        raise RuntimeError(f"{quantization} quantization (QLoRA) needs a CUDA GPU and bitsandbytes")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:  # pragma: no cover - bitsandbytes is a core dependency
        raise ImportError("QLoRA needs bitsandbytes: pip install bitsandbytes") from err
    from transformers import BitsAndBytesConfig

    if quantization == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"quantization must be '4bit', '8bit' or None, got {quantization!r}")
