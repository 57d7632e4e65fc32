"""Rows written by earlier versions of the harness, read as today's: :func:`upgrade`, the one place that knows what
an older row lacks and what that meant, so no reader downstream carries a fallback of its own.

What changed, and what an older row means (each filled only where a row lacks it):

* ``status``, ``decoder_params``, ``turn``, ``repeat``, ``run_id``: before these columns, every row was an ``ok``
  single-turn, single-repeat row of one run, without settings recorded (a null ``turn`` or ``repeat``: 0).
* ``temperature``, ``top_p``, ``top_k`` (:data:`SAMPLING_DEFAULTS`): the harness sampled nothing before them, so an
  older row is greedy.
* ``group_identity``: before it, the run identity was the group.
* ``decoder_class``: the class its run folder's ``meta.json`` config names (``_target_``), else the decoder's name.
* ``load_1m_before`` / ``load_1m_after`` were called ``load_avg_1m_before`` / ``load_avg_1m_after``.

Two readers keep their own rule because they do not read rows through here: the cell key of a raw row
(:func:`harness.rows.identity.cell_key`, the same sampling defaults) and a cell's draft shape, which for rows before
``draft_shape`` is inferred from the cell's counters (:func:`harness.rows.grouping.draft_shape`). Pure pandas.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from harness.rows.columns import LOAD_COLUMNS, SAMPLING_DEFAULTS

#: The load columns' names in older rows, in the order of :data:`harness.rows.columns.LOAD_COLUMNS`.
LEGACY_LOAD_COLUMNS = ("load_avg_1m_before", "load_avg_1m_after")
#: Bookkeeping columns and what a row without them was.
BOOKKEEPING_DEFAULTS = {"status": "ok", "decoder_params": "{}", "turn": 0, "repeat": 0, "run_id": "run"}
#: Measurements a frame of rows that never ran (no ok row) lacks altogether.
MEASUREMENT_COLUMNS = ("tokens_per_s", "wall_time_s", "new_tokens", "num_steps")


def decoder_classes_of(meta: Mapping[str, Any] | None) -> dict[str, str]:
    """Decoder name -> class name (``SpeculativeDecoder``) from a run folder's ``meta.json`` (its ``config``)."""
    decoders = ((meta or {}).get("config") or {}).get("decoder") or {}
    return {str(name): str(node["_target_"]).rsplit(".", 1)[-1] for name, node in decoders.items()
            if isinstance(node, Mapping) and node.get("_target_")}


def upgrade(rows: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """``rows`` (a copy) with every column an older version did not write filled as the module docstring says;
    rows that have a column keep their values. ``meta``: the run folder's ``meta.json``, whose config names each
    decoder's class. Idempotent.
    """
    rows = rows.copy()
    for c, default in BOOKKEEPING_DEFAULTS.items():
        if c not in rows:
            rows[c] = default
    rows["turn"] = rows["turn"].fillna(0)
    rows["repeat"] = rows["repeat"].fillna(0)
    for c in MEASUREMENT_COLUMNS:
        if c not in rows:
            rows[c] = math.nan
    for c, default in SAMPLING_DEFAULTS.items():
        rows[c] = rows[c].where(rows[c].notna(), default) if c in rows else default
    if "run_identity" in rows:
        fallback = rows["run_identity"]
        rows["group_identity"] = rows["group_identity"].where(rows["group_identity"].notna(), fallback) \
            if "group_identity" in rows else fallback
    if "decoder" in rows:
        named = decoder_classes_of(meta)
        fallback = pd.Series([named.get(str(d), str(d)) for d in rows["decoder"]], index=rows.index, dtype=object)
        rows["decoder_class"] = rows["decoder_class"].where(rows["decoder_class"].notna(), fallback) \
            if "decoder_class" in rows else fallback
    for new, old in zip(LOAD_COLUMNS, LEGACY_LOAD_COLUMNS):
        if old in rows and new not in rows:
            rows = rows.rename(columns={old: new})
    return rows
