"""Issue 49 §5, unclear errors and unbounded resources: each refused through ``obliq`` in one ``error:`` line
(exit 2) naming the file (and line or field where there is one) — a config or recipe that is not YAML,
qrels or runs not in UTF-8, damaged weight files, a hub id typo offline, a path of the wrong kind as a
model, a failed write — and the bounds: a line or a config of absurd size, and an embedding cache that a
re-export of the same weights does not grow, listed and pruned by ``obliq cache``.

Damaged weights, a wrong kind of model and a hub id typo are refused by :func:`obliq.aliases.check_model`,
which :func:`obliq.search.encoders.load_encoder` calls before anything loads."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from support import cli_fails as _fails
from support import make_task

from obliq.cli import main as obliq_main
from obliq.files import MAX_LINE, publish, read_text, write_text
from obliq.write_errors import WriteError
from obliq.yaml_checks import MAX_YAML_SIZE

COMMON = ["--retrieval.top_k", "5", "--measures", "[NDCG@5]", "--latency_queries", "0"]


@pytest.fixture()
def task(tmp_path) -> Path:
    docs = [{"_id": f"d{i}", "title": "", "text": f"text number {i} about apples and pears"} for i in range(10)]
    return make_task(tmp_path / "t", docs, [{"_id": "q1", "text": "apples"}], [("q1", "d1", 1)])


def _evaluate(model, task, tmp_path, name="o") -> list[str]:
    return ["evaluate", "--model", str(model), "--tasks", str(task), "--output", str(tmp_path / name), *COMMON]


# --- (1) a config or recipe that is not YAML ----------------------------------------------------------


@pytest.mark.parametrize("command", [["evaluate"], ["train", "fit"]])
def test_a_config_that_is_not_yaml_is_named_in_one_line(tmp_path, capsys, command):
    cases = {
        "binary.yaml": (b"\x7fELF\x02\x01\x01\x00\x00\x00\xf0\x9f" * 20, ["binary.yaml", "a binary file"]),
        "list.yaml": (b"[1, 2]\n", ["list.yaml", "a YAML mapping of settings", "not a list"]),
        "tab.yaml": (b"model: bm25\ntasks:\n\t- t\n", ["tab.yaml:3", "not valid YAML", "tabs"]),
        "latin1.yaml": ("model: bm25\nnote: café\n".encode("latin-1"), ["latin1.yaml:2", "not UTF-8", "0xe9"]),
        "empty.yaml": (b"# nothing\n", ["empty.yaml", "not an empty file"]),
    }
    for name, (data, needles) in cases.items():
        (tmp_path / name).write_bytes(data)
        _fails([*command, "--config", str(tmp_path / name)], capsys, *needles)


def test_a_recipe_that_is_not_yaml_is_named_in_one_line(tmp_path, capsys):
    (tmp_path / "r.yaml").write_text("work_dir: x\ntrainer:\n\tmax_steps: 1\n")
    _fails(["quickstart", "--recipe", str(tmp_path / "r.yaml")], capsys, "r.yaml:3", "not valid YAML")


# --- (2) qrels or runs not in UTF-8 ---------------------------------------------------------------------


def test_qrels_or_a_run_not_in_utf8_name_the_file_and_line(tmp_path, capsys):
    qrels, run = tmp_path / "q.tsv", tmp_path / "r.trec"
    qrels.write_text("q1\td1\t1\n")
    run.write_text("q1 Q0 d1 1 2.0 x\n")
    latin = tmp_path / "latin.tsv"
    latin.write_bytes("q1\td1\t1\nq2\tcaf\xe9\t1\n".encode("latin-1"))
    _fails(["metrics", "--qrels", str(latin), "--run", str(run)], capsys, "latin.tsv:2", "not UTF-8", "0xe9")
    bad_run = tmp_path / "latin.trec"
    bad_run.write_bytes("q1 Q0 d1 1 2.0 x\nq1 Q0 d\xe9 2 1.0 x\n".encode("latin-1"))
    _fails(["metrics", "--qrels", str(qrels), "--run", str(bad_run)], capsys, "latin.trec:2", "not UTF-8")


# --- (3) damaged weight files, (5) a path of the wrong kind, (4) a hub id typo offline --------------------
# (obliq.aliases.check_model, called by obliq.search.encoders.load_encoder before anything loads)


def _safetensors(path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((64, 64), dtype=np.float32)}, str(path))


def test_empty_or_cut_weight_files_are_named_before_anything_loads(task, tmp_path, capsys):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    weights = model / "model.safetensors"
    weights.write_bytes(b"")
    _fails(_evaluate(model, task, tmp_path, "o1"), capsys, str(weights), "empty weight file (0 bytes)")
    _safetensors(weights)
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    _fails(_evaluate(model, task, tmp_path, "o2"), capsys, str(weights), "cut short", f"{len(whole):,}")
    weights.write_bytes(b"\xff" * 8 + whole[8:])
    _fails(_evaluate(model, task, tmp_path, "o3"), capsys, str(weights), "cut short")
    weights.unlink()
    (model / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # a zip archive cut short
    _fails(_evaluate(model, task, tmp_path, "o4"), capsys, "pytorch_model.bin", "cut short")


def test_a_file_or_a_folder_without_a_model_is_refused_as_a_model(task, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}\n')
    _fails(_evaluate(rows, task, tmp_path, "o1"), capsys, "rows.jsonl", "a file, not a model")
    (tmp_path / "x.ckpt").write_bytes(b"PK")
    _fails(_evaluate(tmp_path / "x.ckpt", task, tmp_path, "o2"), capsys, "x.ckpt", "obliq export")
    empty = tmp_path / "export"
    (empty / "adapter").mkdir(parents=True)
    (empty / "adapter" / "adapter_config.json").write_text("{}")
    _fails(_evaluate(empty, task, tmp_path, "o3"), capsys, str(empty), "no model in it", "'adapter' holds one")


def test_a_hub_id_typo_offline_says_not_in_the_local_cache(task, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _fails(
        _evaluate("sentence-transformers/all-MiniLM-L6-v3", task, tmp_path),
        capsys,
        "sentence-transformers/all-MiniLM-L6-v3",
        "not in the local cache (offline",
        "did you mean 'sentence-transformers/all-MiniLM-L6-v2'",
    )
    assert "huggingface.co" not in line


# --- (6) a failed write ---------------------------------------------------------------------------------


def test_a_full_disk_or_a_read_only_folder_names_the_file_not_written(task, tmp_path, capsys, monkeypatch):
    replace, mkstemp = os.replace, tempfile.mkstemp

    def full(src, dst, *a, **k):
        if str(dst).endswith("summary.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", full)
    _fails(
        _evaluate("bm25", task, tmp_path, "o1"),
        capsys,
        str(tmp_path / "o1" / "t" / "summary.json"),
        "could not be written (no space left on the device)",
    )
    monkeypatch.setattr(os, "replace", replace)

    def read_only(*a, dir=None, prefix="", **k):
        if prefix.startswith(".summary.json"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return mkstemp(*a, dir=dir, prefix=prefix, **k)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    _fails(
        _evaluate("bm25", task, tmp_path, "o2"),
        capsys,
        str(tmp_path / "o2" / "t" / "summary.json"),
        "(a read-only file system)",
    )


def test_publish_names_the_file_and_leaves_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    write_text(target, "old")
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EDQUOT, "Disk quota exceeded")))
    with pytest.raises(WriteError, match=r"a\.txt: could not be written \(the disk quota is used up\)") as err:
        write_text(target, "new")
    assert err.value.errno == errno.EDQUOT and isinstance(err.value, OSError)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(WriteError, match=r"b\.txt: could not be written \(no space left"):  # the inner file's
        with publish(target):
            with publish(tmp_path / "b.txt"):
                raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(FileNotFoundError):  # an input that is missing inside the block is not a failed write
        with publish(target):
            read_text(tmp_path / "missing.txt")
    assert read_text(target) == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    if os.geteuid() != 0:  # root writes into a read-only folder all the same
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(WriteError, match=r"locked/x\.txt: could not be written \(no permission"):
            write_text(locked / "x.txt", "x")


# --- (7) bounds on what is read -------------------------------------------------------------------------


def test_a_line_or_a_config_of_absurd_size_is_refused_before_it_is_read_whole(tmp_path, capsys):
    run = tmp_path / "r.trec"
    run.write_text("q1 Q0 d1 1 2.0 x\n")
    qrels = tmp_path / "q.tsv"
    with qrels.open("w") as f:
        f.write("q1\td1\t1\n")
        f.write("q1\t" + "d" * MAX_LINE + "\t1\n")
    _fails(["metrics", "--qrels", str(qrels), "--run", str(run)], capsys, "q.tsv:2", f"more than {MAX_LINE:,}")
    ok = tmp_path / "ok.tsv"
    ok.write_text("q1\td1\t1\n")
    big = tmp_path / "big.yaml"
    big.write_text("model: bm25\n" + "# padding\n" * (MAX_YAML_SIZE // 10 + 1))
    _fails(["evaluate", "--config", str(big)], capsys, "big.yaml", f"more than the {MAX_YAML_SIZE:,}")
    assert obliq_main(["metrics", "--qrels", str(ok), "--run", str(run), "--measures", "P@1"])["n_queries"] == 1


# --- (8) the embedding cache: keyed by an export's weights digest, listed and pruned ---------------------


def _export(folder: Path, weights: bytes) -> Path:
    """What ``obliq export`` leaves: the model's files, then its record, then the card."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "obliq_export.json").write_text(json.dumps({"weights_sha256": hashlib.sha256(weights).hexdigest()}))
    (folder / "README.md").write_text("card")
    return folder


