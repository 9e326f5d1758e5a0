"""Search over a corpus of shards, approximate and quantized indexes, the embedding store.

References are independent of the code under test: numpy float64 brute force (exact search,
truncation), faiss's own IndexFlatIP, numpy Hamming distances, set intersections computed here
(recall), and IVF with every list probed (an exact search by construction)."""

from __future__ import annotations

import hashlib
import json
import mmap

import numpy as np
import pytest

import obliq.search.exact as index_module
from obliq.search.exact import Corpus, ExactIndex, ranked, truncate
from obliq.search.faiss_index import IndexSpec, VectorIndex, recall_vs_exact
from obliq.search.settings import RetrievalSettings
from obliq.search.store import IncompleteStore, Store
from obliq.shards import Shard


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _lowrank(rng, n, d, rank=8, noise=0.3):
    """Clustered vectors (a rank-``rank`` signal plus noise): neighbours are well separated, as in real embeddings."""
    basis = rng.standard_normal((rank, d))
    return _unit(rng.standard_normal((n, rank)) @ basis + noise * rng.standard_normal((n, d)))


def _brute(q, docs, k, dim=None):
    """float64 cosine top-k, ties by row (the vectors here are continuous: no ties)."""
    q, docs = q.astype(np.float64), docs.astype(np.float64)
    if dim is not None:
        q, docs = q[:, :dim], docs[:, :dim]
    q, docs = q / np.linalg.norm(q, axis=1, keepdims=True), docs / np.linalg.norm(docs, axis=1, keepdims=True)
    sims = q @ docs.T
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, top, axis=1), top


def _overlap(found, exact, k):
    """Recall of exact's top-k, computed here by hand."""
    return np.mean([len(set(f[:k]) & set(e[:k])) / k for f, e in zip(found.tolist(), exact.tolist())])


@pytest.fixture()
def sharded(tmp_path):
    """1000 vectors in 3 strided .npy shards (shard i holds rows i, i + 3, …), and 30 queries drawn alike."""
    rng = np.random.default_rng(0)
    both = _lowrank(rng, 1030, 64)
    x, rng_queries = both[:1000], both[1000:]
    np.save(tmp_path / "queries.npy", rng_queries)
    parts = []
    for i in range(3):
        np.save(tmp_path / f"s{i}.npy", x[i::3])
        parts.append((tmp_path / f"s{i}.npy", np.arange(i, 1000, 3)))
    return x, parts, rng


def test_exact_search_over_shards_equals_float64_brute_force_and_faiss_flat(sharded, monkeypatch):
    import faiss

    x, parts, rng = sharded
    monkeypatch.setattr(index_module, "BLOCK_BYTES", 100 * 64 * 4)  # blocks of 100 rows: many merges
    corpus = Corpus(parts)
    q = rng.standard_normal((40, 64)).astype(np.float32)
    scores, idx = ExactIndex(corpus, use_gpu=False).search(q, 25)
    ref_scores, ref_idx = _brute(q, x, 25)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
    flat = faiss.IndexFlatIP(64)
    flat.add(x)
    np.testing.assert_array_equal(idx, flat.search(_unit(q), 25)[1])
    # k beyond the corpus: every document once, no padding
    _, everything = ExactIndex(corpus, use_gpu=False).search(q[:2], 5000)
    assert everything.shape == (2, 1000) and sorted(everything[0].tolist()) == list(range(1000))


def test_blocks_of_a_file_are_memory_mapped_views_not_copies(sharded):
    _, parts, _ = sharded
    block, rows = next(Corpus(parts).blocks())
    base = block
    while getattr(base, "base", None) is not None and not isinstance(base, mmap.mmap):
        base = base.base
    assert isinstance(base, mmap.mmap) and not block.flags.owndata and rows[:3].tolist() == [0, 3, 6]


def test_take_reads_rows_in_chunks_in_any_order_with_repeats(sharded, monkeypatch):
    x, parts, rng = sharded
    monkeypatch.setattr(index_module, "BLOCK_BYTES", 7 * index_module.FAULT_AROUND_BYTES)  # 7 rows a mapping
    rows = rng.integers(0, 1000, size=200)  # unsorted, repeated, every shard
    np.testing.assert_array_equal(Corpus(parts).take(rows), x[rows])
    drawn = np.sort(np.random.default_rng(3).choice(1000, size=50, replace=False))  # the documented draw
    np.testing.assert_array_equal(Corpus(parts).sample(50, seed=3), x[drawn])


