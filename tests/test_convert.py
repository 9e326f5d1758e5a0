"""``obliq data convert``: sentence-transformers (save_to_disk, Parquet), Tevatron and ReasonIR records into
training rows that obliq's own row check and data module accept; every refusal names file, line or row, column."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from obliq.commands.data import convert
from obliq.data.convert import ConvertError
from obliq.data.rows import parse_row, read_rows


def _id(text: str, prefix: str = "doc:") -> str:
    return prefix + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _passage(docid: str, text: str, title: str = "") -> dict:
    return {"docid": docid, "title": title, "text": text}


def _checked(path: Path) -> list[dict]:
    """The rows of ``path``, each through obliq's own reader and row check."""
    rows = read_rows(path)
    for i, row in enumerate(rows, 1):
        parse_row(json.dumps(row), str(path), i)
    return rows


ST = {
    "anchor": ["what melts ice", "who wrote the odyssey"],
    "positive": ["Salt lowers the freezing point of water.", "Homer is credited with the Odyssey."],
    "negative_1": ["Sugar dissolves in tea.", "Virgil wrote the Aeneid."],
    "negative_2": ["Ice floats on water.", "Sugar dissolves in tea."],
}


def test_sentence_transformers_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict(ST).save_to_disk(str(tmp_path / "st"))
    report = convert(tmp_path / "st", tmp_path / "rows.jsonl", task="physics")
    assert report["rows"] == 2 and report["format"] == "sentence-transformers" and report["detected"]
    assert report["inputs"] == [str(tmp_path / "st" / "data-00000-of-00001.arrow")]
    rows = _checked(tmp_path / "rows.jsonl")
    first, second = rows
    assert first["id"] == "physics:st:0" and second["id"] == "physics:st:1"
    assert first["task"] == "physics" and first["source"] == "public"
    assert first["query"] == "what melts ice"
    assert first["positive"] == {"id": _id(ST["positive"][0]), "text": ST["positive"][0]}
    assert [n["text"] for n in first["negatives"]] == ["Sugar dissolves in tea.", "Ice floats on water."]
    assert first["meta"] == {"query_id": _id("what melts ice", "q:")}
    # the same text is the same document wherever it is
    assert first["negatives"][0]["id"] == second["negatives"][1]["id"] == _id("Sugar dissolves in tea.")
    assert "instruction" not in first