def test_a_reexport_of_the_same_weights_finds_the_same_store(task, tmp_path):
    from obliq.search.encoders import fingerprint
    from obliq.search.settings import RetrievalSettings
    from obliq.search.store import Store
    from obliq.tasks import load_task

    settings, loaded = RetrievalSettings(cache_dir=tmp_path / "stores"), load_task(task)
    model = _export(tmp_path / "exp" / "merged", b"W" * 64)
    first, files = Store.of(str(model), settings, loaded), fingerprint(str(model))
    time.sleep(0.01)
    _export(model, b"W" * 64)  # exported again: new files, new times, the same weights
    assert fingerprint(str(model)) != files  # the files' own fingerprint moved: a store each time before
    assert Store.of(str(model), settings, loaded).folder == first.folder
    assert Store.of(str(model), settings, loaded).model == str(model.resolve())
    _export(model, b"V" * 64)  # other weights
    assert Store.of(str(model), settings, loaded).folder != first.folder
    _export(model, b"W" * 64)
    time.sleep(0.01)
    (model / "model.safetensors").write_bytes(b"X" * 64)  # edited in place after the export: its files decide
    assert Store.of(str(model), settings, loaded).folder != first.folder
    other = _export(tmp_path / "exp" / "adapter", b"W" * 64)  # the same record, other files: another store
    (other / "config.json").write_text('{"model_type": "bert", "x": 1}')
    (other / "obliq_export.json").write_text((other / "obliq_export.json").read_text())
    assert Store.of(str(other), settings, loaded).folder != first.folder


