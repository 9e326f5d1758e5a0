"""Few-shot Stage B: real (document, query) pairs of a task's development side shown in the prompt.

Promptagator (Dai et al. 2022, §3) and InPars show a handful of real pairs; :func:`~obliq.synth.generate.synthesize`
draws ``k`` of them per document from an :class:`ExamplePool` (item 4 of :mod:`obliq.synth.generate`'s
notes): never from the test side, never a query whose gold set holds the source document.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from obliq.llm.prompts import cut_words
from obliq.tasks import Task, load_query_split
from obliq.text import text_hash


@dataclass
class FewShotConfig:
    """Few-shot Stage B settings (see the notes of :mod:`obliq.synth.generate`, item 4).

    Attributes:
        k: real (document, query) pairs shown in each Stage B prompt; 0 = none (zero-shot).
        split: the development side they come from: ``queries-<split>.jsonl`` and ``qrels/<split>.tsv``
            of the task folder (``obliq task split`` writes ``dev``); never ``test``.
        max_doc_words: each example's document and query are cut to this many whitespace words.
    """

    k: int = 0
    split: str = "dev"
    max_doc_words: int = 80

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise ValueError(f"fewshot.k: must be an integer >= 0, got {self.k!r}")
        if isinstance(self.max_doc_words, bool) or not isinstance(self.max_doc_words, int) or self.max_doc_words < 1:
            raise ValueError(f"fewshot.max_doc_words: must be an integer >= 1, got {self.max_doc_words!r}")
        if not isinstance(self.split, str) or not self.split.strip() or any(c in self.split for c in "/\\"):
            raise ValueError(f"fewshot.split: must be a split name such as dev, got {self.split!r}")
        if self.split == "test":
            raise ValueError("fewshot.split: examples never come from the test side; use the development side (dev)")


@dataclass(frozen=True)
class Example:
    """One few-shot example: a development query and one of its gold documents, as the prompt shows them."""

    query_id: str
    doc_id: str
    query: str
    document: str


class ExamplePool:
    """The real (query, gold documents) pairs of a task's development side, for few-shot Stage B.

    Args:
        task: the loaded task (its folder holds the development side).
        split: the development split (``queries-<split>.jsonl``, ``qrels/<split>.tsv``).
        max_doc_words: examples are cut to this many words.

    Attributes:
        queries: ``(query id, text, gold document indices)`` of each development query with at least one
            gold document (grade >= 1) in the corpus, sorted by id.

    Raises:
        FileNotFoundError: the task folder has no development side (split the task first).
        ValueError: a development query that is also a test query (same id, or the same normalised
            text as one of ``queries.jsonl``), another corpus, or no development query with a gold
            document.
    """

    def __init__(self, task: Task, split: str = "dev", max_doc_words: int = 80):
        queries_file = Path(task.path) / f"queries-{split}.jsonl"
        if not queries_file.is_file() or not (Path(task.path) / "qrels" / f"{split}.tsv").is_file():
            raise FileNotFoundError(
                f"{queries_file}: few-shot examples come from the task's development side "
                f"(queries-{split}.jsonl and qrels/{split}.tsv); write it with `obliq task split`"
            )
        dev = load_query_split(task.path, split, apart_from=task)  # few-shot examples never show a test query
        index = {d: i for i, d in enumerate(task.doc_ids)}
        qrels = dev.qrels["test"]
        self.queries: list[tuple[str, str, tuple[int, ...]]] = []
        for qid, text in sorted(zip(dev.query_ids, dev.query_texts)):
            gold = tuple(sorted(index[d] for d, g in qrels.get(qid, {}).items() if g > 0 and d in index))
            if gold and text.strip():
                self.queries.append((qid, text, gold))
        if not self.queries:
            raise ValueError(f"{queries_file}: no development query has a gold document in the corpus")
        self.task, self.max_doc_words = task, max_doc_words
        self._hashes: dict[int, int] = {}

    def _hash(self, i: int) -> int:
        if i not in self._hashes:
            self._hashes[i] = text_hash(self.task.doc_texts[i])
        return self._hashes[i]

    def choose(self, doc_index: int, k: int, seed: int) -> list[Example]:
        """Up to ``k`` examples for the document ``doc_index``, drawn with ``random.Random(seed)``.

        The queries whose gold set holds the document, or a document with its normalised text, are left
        out (see the notes of :mod:`obliq.synth.generate`, item 4); ``k`` distinct queries are sampled from
        the others (all of them when fewer), then one of each query's gold documents with a text. Same seed,
        same examples.
        """
        own = self._hash(doc_index)
        eligible = [q for q in self.queries if doc_index not in q[2] and all(self._hash(j) != own for j in q[2])]
        rng = random.Random(seed)
        out = []
        for qid, text, gold in rng.sample(eligible, min(k, len(eligible))):
            shown = [j for j in gold if self.task.doc_texts[j].strip()]
            if not shown:
                continue
            j = rng.choice(shown)
            out.append(
                Example(
                    qid,
                    self.task.doc_ids[j],
                    cut_words(" ".join(text.split()), self.max_doc_words)[0],
                    cut_words(self.task.doc_texts[j], self.max_doc_words)[0],
                )
            )
        return out


__all__ = ["Example", "ExamplePool", "FewShotConfig"]
