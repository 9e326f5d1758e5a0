"""Ties and cuts (issue 24 §2): the ranking obliq writes and scores is trec_eval's order (score
descending, then document id descending) decided before the cut at top_k, for every retriever — exact
dense search, BM25, run files and the training callback — so a metric at depth k is the same whether
2, 3 or 1000 documents were retrieved. The right values come from pytrec_eval on the complete ranking
(every document scored), with the same text under several ids."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import pytrec_eval
from support import make_task

from obliq.eval.metrics import evaluate_run
from obliq.search.retrieval import make_retriever
from obliq.search.runs import read_run
from obliq.search.settings import RetrievalSettings
from obliq.tasks import load_task

SAME = "The committee adjourned without a vote on the amended policy."
CORPUS = [  # three copies of one text; the relevant one has the smallest id (last in trec_eval's order)
    ("a1", SAME),
    ("a2", SAME),
    ("a3", SAME),
    ("b", "A witness declined to answer and turned the question back on the committee."),
    ("c", "Recipes for bread with a long cold fermentation."),
    ("d", "The committee voted on the amended policy after a long adjournment."),
]
QUERIES = [("q1", SAME), ("q2", "the committee policy vote")]
QRELS = [("q1", "a1", 1), ("q1", "b", 1), ("q2", "a1", 2), ("q2", "d", 1)]
MEASURES = ["NDCG@1", "NDCG@2", "NDCG@3", "Recall@2", "Recall@3", "P@2"]


@pytest.fixture()
def task(tmp_path):
    return load_task(
        make_task(
            tmp_path / "dup",
            [{"_id": d, "title": "", "text": t} for d, t in CORPUS],
            [{"_id": q, "text": t} for q, t in QUERIES],
            QRELS,
        )
    )


def _reference(task, scores: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """pytrec_eval on the complete ranking (every document with its score): trec_eval orders ties itself."""
    qrels = {q: {d: int(g) for d, g in task.qrels["test"][q].items()} for q in task.qrels["test"]}
    names = {"ndcg_cut_1": "NDCG@1", "ndcg_cut_2": "NDCG@2", "ndcg_cut_3": "NDCG@3"}
    names |= {"recall_2": "Recall@2", "recall_3": "Recall@3", "P_2": "P@2"}
    got = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.1,2,3", "recall.2,3", "P.2"}).evaluate(scores)
    return {q: {names[k]: v for k, v in m.items() if k in names} for q, m in got.items()}


def _check_every_depth(task, retrieve_at, reference):
    for depth in (2, 3, 4, 1000):
        run = retrieve_at(depth).run
        ev = evaluate_run(task.qrels["test"], run, [m for m in MEASURES if int(m.split("@")[1]) <= depth])
        for q, values in ev.per_query.items():
            for name, value in values.items():
                assert value == pytest.approx(reference[q][name], abs=1e-9), (depth, q, name)
        for q, docs in run.items():  # the ranking at this depth is the complete ranking's prefix
            full = sorted(reference_scores[q].items(), key=lambda x: (x[1], x[0]), reverse=True)
            assert list(docs) == [d for d, _ in full[: len(docs)]], (depth, q)


class _Vectors:
    """An encoder in memory (the callback's case): a fixed vector per text, so equal texts tie exactly."""

    def __init__(self, dim: int = 16):
        self.dim, self.cache = dim, {}

    def encode(self, texts, kind="query", batch_size=32, max_length=None):
        out = []
        for t in texts:
            if t not in self.cache:
                self.cache[t] = np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim)
            out.append(self.cache[t])
        return np.asarray(out, dtype=np.float32)


