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
    """``s`` as floats (non-numbers -> NaN)."""
    return pd.to_numeric(s, errors="coerce")


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