def test_parquet_folder_reads_every_file_in_order_and_other_column_names(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    part = lambda q, p, n: pa.table({"query": q, "positive": p, "negative": n, "source_name": ["x"] * len(q)})
    pq.write_table(part(["q2"], ["p two"], ["n two"]), folder / "train-00001-of-00002.parquet")
    pq.write_table(part(["q0", "q1"], ["p zero", "p one"], [None, "n one"]), folder / "train-00000-of-00002.parquet")
    report = convert(tmp_path / "hub", tmp_path / "rows.jsonl", task="t", id_prefix="mine")
    assert report["inputs"] == [
        str(folder / "train-00000-of-00002.parquet"),
        str(folder / "train-00001-of-00002.parquet"),
    ]
    assert report["ignored_columns"] == ["source_name"] and report["missing_negatives"] == 1
    rows = _checked(tmp_path / "rows.jsonl")
    assert [(r["id"], r["query"], r["positive"]["text"]) for r in rows] == [
        ("mine:0", "q0", "p zero"),
        ("mine:1", "q1", "p one"),
        ("mine:2", "q2", "p two"),
    ]
    assert rows[0]["negatives"] == [] and rows[1]["negatives"] == [{"id": _id("n one"), "text": "n one"}]


def test_tevatron_jsonl_keeps_ids_titles_and_several_positives(tmp_path):
    src = _jsonl(
        tmp_path / "train.jsonl",
        [
            {
                "query_id": "17",
                "query": "capital of france",
                "positive_passages": [_passage("d1", "Paris is the capital.", "Paris"), _passage("d2", "It is Paris.")],
                "negative_passages": [_passage("d3", "Lyon is a city."), _passage("d4", "Nice is warm.")],
                "answers": ["Paris"],
            },
            {"query_id": 18, "query": "capital of italy", "positive_passages": [_passage(5, "Rome.")]},
        ],
    )
    report = convert(src, tmp_path / "rows.jsonl", task="geo", format="tevatron", source="public")
    assert (
        report["rows"] == 2 and report["rows_with_several_positives"] == 1 and report["ignored_columns"] == ["answers"]
    )
    first, second = _checked(tmp_path / "rows.jsonl")
    assert first["id"] == "geo:train:1" and second["id"] == "geo:train:2"  # the lines
    assert first["positives"] == [
        {"id": "d1", "text": "Paris Paris is the capital."},
        {"id": "d2", "text": "It is Paris."},
    ]
    assert [n["id"] for n in first["negatives"]] == ["d3", "d4"]
    assert first["meta"] == {"query_id": "17"} and second["meta"] == {"query_id": "18"}
    assert second["positive"] == {"id": "5", "text": "Rome."} and second["negatives"] == []


def test_reasonir_pairs_and_plain_texts(tmp_path):
    src = _jsonl(
        tmp_path / "vl.jsonl",
        [
            {
                "query": ["Given a math problem, retrieve a useful theorem", "Why is the sum of two odd numbers even?"],
                "pos": [["", "An odd number is 2k + 1, so two of them sum to 2(k + m + 1)."]],
                "neg": [
                    ["", "Prime numbers have two divisors."],
                    ["Represent the passage", "Squares are never prime."],
                ],
            },
            {"query": "a plain query", "pos": ["A plain positive text.", "Another positive text."], "neg": []},
        ],
    )
    report = convert(src, tmp_path / "rows.jsonl", task="math", format="auto")
    assert report["format"] == "reasonir" and report["document_instructions"] == 1
    first, second = _checked(tmp_path / "rows.jsonl")
    assert first["query"] == "Why is the sum of two odd numbers even?"
    assert first["instruction"] == "Given a math problem, retrieve a useful theorem"
    text = "An odd number is 2k + 1, so two of them sum to 2(k + m + 1)."
    assert first["positive"] == {"id": _id(text), "text": text}
    assert [n["text"] for n in first["negatives"]] == ["Prime numbers have two divisors.", "Squares are never prime."]
    assert first["meta"]["document_instructions"] == {_id("Squares are never prime."): "Represent the passage"}
    assert [p["text"] for p in second["positives"]] == ["A plain positive text.", "Another positive text."]
    assert "instruction" not in second


def test_the_converted_rows_are_a_training_source(tmp_path):
    from obliq.data import MixturePlan, Source, TrainingDataModule

    src = _jsonl(
        tmp_path / "st.jsonl",
        [{"anchor": f"query {i}", "positive": f"document number {i}", "negative": f"other text {i}"} for i in range(6)],
    )
    convert(src, tmp_path / "rows.jsonl", task="t")
    dm = TrainingDataModule([Source(str(tmp_path / "rows.jsonl"))], batch_size=2, index_dir=str(tmp_path / "index"))
    dm.setup()
    plan = MixturePlan(dm.sources, dm.reader.sizes, dm.batch_size, 1, dm.seed, dm.shuffle)
    assert plan.steps_per_epoch == 3 and dm.reader.sizes == [6]


def test_the_command_line(tmp_path, capsys):
    from obliq.cli import main

    src = _jsonl(tmp_path / "st.jsonl", [{"question": "q", "positive": "a document"}])
    main(["data", "convert", "--input", str(src), "--out", str(tmp_path / "rows.jsonl"), "--task", "t"])
    assert json.loads(capsys.readouterr().out)["rows"] == 1
    assert read_rows(tmp_path / "rows.jsonl")[0]["query"] == "q"


# ------------------------------------------------------------------------------------------- refusals


def test_an_empty_text_is_named_by_file_line_and_field(tmp_path):
    good = {"query_id": "1", "query": "q", "positive_passages": [_passage("d1", "text")]}
    bad = {"query_id": "2", "query": "q2", "positive_passages": [_passage("d9", "  ")]}
    src = _jsonl(tmp_path / "train.jsonl", [good, good, bad])
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "rows.jsonl", task="t")
    assert str(err.value) == f"{src}:3:positive_passages[0].text: empty text"
    assert not (tmp_path / "rows.jsonl").exists()  # nothing written

    src = _jsonl(tmp_path / "st.jsonl", [{"anchor": "", "positive": "p"}])
    with pytest.raises(ConvertError, match=r"st\.jsonl:1:anchor: empty text$"):
        convert(src, tmp_path / "rows.jsonl", task="t")


def test_an_empty_text_in_a_table_is_named_by_file_row_and_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"anchor": ["a", "b"], "positive": ["p", "q"], "negative_1": ["n", ""]}), path)
    with pytest.raises(ConvertError) as err:
        convert(path, tmp_path / "rows.jsonl", task="t")
    assert str(err.value) == f"{path}:row 1:negative_1: empty text"
    assert not (tmp_path / "rows.jsonl").exists()


def test_a_negative_equal_to_a_positive(tmp_path):
    src = _jsonl(tmp_path / "st.jsonl", [{"anchor": "q", "positive": "The same text.", "negative": "the same text"}])
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "rows.jsonl", task="t")
    assert err.value.kind == "negative-is-positive"
    assert str(err.value) == f"{src}:1:negative: the negative is a positive: the text of positive (normalised)"

    pos = [_passage("d1", "A text."), _passage("d2", "B text.")]
    src = _jsonl(tmp_path / "tev.jsonl", [{"query": "q", "positive_passages": pos, "negative_passages": [pos[1]]}])
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "rows.jsonl", task="t")
    assert str(err.value) == (
        f"{src}:1:negative_passages[0].docid: the negative is a positive: the id 'd2' of positive_passages[1]"
    )


