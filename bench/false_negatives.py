"""How many mined hard negatives are really positives: the false-negative rate of each mining method,
measured with real queries whose relevant documents are known.

    python bench/false_negatives.py [--data ../shared/data/tasks] [--tasks stance-tweets math-theoremqa \\
        writing-news hearings-exchanges] [--k 4] [--model minilm] [--max_length N] \\
        [--out runs/bench/false-negatives.json]

Per task, the development side of its query split (:func:`obliq.tasks.split_queries`, half the queries,
seed 0, query groups kept whole: the queries a recipe may tune on, never the test side) gives one
training row per query, as a synthetic query would: the query and its first relevant document (by id)
as the positive. Negatives are mined for these rows by each method (:mod:`obliq.negatives.mine`), and a
negative is a false negative when the development qrels judge it relevant to the row's query (the
row's other relevant documents). Methods:

- ``bm25``: obliq's BM25, top k;
- ``bm25 + 95%``: positive-aware filtering on BM25 scores (drop candidates above 95% of the positive's);
- ``dense``: ``--model`` (all-MiniLM-L6-v2 by default, reading the evaluation's lengths or ``--max_length``
  tokens), top k by cosine;
- ``dense + 95%``: positive-aware filtering (NV-Retriever's TopK-PercPos, 95%);
- ``dense + 95% + teacher veto``: also rule out the positive's 10 nearest neighbours in the stylometric
  teacher's space;
- ``dense + 95% + attribute veto``: also rule out documents with the positive's attribute
  (``attributes.tsv``; on these tasks the attribute is the relevance label itself, except
  hearings-exchanges, whose attribute is the witness's response type);
- ``teacher``: the stylometric teacher as the mining model, top k.

Prints one markdown table (false-negative rate = relevant negatives / negatives, with the counts) and
writes the JSON. A benchmark prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from obliq.eval.results import made_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("OBLIQ_DATA", REPO.parent / "shared" / "data")) / "tasks"
TASKS = ("stance-tweets", "math-theoremqa", "writing-news", "hearings-exchanges")


def dev_rows(task) -> tuple[list[dict], dict]:
    """One row per development query (its first relevant document as the positive) and the dev qrels."""
    from obliq.tasks import split_queries

    dev, _ = split_queries(task, 0.5, seed=0)
    text = dict(zip(dev.doc_ids, dev.doc_texts))
    gold = dev.qrels["test"]
    rows = []
    for q, query in zip(dev.query_ids, dev.query_texts):
        relevant = sorted(d for d, g in gold.get(q, {}).items() if g > 0 and d in text)
        if relevant:
            rows.append(
                {
                    "id": q,
                    "task": task.name,
                    "source": "public",
                    "query": query,
                    "positive": {"id": relevant[0], "text": text[relevant[0]]},
                    "negatives": [],
                }
            )
    return rows, gold


def measure(folder: Path, k: int, model: str, max_length: int | None = None) -> dict:
    """Every method on one task: its false-negative counts and rate."""
    from obliq.files import read_id_table
    from obliq.negatives.mine import AttributeVeto, Bm25sBackend, DenseBackend, TeacherVeto, mine_negatives
    from obliq.tasks import load_task

    task = load_task(folder)
    rows, gold = dev_rows(task)
    engines = {"bm25": Bm25sBackend(task.doc_texts)}
    t0 = time.perf_counter()
    engines["dense"] = DenseBackend(task.doc_texts, model, query_max_length=max_length, passage_max_length=max_length)
    engines["teacher"] = DenseBackend(task.doc_texts, "stylometric")
    encode_s = time.perf_counter() - t0
    teacher_veto = TeacherVeto(task.doc_texts, "stylometric", 10)
    attributes = folder / "attributes.tsv"
    attribute_veto = AttributeVeto(read_id_table(attributes), task.doc_ids) if attributes.is_file() else None
    methods = {
        "bm25": ("bm25", None, None),
        "bm25 + 95%": ("bm25", 0.95, None),
        "dense": ("dense", None, None),
        "dense + 95%": ("dense", 0.95, None),
        "dense + 95% + teacher veto": ("dense", 0.95, teacher_veto),
        **({"dense + 95% + attribute veto": ("dense", 0.95, attribute_veto)} if attribute_veto else {}),
        "teacher": ("teacher", None, None),
    }
    out = {
        "task": task.name,
        "rows": len(rows),
        "docs": len(task.doc_ids),
        "encode_s": round(encode_s, 1),
        # relevant documents besides each row's positive: with none (one relevant per query) no negative can
        # be seen to be a false negative, and a rate of 0 would be a claim the qrels cannot make
        "other_relevant": sum(sum(g > 0 for g in gold.get(r["id"], {}).values()) - 1 for r in rows),
        "methods": {},
    }
    for name, (engine, ratio, veto) in methods.items():
        mined, report = mine_negatives(
            rows, task.doc_ids, task.doc_texts, engines[engine], k=k, max_score_ratio=ratio, veto=veto
        )
        negatives = [(r["id"], n["id"]) for r in mined for n in r["negatives"]]
        false = sum(gold.get(q, {}).get(d, 0) > 0 for q, d in negatives)
        out["methods"][name] = {
            "negatives": len(negatives),
            "false_negatives": false,
            "rate": false / len(negatives) if negatives and out["other_relevant"] else None,
            "short_rows": report.short_rows,
            "dropped": report.dropped,
        }
    return out


def table(results: list[dict]) -> str:
    methods = list(dict.fromkeys(m for r in results for m in r["methods"]))
    lines = [
        "False-negative rate of mined hard negatives on development queries (relevant negatives / "
        "negatives; k per row, one row per query)",
        "",
        "| method | " + " | ".join(f"{r['task']} (n={r['rows']})" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for m in methods:
        cells = []
        for r in results:
            x = r["methods"].get(m)
            if x is not None and not r["other_relevant"]:
                cells.append("n/a (1 relevant per query)")
            elif x is None or x["rate"] is None:
                cells.append("–")
            else:
                cells.append(f"{100 * x['rate']:.1f}% ({x['false_negatives']}/{x['negatives']})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--model", default="minilm")
    parser.add_argument(
        "--max_length", type=int, help="query and passage tokens the dense model reads (default: the evaluation's)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench/false-negatives.json"))
    args = parser.parse_args()
    results = [measure(args.data / t, args.k, args.model, args.max_length) for t in args.tasks]
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    print(made_with(), file=sys.stderr)  # what the figures were made with (stdout may be parsed)
    main()