def test_truncation_renormalises_and_search_at_a_dimension_equals_brute_force(sharded):
    x, parts, rng = sharded
    q = rng.standard_normal((10, 64)).astype(np.float32)
    t = truncate(x, 16)
    assert t.shape == (1000, 16) and np.abs(np.linalg.norm(t, axis=1) - 1).max() < 1e-6
    scores, idx = ExactIndex(Corpus(parts, dim=16), use_gpu=False).search(q, 10)
    ref_scores, ref_idx = _brute(q, x, 10, dim=16)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
    with pytest.raises(ValueError, match="retrieval.dim 65 must lie in 1 … 64"):
        Corpus(parts, dim=65)
    with pytest.raises(ValueError, match="queries have dimension 16, docs 64"):
        ExactIndex(Corpus(parts, dim=16), use_gpu=False).search(q[:, :16], 10)


def test_recall_vs_exact_by_hand():
    exact = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    found = np.array([[1, 0, 9, -1], [7, 6, 5, 4]])
    r = recall_vs_exact(found, exact, [2, 4])
    assert r == {"Recall@2": pytest.approx((2 / 2 + 0 / 2) / 2), "Recall@4": pytest.approx((2 / 4 + 4 / 4) / 2)}


def test_ranked_puts_padding_last():
    s, i = ranked(np.array([[0.1, -3.4e38, 0.5]]), np.array([[3, -1, 7]]))
    assert i.tolist() == [[7, 3, -1]] and s[0, 2] == -np.inf


@pytest.mark.parametrize(
    "name, extra, floor",
    [
        ("hnsw", {}, 0.95),
        ("hnsw-int8", {}, 0.9),
        ("int8", {}, 0.9),
        ("int8", {"rescore": 4}, 0.999),
        ("ivf-pq", {"rescore": 10}, 0.9),
        ("binary", {"rescore": 20}, 0.8),
        ("BHNSW16", {"rescore": 20}, 0.7),
    ],
)
def test_each_index_finds_what_exact_search_finds(sharded, tmp_path, name, extra, floor):
    x, parts, rng = sharded
    corpus = Corpus(parts, token="v1")
    q = np.load(tmp_path / "queries.npy")  # drawn as the documents were
    _, exact = _brute(q, x, 10)
    spec = IndexSpec(index=name, train_size=1000, nprobe=1000, **extra)
    built = VectorIndex(corpus, spec, folder=tmp_path)
    scores, found = built.search(q, 10)
    assert found.shape == (30, 10) and _overlap(found, exact, 10) >= floor
    assert recall_vs_exact(found, exact, [10])["Recall@10"] == pytest.approx(_overlap(found, exact, 10))
    if extra.get("rescore"):  # rescored scores are the exact cosines of the documents found
        x64 = x.astype(np.float64)
        cos = np.einsum("qd,qkd->qk", _unit(q).astype(np.float64), x64[found])
        np.testing.assert_allclose(scores, cos, atol=1e-5)
    info = built.describe()
    assert info["reused"] is False and info["bytes"] > 0 and info["rescore"] == extra.get("rescore", 0)
    again = VectorIndex(corpus, spec, folder=tmp_path)  # the saved index, memory-mapped
    assert again.describe()["reused"] is True
    np.testing.assert_array_equal(again.search(q, 10)[1], found)


def test_ivf_with_every_list_probed_is_exact(sharded):
    x, parts, rng = sharded
    q = rng.standard_normal((20, 64)).astype(np.float32)
    built = VectorIndex(Corpus(parts), IndexSpec(index="IVF16,Flat", nprobe=16, train_size=1000))
    assert built.describe()["params"] == {"nlist": 16, "nprobe": 16}
    scores, found = built.search(q, 10)
    ref_scores, ref = _brute(q, x, 10)
    np.testing.assert_array_equal(found, ref)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)


def test_ivf_pq_is_trained_without_polysemous_codes(sharded):
    import faiss

    _, parts, _ = sharded
    built = VectorIndex(Corpus(parts), IndexSpec(index="ivf-pq", train_size=1000))
    assert built.describe()["factory"] == "IVF16,PQ4"  # 4·√1000 → 128, capped at 1000 / 39 training vectors
    assert isinstance(built.index, faiss.IndexIVFPQ) and built.index.do_polysemous_training is False


