"""Shared helpers for the tests of obliq.data (no tests here): real training rows built from the
shared tasks, and a real Hugging Face tokenizer wrapped with the query/passage prefixes."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

NEGATIVE_CHOICES = (4, 4, 4, 3, 2, 1, 0, 6)  # fewer than k = 4 allowed; 6 checks the cut to k


def _norm(text: str) -> str:
    # The test's own notion of "same text", independent of obliq.data.rows.normalise_text.
    return " ".join(re.sub(r"[^\w\s]", "", text.lower()).split())


def task_rows(tasks_dir: Path, task: str, limit: int | None = None, seed: int = 13) -> list[dict]:
    """Training rows from a BEIR task: one row per relevant (query, doc) pair of qrels/test.tsv, in
    file order, with random corpus documents (neither relevant to the query nor equal in text to
    the positive) as negatives."""
    folder = tasks_dir / task
    corpus = {}
    with open(folder / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            corpus[doc["_id"]] = doc["text"]
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = {q["_id"]: q["text"] for q in map(json.loads, f)}
    with open(folder / "qrels" / "test.tsv", encoding="utf-8") as f:
        pairs = [(r["query-id"], r["corpus-id"]) for r in csv.DictReader(f, delimiter="\t") if int(r["score"]) >= 1]
    relevant: dict[str, set[str]] = {}
    for qid, did in pairs:
        relevant.setdefault(qid, set()).add(did)
    ids = list(corpus)
    rng = np.random.default_rng(seed)
    rows = []
    for qid, did in pairs[:limit]:
        want = int(rng.choice(NEGATIVE_CHOICES))
        negatives = []
        while len(negatives) < want:
            cand = ids[int(rng.integers(len(ids)))]
            if (
                cand in relevant[qid]
                or cand in {n["id"] for n in negatives}
                or _norm(corpus[cand]) == _norm(corpus[did])
            ):
                continue
            negatives.append({"id": cand, "text": corpus[cand]})
        rows.append(
            {
                "id": f"{task}/{qid}/{did}",
                "task": task,
                "source": "public",
                "query": queries[qid],
                "positive": {"id": did, "text": corpus[did]},
                "negatives": negatives,
            }
        )
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def file_ids(*paths: Path) -> list[str]:
    """Row ids of files, read here with json (independently of obliq.data)."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out += [json.loads(line)["id"] for line in f if line.strip()]
    return out


class PrefixTokenizer:
    """A real HF tokenizer with the 'query: ' / 'passage: ' prefixes, as BiEncoder.tokenize will do."""

    def __init__(self, path: str, max_query: int = 32, max_passage: int = 48):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.max = {"query": max_query, "passage": max_passage}

    def __call__(self, texts: list[str], kind: str, instructions=None) -> dict[str, torch.Tensor]:
        prefix = {"query": "query: ", "passage": "passage: "}[kind]
        enc = self.tok(
            [prefix + t for t in texts], padding=True, truncation=True, max_length=self.max[kind], return_tensors="pt"
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


@pytest.fixture(scope="session")
def tokenize(minilm_path) -> PrefixTokenizer:
    return PrefixTokenizer(minilm_path)
