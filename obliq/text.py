"""Text at the bottom of every stage: repairs, the one notion of "the same text", words, function words.

- :func:`repair_text`: lone UTF-16 surrogates become U+FFFD and NUL bytes a space (``C17``), for every
  text obliq reads (task files and training rows alike);
- :func:`normalise_text` / :func:`text_hash`: "the same document" for the whole project (the
  negative-vs-positive check of training rows, the loss's duplicate mask, the hard-negative miner,
  kNN pairs);
- :func:`fold` / :func:`words`: NFKC + case folding, then ``\\w+`` tokens: obliq's one lexical tokenizer
  (BM25 evaluation and hard-negative mining, the synthetic-query audit and filter, word counts and
  copy checks in prompts and replies);
- :func:`load_function_words`: the built-in function-word lists (``obliq/function_words/``), used by
  the stylometric teacher and by the synthetic-query audit's entity heuristic.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from pathlib import Path

from obliq.files import read_text

FUNCTION_WORD_LISTS = Path(__file__).with_name("function_words")
"""Folder of the built-in function-word lists (``<name>.txt``: ``english``, ``mosteller-wallace``)."""

_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")
WORD = re.compile(r"\w+")
"""A word: a run of Unicode letters, digits and underscores (Python's ``\\w``)."""


def repair_text(text: str) -> tuple[str, int]:
    """Replace each lone surrogate (U+D800..U+DFFF) by U+FFFD and each NUL by a space (``shared/cases/C17``).

    JSON escapes such as ``"\\udcb2"`` decode to lone surrogates, which break UTF-8 encoding and
    tokenizers; a proper surrogate pair escape decodes to one code point and is left alone.

    Returns:
        The repaired text and the number of characters replaced.
    """
    if not _BAD_CHARS.search(text):
        return text, 0
    repaired, n = _BAD_CHARS.subn(lambda m: " " if m.group() == "\x00" else "\ufffd", text)
    return repaired, n


@functools.cache
def _punctuation_table() -> dict[int, None]:
    # Unicode has punctuation (P*) only in planes 0 and 1; scanning those takes ~30 ms.
    return dict.fromkeys(i for i in range(0x20000) if unicodedata.category(chr(i)).startswith("P"))


@functools.cache
def _ascii_punctuation() -> bytes:
    return bytes(c for c in range(128) if c in _punctuation_table())


def normalise_text(text: str) -> str:
    """The form in which two texts count as "the same document".

    Unicode NFKC, case folding, every Unicode punctuation character (categories P*) removed, runs of
    whitespace collapsed to one space, ends stripped. This is the comparison the shared tasks were
    de-duplicated with ("after lowercasing and removing punctuation", ``shared/data/README.md``).
    """
    if text.isascii():  # same result, faster: NFKC is the identity and casefold is lower on ASCII
        return " ".join(text.lower().encode().translate(None, _ascii_punctuation()).decode().split())
    folded = unicodedata.normalize("NFKC", text).casefold().translate(_punctuation_table())
    return " ".join(folded.split())


def text_hash(text: str) -> int:
    """Signed 64-bit hash of :func:`normalise_text` of ``text`` (BLAKE2b, 8-byte digest), stable across runs.

    Fits a ``torch.int64``; equal for texts that differ only in case, punctuation or whitespace.
    """
    digest = hashlib.blake2b(normalise_text(text).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def id_hash(row_id: str) -> int:
    """Signed 64-bit BLAKE2b hash of a row id, used to find duplicate ids without holding the ids."""
    digest = hashlib.blake2b(row_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def nfkc(text: str) -> str:
    """Unicode NFKC (Unicode Standard Annex #15, https://unicode.org/reports/tr15/): "e" + U+0301
    (decomposed, NFD) becomes "é", the ligature "ﬁ" (U+FB01) "fi", a full-width "Ａ" "A" (C50)."""
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def fold(text: str) -> str:
    """The form in which lexical matching compares words: NFKC, case folding, NFKC again.

    Case folding is Unicode's lowercasing for caseless matching (``str.casefold``: "ß" → "ss"); the
    second NFKC recomposes what folding decomposes ("ǰ" folds to "j" + U+030C, which would cut a
    ``\\w+`` word). The Unicode Standard's "compatibility caseless match" (§3.13), in composed form.
    ASCII text is only lowercased (the same result).
    Without it a word written in another Unicode form never matches (``shared/cases/C50``).
    """
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def words(text: str) -> list[str]:
    """The ``\\w+`` tokens of :func:`fold` of a text: obliq's one lexical tokenizer (BM25, the
    synthetic-query audit, lengths and copy checks)."""
    return WORD.findall(fold(text))


def load_function_words(spec: str) -> list[str]:
    """The function words named by ``spec``: a built-in list name or a path (one word a line).

    Returns:
        Distinct lowercase words, in file order.

    Raises:
        FileNotFoundError: neither a built-in list nor a file.
        ValueError: a line holds more than one token, or the list is empty (file and line named).
    """
    path = FUNCTION_WORD_LISTS / f"{spec}.txt"
    if not path.is_file():
        path = Path(spec)
        if not path.is_file():
            builtin = sorted(p.stem for p in FUNCTION_WORD_LISTS.glob("*.txt"))
            raise FileNotFoundError(f"function-word list {spec!r}: not a built-in list {builtin} and not a file")
    found: list[str] = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        line = line.split("#", 1)[0].strip().lower()
        if not line:
            continue
        if len(line.split()) != 1:
            raise ValueError(f"{path}:{lineno}: expected one word a line, got {line!r}")
        if line not in found:
            found.append(line)
    if not found:
        raise ValueError(f"{path}: no function words")
    return found
