"""``obliq data convert`` against ``datasets.load_dataset`` (issue 53 §1 and §3, C63).

Seeded dataset folders — configurations listed in a README.md ``configs:`` header, files named by split
(``train.parquet``, ``dev.jsonl``, ``data/test-00000-of-00002.arrow``, ``valid/part-0.parquet``), Parquet, Arrow
(stream and file formats) and JSONL, shards of 0 to 4 records — are converted by obliq, one configuration and
split at a time, and the rows compared with what ``datasets.load_dataset(folder, name=config, split=split)``
reads: the same records, in the same order, after obliq's documented mapping (sentence-transformers: ``anchor``
→ ``query``, ``positive`` → ``positive.text``, ``negative`` → ``negatives``, an empty one skipped). A folder of
several configurations or splits is refused naming them, as datasets refuses it; the cases of C63 as the case
gives them; and the §3 kinds: a ``negatives`` column, a JSON key given twice, files that cannot be read.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from support import cli_fails

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from obliq.commands.data import convert  # noqa: E402
from obliq.data.convert import ConvertError  # noqa: E402
from obliq.data.rows import read_rows  # noqa: E402

SCHEMA = pa.schema(
    [("anchor", pa.string()), ("positive", pa.string()), ("negative", pa.string()), ("tag", pa.string())]
)
KEYWORDS = {
    "train": ["train", "training"],
    "validation": ["validation", "valid", "dev", "val"],
    "test": ["test", "eval"],
}
"""datasets' split keywords (``datasets.data_files.SPLIT_KEYWORDS``) that a file or folder name may use."""
WORDS = "salt ice tide ledger comet prism orchard falcon quartz meadow".split()


def _records(rng: random.Random, n: int, tag: str) -> list[dict]:
    """``n`` sentence-transformers records; a file's first record has a negative (datasets infers the type)."""
    return [
        {
            "anchor": f"{tag} query {i} {rng.choice(WORDS)}",
            "positive": f"{tag} passage {i} about {rng.choice(WORDS)} {rng.randrange(10**6)}",
            "negative": None if i and rng.random() < 0.25 else f"{tag} other text {i} {rng.choice(WORDS)}",
            "tag": tag,
        }
        for i in range(n)
    ]


def _write(path: Path, records: list[dict], fmt: str, rng: random.Random) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        return
    table = pa.Table.from_pylist(records, schema=SCHEMA)
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=rng.choice([1, 2, 1000]))
        return
    new = rng.choice([pa.ipc.new_stream, pa.ipc.new_file])  # datasets' arrow builder reads both
    with pa.OSFile(str(path), "wb") as sink, new(sink, SCHEMA) as writer:
        writer.write_table(table, max_chunksize=rng.choice([1, 3, 1000]))


def _shards(rng: random.Random, fmt: str) -> list[int]:
    """The record counts of one split's shards: at least one record in all; no empty JSONL or Parquet file."""
    low = 0 if fmt == "arrow" else 1  # datasets fails on an empty Parquet shard (its batch size is 0)
    counts = [rng.randint(low, 4) for _ in range(rng.randint(1, 3))]
    counts[0] = max(counts[0], 1)
    return counts