def test_dense_search_cuts_ties_in_trec_order_at_every_depth(task):
    global reference_scores
    encoder = _Vectors()
    docs = encoder.encode(task.doc_texts, "passage").astype(np.float64)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = encoder.encode(task.query_texts, "query").astype(np.float64)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    reference_scores = {  # float64 cosines of every document, rounded to float32 as obliq reports them
        q: {d: float(np.float32(s)) for d, s in zip(task.doc_ids, docs @ v)} for q, v in zip(task.query_ids, queries)
    }
    reference = _reference(task, reference_scores)
    assert reference["q1"]["NDCG@2"] == 0.0 and reference["q1"]["NDCG@3"] > 0  # a3, a2 first; a1 third
    _check_every_depth(task, lambda k: make_retriever(encoder, RetrievalSettings(top_k=k))(task), reference)


def test_bm25_cuts_ties_in_trec_order_at_every_depth(task):
    global reference_scores
    from obliq.search.bm25 import BM25

    index = BM25(task.doc_texts)
    reference_scores = {}
    for q, text in zip(task.query_ids, task.query_texts):
        s = index.scores(index.tokenize([text])[0])
        reference_scores[q] = {d: float(v) for d, v in zip(task.doc_ids, s) if v > 0}
    reference = _reference(task, reference_scores)
    assert reference["q2"]["NDCG@1"] < 1  # the tie group of the three copies decides q2's top
    _check_every_depth(task, lambda k: make_retriever("bm25", RetrievalSettings(top_k=k))(task), reference)


def test_a_real_encoder_on_duplicated_texts(task, minilm_path):
    """The same with all-MiniLM-L6-v2: the three copies get the same vector, and the cut keeps trec_eval's."""
    global reference_scores
    from obliq.search.encoders import load_encoder

    encoder = load_encoder(minilm_path)
    docs = np.asarray(encoder.encode(task.doc_texts, kind="passage"), dtype=np.float64)
    queries = np.asarray(encoder.encode(task.query_texts, kind="query"), dtype=np.float64)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    reference_scores = {
        q: {d: float(np.float32(s)) for d, s in zip(task.doc_ids, docs @ v)} for q, v in zip(task.query_ids, queries)
    }
    assert len({reference_scores["q1"][d] for d in ("a1", "a2", "a3")}) == 1  # an exact tie
    reference = _reference(task, reference_scores)
    _check_every_depth(
        task, lambda k: make_retriever(minilm_path, RetrievalSettings(top_k=k, cache=False))(task), reference
    )


def test_a_run_file_with_ties_in_any_line_order_scores_as_trec_eval(task, tmp_path):
    lines = ["q1 Q0 a1 1 0.9 x", "q1 Q0 b 2 0.9 x", "q1 Q0 a3 3 0.9 x", "q1 Q0 a2 4 0.9 x", "q2 Q0 d 1 0.5 x"]
    rng = np.random.default_rng(0)
    for trial in range(3):
        order = rng.permutation(len(lines))
        path = tmp_path / f"run{trial}.trec"
        path.write_text("\n".join(lines[i] for i in order) + "\n")
        got = make_retriever(str(path))(task).run
        ev = evaluate_run(task.qrels["test"], got, ["NDCG@2", "Recall@2"])
        reference = _reference(task, read_run(path))
        for q, values in ev.per_query.items():
            assert values["NDCG@2"] == pytest.approx(reference[q]["NDCG@2"]), (trial, q)
    assert reference["q1"]["NDCG@2"] > 0  # b (id above a3) is second in trec_eval's order


class _Cosines:
    """An encoder in memory whose vectors give each document a chosen cosine with the query ``Q``."""

    def __init__(self, cosine: dict[str, float]):
        self.cosine = cosine

    def encode(self, texts, kind="query", batch_size=32, max_length=None):
        c = np.array([1.0 if t == "Q" else self.cosine[t] for t in texts])
        return np.stack([c, np.sqrt(1 - c**2)], axis=1).astype(np.float32)