def test_binary_scores_are_hamming_similarities(sharded):
    x, parts, rng = sharded
    q = rng.standard_normal((5, 64)).astype(np.float32)
    scores, found = VectorIndex(Corpus(parts), IndexSpec(index="binary")).search(q, 8)
    bits_q, bits_x = q > 0, x > 0
    hamming = (bits_q[:, None, :] != bits_x[None, :, :]).sum(-1)  # (5, 1000)
    np.testing.assert_allclose(scores, 1 - 2 * np.take_along_axis(hamming, found, axis=1) / 64)
    assert (np.sort(hamming, axis=1)[:, :8] == np.take_along_axis(hamming, found, axis=1)).all()


def test_too_few_results_are_padded_and_a_saved_index_of_other_vectors_is_rebuilt(sharded, tmp_path, caplog):
    x, parts, rng = sharded
    q = rng.standard_normal((5, 64)).astype(np.float32)
    spec = IndexSpec(index="IVF16,Flat", nprobe=1, train_size=1000)
    scores, found = VectorIndex(Corpus(parts, token="a"), spec, folder=tmp_path).search(q, 1000)
    assert (found < 0).any() and np.isneginf(scores[found < 0]).all()
    assert all((row[row >= 0][:, None] != row[row < 0]).all() for row in found)  # padding last
    rebuilt = VectorIndex(Corpus(parts, token="b"), spec, folder=tmp_path)  # new vectors: a new index
    assert rebuilt.describe()["reused"] is False
    [saved] = [
        f
        for f in tmp_path.glob("index-IVF16_Flat-d64-*.faiss")
        if '"corpus": "b"' in f.with_suffix(".json").read_text()
    ]
    saved.write_bytes(b"not an index")
    again = VectorIndex(Corpus(parts, token="b"), spec, folder=tmp_path)
    assert again.describe()["reused"] is False and "unusable saved index" in caplog.text


def test_bad_index_settings_are_refused_with_their_name():
    with pytest.raises(ValueError, match="retrieval.nprobe: must be an integer >= 1"):
        RetrievalSettings(nprobe=0)
    with pytest.raises(ValueError, match="flat search is exact"):
        RetrievalSettings(rescore=2)
    with pytest.raises(ValueError, match="retrieval.dim: must be an integer >= 1 or null"):
        RetrievalSettings(dim=0)
    corpus = Corpus.from_array(np.eye(8, dtype=np.float32))
    with pytest.raises(ValueError, match="faiss cannot build 'Bogus42'"):
        VectorIndex(corpus, IndexSpec(index="Bogus42"))
    with pytest.raises(ValueError, match="multiple of 8"):
        VectorIndex(Corpus.from_array(np.eye(12, dtype=np.float32)), IndexSpec(index="binary"))
    # an HNSW candidate list longer than the corpus only costs time (ef_search 2e9: hour-long searches)
    hnsw = VectorIndex(corpus, IndexSpec(index="hnsw", ef_search=2_000_000_000))
    assert hnsw.describe()["params"]["ef_search"] == 8


# ---------------------------------------------------------------------------------------------- the store

FP = {"model": "m@1", "encoder": "auto", "passage_max_length": 16, "corpus_sha256": "abc", "n_docs": 10}


def _write(folder, x, ids, count, only=None, block=3):
    for i in range(count) if only is None else only:
        shard = Shard(i, count)
        mine = shard.select(range(len(ids)))
        Store(folder, FP).write(
            shard, [ids[p] for p in mine], [x[mine][s : s + block] for s in range(0, len(mine), block)]
        )


def test_a_store_of_strided_shards_reads_back_in_corpus_order(tmp_path):
    rng = np.random.default_rng(3)
    x = _unit(rng.standard_normal((10, 8)))
    ids = [f"d{i}" for i in range(10)]
    _write(tmp_path, x, ids, 3)
    np.testing.assert_allclose(Store(tmp_path, FP).read_vectors(ids), x, atol=1e-7)
    shuffled = ids[::-1]  # the task's order decides the rows, not the shards'
    np.testing.assert_allclose(Store(tmp_path, FP).read_vectors(shuffled), x[::-1], atol=1e-7)
    assert json.loads((tmp_path / "shard-1-of-3.json").read_text())["rows"] == 3
    with pytest.raises(ValueError, match="made otherwise"):
        Store(tmp_path, {**FP, "model": "other"}).open(ids)
    with pytest.raises(ValueError, match="cover 10 documents of 11"):
        Store(tmp_path, FP).open([*ids, "d10"])


