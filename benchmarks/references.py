"""The committed reference reports (``results/reference/**/report/`` and :data:`DOCS_REPORTS`), regenerated from
their committed rows by the current code, and checked to be up to date (CI). ``python -m harness.report`` refuses to write into these
folders; this is the one command that does. The README's headline blocks have their own command,
``benchmarks/headline.py``.

    python benchmarks/references.py             # rewrite every committed report (tables and figures)
    python benchmarks/references.py --check     # exit 1 when a committed table differs from what the rows give now
                                                # (tables only: figures depend on the matplotlib build;
                                                # CSV numbers compared to a relative 1e-9)

A report in a run folder reads that run (``<run>/report`` reads ``<run>``). Exit status: 0 up to date or
written, 1 ``--check`` found a difference (a unified diff of each is printed), 2 no committed report found.
Imports no torch: pandas, matplotlib and the harness's report only.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.protocols.committed import same_table  # noqa: E402
from harness.report import build as report  # noqa: E402

#: Files of a report compared by ``--check`` (figures are not: their bytes depend on the matplotlib build).
TABLE_SUFFIXES = (".md", ".csv", ".tex")
#: Committed reports outside a run folder: report folder -> the runs it reads (the README's headline reports
#: are ``benchmarks/headline.py``'s).
DOCS_REPORTS = {
    "docs/results/heldout_trees": ("results/reference/trees_bf16_zen4/race",),
    "docs/results/tune_trees": ("results/reference/trees_bf16_zen4/tune_trees",),
}


def committed_reports() -> dict[Path, tuple[Path, ...]]:
    """Every committed report folder (relative to the repository root) -> the runs it is built from: the
    ``report/`` folders git tracks under ``results/reference`` (each reads the run folder above it) and
    :data:`DOCS_REPORTS`."""
    out = subprocess.run(["git", "ls-files", "results/reference"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    found = {Path(f).parent: (Path(f).parent.parent,) for f in out
             if Path(f).name == "report.md" and Path(f).parent.name == "report"}
    found.update({Path(k): tuple(map(Path, v)) for k, v in DOCS_REPORTS.items()})
    return dict(sorted(found.items()))


def regenerate(runs: tuple[Path, ...], out: Path, plots: bool) -> dict[str, Path]:
    """Write the report of ``runs`` into ``out``."""
    return report.write_report(list(runs), out, plots=plots)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing (tables only)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # reports name their sources relative to the repository root
    folders = committed_reports()
    if not folders:
        print("error: no committed report under results/reference", file=sys.stderr)
        return 2
    stale = 0
    for folder, runs in folders.items():
        if not args.check:
            written = regenerate(runs, folder, plots=(folder / "figures").is_dir())
            print(f"{folder}: {len(written)} files")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / folder.name  # the same folder name: a report's LaTeX labels carry it
            regenerate(runs, fresh, plots=False)
            for new in sorted(fresh.iterdir()):
                if new.suffix not in TABLE_SUFFIXES:
                    continue
                old = folder / new.name
                a = old.read_text().splitlines(keepends=True) if old.is_file() else []
                b = new.read_text().splitlines(keepends=True)
                if not same_table("".join(a), "".join(b), new.suffix):
                    stale += 1
                    sys.stdout.writelines(difflib.unified_diff(a, b, str(old), f"{old} (now)", n=1))
    if args.check:
        print(f"{len(folders)} committed reports: " + (f"{stale} stale table(s); run `python "
                                                       "benchmarks/references.py` and commit" if stale else
                                                       "up to date"))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
