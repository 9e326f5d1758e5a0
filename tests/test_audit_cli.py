"""``obliq audit`` through jsonargparse, as obliq/cli.py hands it over (``auto_cli`` on a dict of commands)."""

from __future__ import annotations

import json

import pytest
from jsonargparse import auto_cli
from test_audit_lean import write_task

from obliq.commands.audit import audit


def test_audit_parses_and_runs_from_the_command_line(tmp_path):
    task = write_task(tmp_path / "t")
    out = tmp_path / "out"
    argv = [
        "audit",
        "--task",
        str(task),
        "--output",
        str(out),
        "--models",
        f"[{task / 'hand.trec'}]",
        "--paired",
        "[[left, right]]",
        "--groups",
        "[[left, right]]",
        "--document_attributes",
        str(task / "lean.tsv"),
        "--lean_k",
        "[3]",
        "--measures",
        "[RR@10]",
        "--resamples",
        "500",
        "--permutations",
        "500",
    ]
    result = auto_cli({"audit": audit}, args=argv, as_positional=False)
    assert result["output"] == str(out)
    report = json.loads((out / "audit.json").read_text())
    assert report["config"]["paired"] == [["left", "right"]] and report["config"]["lean_k"] == [3]
    assert [r["metric"] for r in report["groups"][0]["rows"]] == ["RR@10", "lean@3"]


def test_audit_help_comes_from_the_docstring(capsys):
    with pytest.raises(SystemExit) as exit_:
        auto_cli({"audit": audit}, args=["audit", "--help"], as_positional=False)
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for phrase in (
        "paired variants",
        "--paired",
        "--document_attributes",
        "sign-flip resamples B",
        "--lean_relevant_only",
    ):
        assert phrase in text


def test_proposed_cli_entry(tmp_path, monkeypatch, capsys):
    """The entry proposed for obliq/cli.py's COMMANDS, ``"audit": audit``, with its conveniences:
    bare values fill the required task and output, ``--lean-relevant-only`` alone means true."""
    import obliq.cli

    monkeypatch.setitem(obliq.cli.COMMANDS, "audit", audit)
    task = write_task(tmp_path / "t")
    out = tmp_path / "out"
    obliq.cli.main(
        [
            "audit",
            str(task),
            str(out),
            "--models",
            f"[{task / 'hand.trec'}]",
            "--groups",
            "[[left, right]]",
            "--document-attributes",
            str(task / "lean.tsv"),
            "--lean_k",
            "[3]",
            "--lean-relevant-only",
            "--measures",
            "[RR@10]",
            "--resamples",
            "200",
            "--permutations",
            "200",
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["output"] == str(out)
    (lean,) = [h for h in printed["headline"] if h["metric"] == "lean@3"]
    assert lean["difference"] == 0.5 - 0.0  # gold-filtered: right {R1: 1/2}, left {L1: -1, L2: 1}