def test_obliq_cache_lists_and_prunes_stores(task, tmp_path, capsys):
    from obliq.search.settings import RetrievalSettings
    from obliq.search.store import Store
    from obliq.shards import Shard
    from obliq.tasks import load_task

    root = tmp_path / "stores"
    settings, loaded = RetrievalSettings(cache_dir=root), load_task(task)
    a, b = _export(tmp_path / "a", b"A" * 64), _export(tmp_path / "b", b"B" * 64)
    for model in (a, b):
        Store.of(str(model), settings, loaded).write(Shard(0, 1), loaded.doc_ids, [np.eye(10, dtype=np.float32)])
    (root / "not-a-store").mkdir()  # never listed nor removed
    listed = obliq_main(["cache", "--root", str(root)])
    assert sorted(s["model"] for s in listed["stores"]) == [str(a), str(b)] and listed["bytes"] > 0
    old = Store.of(str(a), settings, loaded).folder / "store.json"
    os.utime(old, (time.time() - 10 * 86400,) * 2)
    assert [s["folder"] for s in obliq_main(["cache", "--older_than", "5", "--root", str(root)])["stores"]] == [
        str(old.parent)
    ]
    Store.of(str(a), settings, loaded).open(loaded.doc_ids)  # opened: used now
    assert obliq_main(["cache", "--older_than", "5", "--root", str(root)])["stores"] == []
    os.utime(old, (time.time() - 10 * 86400,) * 2)
    done = obliq_main(["cache", "--model", str(b), "--prune", "--root", str(root)])
    assert [s["folder"] for s in done["stores"]] == [str(Store.of(str(b), settings, loaded).folder)] and done["pruned"]
    assert sorted(p.name for p in root.iterdir()) == sorted([old.parent.name, "not-a-store"])
    obliq_main(["cache", "--older_than", "5", "--prune", "true", "--root", str(root)])
    assert [p.name for p in root.iterdir()] == ["not-a-store"]
    capsys.readouterr()
    _fails(["cache", "--prune", "--root", str(root)], capsys, "--older_than DAYS and/or --model")
    _fails(["cache", "--older_than", "-1", "--root", str(root)], capsys, "older_than", ">= 0")
