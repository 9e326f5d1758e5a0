"""Issue 49 §3, inputs checked against what made them: a file derived from a corpus or a model carries the
identity of what it was derived from, and is refused, by a one-line message naming the file and the field,
when that no longer holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from obliq.data.rows import Doc, TrainingRow
from obliq.data.teacher_table import TeacherTable, write_teacher_table
from obliq.search.runs import check_run_corpus, read_run, run_record, write_run
from obliq.tasks import load_task
from obliq.text import text_hash


def _row(anchor: str, query: str, doc: str, text: str) -> TrainingRow:
    positive = Doc(doc, text, text_hash(text))
    return TrainingRow(f"knn:{anchor}:{doc}", "t", "knn", query, positive, (), meta={"anchor_id": anchor})


def test_teacher_vectors_of_another_version_of_the_corpus_are_refused(tmp_path):
    """(1) `distill graph --vectors_out` records each encoded text's hash: rows with the same ids and other
    texts (a rebuilt corpus) are refused before training instead of getting a wrong relational term."""
    write_teacher_table(
        tmp_path / "t.npz", ["a", "b"], np.eye(2, dtype=np.float32), ["Alpha text.", "Beta text."], "f" * 64
    )
    table = TeacherTable(tmp_path / "t.npz")
    assert table.corpus_sha256 == "f" * 64
    table.check_covers([_row("a", "alpha  TEXT", "b", "beta text")])  # the same text (normalise_text)
    with pytest.raises(ValueError, match=r"t\.npz: field text_hashes: document 'b' \(row 'knn:a:b'\) has another"):
        table.check_covers([_row("a", "Alpha text.", "b", "Beta text, revised.")])
    with pytest.raises(ValueError, match="field text_hashes: document 'a'"):
        table.check_covers([_row("a", "Alpha, second edition.", "b", "Beta text.")])

    from support import write_rows

    from obliq.data import TrainingDataModule

    row = {"id": "knn:a:b", "task": "t", "source": "knn", "query": "Alpha text.", "negatives": []}
    write_rows(
        tmp_path / "knn.jsonl", [row | {"positive": {"id": "b", "text": "Beta, revised."}, "meta": {"anchor_id": "a"}}]
    )
    data = TrainingDataModule(
        sources=[{"path": str(tmp_path / "knn.jsonl")}],
        batch_size=1,
        index_dir=str(tmp_path / "index"),
        teacher_vectors=str(tmp_path / "t.npz"),
    )
    with pytest.raises(ValueError, match=r"t\.npz: field text_hashes: document 'b'"):
        data.setup("fit")  # before the first step


def test_distill_graph_records_what_its_vectors_encode(tmp_path, tasks_dir):
    """(1) end to end: the vectors `obliq distill graph` writes hold the corpus digest and each text's hash."""
    from support import task_slice

    from obliq.cli import main as obliq_main

    task_dir = task_slice(tasks_dir, "writing-news", tmp_path / "news", 2, 10)
    obliq_main(["distill", "graph", "--task", str(task_dir), "--k", "2", "--out", str(tmp_path / "g.json"),
                "--vectors_out", str(tmp_path / "t.npz")])  # fmt: skip
    task, table = load_task(task_dir), TeacherTable(tmp_path / "t.npz")
    assert table.corpus_sha256 == task.corpus_sha256
    assert table.text_hashes.tolist() == [text_hash(t) for t in task.doc_texts]


def _task(tmp_path: Path, tasks_dir: Path) -> Path:
    folder = tmp_path / "task"
    shutil.copytree(tasks_dir / "stance-tweets", folder)
    return folder


