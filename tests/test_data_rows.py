"""Training rows: validation messages (file:line:field), fail and skip modes, repairs, the index cache."""

from __future__ import annotations

import copy
import json
import os
from collections import Counter

import pytest
import torch
from support import file_ids, task_rows, write_rows

from obliq.data import RowCaps, RowError, Source, TrainingDataModule, parse_row
from obliq.text import normalise_text, text_hash


@pytest.fixture(scope="module")
def good_rows(tasks_dir):
    rows = [r for r in task_rows(tasks_dir, "math-theoremqa", limit=100) if len(r["negatives"]) >= 2]
    assert len(rows) >= 45
    return rows


def _bad_lines(rows: list[dict]) -> list[tuple[bytes, str, str]]:
    """One bad line per class: (line bytes, expected field, expected kind), each from a real row."""
    out = []

    def variant(i, change):
        row = copy.deepcopy(rows[i])
        change(row)
        return json.dumps(row).encode()

    out.append((json.dumps(rows[0]).encode()[:-7], "(row)", "json"))
    out.append((json.dumps(rows[1]).encode().replace(b'"query": "', b'"query": "\xff\xfe', 1), "(row)", "json"))
    out.append((b"[1, 2, 3]", "(row)", "json"))
    out.append((variant(2, lambda r: r.pop("query")), "query", "missing"))
    out.append((variant(3, lambda r: r.pop("negatives")), "negatives", "missing"))
    out.append((variant(4, lambda r: r.update(positive=r["positive"]["text"])), "positive", "type"))
    out.append((variant(5, lambda r: r["negatives"][1].update(id=17)), "negatives[1].id", "type"))
    out.append((variant(6, lambda r: r["positive"].update(text=" \t ")), "positive.text", "empty"))
    out.append((variant(7, lambda r: r.update(source="web")), "source", "value"))
    out.append((variant(8, lambda r: r.update(negative=r["negatives"])), "negative", "unknown-field"))
    out.append(
        (
            variant(9, lambda r: r["negatives"][1].update(id=r["positive"]["id"])),
            "negatives[1].id",
            "negative-is-positive",
        )
    )
    # The positive's text again under another id: upper case, extra punctuation and spacing (C06).
    out.append(
        (
            variant(
                10,
                lambda r: r["negatives"][0].update(
                    text="  " + r["positive"]["text"].upper().replace(" ", "  ") + " !!"
                ),
            ),
            "negatives[0].text",
            "negative-is-positive",
        )
    )
    out.append((variant(11, lambda r: r["negatives"][0].pop("text")), "negatives[0].text", "missing"))
    # teacher scores (issue 32 §3): the wrong length, a string, an infinite one, all NaN — each named where read
    n = lambda r: 1 + len(r["negatives"])  # noqa: E731
    out.append((variant(12, lambda r: r.update(meta={"teacher_scores": [0.5]})), "meta.teacher_scores", "value"))
    scores = lambda r, first, rest: r.update(meta={"teacher_scores": [first] + [rest] * (n(r) - 1)})  # noqa: E731
    out.append((variant(13, lambda r: scores(r, "high", 0.1)), "meta.teacher_scores[0]", "value"))
    out.append((variant(14, lambda r: scores(r, 0.9, float("inf"))), "meta.teacher_scores[1]", "value"))
    out.append((variant(15, lambda r: scores(r, float("nan"), float("nan"))), "meta.teacher_scores[0]", "value"))
    return out


def _dm(tmp_path, sources, **kw):
    kw.setdefault("num_workers", 0)
    return TrainingDataModule(sources=sources, batch_size=4, index_dir=str(tmp_path / "index"), shuffle=False, **kw)


def test_every_bad_class_fails_with_file_line_field(tmp_path, good_rows):
    for n, (bad, field, kind) in enumerate(_bad_lines(good_rows)):
        path = tmp_path / f"bad{n}.jsonl"
        lines = [json.dumps(r).encode() for r in good_rows[20:25]]
        lines.insert(3, bad)  # line 4
        path.write_bytes(b"\n".join(lines) + b"\n")
        with pytest.raises(RowError) as err:
            _dm(tmp_path, [Source(str(path))]).setup()
        assert str(err.value).startswith(f"{path}:4:{field}: "), str(err.value)
        assert err.value.kind == kind and err.value.line == 4 and err.value.field == field


