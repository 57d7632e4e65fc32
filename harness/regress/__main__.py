"""``python -m harness.regress``: see :mod:`harness.regress.gate`."""

import sys

from harness.regress.gate import main

sys.exit(main())