def test_more_shards_than_documents_read_back_and_a_damaged_shard_deletes_nothing(tmp_path, caplog):
    """Issue 32 §3: with more shards than documents the empty shard was a 0-byte file (its data under a stray
    name), and the next evaluate deleted every shard and re-encoded. Empty shards read back; a damaged shard of a
    store of several is named, and no other shard's file is deleted."""
    from obliq.search.retrieval import _stored_corpus

    x = _unit(np.random.default_rng(5).standard_normal((2, 8)))
    ids = ["d0", "d1"]
    _write(tmp_path, x, ids, 3)
    assert not list(tmp_path.glob("*.tmp*")) and (tmp_path / "shard-2-of-3.npy").stat().st_size > 0
    np.testing.assert_allclose(Store(tmp_path, FP).read_vectors(ids), x, atol=1e-7)

    class _Task:
        doc_ids = ids

    damaged = tmp_path / "shard-1-of-3.npy"
    damaged.write_bytes(b"\0" * damaged.stat().st_size)  # the same size: only reading it tells
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="a store of 3 shards is unusable"):
        _stored_corpus(Store(tmp_path, FP), _Task())
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing deleted


def test_an_incomplete_or_damaged_store_names_its_shards(tmp_path):
    x = _unit(np.random.default_rng(4).standard_normal((10, 8)))
    ids = [f"d{i}" for i in range(10)]
    _write(tmp_path, x, ids, 4, only=[0, 2])
    with pytest.raises(IncompleteStore, match="2 of 4 shards are not complete") as err:
        Store(tmp_path, FP).open(ids)
    assert err.value.missing == [1, 3] and Store(tmp_path, FP).status()[1] == {1: "not written", 3: "not written"}
    _write(tmp_path, x, ids, 4, only=[1, 3])
    npy = Store(tmp_path, FP).shard_files(Shard(2, 4))[0]
    npy.write_bytes(npy.read_bytes()[:-4])  # cut short
    assert "cut short" in Store(tmp_path, FP).status()[1][2]
    with pytest.raises(ValueError, match="split into 4 shards, not 2"):
        _write(tmp_path, x, ids, 2, only=[0])


class _HashEncoder:
    """An encoder double: a fixed random 16-d vector per text (clustered: texts share a topic word)."""

    def __init__(self):
        rng = np.random.default_rng(7)
        self.topics = {t: rng.standard_normal(16) for t in ("red", "blue", "green", "gold")}

    def encode(self, texts, kind="query", batch_size=32, max_length=None):
        out = []
        for text in texts:
            seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
            noise = np.random.default_rng(seed).standard_normal(16)
            out.append(self.topics[text.split()[0]] + 2.0 * noise)
        return np.array(out, dtype=np.float32)


def test_evaluate_reports_an_approximate_search_with_its_recall_and_drops_padding(tmp_path):
    from support import make_task

    from obliq.eval.results import evaluate_tasks
    from obliq.search.retrieval import make_retriever
    from obliq.tasks import load_task

    topics = ["red", "blue", "green", "gold"]
    docs = [{"_id": f"d{i}", "text": f"{topics[i % 4]} document {i}"} for i in range(400)]
    queries = [{"_id": f"q{i}", "text": f"{topics[i % 4]} query {i}"} for i in range(12)]
    task = load_task(make_task(tmp_path / "t", docs, queries, [(f"q{i}", f"d{i}", 1) for i in range(12)]))
    encoder = _HashEncoder()
    exact = make_retriever(encoder, RetrievalSettings(top_k=100))(task)
    approx = make_retriever(encoder, RetrievalSettings(top_k=100, index="IVF16,Flat", nprobe=1, train_size=400))(task)
    assert exact.index["exact"] is True and "recall_vs_exact" not in exact.index
    by_hand = np.mean([len(set(list(approx.run[q])[:10]) & set(list(exact.run[q])[:10])) / 10 for q in task.query_ids])
    recall = approx.index["recall_vs_exact"]
    assert recall["Recall@10"] == pytest.approx(by_hand) and recall["n_queries"] == 12 and recall["Recall@100"] < 1
    assert any(len(approx.run[q]) < 100 for q in task.query_ids)  # 1 of 16 lists probed: fewer than 100 found
    assert all(set(approx.run[q]) <= set(task.doc_ids) for q in task.query_ids)
    for q in task.query_ids:  # what it found scores as exact search scores it (IVF-Flat keeps the vectors)
        assert all(
            approx.run[q][d] == pytest.approx(exact.run[q].get(d, approx.run[q][d]), abs=1e-5) for d in approx.run[q]
        )
    [summary] = evaluate_tasks(lambda t: approx, [task], tmp_path / "out", "double", ["NDCG@10", "Recall@100"])
    assert summary["index"]["factory"] == "IVF16,Flat" and summary["index"]["params"] == {"nlist": 16, "nprobe": 1}
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| t | IVF16,Flat | IVF16,Flat | 16 | nlist 16, nprobe 1 | – |" in table and "Recall@10 vs exact" in table


