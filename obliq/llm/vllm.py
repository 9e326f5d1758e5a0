"""The vLLM backend: offline batched generation on a GPU, the paper's setting for a 27B instruction model
(:mod:`obliq.llm.backends`). vLLM is imported only when the backend is built."""

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


class VLLMBackend:
    """vLLM offline batched generation (GPU), the paper's setting for a 27B instruction model.

    vLLM pins its own torch and transformers, so it lives in a separate GPU environment:
    ``pip install -e '.[gen]'`` there. It is imported only when this class is built.

    Args:
        model: an alias, a local folder or a hub id.
        tensor_parallel_size: GPUs to shard the model over.
        gpu_memory_utilization: share of GPU memory vLLM may take.
        max_model_len: context length cap (default: the model's).
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
        top_p: float = 0.95,
        reasoning: bool = False,
        reasoning_tokens: int = 1024,
    ):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise ImportError(
                "the vllm backend needs vLLM, which pins its own torch: install it in a separate GPU "
                "environment with `pip install -e '.[gen]'` (or use backend=transformers)"
            ) from err
        self._sampling = SamplingParams
        self.llm = LLM(
            model=resolve_model(model),
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
        )
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


@dataclass
class VLLMConfig(BackendConfig):
    """The vLLM backend's settings (``backend: {name: vllm, …}``): those of
    :class:`~obliq.llm.backends.BackendConfig` and:

    Attributes:
        tensor_parallel_size: GPUs to shard the model over.
        gpu_memory_utilization: share of GPU memory it may take.
        max_model_len: context length cap (default the model's).
    """

    backend_class = VLLMBackend

    name: str = "vllm"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.max_model_len is not None:
            check_int("max_model_len", self.max_model_len, 1)
        share = self.gpu_memory_utilization
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"gpu_memory_utilization: must be a number in (0, 1], got {share!r}")


CONFIG = VLLMConfig
