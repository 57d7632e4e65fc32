"""The README's headline table and the committed reports behind it, generated from committed race rows.

    python benchmarks/headline.py            # regenerate docs/results/<name>/ and the README block
    python benchmarks/headline.py --check    # exit 1 when the README block or a committed table differs

The command line, the races and the exit status are :mod:`harness.protocols.headline`'s (``--help``); this script
runs it. The harness is imported as installed by ``setup.sh`` (``pip install -e .``).
"""

import sys

from harness.protocols.headline import main

if __name__ == "__main__":
    sys.exit(main())
