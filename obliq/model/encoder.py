"""The bi-encoder: any transformers backbone, bidirectional for decoders, LoRA, mean pooling, L2 norm.

One encoder serves queries and passages (the OBLIQ-IR paper §3.3; the model card). Decoder-only
backbones (Llama, Qwen, Mistral) get bidirectional attention as NV-Embed does (Lee et al., 2025);
encoders (BERT) run as they are. LoRA comes from peft (Hu et al., 2022); QLoRA loads the base in
4 or 8 bit through bitsandbytes, on a CUDA GPU or the CPU (:mod:`obliq.model.backbone`: how a backbone is loaded).
Texts become token ids in :mod:`obliq.model.tokenizer`; the settings a saved encoder may set are
:mod:`obliq.model.settings`'s, an adapter folder's base is checked by :mod:`obliq.model.adapter`.
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
from obliq.files import read_json_object, write_json, write_text
from obliq.model.adapter import BASE_DIGEST, base_digest, check_adapter_weights, check_base, resolve_base
from obliq.model.backbone import (
    DTYPES,
    POSITION_OFFSET_MODELS,
    ensure_pad_token,
    model_capacity,
    one_4bit_kernel,
    quantization_config,
)
from obliq.model.bidirectional import (
    check_bidirectional,
    check_loading,
    check_model_code,
    has_causal_attention,
    make_bidirectional,
)
from obliq.model.lora import LoraSettings, apply_lora
from obliq.model.pooling import mean_pool
from obliq.model.settings import stored_settings
from obliq.model.tokenizer import PASSAGE_MAX_LENGTH, QUERY_MAX_LENGTH, Kind, TextTokenizer, check_vocabulary
from obliq.windows import Windows, mean_of_windows

log = logging.getLogger(__name__)

CONFIG_NAME = "obliq_encoder.json"


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
        quantization: None, ``4bit`` (nf4, computing in ``dtype``) or ``8bit``: QLoRA's base through bitsandbytes,
            on a CUDA GPU or the CPU. Training only: a saved adapter names its base unquantized.
        gradient_checkpointing: recompute activations in backward (non-reentrant).
        attn_implementation: ``sdpa`` or ``eager`` (or ``flash_attention_2`` on GPU).
        trust_remote_code: allow a hub model's own code; off unless asked.
        windows: read long texts in token windows (:class:`obliq.windows.Windows`: size, stride, reduce ``mean``
            or ``maxsim``), in training and by default in evaluation; None (default): truncate at the max
            lengths. Saved with the encoder.

    Raises:
        RuntimeError: the bidirectional self-test fails (a decoder that stayed causal, C03).
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
        windows: Windows | None = None,
    ):
        super().__init__()
        windows = Windows.of(windows, "windows")
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
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
            windows=windows.settings() if windows else None,
        )
        self.windows = windows
        self.name_or_path = backbone
        path = resolve_model(backbone)
        family = check_model_code(path, trust_remote_code)  # a published family read as data; unknown code refused
        positions = model_capacity(path, AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        check_vocabulary(self.tokenizer, path)
        ensure_pad_token(self.tokenizer)
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
        self.text.windowing = windows  # what the training collator reads long texts with

        kwargs: dict = {"dtype": DTYPES[dtype], "trust_remote_code": trust_remote_code}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        if quantization:
            kwargs["quantization_config"] = quantization_config(quantization, DTYPES[dtype])
        try:
            model, loading = AutoModel.from_pretrained(path, output_loading_info=True, **kwargs)
        except pickle.UnpicklingError as err:  # a pickled pytorch_model.bin holding more than tensors
            from obliq.errors import weights_only_refusal

            raise weights_only_refusal(err, f"{path} (its pytorch_model.bin or another pickle)") from None
        check_loading(path, loading, every_weight=family is not None)
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # BERT's CLS pooler is unused by mean pooling; drop it (and its LoRA)
        causal = has_causal_attention(model)
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

            one_4bit_kernel(model)  # bitsandbytes' CPU inference repacking off: it has no backward (backbone.py)

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
        elif gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            if adapter is not None:
                from peft import PeftModel
                from safetensors import SafetensorError

                check_adapter_weights(Path(adapter))
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
        self,
        query_max_length: int | None = None,
        passage_max_length: int | None = None,
        task=None,
        windows: Windows | None = None,
    ) -> dict:
        """How this encoder reads texts when asked for these lengths: its prefixes (for ``task``'s
        queries: with its instruction when the encoder uses instructions), the token lengths it
        actually keeps (cut to its capacity) and its windows (``windows``, else its own; their ``size`` cut to
        its capacity, as read). What a report states of a system."""
        policy = {
            "query_prefix": self.text.format([""], "query", [_instruction(task)])[0],
            "passage_prefix": self.text.prefix["passage"],
            "query_max_length": self.text.cap(query_max_length) if query_max_length else self.text.max_length["query"],
            "passage_max_length": self.text.cap(passage_max_length)
            if passage_max_length
            else self.text.max_length["passage"],
        }
        windows = windows or self.windows
        if windows is not None:
            policy["windows"] = dict(windows.settings(), size=self.text.cap(windows.size))
        return policy

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
        windows: Windows | None = None,
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
            windows: read long texts in windows (:mod:`obliq.windows`); None: the encoder's own
                (``self.windows``). A windowed text is the mean of its windows (``max_length`` is then
                ``windows.size``); queries only with ``windows.queries``.

        Returns:
            (n, hidden) float32 CPU tensor of unit vectors, in the input order.

        Raises:
            ValueError: windows whose ``reduce`` is ``maxsim`` for a windowed kind: a text is then its windows
                (:meth:`encode_windows`), not one vector.
        """
        texts = list(texts)
        if instructions is None and kind == "query" and _instruction(task):
            instructions = [_instruction(task)] * len(texts)
        windows = windows or self.windows
        windowed = windows is not None and (kind == "passage" or windows.queries)
        if windowed and windows.reduce == "maxsim" and kind == "passage":
            raise ValueError(
                "windows.reduce maxsim: a passage is the set of its windows' vectors, not one vector: obliq "
                "evaluate and obliq search score it by MaxSim (encode_windows); a store (obliq encode), mteb and "
                "sentence-transformers take one vector a text: use windows.reduce mean"
            )
        if not texts:
            return torch.empty(0, self.hidden_size)
        if windowed:
            vectors, owner = self.encode_windows(texts, kind, batch_size, windows, show_progress, instructions)
            return mean_of_windows(vectors, owner, len(texts))
        return self._encode(texts, kind, batch_size, show_progress, instructions, max_length)

    def _encode(self, texts, kind, batch_size, show_progress, instructions, max_length) -> torch.Tensor:
        from tqdm.auto import tqdm

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

    @torch.no_grad()
    def encode_windows(
        self,
        texts: list[str],
        kind: Kind = "passage",
        batch_size: int = 32,
        windows: Windows | None = None,
        show_progress: bool | None = None,
        instructions: list[str | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode texts as token windows (:meth:`TextTokenizer.windows`), ``batch_size`` windows a forward pass,
        in eval mode and without gradients.

        Args:
            texts: n strings; kind: ``query`` or ``passage`` (its prefix).
            windows: the window settings; None: the encoder's own.
            instructions: each query's instruction (with ``use_instructions``).

        Returns:
            ``(vectors, window_doc)``: (W, hidden) float32 CPU unit vectors of every window, the windows of text 0
            first, each text's in text order, and (W,) int64, the text of each window.

        Raises:
            ValueError: no window settings (none given, and the encoder has none).
        """
        from tqdm.auto import tqdm

        windows = windows or self.windows
        if windows is None:
            raise ValueError("encode_windows: no window settings (pass windows=Windows(...))")
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # similar lengths share a forward pass
        starts = range(0, len(texts), batch_size)
        if show_progress is None:
            show_progress = len(starts) > 8
        was_training = self.training
        self.eval()
        vectors, owners = [], []
        try:
            for s in tqdm(starts, desc=f"encode {kind} windows", disable=not show_progress):
                idx = order[s : s + batch_size]
                instr = [instructions[i] for i in idx] if instructions is not None else None
                batch, owner = self.text.windows([texts[i] for i in idx], kind, windows, instr)
                for w in range(0, len(owner), batch_size):
                    vectors.append(self({k: v[w : w + batch_size] for k, v in batch.items()}).cpu())
                owners.append(torch.tensor(idx, dtype=torch.long)[owner])
        finally:
            self.train(was_training)
        if not vectors:
            return torch.empty(0, self.hidden_size), torch.empty(0, dtype=torch.long)
        owner = torch.cat(owners)
        back = torch.sort(owner, stable=True).indices  # text order; a text's windows keep theirs
        return torch.cat(vectors)[back], owner[back]

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


def _sort_targets(file: Path) -> None:
    """Write an adapter's ``target_modules`` / ``exclude_modules`` lists sorted: peft writes them from a set, in
    an order that changes with the interpreter's hash seed, so two saves of one adapter would differ."""
    config = read_json_object(file, "a peft adapter's settings")
    keys = [k for k in ("target_modules", "exclude_modules") if isinstance(config.get(k), list)]
    if keys:
        config.update({k: sorted(config[k]) for k in keys})
        write_text(file, json.dumps(config, indent=2, sort_keys=True))


def _instruction(task) -> str | None:
    """A task's query instruction (``task.instruction``), None without a task."""
    return getattr(task, "instruction", None)
