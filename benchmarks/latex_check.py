"""Typeset every committed report's LaTeX tables in a two-column page and say which ones fail or stick out.

The report fits each table by an estimated width (``harness/report/tables.py``); this runs real LaTeX over the
result, the way a reviewer pastes a table into a paper: one document per ``.tex`` file, a two-column page of the
measures the report fits to (``harness.report.tables.COLUMN_PT`` / ``TEXT_PT``, ACM sigconf's; :data:`PREAMBLE`),
``booktabs`` and ``graphicx`` as the report's docs say. A file passes when ``pdflatex`` compiles it without an
error and no box sticks out of its column (a ``table``) or the page (a ``table*``) by more than :data:`SLACK_PT`.

    python benchmarks/latex_check.py                      # every results/reference/**/report/*.tex and docs/results
    python benchmarks/latex_check.py RUN/report/main.tex  # some files
    python benchmarks/latex_check.py --keep /tmp/tex      # keep the documents, logs and PDFs there
    python benchmarks/latex_check.py --quiet              # print the failures and the count only (CI)

Exit status: 0 every file passed, 1 one failed (its error or overfull box printed), 2 no ``pdflatex`` on the PATH or
no file found. Needs a TeX distribution (Debian: ``texlive-latex-base texlive-latex-recommended``); imports no torch.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.report.tables import COLUMN_PT, TEXT_PT  # noqa: E402

#: The page the report fits its tables to (harness.report.tables: columns of COLUMN_PT, text of TEXT_PT, ACM
#: ``sigconf``'s measures), with the packages the report needs.
PREAMBLE = (r"""\documentclass[10pt,twocolumn]{article}
\usepackage[paperwidth=8.5in,paperheight=11in,textheight=9.25in,"""
            f"textwidth={TEXT_PT}pt,columnsep={TEXT_PT - 2 * COLUMN_PT}pt]{{geometry}}\n"
            r"""\usepackage{booktabs}
\usepackage{graphicx}
\begin{document}
""")
#: A box may stick out this far (points) before the table counts as not fitting (TeX's own ``\hfuzz`` is 0.1 pt).
SLACK_PT = 1.0

OVERFULL = re.compile(r"^Overfull \\hbox \(([0-9.]+)pt too wide\)(.*)$", re.M)
ERROR = re.compile(r"^! (.*)$", re.M)


def committed() -> list[Path]:
    """Every committed report's LaTeX files, sorted."""
    return sorted([*ROOT.glob("results/reference/**/report/*.tex"), *ROOT.glob("docs/results/**/*.tex")])


def typeset(tex: Path, work: Path) -> tuple[bool, list[str]]:
    """Compile one table file in the two-column page. Returns (passed, what went wrong: one line each)."""
    work.mkdir(parents=True, exist_ok=True)
    doc = work / "doc.tex"
    doc.write_text(PREAMBLE + tex.read_text() + "\n\\end{document}\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=work,
                          capture_output=True, text=True, timeout=120)
    log = (work / "doc.log").read_text(errors="replace") if (work / "doc.log").exists() else proc.stdout
    problems = [f"error: {m}" for m in ERROR.findall(log)]
    if proc.returncode and not problems:
        problems.append(f"pdflatex exit status {proc.returncode}")
    problems += [f"overfull by {float(pt):.1f} pt{where}" for pt, where in OVERFULL.findall(log)
                 if float(pt) > SLACK_PT]
    return not problems, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="LaTeX table files (default: every committed report's)")
    ap.add_argument("--keep", type=Path, help="folder to keep each document, log and PDF in")
    ap.add_argument("--quiet", action="store_true", help="print the files that fail and the count only")
    args = ap.parse_args(argv)
    if shutil.which("pdflatex") is None:
        print("error: no pdflatex on the PATH; install a TeX distribution (Debian: texlive-latex-base "
              "texlive-latex-recommended)", file=sys.stderr)
        return 2
    files = args.files or committed()
    if not files:
        print("error: no .tex file found", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        for i, tex in enumerate(files):
            ok, problems = typeset(tex.resolve(), base / f"{i:03d}")
            failed += not ok
            shown = tex.resolve().relative_to(ROOT) if tex.resolve().is_relative_to(ROOT) else tex
            if not (ok and args.quiet):
                print(f"{'ok    ' if ok else 'FAILED'} {shown}" + "".join(f"\n       {p}" for p in problems))
    print(f"{len(files) - failed} of {len(files)} table files compile in a two-column page and fit; {failed} do not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