def _layout(folder: Path, seed: int) -> tuple[dict[str, dict[str, list[dict]]], str | None, str]:
    """A seeded dataset folder: ``{config: {split: records in datasets' order}}``, the default configuration
    (None: several and none marked) and the format. Splits and configurations are datasets' names for them."""
    rng = random.Random(seed)
    fmt, kind = rng.choice(["parquet", "arrow", "jsonl"]), rng.choice(["readme", "readme", "flat", "sharded", "dirs"])
    splits = sorted(rng.sample(list(KEYWORDS), rng.randint(1, 3)), key=list(KEYWORDS).index)
    layout: dict[str, dict[str, list[dict]]] = {}
    if kind == "readme":
        configs = rng.sample(["hq", "vl", "triplet", "triplet-all", "pair"], rng.choice([1, 2, 2, 3]))
        default = rng.choice(configs) if len(configs) > 1 and rng.random() < 0.5 else None
        header = ["---", "configs:"]
        for config in configs:
            header += [f"- config_name: {config}"] + (["  default: true"] if config == default else [])
            header.append("  data_files:")
            layout[config] = {}
            for split in rng.sample(splits, rng.randint(1, len(splits))):
                counts, records = _shards(rng, fmt), []
                for i in rng.sample(range(len(counts)), len(counts)):  # written out of order
                    part = _records(rng, counts[i], f"{config}/{split}/{i}")
                    _write(folder / config / f"{split}-{i:05d}-of-{len(counts):05d}.{fmt}", part, fmt, rng)
                    records.append((i, part))
                layout[config][split] = [r for _, part in sorted(records, key=lambda x: x[0]) for r in part]
                header += [f"  - split: {split}", f"    path: {config}/{split}-*"]
        (folder / "README.md").write_text("\n".join([*header, "---", "", "# generated"]) + "\n", encoding="utf-8")
        return layout, default if len(configs) > 1 else configs[0], fmt
    layout["default"] = {}
    names = {s: rng.choice(KEYWORDS[s]) for s in splits}  # data/<name>-00000-of-0000n: datasets's split is <name>
    for split in splits:
        counts = _shards(rng, fmt) if kind != "flat" else [rng.randint(1, 5)]
        parts = []
        for i in range(len(counts)):
            part = _records(rng, counts[i], f"{split}/{i}")
            name = {
                "flat": f"{names[split]}.{fmt}",
                "sharded": f"data/{names[split]}-{i:05d}-of-{len(counts):05d}.{fmt}",
                "dirs": f"{names[split]}/part-{i}.{fmt}",
            }[kind]
            _write(folder / name, part, fmt, rng)
            parts.append(part)
        layout["default"][names[split] if kind == "sharded" else split] = [r for part in parts for r in part]
    return layout, "default", fmt


def _mapped(records) -> list[tuple]:
    """Records as obliq's documented mapping makes them rows: (query, positive, negatives)."""
    return [(r["anchor"], r["positive"], [r["negative"]] if r["negative"] is not None else []) for r in records]


def _rows(path: Path) -> list[tuple]:
    return [(r["query"], r["positive"]["text"], [n["text"] for n in r["negatives"]]) for r in read_rows(path)]


def _convert(folder: Path, out: Path, subset: str | None = None, split: str | None = None) -> dict:
    """obliq's conversion, naming a configuration or a split only when one is chosen."""
    chosen = {k: v for k, v in (("subset", subset), ("split", split)) if v is not None}
    return convert(folder, out, task="t", **chosen)


@pytest.mark.parametrize("seed", range(24))
def test_generated_folders_convert_as_datasets_loads_them(tmp_path, seed):
    folder = tmp_path / f"data{seed}"
    layout, default, fmt = _layout(folder, seed)
    rng, cache, none = random.Random(seed + 1000), str(tmp_path / "hf"), tmp_path / "none.jsonl"
    for config, splits in layout.items():  # each configuration and split: datasets' records, in its order
        name = config if (config != default or rng.random() < 0.5) else None
        for split, records in splits.items():
            out = tmp_path / f"{config}-{split}.jsonl"
            report = _convert(folder, out, name, split if (len(splits) > 1 or rng.random() < 0.5) else None)
            reference = datasets.load_dataset(str(folder), name=config, split=split, cache_dir=cache)
            assert _mapped(reference) == _mapped(records), "the generator's expectation is datasets' reading"
            assert _rows(out) == _mapped(reference), (config, split, fmt)
            assert report["subset"] == config and report["split"] == split and report["rows"] == len(records)
            assert report["ignored_columns"] == ["tag"] and len(report["inputs"]) >= 1
            prefix = ":".join(["t", folder.name, *([config] if config != "default" else []), split])
            assert [r["id"] for r in read_rows(out)] == [f"{prefix}:{i}" for i in range(len(records))]
        if len(splits) > 1:  # several splits, none chosen: refused naming them
            with pytest.raises(ValueError) as err:
                _convert(folder, none, name)
            assert all(repr(s) in str(err.value) for s in splits) and "--split" in str(err.value)
        with pytest.raises(ValueError, match="no split 'nope'"):
            _convert(folder, none, name, "nope")
    if default is None:  # several configurations and none marked: both refuse, obliq naming them
        with pytest.raises(ValueError, match="Config name is missing"):
            datasets.load_dataset(str(folder), cache_dir=cache)
        with pytest.raises(ValueError) as err:
            _convert(folder, none)
        assert str(list(layout)) in str(err.value) and "--subset" in str(err.value)
    with pytest.raises(ValueError, match="no configuration 'nope'"):
        _convert(folder, none, "nope")
    assert not none.exists()