def test_one_docid_with_two_texts_names_both_places(tmp_path):
    src = _jsonl(
        tmp_path / "train.jsonl",
        [
            {"query": "q1", "positive_passages": [_passage("d1", "First text.")]},
            {
                "query": "q2",
                "positive_passages": [_passage("d2", "x")],
                "negative_passages": [_passage("d1", "Other.")],
            },
        ],
    )
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "rows.jsonl", task="t")
    assert str(err.value).startswith(f"{src}:2:negative_passages[0].docid: document 'd1' has another text")
    assert f"{src}:1:positive_passages[0].text" in str(err.value)


def test_missing_columns_are_named_with_the_columns_present(tmp_path):
    src = _jsonl(tmp_path / "train.jsonl", [{"query": "q", "positive_passages": [_passage("d", "t")]}, {"query": "q"}])
    with pytest.raises(ConvertError, match=r"train\.jsonl:2:positive_passages: no positive_passages column .*query"):
        convert(src, tmp_path / "rows.jsonl", task="t", format="tevatron")
    src = _jsonl(tmp_path / "st.jsonl", [{"anchor": "q", "negative": "n"}])
    with pytest.raises(ConvertError, match=r"st\.jsonl:1:positive: no positive column .*\(fields: anchor, negative\)"):
        convert(src, tmp_path / "rows.jsonl", task="t", format="sentence-transformers")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"query": ["q"], "negative_1": ["n"]}), tmp_path / "st.parquet")
    with pytest.raises(ValueError, match=r"st\.parquet: positive: no positive column .*\(columns: query, negative_1\)"):
        convert(tmp_path / "st.parquet", tmp_path / "rows.jsonl", task="t", format="sentence-transformers")
    src = _jsonl(tmp_path / "none.jsonl", [{"query": "q", "pos": []}])
    with pytest.raises(ConvertError, match=r"none\.jsonl:1:pos: no positive"):
        convert(src, tmp_path / "rows.jsonl", task="t")


def test_an_unknown_format_names_columns_and_formats(tmp_path):
    src = _jsonl(tmp_path / "x.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 0.5}])
    with pytest.raises(ValueError) as err:
        convert(src, tmp_path / "rows.jsonl", task="t")
    message = str(err.value)
    assert "sentence1, sentence2, score" in message
    assert all(name in message for name in ("sentence-transformers", "tevatron", "reasonir"))
    (tmp_path / "x.csv").write_text("anchor,positive\n")
    with pytest.raises(ValueError, match="obliq converts JSONL"):
        convert(tmp_path / "x.csv", tmp_path / "rows.jsonl", task="t")


def test_the_output_is_never_the_input_nor_replaced_unasked(tmp_path):
    src = _jsonl(tmp_path / "st.jsonl", [{"anchor": "q", "positive": "p"}])
    before = src.read_bytes()
    with pytest.raises(ValueError, match="would destroy the input"):
        convert(src, src, task="t")
    assert src.read_bytes() == before

    out = tmp_path / "rows.jsonl"
    out.write_text("keep me\n")
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert(src, out, task="t")
    assert out.read_text() == "keep me\n"


def test_a_dataset_dict_needs_its_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    part = datasets.Dataset.from_dict({"anchor": ["q"], "positive": ["p"]})
    datasets.DatasetDict({"train": part, "dev": part}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"several splits \(train, dev\).*--split"):
        convert(tmp_path / "dd", tmp_path / "rows.jsonl", task="t")
    report = convert(tmp_path / "dd", tmp_path / "rows.jsonl", task="t", split="dev")
    assert report["split"] == "dev" and read_rows(tmp_path / "rows.jsonl")[0]["id"] == "t:dd:dev:0"

    bad = datasets.Dataset.from_dict({"anchor": ["q", "r"], "positive": ["p", 7 * " "]})
    datasets.DatasetDict({"train": bad}).save_to_disk(str(tmp_path / "bad"))  # one split: read without --split
    with pytest.raises(ConvertError) as err:
        convert(tmp_path / "bad", tmp_path / "bad.jsonl", task="t")
    assert str(err.value) == f"{tmp_path / 'bad' / 'train'}:row 1:positive: empty text"
    assert not (tmp_path / "bad.jsonl").exists()


def test_reasonir_document_ids_instead_of_texts_are_refused(tmp_path):
    src = _jsonl(
        tmp_path / "hq.jsonl", [{"query": ["", "q"], "pos": [["", "biology/doc_12.txt"]], "neg": [["", "x y"]]}]
    )
    with pytest.raises(ValueError, match="document ids, not texts"):
        convert(src, tmp_path / "rows.jsonl", task="t")
    assert not (tmp_path / "rows.jsonl").exists()