def test_duplicate_id_fails_naming_both_places(tmp_path, good_rows):
    a = write_rows(tmp_path / "a.jsonl", good_rows[:5])
    again = dict(good_rows[7], id=good_rows[2]["id"])
    b = write_rows(tmp_path / "b.jsonl", [good_rows[6], again])
    with pytest.raises(RowError) as err:
        _dm(tmp_path, [Source(str(a)), Source(str(b))]).setup()
    assert str(err.value) == f"{b}:2:id: row id {good_rows[2]['id']!r} already used at {a}:3"
    assert err.value.kind == "duplicate-id"


def test_skip_mode_counts_every_class_and_keeps_the_good_rows(tmp_path, good_rows, tokenize):
    bad = _bad_lines(good_rows)
    lines, expected_ids, expected_messages = [], [], []
    path = tmp_path / "mixed.jsonl"
    good = iter(good_rows[20:])
    for bad_line, field, _ in bad:
        row = next(good)
        lines += [json.dumps(row).encode(), bad_line, b""]  # a blank line is not a row
        expected_ids.append(row["id"])
        expected_messages.append(f"{path}:{len(lines) - 1}:{field}:")
    path.write_bytes(b"\n".join(lines) + b"\n")
    dup = dict(good_rows[40], id=expected_ids[0])
    other = write_rows(tmp_path / "other.jsonl", [good_rows[41], dup, good_rows[42]])
    expected_ids += [good_rows[41]["id"], good_rows[42]["id"]]

    dm = _dm(tmp_path, [Source(str(path)), Source(str(other))], on_bad_row="skip", tokenize=tokenize)
    dm.setup()
    expected_kinds = Counter(kind for _, _, kind in bad)
    assert dm.stats["sources"][0]["skipped"] == dict(expected_kinds)
    assert dm.stats["sources"][1]["skipped"] == {"duplicate-id": 1}
    assert dm.stats["skipped"] == len(bad) + 1
    assert [s["rows"] for s in dm.stats["sources"]] == [len(bad), 2]
    assert dm.state_dict()["stats"] == dm.stats  # saved with the checkpoint

    errors = (dm.reader.indexes[0][0].folder / "errors.txt").read_text(encoding="utf-8").splitlines()
    assert [e[: len(m)] for e, m in zip(errors, expected_messages)] == expected_messages and len(errors) == len(bad)

    seen = [rid for batch in dm.make_dataloader() for rid in batch["row_ids"]]
    assert seen == expected_ids  # shuffle=False: file order, bad rows and the later duplicate left out

    # The same cache in fail mode: the file's first bad row is raised.
    with pytest.raises(RowError, match=f"^{path}:2:"):
        _dm(tmp_path, [Source(str(path))]).setup()


def test_repairs_surrogates_and_nul_and_counts_them(tmp_path, good_rows, tokenize):
    # shared/cases/C17: the JSON escapes decode to a lone surrogate and a NUL.
    row = dict(good_rows[0], id="c17", query="QUERY")
    line = json.dumps(row).replace('"QUERY"', '"caf\\u00e9 \\udcb2 end\\u0000tail"').encode()
    raw_nul = json.dumps(dict(good_rows[1], id="raw-nul", query="a@b")).encode().replace(b"a@b", b"a\x00b")
    path = tmp_path / "c17.jsonl"
    path.write_bytes(line + b"\n" + raw_nul + b"\n")
    dm = _dm(tmp_path, [Source(str(path))], tokenize=tokenize)
    dm.setup()
    assert dm.stats["sources"][0]["repaired_chars"] == 3 and dm.stats["sources"][0]["repaired_rows"] == 2
    assert dm.stats["skipped"] == 0
    rows = dm.reader[next(iter(dm.make_dataloader().sampler))]
    assert [r.query for r in rows] == ["café \ufffd end tail", "a b"]
    batch = next(iter(dm.make_dataloader()))  # the real tokenizer takes the repaired text
    assert batch["row_ids"] == ["c17", "raw-nul"] and batch["query"]["input_ids"].shape[0] == 2
    # what the stages read (negatives, distill): the same repair, so the rows can be written out again
    from obliq.data.rows import read_rows

    read = read_rows(path)
    assert [r["query"] for r in read] == ["café \ufffd end tail", "a b"]
    json.dumps(read, ensure_ascii=False).encode("utf-8")  # a lone surrogate would raise here


