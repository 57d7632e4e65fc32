"""Whether a committed report table agrees with the one the current code regenerates from the same rows.

Used by the ``--check`` of ``benchmarks/headline.py`` (:mod:`harness.protocols.headline`). Tables are compared as
text, line by line; CSV numbers may differ in their last bits. Imports nothing beyond the standard library.
"""

from __future__ import annotations

import math


def _same_line(a: str, b: str) -> bool:
    """Two table lines agree: equal text, or (CSV) equal fields where numbers may differ in their last bits
    (relative 1e-9: least-squares fits and sums come out a few ulps apart on CPUs with other vector units)."""
    if a == b:
        return True
    fa, fb = a.rstrip("\n").split(","), b.rstrip("\n").split(",")
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb):
        if x == y:
            continue
        try:
            if not math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12):
                return False
        except ValueError:
            return False
    return True


def same_table(old: str, new: str, suffix: str) -> bool:
    """A committed table's text ``old`` agrees with the regenerated ``new`` (``suffix`` ``.csv``: numbers to a
    relative 1e-9, see :func:`_same_line`; other tables: exact text)."""
    a, b = old.splitlines(), new.splitlines()
    return len(a) == len(b) and all(_same_line(x, y) if suffix == ".csv" else x == y for x, y in zip(a, b))