def test_configurations_in_folders_without_a_readme_are_not_read_as_one(tmp_path):
    """Without a ``configs:`` header, datasets reads ``hq/train/0000.parquet`` and ``vl/train/0000.parquet``
    (the hub's Parquet export of two configurations) as one split: obliq refuses, naming the folders."""
    for config, n in (("hq", 2), ("vl", 3)):
        _write(
            tmp_path / "d" / config / "train" / "0000.parquet",
            _records(random.Random(n), n, config),
            "parquet",
            random.Random(0),
        )
    assert len(datasets.load_dataset(str(tmp_path / "d"), split="train", cache_dir=str(tmp_path / "hf"))) == 5
    with pytest.raises(ValueError, match=r"several folders \(hq, vl\).*--input"):
        convert(tmp_path / "d", tmp_path / "rows.jsonl", task="t")
    report = convert(tmp_path / "d" / "vl", tmp_path / "rows.jsonl", task="t")
    assert report["rows"] == 3 and report["split"] == "train"


# --------------------------------------------------------------------------------------- C63


def _hub(folder: Path, configs: dict[str, list[dict]]) -> Path:
    """A hub snapshot: ``<config>/train-00000-of-00001.parquet`` each, listed in README.md's ``configs:``."""
    header = ["---", "configs:"]
    for config, records in configs.items():
        (folder / config).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(records), folder / config / "train-00000-of-00001.parquet")
        header += [f"- config_name: {config}", "  data_files:", "  - split: train", f"    path: {config}/train-*"]
    (folder / "README.md").write_text("\n".join([*header, "---", ""]), encoding="utf-8")
    return folder


def _reasonir(i: int, pos: str) -> dict:
    return {"query": ["Retrieve a passage that helps", f"question {i} about cells"], "pos": [["", pos]], "neg": []}


def test_c63_a_reasonir_data_hq_and_vl(tmp_path, capsys):
    from obliq.cli import main

    hq = [_reasonir(i, f"biology_{1021 + i}_3.txt") for i in range(3)]
    vl = [_reasonir(10 + i, f"A passage of text number {i} on mitochondria.") for i in range(4)]
    folder = _hub(tmp_path / "reasonir-data", {"hq": hq, "vl": vl})
    argv = ["data", "convert", "--input", str(folder), "--task", "t", "--out"]
    cli_fails([*argv, str(tmp_path / "rows.jsonl")], capsys, str(folder), "['hq', 'vl']", "--subset")
    assert not (tmp_path / "rows.jsonl").exists()
    report = main([*argv, str(tmp_path / "vl.jsonl"), "--subset", "vl"])
    reference = datasets.load_dataset(str(folder), "vl", split="train", cache_dir=str(tmp_path / "hf"))
    assert report["rows"] == 4 == len(reference)
    rows = read_rows(tmp_path / "vl.jsonl")
    assert [(r["query"], r["instruction"], r["positive"]["text"]) for r in rows] == [
        (rec["query"][1], rec["query"][0], rec["pos"][0][1]) for rec in reference
    ]
    with pytest.raises(ValueError, match=r"biology_1021_3\.txt.*document ids, not texts"):
        convert(folder, tmp_path / "hq.jsonl", task="t", subset="hq")