def test_parse_row_keeps_fields_and_cuts_nothing(good_rows):
    src = dict(good_rows[0], lens="style", instruction=None, meta={"k": 1})
    row = parse_row(json.dumps(src), "f.jsonl", 9)
    assert (row.id, row.task, row.source, row.query, row.lens, row.instruction, row.meta) == (
        src["id"],
        src["task"],
        src["source"],
        src["query"],
        "style",
        None,
        {"k": 1},
    )
    assert row.positive.id == src["positive"]["id"] and row.positive.text == src["positive"]["text"]
    assert [(d.id, d.text) for d in row.negatives] == [(n["id"], n["text"]) for n in src["negatives"]]
    assert row.repairs == 0


def test_normalised_text_identity():
    a = "The quick, brown fox -- jumps!"
    assert normalise_text(a) == "the quick brown fox jumps"
    assert text_hash(a) == text_hash("  the QUICK brown fox jumps ") == text_hash("The quick brown fox jumps.")
    assert text_hash(a) != text_hash("The quick brown fox sleeps")
    assert normalise_text("Café — «DÉJÀ vu», ＡＢＣ") == "café déjà vu abc"  # NFKC, case folding, Unicode punctuation
    assert text_hash("Straße «x»") == text_hash("STRASSE x")
    assert -(2**63) <= text_hash(a) < 2**63
    assert torch.tensor([text_hash(a)]).dtype == torch.int64


def test_index_is_cached_and_rebuilt_when_the_file_changes(tmp_path, good_rows):
    path = write_rows(tmp_path / "rows.jsonl", good_rows[:10])
    dm = _dm(tmp_path, [Source(str(path))])
    dm.setup()
    folder = dm.reader.indexes[0][0].folder
    assert folder.is_dir() and dm.stats["sources"][0]["rows"] == 10
    dm2 = _dm(tmp_path, [Source(str(path))])
    dm2.setup()
    assert dm2.reader.indexes[0][0].folder == folder  # same cache entry
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(good_rows[10]) + "\n")
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    dm3 = _dm(tmp_path, [Source(str(path))])
    dm3.setup()
    assert dm3.reader.indexes[0][0].folder != folder and dm3.stats["sources"][0]["rows"] == 11
    assert [dm3.reader.read(0, 0, p).id for p in range(11)] == file_ids(path)


def test_source_and_module_arguments_are_checked(tmp_path, good_rows):
    path = write_rows(tmp_path / "rows.jsonl", good_rows[:3])
    with pytest.raises(ValueError, match="weight or a count"):
        Source(str(path), weight=1.0, count=3)
    with pytest.raises(ValueError, match="weight"):
        Source(str(path), weight=0.0)
    with pytest.raises(ValueError, match="count"):
        Source(str(path), count=-1)
    with pytest.raises(FileNotFoundError, match="no file matches"):
        _dm(tmp_path, [Source(str(tmp_path / "nope*.jsonl"))]).setup()
    with pytest.raises(ValueError, match="in two sources"):
        _dm(tmp_path, [Source(str(path)), Source(str(tmp_path / "*.jsonl"))]).setup()
    with pytest.raises(RuntimeError, match="tokenize is not set"):
        _dm(tmp_path, [Source(str(path))]).make_dataloader()


# --- rows with several positives (issue 47 §2) --------------------------------------------------------------------


def _with_positives(row: dict, others: list[dict]) -> dict:
    """``row`` (a real row) with ``positives``: its positive, then the positives of ``others`` (real rows of other
    documents), none of which is one of its negatives."""
    out = copy.deepcopy(row)
    taken = {row["positive"]["id"], *(n["id"] for n in row["negatives"])}
    extra = [o["positive"] for o in others if o["positive"]["id"] not in taken]
    out["positives"] = [out.pop("positive"), *copy.deepcopy(extra[:2])]
    assert len(out["positives"]) == 3
    return out


def test_a_row_with_several_positives_keeps_them_in_order(good_rows):
    from obliq.text import id_hash

    src = _with_positives(good_rows[0], good_rows[30:40])
    row = parse_row(json.dumps(src), "f.jsonl", 3)
    assert [(d.id, d.text) for d in row.positives] == [(p["id"], p["text"]) for p in src["positives"]]
    assert row.positive == row.positives[0] and row.positive.id == good_rows[0]["positive"]["id"]
    # keys: the query's, every positive's, then each kept negative's (what a no-duplicates step keeps apart)
    docs = [*src["positives"], *src["negatives"]]
    expected = [*row.query_key()] + [k for d in docs for k in (id_hash(d["id"]), text_hash(d["text"]))]
    assert row.keys() == expected
    assert row.keys(RowCaps(max_negatives=1, max_positives=2)) == expected[:6] + expected[8:10]
    # a one-element list is one positive, read as `positive` is
    one = dict(copy.deepcopy(good_rows[1]))
    one["positives"] = [one.pop("positive")]
    assert (
        parse_row(json.dumps(one), "f.jsonl", 4).positives
        == parse_row(json.dumps(good_rows[1]), "f.jsonl", 4).positives
    )


