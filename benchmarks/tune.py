"""Pick each decoder family's best setting from tuning runs on the dev split; write
``conf/decoder/tuned/<family>_tuned.yaml``.

Step 2 of the tuning protocol (docs/experiments.md, "Tuning protocol")::

    python benchmarks/tune.py results/tuning/tune_all results/tuning/tune_all_mbpp --combine task [--metric speedup]

The command line, its rules and exit status are :mod:`harness.protocols.tune`'s (``--help``); this script runs it.
It imports the harness of its own checkout, whichever checkout the venv's editable install
(``setup.sh``) points at: it writes into that checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's harness

from harness.protocols.tune import main

if __name__ == "__main__":
    sys.exit(main())
