"""The tables of docs/papers.md ("the papers and us"), generated from the committed reference reports.

    python benchmarks/papers.py            # rewrite the tables of docs/papers.md
    python benchmarks/papers.py --check    # exit 1 when a table differs from what the reports give now (CI)

The tables, their sources and the exit status are :mod:`harness.protocols.papers`'s (``--help``); this script runs
it. The harness is imported as installed by ``setup.sh`` (``pip install -e .``).
"""

import sys

from harness.protocols.papers import main

if __name__ == "__main__":
    sys.exit(main())
