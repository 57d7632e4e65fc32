"""The tables of docs/papers.md ("the papers and us"), generated from the committed reference reports.

    python benchmarks/papers.py            # rewrite the tables of docs/papers.md
    python benchmarks/papers.py --check    # exit 1 when a table differs from what the reports give now (CI)

The tables, their sources and the exit status are :mod:`harness.protocols.papers`'s (``--help``); this script runs
it. It imports the harness of its own checkout, whichever checkout the venv's editable install
(``setup.sh``) points at: it writes into that checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's harness

from harness.protocols.papers import main

if __name__ == "__main__":
    sys.exit(main())
