"""Pick each decoder family's best setting from tuning runs on the dev split; write ``conf/decoder/tuned/<family>_tuned.yaml``.

Step 2 of the tuning protocol (docs/experiments.md, "Tuning protocol")::

    python benchmarks/tune.py results/tuning/tune_all results/tuning/tune_all_mbpp --combine task [--metric speedup]

The command line, its rules and exit status are :mod:`harness.protocols.tune`'s (``--help``); this script runs it.
The harness is imported as installed by ``setup.sh`` (``pip install -e .``).
"""

import sys

from harness.protocols.tune import main

if __name__ == "__main__":
    sys.exit(main())