def test_c42_an_index_faiss_cannot_train_on_the_corpus_is_refused_before_encoding(tmp_path):
    """shared/cases/C42 (faiss #237, #2513): on 60 vectors faiss itself cannot train IVF64,Flat nor
    IVF1,PQ24 (256 centroids per sub-quantizer) and can train IVF1,PQ24x4. obliq refuses the first two in
    one line naming the setting and the size before encoding anything; the ivf-pq preset uses fewer bits
    and says so in the results."""
    import faiss
    from support import make_task

    from obliq.search.faiss_index import factory_string
    from obliq.search.retrieval import make_retriever
    from obliq.tasks import load_task

    x = _lowrank(np.random.default_rng(3), 60, 384)
    for factory, trains in (("IVF64,Flat", False), ("IVF1,PQ24", False), ("IVF1,PQ24x4", True)):  # faiss's word
        index = faiss.index_factory(384, factory, faiss.METRIC_INNER_PRODUCT)
        if trains:
            index.train(x)
        else:
            with pytest.raises(RuntimeError):
                index.train(x)
        if trains:
            assert factory_string(IndexSpec(index=factory), 60, 384) == (factory, None)
        else:
            with pytest.raises(ValueError, match=rf"retrieval.index '{factory}'.*the corpus gives 60 \(60 documents"):
                factory_string(IndexSpec(index=factory), 60, 384)
    built = VectorIndex(Corpus.from_array(x), IndexSpec(index="ivf-pq"))
    assert built.describe()["factory"] == "IVF1,PQ24x5" and "5-bit codes" in built.describe()["adjusted"]
    assert factory_string(IndexSpec(index="ivf-pq"), 20000, 384) == ("IVF512,PQ24", None)  # untouched when it trains

    topics = ["red", "blue", "green", "gold"]
    docs = [{"_id": f"d{i}", "text": f"{topics[i % 4]} document {i}"} for i in range(60)]
    queries = [{"_id": f"q{i}", "text": f"{topics[i % 4]} query {i}"} for i in range(4)]
    task = load_task(make_task(tmp_path / "t", docs, queries, [(f"q{i}", f"d{i}", 1) for i in range(4)]))
    encoder, calls = _HashEncoder(), []
    encode = encoder.encode
    encoder.encode = lambda texts, *a, **k: calls.append(len(texts)) or encode(texts, *a, **k)
    with pytest.raises(ValueError, match="64 inverted lists need at least 64 training vectors"):
        make_retriever(encoder, RetrievalSettings(index="IVF64,Flat", cache=False))(task)
    assert calls == []  # refused before the corpus was encoded