def test_c63_b_sentence_transformers_triplet_and_triplet_all(tmp_path):
    pairs = [(f"anchor {i}", f"the positive passage {i}") for i in range(3)]
    negatives = [[f"negative {i}.{j}" for j in range(2)] for i in range(3)]
    triplet = [{"anchor": a, "positive": p, "negative": negatives[i][0]} for i, (a, p) in enumerate(pairs)]
    every = [{"anchor": a, "positive": p, "negative": n} for (a, p), ns in zip(pairs, negatives) for n in ns]
    folder = _hub(tmp_path / "st", {"triplet": triplet, "triplet-all": every})
    with pytest.raises(ValueError, match=r"\['triplet', 'triplet-all'\].*--subset"):
        convert(folder, tmp_path / "rows.jsonl", task="t")
    for config, n in (("triplet", 3), ("triplet-all", 6)):
        out = tmp_path / f"{config}.jsonl"
        assert convert(folder, out, task="t", subset=config)["rows"] == n
        reference = datasets.load_dataset(str(folder), config, split="train", cache_dir=str(tmp_path / "hf"))
        assert _rows(out) == [(r["anchor"], r["positive"], [r["negative"]]) for r in reference]
    assert {r["id"] for r in read_rows(tmp_path / "triplet.jsonl")}.isdisjoint(
        r["id"] for r in read_rows(tmp_path / "triplet-all.jsonl")
    )


# ----------------------------------------------------------------------------- issue 53 §3


def test_a_parquet_folder_of_train_and_test_needs_its_split(tmp_path, capsys):
    folder = tmp_path / "pq"
    for split, n in (("train", 3), ("test", 2)):
        _write(folder / f"{split}.parquet", _records(random.Random(n), n, split), "parquet", random.Random(0))
    cli_fails(["data", "convert", "--input", str(folder), "--out", str(tmp_path / "o.jsonl"), "--task", "t"], capsys,
              str(folder), "'train'", "'test'", "--split")  # fmt: skip
    report = convert(folder, tmp_path / "test.jsonl", task="t", split="test")
    reference = datasets.load_dataset(str(folder), split="test", cache_dir=str(tmp_path / "hf"))
    assert report["rows"] == 2 and _rows(tmp_path / "test.jsonl") == _mapped(reference)
    assert report["inputs"] == [str(folder / "test.parquet")]


def test_the_output_is_never_a_file_the_input_folder_resolves_to(tmp_path, capsys):
    """A hub snapshot keeps its data files as symlinks to blobs: converting it into the blob (or through another
    name of it) is refused before anything is written, and the blob keeps its bytes."""
    blob = tmp_path / "blobs" / "abc123"
    blob.parent.mkdir()
    blob.write_text("".join(json.dumps({"anchor": f"q{i}", "positive": f"text {i}"}) + "\n" for i in range(4)))
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "train.jsonl").symlink_to(blob)
    (tmp_path / "alias.jsonl").symlink_to(blob)
    before = blob.read_bytes()
    for out in (blob, tmp_path / "alias.jsonl"):
        argv = ["data", "convert", "--input", str(tmp_path / "snap"), "--out", str(out), "--task", "t"]
        cli_fails([*argv, "--overwrite", "true"], capsys, f"output {out} is the input file", "train.jsonl")
    assert blob.read_bytes() == before


