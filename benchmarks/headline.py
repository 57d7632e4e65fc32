"""The README's headline table and the committed reports behind it, generated from committed race rows.

    python benchmarks/headline.py            # regenerate docs/results/<name>/ and the README block
    python benchmarks/headline.py --check    # exit 1 when the README block or a committed table differs

The command line, the races and the exit status are :mod:`harness.protocols.headline`'s (``--help``); this script
runs it. It imports the harness of its own checkout, whichever checkout the venv's editable install
(``setup.sh``) points at: it writes into that checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's harness

from harness.protocols.headline import main

if __name__ == "__main__":
    sys.exit(main())
