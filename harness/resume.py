"""Resumable runs: which (sample, decoder) cells of a run folder are already done.

A *cell* is one (task, sample, turn, repeat, decoder, decoder_params) under one *configuration*: the model
pair, dtype, device and generation budget (:data:`CONFIG_FIELDS`). Re-running the same command into the
same folder with ``runner.resume=true`` (the default) skips every cell that already has a row with status
``ok`` (or ``prompt_too_long``, which is deterministic for a configuration) in ``results.jsonl`` and computes
only the rest. Rows are appended and flushed one cell at a time, so a crash or kill loses at most the cell
in progress.

Pairing across processes: a resumed process adopts the ``run_id`` of the folder's earlier rows of the same
configuration, so every tool that pairs a decoder with vanilla by ``(run_id, task, sample_id, repeat)`` sees
one run; ``attempt_id`` (one per process) tells the processes apart.

Pure Python and pandas; no torch, so reports and plots can use :func:`latest_rows` too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

#: Row columns that identify a configuration: rows that differ in any of them are never the same cell.
CONFIG_FIELDS = ("model", "target_model", "draft_model", "dtype", "device_name", "task", "task_version",
                 "max_new_tokens", "temperature", "top_p", "top_k", "sampling_seed")
#: Values of configuration columns that rows written before the column existed mean (greedy decoding).
CONFIG_DEFAULTS = {"temperature": 0, "top_p": 1, "top_k": 0}
#: Row columns that identify one cell within a configuration (``turn`` only where a task has turns).
CELL_FIELDS = CONFIG_FIELDS + ("sample_id", "turn", "repeat", "decoder", "decoder_params")
#: Statuses that count as done: ``ok`` and the deterministic skip ``prompt_too_long``. ``error`` rows
#: are retried.
DONE_STATUSES = ("ok", "prompt_too_long")


def norm(value: Any) -> Any:
    """Canonical form of a row value for keys: NaN/None -> None, integral floats -> int (pandas turns int
    columns with gaps into floats), everything else unchanged (lists -> tuples)."""
    if value is None:
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    if isinstance(value, list):
        return tuple(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return norm(value.item())
    return value


def _field(row: Mapping[str, Any], f: str) -> Any:
    value = norm(row.get(f))
    return CONFIG_DEFAULTS.get(f) if value is None else value


def config_key(row: Mapping[str, Any]) -> tuple:
    """Key of the configuration a row belongs to (see :data:`CONFIG_FIELDS`, :data:`CONFIG_DEFAULTS`)."""
    return tuple(_field(row, f) for f in CONFIG_FIELDS)


def cell_key(row: Mapping[str, Any]) -> tuple:
    """Key of the cell a row fills (see :data:`CELL_FIELDS`)."""
    return tuple(_field(row, f) for f in CELL_FIELDS)


def repair_trailing_newline(path: str | Path) -> bool:
    """If ``path`` ends in a partial line (a process killed mid-write), end it with a newline so the next
    appended row starts on its own line. The partial line stays and is skipped by ``read_results``.

    Returns:
        True when the file was repaired.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return False
        f.write(b"\n")
    return True


@dataclass
class ResumeState:
    """What a run folder already holds for one configuration.

    Attributes:
        done: cell keys (:func:`cell_key`) with a done row.
        vanilla_token_ids: ``(sample_id, turn, repeat)`` -> vanilla's stored ``token_ids`` (the reference
            for ``matches_vanilla`` when vanilla's cell is done but another decoder's is not).
        run_id: the ``run_id`` of the configuration's latest earlier row, adopted by the resumed process.
        rows_seen: rows read from the file (all configurations).
    """

    done: set[tuple] = field(default_factory=set)
    vanilla_token_ids: dict[tuple, tuple[int, ...]] = field(default_factory=dict)
    #: ``(sample_id, turn, repeat, decoder, decoder_params)`` -> stored completion text of a done cell
    #: (a multi-turn task asks turn k+1 with the decoder's own turn-k answer).
    completions: dict[tuple, str] = field(default_factory=dict)
    run_id: str | None = None
    rows_seen: int = 0


def load_state(rows: pd.DataFrame, config: Mapping[str, Any]) -> ResumeState:
    """Done cells of ``config`` (a mapping with the :data:`CONFIG_FIELDS`) among ``rows``."""
    state = ResumeState(rows_seen=len(rows))
    if rows.empty:
        return state
    want = config_key(config)
    for row in rows.to_dict("records"):
        if config_key(row) != want:
            continue
        if row.get("run_id"):
            state.run_id = row["run_id"]
        if row.get("status") not in DONE_STATUSES:
            continue
        state.done.add(cell_key(row))
        if row.get("status") == "ok":
            state.completions[tuple(norm(row.get(k)) for k in ("sample_id", "turn", "repeat", "decoder",
                                                                "decoder_params"))] = row.get("completion") or ""
        ids = row.get("token_ids")
        if row.get("decoder") == "vanilla" and row.get("status") == "ok" and isinstance(ids, (list, tuple)):
            state.vanilla_token_ids[(norm(row.get("sample_id")), norm(row.get("turn")), norm(row.get("repeat")))] = \
                tuple(int(t) for t in ids)
    return state


def latest_rows(rows: pd.DataFrame, extra_keys: Iterable[str] = ()) -> pd.DataFrame:
    """One row per cell: the last ``ok`` row when there is one, else the last row.

    Rows from a resumed run folder can repeat a cell (an ``error`` later retried, or a folder re-run with
    ``runner.resume=false``); summaries must count each cell once.

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


def params_key(decoder: str, params: Mapping[str, Any]) -> tuple[str, str]:
    """``(decoder, decoder_params)`` as a row stores them (``decoder_params`` is sorted JSON)."""
    return decoder, json.dumps(dict(params), sort_keys=True)