def test_the_store_fingerprint_covers_what_is_loaded_behind_a_name(tmp_path, monkeypatch):
    """Issue 32's kept-back kind (b): a store found by a model's name must not survive a change of the model
    behind it. A weight file rewritten in place to the same size and mtime, an adapter's local base edited in
    place, and a hub id whose cached revision moved (huggingface_hub's own resolution of refs/main) each give
    another fingerprint, so another store."""
    import os
    import time

    from obliq.search.encoders import fingerprint

    model = tmp_path / "base"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"A" * 64)
    before = fingerprint(str(model))
    st = weights.stat()
    time.sleep(0.01)
    weights.write_bytes(b"B" * 64)  # same size
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
    assert fingerprint(str(model)) != before

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(model)}))
    (adapter / "adapter_model.safetensors").write_bytes(b"L" * 8)
    with_base = fingerprint(str(adapter))
    assert fingerprint(str(model)) in with_base
    (model / "config.json").write_text("{}")  # the base edited in place
    assert fingerprint(str(adapter)) != with_base

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    repo = cache / "models--owner--name"
    for commit in ("a" * 40, "b" * 40):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text(commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    first = fingerprint("owner/name")
    assert "a" * 40 in first
    (repo / "refs" / "main").write_text("b" * 40)  # the revision behind the name moved
    assert "b" * 40 in fingerprint("owner/name") and fingerprint("owner/name") != first
    assert fingerprint("owner/not-cached") == "owner/not-cached"


def test_a_store_checks_its_rows_and_an_index_is_never_reused_over_other_vectors(tmp_path):
    """Issue 32 §3: rows edited in place (a NaN), ids in another order, and a saved index copied from another
    store of the same settings were searched as valid (NDCG@10 0.92 → 0.14). A shard is checked against the
    checksum written with it whenever its files changed; a copied store is read once and accepted; an index
    is keyed by the rows' checksums."""
    import shutil

    rng = np.random.default_rng(6)
    ids = [f"d{i}" for i in range(40)]
    a, b = _unit(rng.standard_normal((40, 16))), _unit(rng.standard_normal((40, 16)))
    A, B = tmp_path / "one" / "store", tmp_path / "two" / "store"  # one name: the index key differs by the rows only
    _write(A, a, ids, 2)
    _write(B, b, ids, 2)
    np.testing.assert_allclose(Store(A, FP).read_vectors(ids), a, atol=1e-7)
    shutil.copytree(A, tmp_path / "copy")  # new files (inodes, times): read once, same checksum
    np.testing.assert_allclose(Store(tmp_path / "copy", FP).read_vectors(ids), a, atol=1e-7)

    spec = IndexSpec(index="IVF2,Flat", nprobe=2, train_size=40)
    VectorIndex(Store(A, FP).open(ids), spec, folder=A)
    for f in (A).glob("index-*"):
        shutil.copy(f, B / f.name)  # another store's index, same settings
    index = VectorIndex(Store(B, FP).open(ids), spec, folder=B)
    assert index.describe()["reused"] is False
    _, found = index.search(b[:5], 1)
    assert found[:, 0].tolist() == [0, 1, 2, 3, 4]  # b's own vectors, not a's

    edited = tmp_path / "copy" / "shard-0-of-2.npy"
    x = np.load(edited)
    x[3] = np.nan
    np.save(edited, x)
    with pytest.raises(ValueError, match=r"shard-0-of-2.npy: row 3 is not a finite unit vector"):
        Store(tmp_path / "copy", FP).open(ids)
    ids_file = B / "shard-1-of-2.ids"
    lines = ids_file.read_text().splitlines()
    ids_file.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")  # two rows' ids swapped
    with pytest.raises(ValueError, match=r"shard-1-of-2.npy: its rows or ids are not the ones written"):
        Store(B, FP).open(ids)


def test_an_index_file_of_another_store_under_this_ones_name_is_rebuilt(tmp_path, caplog):
    """The clean-clone pass: another store's index file copied over this store's index (same name) was
    reused ("reused": true, NDCG@10 of the other corpus). Its record now holds the file's checksum."""
    import logging
    import shutil

    rng = np.random.default_rng(8)
    ids = [f"d{i}" for i in range(60)]
    a, b = _unit(rng.standard_normal((60, 16))), _unit(rng.standard_normal((60, 16)))
    A, B = tmp_path / "one" / "store", tmp_path / "two" / "store"
    _write(A, a, ids, 1)
    _write(B, b, ids, 1)
    spec = IndexSpec(index="hnsw")
    theirs = VectorIndex(Store(A, FP).open(ids), spec, folder=A)
    own = VectorIndex(Store(B, FP).open(ids), spec, folder=B)
    shutil.copy(theirs.path, own.path)  # over this store's own file name
    with caplog.at_level(logging.WARNING):
        again = VectorIndex(Store(B, FP).open(ids), spec, folder=B)
    assert again.describe()["reused"] is False and "checksum differs" in caplog.text
    assert again.search(b[:5], 1)[1][:, 0].tolist() == [0, 1, 2, 3, 4]