def test_the_training_callback_cuts_ties_as_evaluate_does(tmp_path):
    """The callback goes through the same retriever: three copies of one text straddle rank 10 (the
    relevant copy has the smallest id, so trec_eval ranks it 12th); NDCG@10 is pytrec_eval's on the
    complete ranking at top_k 10, 11 and 1000."""
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from obliq.callbacks import RetrievalEvaluation

    cosine = {f"near {i}": 0.9 - 0.01 * i for i in range(9)} | {"copy": 0.5} | {f"far {i}": 0.1 for i in range(4)}
    corpus = [(f"n{i}", f"near {i}") for i in range(9)] + [("z1", "copy"), ("z2", "copy"), ("z3", "copy")]
    corpus += [(f"f{i}", f"far {i}") for i in range(4)]
    path = make_task(
        tmp_path / "tie10",
        [{"_id": d, "title": "", "text": t} for d, t in corpus],
        [{"_id": "q", "text": "Q"}],
        [("q", "z1", 1), ("q", "n0", 1)],
    )
    encoder = _Cosines(cosine)

    class Module(LightningModule):
        def __init__(self):
            super().__init__()
            self.encoder, self.layer = encoder, torch.nn.Linear(1, 1)

    values = {}
    for k in (10, 11, 1000):
        trainer = Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path / str(k))
        settings = RetrievalSettings(top_k=k)
        callback = RetrievalEvaluation([str(path)], every_n_steps=0, retrieval=settings, measures=["NDCG@10"])
        module = Module()
        callback.setup(trainer, module, "fit")
        values[k] = callback.evaluate(trainer, module)[0]["metrics"]["NDCG@10"]
    task = load_task(path)
    vectors = encoder.encode(task.doc_texts).astype(np.float64)
    scores = {"q": {d: float(np.float32(v @ [1.0, 0.0])) for d, v in zip(task.doc_ids, vectors)}}
    qrels = {"q": {"z1": 1, "n0": 1}}
    expect = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(scores)["q"]["ndcg_cut_10"]
    assert expect == pytest.approx(1 / (1 + 1 / np.log2(3)))  # n0 first; z1 12th, past the cut
    assert values[10] == values[11] == values[1000] == pytest.approx(expect)


def test_before_the_fix_faiss_alone_keeps_an_arbitrary_part_of_a_tie_group():
    """The control: faiss's own top-2 of three equal vectors is not trec_eval's (a3, a2)."""
    import faiss

    x = np.eye(4, dtype=np.float32)[[0, 0, 0, 1]]
    index = faiss.IndexFlatIP(4)
    index.add(x)
    _, got = index.search(x[:1], 2)
    assert sorted(got[0].tolist()) != [1, 2]
    from obliq.search.exact import ExactIndex

    _, ours = ExactIndex(x, ids=["a1", "a2", "a3", "b"]).search(x[:1], 2)
    assert ours[0].tolist() == [2, 1]


def test_reciprocal_rank_fusion_by_hand_with_ties_in_trec_order():
    """fuse_rrf: Σ 1 / (60 + rank) (Cormack et al. 2009) computed by hand; equal fused scores ranked as
    trec_eval ranks them; depth reads only each run's top ranks; a query of one run is fused from it."""
    from obliq.search.runs import fuse_rrf, top_k

    a = {"q": {"d1": 0.9, "d2": 0.8, "d3": 0.7}, "only-a": {"x": 1.0}}
    b = {"q": {"d3": 5.0, "d1": 4.0, "d4": 3.0}}
    fused = fuse_rrf([a, b])
    assert fused["q"] == pytest.approx({"d1": 1 / 61 + 1 / 62, "d2": 1 / 62, "d3": 1 / 61 + 1 / 63, "d4": 1 / 63})
    assert top_k(fused["q"], 4) == ["d1", "d3", "d2", "d4"] and fused["only-a"] == {"x": 1 / 61}
    swapped = fuse_rrf([{"q": {"x": 0.5, "y": 0.4}}, {"q": {"y": 0.9, "x": 0.1}}])["q"]
    assert swapped["x"] == swapped["y"] and top_k(swapped, 2) == ["y", "x"]  # a tie: document id descending
    shallow = fuse_rrf([a, b], depth=1)["q"]
    assert shallow == {"d1": 1 / 61, "d3": 1 / 61} and top_k(shallow, 2) == ["d3", "d1"]
    with pytest.raises(ValueError, match="at least two runs"):
        fuse_rrf([a])