def _multi_bad_lines(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    """Bad rows with several positives, each from a real row: (line, field, kind, part of the reason)."""
    others = rows[30:45]
    base = lambda i: _with_positives(rows[i], others)  # noqa: E731
    out = []

    def variant(i, change):
        row = base(i)
        change(row)
        return json.dumps(row)

    out.append((variant(0, lambda r: r.update(positive=r["positives"][0])), "positives", "value", "not both"))
    out.append((variant(1, lambda r: r.pop("positives")), "positive", "missing", "list of positives"))
    out.append((variant(2, lambda r: r.update(positives=[])), "positives", "empty", "empty list"))
    out.append((variant(3, lambda r: r.update(positives=r["positives"][0])), "positives", "type", "expected a list"))
    out.append(
        (
            variant(4, lambda r: r["positives"][2].update(id=r["positives"][0]["id"])),
            "positives[2].id",
            "value",
            "id of positives[0]",
        )
    )
    # the second positive's text again under another id: upper case and extra punctuation
    out.append(
        (
            variant(5, lambda r: r["positives"][2].update(text=r["positives"][1]["text"].upper() + " ...")),
            "positives[2].text",
            "value",
            "text of positives[1] (normalised)",
        )
    )
    # a negative equal to a positive that is not the first, by id, then by normalised text
    out.append(
        (
            variant(6, lambda r: r["negatives"][1].update(id=r["positives"][2]["id"])),
            "negatives[1].id",
            "negative-is-positive",
            "positives[2]'s id",
        )
    )
    out.append(
        (
            variant(7, lambda r: r["negatives"][0].update(text="  " + r["positives"][1]["text"].upper() + "!")),
            "negatives[0].text",
            "negative-is-positive",
            "positives[1]'s text",
        )
    )
    scores = lambda r: r.update(meta={"teacher_scores": [0.9] + [0.1] * len(r["negatives"])})  # noqa: E731
    out.append((variant(8, scores), "meta.teacher_scores", "value", "single-positive rows; this row has 3"))
    return out


def test_bad_rows_with_several_positives_fail_with_file_line_field(tmp_path, good_rows):
    bad = _multi_bad_lines(good_rows)
    assert len(bad) == 9
    for line, field, kind, reason in bad:
        with pytest.raises(RowError) as err:
            parse_row(line, "rows.jsonl", 7)
        assert (err.value.field, err.value.kind, err.value.line) == (field, kind, 7), str(err.value)
        assert str(err.value).startswith(f"rows.jsonl:7:{field}: ") and reason in err.value.reason, str(err.value)
    # through the data module: the file and line named at setup; in skip mode, counted by kind
    path = tmp_path / "multi.jsonl"
    good = [_with_positives(r, good_rows[30:45]) for r in good_rows[20:23]]
    path.write_text("\n".join([json.dumps(good[0]), bad[6][0], json.dumps(good[1]), bad[8][0], json.dumps(good[2])]))
    with pytest.raises(RowError, match=rf"^{path}:2:negatives\[1\]\.id: negative has positives\[2\]'s id"):
        _dm(tmp_path, [Source(str(path))]).setup()
    dm = _dm(tmp_path, [Source(str(path))], on_bad_row="skip")
    dm.setup()
    assert dm.stats["sources"][0]["skipped"] == {"negative-is-positive": 1, "value": 1}
    assert [dm.reader.read(0, 0, p).id for p in range(3)] == [r["id"] for r in good]
    assert [len(dm.reader.read(0, 0, p).positives) for p in range(3)] == [3, 3, 3]


def test_read_rows_and_positive_fields_round_trip(tmp_path, good_rows):
    from obliq.data.rows import positive_fields, read_rows, row_positives

    multi = _with_positives(good_rows[0], good_rows[30:40])
    path = write_rows(tmp_path / "rows.jsonl", [multi, good_rows[1]])
    read = read_rows(path)
    assert [len(row_positives(r)) for r in read] == [3, 1]
    assert row_positives(read[1]) == [good_rows[1]["positive"]]
    assert positive_fields(row_positives(read[0])) == {"positives": multi["positives"]}
    assert positive_fields(row_positives(read[1])) == {"positive": good_rows[1]["positive"]}
    with pytest.raises(ValueError, match="at least one positive"):
        positive_fields([])
