"""``python -m harness.report``: see :mod:`harness.report.build`."""

import sys

from harness.report.build import main

sys.exit(main())
