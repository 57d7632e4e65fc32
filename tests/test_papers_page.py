"""docs/papers.md's tables regenerate from the committed reference reports (benchmarks/papers.py --check:
harness.protocols.papers), and the check fails on a hand edit, a missing marker or a row missing from a report."""

from __future__ import annotations

import pytest

from harness.protocols import papers


def test_the_papers_page_is_up_to_date_with_the_committed_reports(capsys):
    assert papers.main(["--check"]) == 0, capsys.readouterr().out[-3000:]


def test_a_hand_edited_number_fails_the_check(tmp_path, capsys):
    page = tmp_path / "papers.md"
    text = papers.PAGE.read_text()
    start = text.index(papers.BEGIN.format(name="opt_tree_comparison"))
    cut = text.index("| gsm8k | opt_tree |", start)
    page.write_text(text[:cut] + text[cut:].replace("| gsm8k | opt_tree | ", "| gsm8k | opt_tree | 9", 1))
    assert papers.main(["--check", "--page", str(page)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert papers.main(["--page", str(page)]) == 0 and page.read_text() == text  # rewriting mends it


def test_a_missing_marker_or_row_is_an_error_not_a_blank(tmp_path, capsys, monkeypatch):
    page = tmp_path / "papers.md"
    page.write_text(papers.PAGE.read_text().replace(papers.END.format(name="warm_cold"), ""))
    assert papers.main(["--check", "--page", str(page)]) == 2
    assert "lacks the markers" in capsys.readouterr().err
    with pytest.raises(LookupError, match="0 rows"):
        papers.row("opt_tree_comparison", "bf16_amx", task="gsm8k", decoder="no_such_decoder")
    monkeypatch.setattr(papers, "TREES", (*papers.TREES, "no_such_decoder"))
    assert papers.main(["--check"]) == 2
    assert "no_such_decoder" in capsys.readouterr().err
