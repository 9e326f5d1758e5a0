"""Query audit (Appendix J): entity heuristic, Jaccard and BM25 rank by hand, macro averaging, and the
command on a real task with its real queries."""

from __future__ import annotations

import json

import pytest

from obliq.search.bm25 import BM25
from obliq.synth.audit import audit_pairs, entity_tokens, jaccard, leaks, source_rank


def test_entity_tokens_by_hand():
    text = (
        "Chairman Issa: I will now recognize myself. Ms. Ingram, if I heard you correctly, the IRS rollout "
        "of the Affordable Care Act is going well. Is that correct?\nMs. Ingram: The portion is fine."
    )
    # sentence-initial words (Chairman, I, Is, The, Ms after a newline) are not entities unless all-caps;
    # "Ms" after "myself." starts a sentence too; function words (I) never count
    assert entity_tokens(text) == {"Issa", "Ingram", "IRS", "Affordable", "Care", "Act"}
    assert entity_tokens("\u201cHello World\u201d, said Ada.") == {"World", "Ada"}
    assert entity_tokens("NASA launched it. A rocket (NASA) flew.") == {"NASA"}
    assert entity_tokens("x is 3 and Y is 4, in R2") == {"R2"}  # single letters are not entities


def test_leaks_is_case_sensitive_and_whole_token():
    src = "Yesterday Senator Warren asked about banks."
    assert leaks("what did Warren ask", src)
    assert not leaks("the warren of tunnels", src)
    assert not leaks("Warrens are big", src)
    assert not leaks("a senator asked about banks", src)  # "Senator" is mid-sentence in the source, but lower-case here


def test_jaccard_by_hand():
    assert jaccard("The cat sat", "the cat ran away") == pytest.approx(2 / 5)  # {the, cat} / {the, cat, sat, ran, away}
    assert jaccard("", "") == 0.0
    assert jaccard("a b", "c d") == 0.0


def test_source_rank_c17_example():
    bm25 = BM25(["foo", "dog", "baz", "quick god", "quick fox"], k1=1.5, b=0.75, stemmer=None)
    assert source_rank(bm25, "quick", 3) == 1 and source_rank(bm25, "quick", 4) == 1  # tied: both rank 1
    assert source_rank(bm25, "quick", 0) is None  # shares no term: never retrieved
    bm25 = BM25(["apple pie", "apple apple apple pear", "apple apple pear pear", "apple pear pear pear"])
    assert [source_rank(bm25, "apple", j) for j in range(4)] == [3, 1, 2, 4]  # hand values: test_negatives


def test_audit_pairs_macro_averages_by_hand():
    docs = ["Alice met Bob in Paris.", "the weather was mild", "Bob likes tea", "tea and cake"]
    bm25 = BM25(docs)
    row = audit_pairs("x", ["where did they meet in Paris", "mild weather"], [[0, 2], [1]], docs, bm25)
    # query 1 leaks "Paris" of doc 0 (entities Bob, Paris) but nothing of doc 2 (no entity: "Bob" starts
    # the sentence): 0.5; query 2 leaks nothing: 0. Macro mean: 0.25.
    assert row.entity_leak == pytest.approx(0.25)
    # Jaccard: q1-doc0 {in, paris} / 9 distinct tokens, q1-doc2 0; q2-doc1 {mild, weather} / 4
    assert row.jaccard == pytest.approx(((2 / 9 + 0) / 2 + 2 / 4) / 2)
    assert row.pairs == 3 and row.queries == 2
    assert row.unretrieved == pytest.approx(1 / 3) and row.rank1 == pytest.approx(2 / 3)
    assert row.median_rank == 1.0


def test_audit_command_on_a_real_task(tasks_dir, tmp_path, capsys):
    from obliq.cli import main
    from obliq.tasks import load_task

    task = load_task(tasks_dir / "hearings-exchanges")
    rows = []
    for i in (0, 1):  # two hand-written queries for the first two exchanges
        rows.append(
            {
                "id": f"r{i}",
                "task": task.name,
                "source": "synthetic",
                "query": [
                    "the witness said the part her agency handled was going fine",
                    "the chairman asked Ingram about an email and she said she would look at it",
                ][i],
                "positive": {"id": task.doc_ids[i], "text": task.doc_texts[i]},
                "negatives": [],
            }
        )
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["synth", "audit", "--rows", str(path), "--task", str(tasks_dir / "hearings-exchanges")])
    printed = capsys.readouterr().out
    assert "generated" in printed and "real" in printed
    result = json.loads(printed[printed.index("{") :])
    gen, real = result["rows"]
    assert gen["queries"] == 2 and real["queries"] == 708 and real["pairs"] == 708
    assert gen["entity_leak"] == 0.5  # "Ingram" is an entity of exchange 1, query 1 names nobody
    assert 0 < real["entity_leak"] < 1 and 0 < real["jaccard"] < 1