@pytest.mark.parametrize(
    ("fmt", "record", "column", "near"),
    [
        ("sentence-transformers", {"anchor": "q", "positive": "p", "negatives": ["n1", "n2"]}, "negatives", "negative"),
        ("sentence-transformers", {"anchor": "q", "positive": "p", "Negative": "n"}, "Negative", "negative"),
        ("sentence-transformers", {"anchor": "q", "positive": "p", "hard_negatives": ["n"]}, "hard_negatives",
         "negative"),
        ("sentence-transformers", {"anchr": "x", "query": "q", "positive": "p"}, "anchr", "anchor"),
        ("tevatron", {"query": "q", "positive_passages": [{"docid": "d", "text": "t"}], "negative_passage": []},
         "negative_passage", "negative_passages"),
        ("reasonir", {"query": "q", "pos": ["a text"], "negs": ["n"]}, "negs", "neg"),
    ],
)  # fmt: skip
def test_a_column_named_like_one_the_format_reads_is_refused(tmp_path, fmt, record, column, near):
    src = tmp_path / "x.jsonl"
    src.write_text(json.dumps(record) + "\n")
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "rows.jsonl", task="t", format=fmt)
    assert str(err.value).startswith(f"{src}:1:{column}: ") and f"named like {near}" in str(err.value)
    assert not (tmp_path / "rows.jsonl").exists()
    record["source_name"] = record.pop(column)  # under a name of its own, ignored and listed
    src.write_text(json.dumps(record) + "\n")
    report = convert(src, tmp_path / "rows.jsonl", task="t", format=fmt)
    assert report["rows"] == 1 and "source_name" in report["ignored_columns"]


def test_a_json_key_given_twice_is_refused_naming_file_line_and_key(tmp_path):
    src = tmp_path / "st.jsonl"
    src.write_text('{"anchor": "q", "positive": "p"}\n{"anchor": "q2", "positive": "kept?", "positive": "last"}\n')
    assert json.loads(src.read_text().splitlines()[1])["positive"] == "last"  # what a JSON reader does
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "rows.jsonl", task="t")
    assert str(err.value).startswith(f"{src}:2:positive: the key 'positive' given twice")
    src.write_text('{"query": "q", "positive_passages": [{"docid": "d1", "text": "a", "docid": "d2"}]}\n')
    with pytest.raises(ConvertError, match=r"st\.jsonl:1:docid: the key 'docid' given twice"):
        convert(src, tmp_path / "rows.jsonl", task="t")


def _damage_parquet(path: Path) -> None:
    table = pa.table({"anchor": [f"q{i}" for i in range(3000)], "positive": [f"p {i} " * 8 for i in range(3000)]})
    pq.write_table(table, path, row_group_size=500, compression="snappy")
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 200):
        data[i] = (data[i] * 7 + 3) % 256
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_files_that_cannot_be_read_are_named_in_one_line(tmp_path, capsys):
    def fails(path: Path, named: Path, *needles: str) -> None:
        argv = ["data", "convert", "--input", str(path), "--out", str(tmp_path / "o.jsonl"), "--task", "t"]
        cli_fails(argv, capsys, str(named), *needles)
        assert not (tmp_path / "o.jsonl").exists()

    _damage_parquet(tmp_path / "damaged.parquet")  # its footer is whole: the page is read late
    fails(tmp_path / "damaged.parquet", tmp_path / "damaged.parquet")
    (tmp_path / "folder").mkdir()
    _damage_parquet(tmp_path / "folder" / "train.parquet")
    fails(tmp_path / "folder", tmp_path / "folder" / "train.parquet")

    records = _records(random.Random(0), 400, "cut")
    _write(tmp_path / "cut.arrow", records, "arrow", random.Random(1))
    _cut(tmp_path / "cut.arrow")
    fails(tmp_path / "cut.arrow", tmp_path / "cut.arrow")
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(records).save_to_disk(str(saved))
    _cut(saved / "data-00000-of-00001.arrow")
    fails(saved, saved / "data-00000-of-00001.arrow")

    for name, text in (("invalid", "{not json"), ("list", "[]"), ("feature", '{"features": {"a": {"_type": "No"}}}')):
        folder = tmp_path / f"info-{name}"
        datasets.Dataset.from_list(records[:3]).save_to_disk(str(folder))
        (folder / "dataset_info.json").write_text(text)
        fails(folder, folder / "dataset_info.json")
    (tmp_path / "yaml").mkdir()
    _write(tmp_path / "yaml" / "train.jsonl", records[:2], "jsonl", random.Random(0))
    (tmp_path / "yaml" / "README.md").write_text("---\nconfigs: [\n---\n")
    fails(tmp_path / "yaml", tmp_path / "yaml" / "README.md")
