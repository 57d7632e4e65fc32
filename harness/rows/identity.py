"""Row identity: which cell a result row fills, when a cell counts as done, and one row per cell.

A cell is one (run identity, configuration, sample, turn, repeat, decoder configuration): :func:`cell_key`
(:data:`CELL_FIELDS`; a missing sampling setting reads as its default, so rows written before the sampling
columns existed key like greedy rows). Resuming a folder (:mod:`harness.job.resume`), coverage and copies
(:mod:`harness.rows.cells`) and reading result files (:func:`harness.rows.results.load_rows`) all key cells
this way. Pure Python and pandas; no torch.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pandas as pd

from harness.rows.columns import SAMPLING, SAMPLING_DEFAULTS, norm

#: Row columns that identify a configuration: rows that differ in any of them are never the same cell.
#: (The ``run_identity`` column covers all of them and much more; see :mod:`harness.job.resume`.)
CONFIG_FIELDS = ("model", "target_model", "draft_model", "dtype", "device_name", "task", "task_version",
                 "max_new_tokens", *SAMPLING, "sampling_seed")
#: Row columns that identify one cell (``turn`` only where a task has turns).
CELL_FIELDS = ("run_identity",) + CONFIG_FIELDS + ("sample_id", "turn", "repeat", "decoder", "decoder_params")
#: Statuses that count as done: ``ok`` and the deterministic skips. ``error`` rows are retried.
DONE_STATUSES = ("ok", "prompt_too_long", "empty_prompt")


def _field(row: Mapping[str, Any], f: str) -> Any:
    value = norm(row.get(f))
    return norm(SAMPLING_DEFAULTS.get(f)) if value is None else value


def cell_key(row: Mapping[str, Any]) -> tuple:
    """Key of the cell a row fills (see :data:`CELL_FIELDS`)."""
    return tuple(_field(row, f) for f in CELL_FIELDS)


def cross_process_pairs(rows: pd.DataFrame) -> pd.Series:
    """Per row: whether it is an ``ok`` decoder row whose vanilla row of the same
    ``(run_id, sample_id, turn, repeat)`` was written by another process (another ``attempt_id``)."""
    if rows.empty or "attempt_id" not in rows:
        return pd.Series(False, index=rows.index, dtype=bool)
    recs = rows.to_dict("records")

    def key(r: Mapping[str, Any]) -> tuple:
        return tuple(norm(r.get(k)) for k in ("run_id", "task", "sample_id", "turn", "repeat"))

    vanilla = {key(r): r.get("attempt_id") for r in recs if r.get("decoder") == "vanilla" and r.get("status") == "ok"}
    flags = [r.get("decoder") != "vanilla" and r.get("status") == "ok" and key(r) in vanilla
             and vanilla[key(r)] != r.get("attempt_id") for r in recs]
    return pd.Series(flags, index=rows.index, dtype=bool)


def latest_rows(rows: pd.DataFrame, extra_keys: Iterable[str] = ()) -> pd.DataFrame:
    """One row per cell: the last ``ok`` row when there is one, else the last row.

    Rows from a resumed run folder can repeat a cell (an ``error`` later retried); summaries must count
    each cell once.

    Args:
        rows: result rows.
        extra_keys: columns added to the cell key (e.g. ``run_dir`` when rows of several folders are mixed).
    """
    if rows.empty:
        return rows
    keys = [tuple(norm(r.get(k)) for k in extra_keys) + cell_key(r) for r in rows.to_dict("records")]
    ok = (rows["status"] == "ok").to_numpy() if "status" in rows else [True] * len(rows)
    chosen: dict[tuple, int] = {}
    for i, (k, is_ok) in enumerate(zip(keys, ok)):
        prev = chosen.get(k)
        if prev is None or is_ok or not ok[prev]:
            chosen[k] = i
    return rows.iloc[sorted(chosen.values())].reset_index(drop=True)
