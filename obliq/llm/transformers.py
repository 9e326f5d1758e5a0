"""The transformers backend: ``generate`` with the model's chat template, on the CPU or a GPU; the
reference the other backends are compared with (:mod:`obliq.llm.backends`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from obliq.aliases import resolve_model
from obliq.errors import check_int
from obliq.llm.backends import BackendConfig
from obliq.llm.chat import chat_ids
from obliq.llm.prompts import Messages
from obliq.llm.reply import end_ids, reasoning_delimiters

DTYPES = ("float32", "bfloat16", "float16")
"""``backend.dtype`` values (torch dtypes)."""


class TransformersBackend:
    """``transformers`` ``generate`` with the model's chat template (:func:`obliq.llm.chat.chat_ids`),
    batched with left padding.

    Args:
        model: an alias (``smollm2``), a local folder or a hub id (:func:`obliq.aliases.resolve_model`).
        device: ``cpu``, ``cuda``, ``cuda:1``…; default CUDA when available, else CPU.
        dtype: ``float32``, ``bfloat16`` or ``float16``; default bfloat16 on CUDA, float32 on CPU.
        batch_size: chats per ``generate`` call.
        top_p: nucleus sampling mass when sampling.
        threads: torch CPU threads while generating (restored afterwards); default torch's own
            setting. On a CPU shared with other busy processes use 1 (docs/decisions.md, "Threads on a
            shared 2-core CPU").
        reasoning: let a reasoning model reason (default off, through the chat template).
        reasoning_tokens: extra reply budget when it reasons.

    Sampling uses its own RNG state (``torch.random.fork_rng``), seeded per call, so the caller's
    global RNG is left alone. Generation stops on any end id (:func:`obliq.llm.reply.end_ids`); a reply
    is decoded up to its end id with special tokens kept (reasoning delimiters can be special tokens).

    Raises:
        ValueError: the tokenizer has no chat template.
    """

    def __init__(
        self,
        model: str = "smollm2",
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
        top_p: float = 0.95,
        threads: int | None = None,
        reasoning: bool = False,
        reasoning_tokens: int = 1024,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model(model)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not self.tokenizer.chat_template:
            raise ValueError(f"{path}: the tokenizer has no chat template; use an instruction-tuned model")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(self.device).eval()
        self.batch_size, self.top_p, self.threads = batch_size, top_p, threads
        self.reasoning, self.reasoning_tokens = reasoning, reasoning_tokens
        self.end_ids = end_ids(self.tokenizer, self.model.generation_config)
        self.delimiters = reasoning_delimiters(self.tokenizer)
        self.name = f"transformers:{model}"
        self.new_tokens, self.seconds, self.finished = 0, 0.0, []
        self.calls, self.prompt_tokens = 0, 0

    def generate(
        self, prompts: Sequence[Messages], max_new_tokens: int, temperature: float, seed: int | Sequence[int]
    ) -> list[str]:
        """See :class:`obliq.llm.backends.Backend`. Batches of ``batch_size``; a batch is seeded with its first
        chat's seed (per-chat seeds are exact with ``batch_size`` 1), or with ``seed + i`` for batch ``i``."""
        import torch

        out: list[str] = []
        self.finished = []
        ends = set(self.end_ids)
        devices = [self.device] if self.device.type == "cuda" else []
        for i in range(0, len(prompts), self.batch_size):
            rows = [
                chat_ids(self.tokenizer, chat, enable_thinking=self.reasoning)
                for chat in prompts[i : i + self.batch_size]
            ]
            enc = self.tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt").to(self.device)
            sampling = (
                dict(do_sample=True, temperature=temperature, top_p=self.top_p)
                if temperature > 0
                else dict(do_sample=False)
            )
            start, threads = time.perf_counter(), torch.get_num_threads()
            try:
                if self.threads:
                    torch.set_num_threads(self.threads)
                with torch.random.fork_rng(devices=devices), torch.inference_mode():
                    torch.manual_seed(seed[i] if not isinstance(seed, int) else seed + i // self.batch_size)
                    ids = self.model.generate(
                        **enc,
                        max_new_tokens=max_new_tokens,
                        eos_token_id=self.end_ids,
                        pad_token_id=self.tokenizer.pad_token_id,
                        **sampling,
                    )
            finally:
                torch.set_num_threads(threads)
            self.seconds += time.perf_counter() - start
            self.calls += len(enc["input_ids"])
            self.prompt_tokens += int(enc["attention_mask"].sum())
            for row in ids[:, enc["input_ids"].shape[1] :].tolist():
                end = next((j for j, t in enumerate(row) if t in ends), None)
                self.finished.append(end is not None)
                self.new_tokens += end + 1 if end is not None else len(row)
                out.append(self.tokenizer.decode(row[:end], skip_special_tokens=False).strip())
        return out


@dataclass
class TransformersConfig(BackendConfig):
    """The transformers backend's settings (``backend: {name: transformers, …}``): those of
    :class:`~obliq.llm.backends.BackendConfig` and:

    Attributes:
        device: a torch device, ``cpu``, ``cuda``, ``cuda:1``… (default CUDA when available).
        dtype: one of :data:`DTYPES` (default bfloat16 on CUDA, float32 on CPU).
        threads: torch CPU threads while generating (1 is fastest on a busy CPU; default torch's).
        batch_size: chats per ``generate`` call.
    """

    backend_class = TransformersBackend

    name: str = "transformers"
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    batch_size: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.device is not None:
            import torch

            try:
                torch.device(self.device if isinstance(self.device, str) else "")
            except RuntimeError:
                raise ValueError(
                    f"device: must be a torch device (cpu, cuda, cuda:1, …), got {self.device!r}"
                ) from None
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None:
            check_int("threads", self.threads, 1)
        check_int("batch_size", self.batch_size, 1)


CONFIG = TransformersConfig