def test_a_run_of_another_corpus_is_refused(tmp_path, tasks_dir):
    """(2) a run obliq writes records the corpus it was retrieved from; scored on a corpus that lost
    documents (or changed), it is refused; a foreign run (no record) is refused when it names documents the
    corpus lacks; a run edited since its record was written is refused until the record is removed."""
    folder = _task(tmp_path, tasks_dir)
    task = load_task(folder)
    run = {q: {d: 1.0 / (1 + n) for n, d in enumerate(task.doc_ids[:5])} for q in task.query_ids}
    write_run(tmp_path / "run.trec", run, tag="m", task=task)
    record = json.loads(run_record(tmp_path / "run.trec").read_text())
    assert record["corpus_sha256"] == task.corpus_sha256 and record["n_docs"] == len(task.doc_ids)
    check_run_corpus(tmp_path / "run.trec", read_run(tmp_path / "run.trec"), task)  # its own corpus: scored

    lines = (folder / "corpus.jsonl").read_text().splitlines()
    (folder / "corpus.jsonl").write_text("\n".join(lines[1:]) + "\n")  # the corpus lost its first document
    smaller = load_task(folder)
    with pytest.raises(ValueError, match=r"run\.trec\.json: field corpus_sha256: run\.trec was retrieved from another"):
        check_run_corpus(tmp_path / "run.trec", read_run(tmp_path / "run.trec"), smaller)
    write_run(tmp_path / "foreign.trec", run)  # no record: a TREC file from elsewhere
    assert not run_record(tmp_path / "foreign.trec").exists()
    with pytest.raises(ValueError, match=rf"foreign\.trec: field docid: 1 documents .* \(e\.g\. {task.doc_ids[0]!r}\)"):
        check_run_corpus(tmp_path / "foreign.trec", read_run(tmp_path / "foreign.trec"), smaller)
    with (tmp_path / "run.trec").open("a") as f:
        f.write(f"{task.query_ids[0]} Q0 {task.doc_ids[9]} 6 0.01 m\n")
    with pytest.raises(ValueError, match=r"run\.trec\.json: field run_sha256: run\.trec was changed"):
        check_run_corpus(tmp_path / "run.trec", read_run(tmp_path / "run.trec"), task)


def test_an_adapters_relative_base_is_read_from_the_adapters_folder(tmp_path, monkeypatch, tiny_llama_dir, minilm_path):
    """(3) a base given as a relative path is recorded relative to the adapter's folder and read from there,
    whatever the current folder holds under that name; an adapter whose relative base exists only from the
    current folder (written relative to some other folder) is refused as ambiguous."""
    from support import lora_encoder

    from obliq.model import BiEncoder
    from obliq.model.adapter import adapter_base

    (tmp_path / "train" / "models").mkdir(parents=True)
    (tmp_path / "train" / "models" / "base").symlink_to(tiny_llama_dir)
    monkeypatch.chdir(tmp_path / "train")
    lora_encoder("models/base").save_pretrained(tmp_path / "train" / "out" / "adapter")
    adapter = tmp_path / "train" / "out" / "adapter"
    assert json.loads((adapter / "obliq_encoder.json").read_text())["backbone"] == "../../models/base"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "../../models/base"

    (tmp_path / "elsewhere" / "models").mkdir(parents=True)  # another model under the same relative name
    (tmp_path / "elsewhere" / "models" / "base").symlink_to(minilm_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert Path(adapter_base(adapter)).resolve() == Path(tiny_llama_dir).resolve()
    assert Path(BiEncoder.from_pretrained(adapter).name_or_path).resolve() == Path(tiny_llama_dir).resolve()

    for name, field in (("obliq_encoder.json", "backbone"), ("adapter_config.json", "base_model_name_or_path")):
        saved = json.loads((adapter / name).read_text())
        (adapter / name).write_text(json.dumps(saved | {field: "models/base"}))  # relative to the training folder
    with pytest.raises(ValueError, match=r"obliq_encoder\.json: field backbone: the relative path 'models/base' is"):
        BiEncoder.from_pretrained(adapter)
    with pytest.raises(ValueError, match=r"adapter_config\.json: field base_model_name_or_path: .* ambiguous"):
        adapter_base(adapter)


def test_a_model_folder_without_its_vocabulary_is_refused(tmp_path, minilm_path):
    """(4) config.json and weights without the tokenizer files: transformers loads a BERT tokenizer of 5
    special tokens that reads every word as [UNK]; refused, not encoded and scored."""
    from obliq.model import BiEncoder
    from obliq.search.encoders import SentenceTransformerEncoder

    folder = tmp_path / "no-vocab"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(minilm_path) / name, folder / name)
    with pytest.raises(ValueError, match=r"no-vocab: field tokenizer: every word of a probe sentence is the unknown"):
        BiEncoder(str(folder))
    with pytest.raises(ValueError, match=r"no-vocab: field tokenizer: .*a vocabulary of 5 tokens"):
        SentenceTransformerEncoder(str(folder))
