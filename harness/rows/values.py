"""Cell values in their canonical form and as text: :func:`num` (a column as floats), :func:`norm` (the key form of
a value) and :func:`format_value`, the one formatter of the tables, summaries and labels. Declaration-free, so
that :mod:`harness.rows.columns` (which re-exports them) and anything below it can use them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def num(s: Any) -> pd.Series:
    """``s`` as floats (non-numbers -> NaN). A Series that is numeric already comes back as a shallow copy, what
    ``pd.to_numeric`` returns for it, in a third of its time (reports call this tens of thousands of times)."""
    if isinstance(s, pd.Series) and isinstance(s.dtype, np.dtype) and s.dtype.kind in "iufb":
        return s.copy(deep=False)
    return pd.to_numeric(s, errors="coerce")


def num_value(value: Any) -> Any:
    """One value as :func:`num` reads it in a column: a number, or NaN (lists, tuples and mappings included)."""
    if isinstance(value, (list, tuple, dict, set, np.ndarray)):
        return math.nan
    return pd.to_numeric(value, errors="coerce")


def norm(value: Any) -> Any:
    """Canonical form of a cell value for keys: NaN/None -> None, integral floats -> int, numpy scalars ->
    Python, lists -> tuples."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(norm(v) for v in value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


def format_value(value: Any, fmt: str | None = None, missing: str = "null") -> str:
    """A value as text: ``missing`` for None or NaN, booleans in lower case, floats in ``fmt``; with ``fmt``
    None, as a person writes a parameter value (:func:`norm`: ``3`` not ``3.0``, other floats in ``g``). The one
    value formatter of the tables, summaries and labels."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if fmt is None:
        v = norm(value)
        if v is None:
            return missing
        if isinstance(v, bool):
            return str(v).lower()
        return format(v, "g") if isinstance(v, float) else str(v)
    if isinstance(value, (float, np.floating)):
        return format(float(value), fmt)
    return str(value)


def fmt_value(value: Any) -> str:
    """A parameter value as a person writes it: ``3`` not ``3.0``, ``None`` as ``null``
    (:func:`format_value`)."""
    return format_value(value)
