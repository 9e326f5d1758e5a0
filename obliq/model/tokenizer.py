"""Texts into token ids for the encoder: prefixes, per-task instructions, truncation to a kind's length
(never beyond the backbone's positions) and padding, without tokenizing a long text whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # only named in annotations: the token-length defaults below are read without torch
    import torch

    from obliq.windows import Windows

Kind = Literal["query", "passage"]

QUERY_MAX_LENGTH = 256
"""Default query length in tokens, for training and evaluation (the OBLIQ-IR paper §4)."""
PASSAGE_MAX_LENGTH = 1024
"""Default passage length in tokens (the model card); cut to a backbone's positions when it has fewer."""

INSTRUCTION_TEMPLATE = "Instruct: {instruction}\n"
"""What ``use_instructions`` puts before a query that carries an instruction."""

PRECUT_CHARS_PER_TOKEN = 8
"""Characters per token of the first cut of a long text (:meth:`TextTokenizer.prefixes`); English averages
about 4. A poor guess costs time, never tokens."""


def _cut(text: str, chars: int) -> str:
    """``text`` cut to at most ``chars`` characters, at the end of a word when the last half holds whitespace."""
    if len(text) <= chars:
        return text
    half = chars // 2
    space = max(text.rfind(c, half, chars + 1) for c in " \t\n\r")
    if space > half and not text[space - 1].isspace():
        return text[:space]
    return text[:chars]


