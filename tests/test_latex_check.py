"""LaTeX tables that fit: the width estimate (harness.report.tables) on a table that stuck out of a typeset page,
and benchmarks/latex_check.py, which typesets tables with pdflatex (those tests skip where no pdflatex is
installed; CI says so in a line of its own)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pandas as pd
import pytest

from harness.report import tables

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("latex_check", ROOT / "benchmarks" / "latex_check.py")
latex_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(latex_check)

needs_tex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex on this machine")

#: The CNN/DailyMail group of a committed main table, set in \scriptsize in a table* that pdflatex found 20.6 pt
#: wider than the page (its estimate at 7 pt per em said it fit).
ROUGE = "0.35 [0.31, 0.38]"
WIDE = pd.DataFrame([[5, "1.17 [0.99, 1.36]", "3.25", "0.61", "0.80", ROUGE, ROUGE, ROUGE, ROUGE]] * 5,
                    index=pd.Index(["vanilla", "speculative", "lookahead", "ouroboros", "ouroboros_warm"],
                                   name="decoder"),
                    columns=["samples", "speedup [95% CI]", "τ", "α", "eq.", "rouge1", "rouge2", "rougeL",
                             "rougeLsum"])


def test_small_sizes_are_estimated_as_wide_as_computer_modern_sets_them():
    assert tables.frame_width_pt(WIDE, 7.0) <= tables.TEXT_PT              # what the estimate used to say
    assert tables.frame_width_pt(WIDE, tables.EM_PT[r"\scriptsize"]) > tables.TEXT_PT
    tex = tables.latex(WIDE.astype(str), "Measured: x.", "tab:x")
    assert r"\resizebox{\textwidth}{!}" in tex                             # scaled to the page, not overfull


@needs_tex
def test_latex_check_passes_a_fitting_table_and_fails_an_overfull_one_and_an_error(tmp_path):
    fitting = tmp_path / "fitting.tex"
    fitting.write_text(tables.latex(WIDE.astype(str), "Measured: x.", "tab:x"))
    overfull = tmp_path / "overfull.tex"
    overfull.write_text(tables.latex(WIDE.astype(str), "Measured: x.", "tab:x")
                        .replace("\\resizebox{\\textwidth}{!}{%\n", "").replace("\\end{tabular}}", "\\end{tabular}"))
    broken = tmp_path / "broken.tex"
    broken.write_text(fitting.read_text().replace("\\toprule", "\\toprulee"))
    assert latex_check.typeset(fitting, tmp_path / "a") == (True, [])
    ok, problems = latex_check.typeset(overfull, tmp_path / "b")
    assert not ok and problems[0].startswith("overfull by ") and float(problems[0].split()[2]) > 10
    ok, problems = latex_check.typeset(broken, tmp_path / "c")
    assert not ok and "Undefined control sequence" in problems[0]
    assert latex_check.main([str(fitting), str(overfull), "--quiet"]) == 1
    assert latex_check.main([str(fitting)]) == 0