class TextTokenizer:
    """Prefix, tokenize, truncate and pad texts for the encoder; picklable without the model, so
    data-loader workers can carry it.

    Args:
        tokenizer: a Hugging Face tokenizer with a pad token.
        query_prefix / passage_prefix: prepended to every query / passage (the model card).
        query_max_length / passage_max_length: cut lengths in tokens, special tokens included.
            A tokenizer's ``model_max_length`` is ignored (some report 1e30, C17).
        use_instructions: prepend ``Instruct: <instruction>\\n`` to queries that carry one.
        capacity: the backbone's positions: no call tokenizes beyond it (None: no cap).

    ``truncated`` counts the texts cut so far, per kind; ``windowing`` is the encoder's
    :class:`~obliq.windows.Windows` (None: texts are cut at the max lengths), read by the training collator.
    """

    def __init__(
        self,
        tokenizer,
        query_prefix: str = "query: ",
        passage_prefix: str = "passage: ",
        query_max_length: int = QUERY_MAX_LENGTH,
        passage_max_length: int = PASSAGE_MAX_LENGTH,
        use_instructions: bool = False,
        capacity: int | None = None,
    ):
        if min(query_max_length, passage_max_length) < 1:
            raise ValueError("max lengths must be positive")
        self.tokenizer = tokenizer
        self.prefix = {"query": query_prefix, "passage": passage_prefix}
        self.capacity = capacity
        self.max_length = {"query": self.cap(query_max_length), "passage": self.cap(passage_max_length)}
        self.use_instructions = use_instructions
        self.truncated = {"query": 0, "passage": 0}
        self.windowing: Windows | None = None  # the encoder's windows: how the training collator reads long texts

    def cap(self, length: int) -> int:
        """``length`` cut to the backbone's positions."""
        return min(length, self.capacity) if self.capacity else length

    def prefixes(self, texts: list[str], limit: int) -> tuple[list[str], dict]:
        """For each text, a prefix that the tokenizer cuts at ``limit`` tokens exactly as it cuts the whole
        text (``tokenizer(text, truncation=True, max_length=limit)``), and those ids: long texts are not
        tokenized whole (a 300 MB row), yet no cut changes a kept token (C17, issue 24 §3).

        A text of more than 2 · :data:`PRECUT_CHARS_PER_TOKEN` · ``limit`` characters is tried at two cuts,
        the second twice as far, each at the end of a word (before whitespace) when the last half of the
        cut holds one. Hugging Face tokenizers tokenize each pre-tokenized piece on its own and their
        normalizers and pre-tokenizers look only a few characters ahead, so a cut can change only the
        piece it falls in; a cut at a word's end changes none for whitespace-splitting pre-tokenizers.
        The first cut is kept when it already gives ``limit`` tokens and the second cut gives the same
        ids (then the text after the first cut changed none of them); otherwise the cuts move 4× further,
        up to the whole text. Texts whose characters make few tokens (runs of whitespace or zero-width
        marks, which tokenizers drop) or many characters per token (URLs, base64, SMILES that WordPiece
        maps to one unknown token) get longer cuts, never fewer tokens. A tokenizer that truncates on
        the left reads whole texts.

        Returns:
            ``(prefixes, encoding)``: the prefixes, and their ``input_ids`` / ``attention_mask`` lists
            (unpadded) cut at ``limit``.
        """
        chars = PRECUT_CHARS_PER_TOKEN * limit + 64
        prefix = list(texts)
        pending = [i for i, t in enumerate(texts) if len(t) > 2 * chars]  # a shorter one is read whole
        if getattr(self.tokenizer, "truncation_side", "right") == "left":
            pending = []
        found: dict[int, tuple[list[int], list[int]]] = {}
        while pending:
            first = [_cut(texts[i], chars) for i in pending]
            second = [_cut(texts[i], 2 * chars) for i in pending]
            a = self.tokenizer(first, truncation=True, max_length=limit, padding=False)
            b = self.tokenizer(second, truncation=True, max_length=limit, padding=False)
            still = []
            for j, i in enumerate(pending):
                if len(a["input_ids"][j]) == limit and a["input_ids"][j] == b["input_ids"][j]:
                    prefix[i], found[i] = first[j], (a["input_ids"][j], a["attention_mask"][j])
                elif second[j] == texts[i]:  # the whole text: exact
                    prefix[i], found[i] = second[j], (b["input_ids"][j], b["attention_mask"][j])
                else:
                    still.append(i)
            pending, chars = still, 4 * chars
        rest = [i for i in range(len(texts)) if i not in found]
        if rest:
            enc = self.tokenizer([prefix[i] for i in rest], truncation=True, max_length=limit, padding=False)
            for j, i in enumerate(rest):
                found[i] = (enc["input_ids"][j], enc["attention_mask"][j])
        ids = [found[i][0] for i in range(len(texts))]
        return prefix, {"input_ids": ids, "attention_mask": [found[i][1] for i in range(len(texts))]}

    def format(self, texts: list[str], kind: Kind, instructions: list[str | None] | None = None) -> list[str]:
        """Prefix texts for ``kind`` (and, with ``use_instructions``, each query's instruction)."""
        if kind not in self.max_length:
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        out = [self.prefix[kind] + t for t in texts]
        if kind == "query" and self.use_instructions and instructions is not None:
            out = [INSTRUCTION_TEMPLATE.format(instruction=i) + t if i else t for t, i in zip(out, instructions)]
        return out

    def __call__(
        self,
        texts: list[str],
        kind: Kind,
        instructions: list[str | None] | None = None,
        max_length: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Tokenize n texts of one kind.

        Args:
            texts: n strings.
            kind: ``query`` or ``passage``.
            instructions: each query's instruction (or None), used with ``use_instructions``.
            max_length: this call's length limit (cut to the backbone's positions); None uses the
                kind's own (``max_length[kind]``).

        Returns:
            ``input_ids`` and ``attention_mask``, LongTensors (n, L), L ≤ the kind's max length,
            padded on the tokenizer's padding side.
        """
        if isinstance(texts, str):
            raise TypeError("tokenize expects a list of texts, not a single string")
        formatted = self.format(list(texts), kind, instructions)
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be positive, got {max_length}")
        limit = self.cap(max_length) if max_length is not None else self.max_length[kind]
        # One token over the limit tells which texts are cut; the prefixes give the tokenizer's own ids.
        prefixes, enc = self.prefixes(formatted, limit + 1)
        over = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > limit]
        if over:
            cut = self.tokenizer([prefixes[i] for i in over], truncation=True, max_length=limit, padding=False)
            for j, i in enumerate(over):
                enc["input_ids"][i] = cut["input_ids"][j]
                enc["attention_mask"][i] = cut["attention_mask"][j]
            self.truncated[kind] += len(over)
        features = [{"input_ids": a, "attention_mask": m} for a, m in zip(enc["input_ids"], enc["attention_mask"])]
        return dict(self.tokenizer.pad(features, padding=True, return_tensors="pt"))

    def specials(self) -> tuple[int, int]:
        """How many special tokens the tokenizer puts before and after a text's own tokens (BERT: 1, 1; Llama:
        1, 0), found by tokenizing one word with and without them."""
        if getattr(self, "_specials", None) is None:
            whole = self.tokenizer("hello")["input_ids"]
            own = self.tokenizer("hello", add_special_tokens=False)["input_ids"]
            head = next(i for i in range(len(whole) - len(own) + 1) if whole[i : i + len(own)] == own)
            self._specials = (head, len(whole) - len(own) - head)
        return self._specials

    def prefix_length(self, prefix: str, ids: list[int]) -> int:
        """The number of a text's first tokens (``ids``, without special tokens) that are its prefix: the longest
        run they share with the prefix tokenized alone (a BPE tokenizer may merge the prefix's last space into the
        text's first word: that token then belongs to the text)."""
        own = self.tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        n = 0
        while n < min(len(own), len(ids)) and own[n] == ids[n]:
            n += 1
        return n

    def windows(
        self, texts: list[str], kind: Kind, windows: Windows, instructions: list[str | None] | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Tokenize n texts into token windows (:mod:`obliq.windows`): each window is the special tokens, the
        text's prefix (and instruction) and ``windows.stride``-spaced runs of the text's own tokens, cut only
        between tokens. A text that fits in ``windows.size`` tokens is one window, the same ids as
        :meth:`__call__` gives it; the first window of a longer one is :meth:`__call__`'s ids at ``windows.size``
        (a tokenizer that truncates on the left keeps a text's end there; its windows still start at the text's
        start). A text of more than ``windows.max_windows`` windows keeps its first ones (counted in ``truncated``).

        Returns:
            ``(batch, window_doc)``: ``input_ids`` / ``attention_mask`` LongTensors (W, L), L ≤ ``windows.size``
            (cut to the backbone's positions), and (W,) int64, the text of each window, texts in input order.

        Raises:
            ValueError: the prefix and special tokens leave a window less room for the text than ``windows.stride``
                (``windows.size`` named, and its cut to the backbone's positions).
        """
        import torch

        if isinstance(texts, str):
            raise TypeError("windows expects a list of texts, not a single string")
        formatted = self.format(list(texts), kind, instructions)
        size = self.cap(windows.size)
        limit = size + windows.stride * (windows.max_windows - 1)  # the tokens max_windows windows hold
        if getattr(self.tokenizer, "truncation_side", "right") == "left":  # it would keep a text's end: read whole
            enc = self.tokenizer(formatted, padding=False, verbose=False)  # (prefixes() reads such texts whole too)
        else:
            _, enc = self.prefixes(formatted, limit + 1)
        head, tail = self.specials()
        features, owner = [], []
        for i, ids in enumerate(enc["input_ids"]):
            if len(ids) <= size:
                runs = [ids]
            else:
                if len(ids) > limit:
                    self.truncated[kind] += 1
                    ids = ids[: limit - tail] + ids[len(ids) - tail :]
                content = ids[head : len(ids) - tail]
                n_prefix = self.prefix_length(formatted[i][: len(formatted[i]) - len(texts[i])], content)
                room = size - head - tail - n_prefix
                if room < windows.stride:
                    cut = f" (cut to the backbone's {size} positions)" if size < windows.size else " tokens"
                    raise ValueError(
                        f"windows.size: {windows.size}{cut} leave {room} for the text after the prefix and special "
                        f"tokens ({n_prefix + head + tail}), fewer than windows.stride {windows.stride}"
                    )
                body = content[n_prefix:]
                starts = range(0, max(1, len(body) - room + windows.stride), windows.stride)
                runs = [ids[:head] + content[:n_prefix] + body[s : s + room] + ids[len(ids) - tail :] for s in starts]
            features += [{"input_ids": r, "attention_mask": [1] * len(r)} for r in runs]
            owner += [i] * len(runs)
        batch = dict(self.tokenizer.pad(features, padding=True, return_tensors="pt"))
        return batch, torch.tensor(owner, dtype=torch.long)


PROBE = "The quick brown fox jumps over the lazy dog while five wizards box."
"""The sentence :func:`check_vocabulary` tokenizes: common English words, which any real vocabulary knows."""


def check_vocabulary(tokenizer, model: object) -> None:
    """Refuse a tokenizer that reads every word as unknown (issue 49 §3): a model folder without its tokenizer
    files (``vocab.txt``, ``tokenizer.json``, …) loads, with transformers 5, a tokenizer of the config's class
    with no vocabulary (BERT's: 5 special tokens), which maps every word to the unknown token, and the model
    would encode and be scored on nothing but that token.

    Raises:
        ValueError: :data:`PROBE` tokenizes to no id, or to the unknown token's id only (``model`` named).
    """
    ids = tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    unknown = getattr(tokenizer, "unk_token_id", None)
    if not ids or (unknown is not None and all(i == unknown for i in ids)):
        raise ValueError(
            f"{model}: field tokenizer: every word of a probe sentence is the unknown token {tokenizer.unk_token!r} "
            f"(a vocabulary of {len(tokenizer)} tokens): the folder lacks its tokenizer files (tokenizer.json, "
            "vocab.txt, …); copy them from the model it was saved from"
        )
