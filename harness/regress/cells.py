"""The gate's cell summaries: result rows read into one record per (task, model pair, decoder configuration),
the shape of the baseline JSON (``{"meta": ..., "cells": {name: record}}``, :data:`BASELINE_VERSION`).

A record holds what the checks (:mod:`harness.regress.checks`) compare: the settings that must agree, equality
with vanilla, the deterministic counters, the speed figures of the noise model (:mod:`harness.regress.noise`)
and the load and contention the cell's timed calls met. Reads result files only (no torch).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.regress.noise import (MAX_CONTENTION, contention_summary, finite, load_summary, robust_figure,
                                   row_contention)
from harness.rows import columns
from harness.rows import metrics
from harness.rows.results import find_result_files, load_rows

BASELINE_VERSION = 3

#: Per-cell settings that must agree between baseline and run for the numbers to be comparable (checked where
#: both sides record them; baselines written before the sampling settings existed were greedy).
SETTINGS = ("max_new_tokens", "task_version", *columns.SAMPLING, "sampling_seeds")


def _sample_digest(sample_ids: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(sorted(set(map(str, sample_ids)))).encode()).hexdigest()[:12]


def _cell_name(task: str, model_pair: str, label: str) -> str:
    return f"{task} | {model_pair} | {label}"


def _sample_key(rows: pd.DataFrame) -> pd.Series:
    turn = rows["turn"].astype(str) if "turn" in rows else "0"
    return rows["task"].astype(str) + "/" + rows["sample_id"].astype(str) + "#" + turn


def speed_figures(mine: pd.DataFrame, vanilla: pd.DataFrame, decoder: str,
                  max_contention: float = MAX_CONTENTION) -> dict[str, dict[str, Any]]:
    """``{"tokens_per_s": ..., "speedup": ..., "contention": ...}`` of one cell's ok rows ``mine``; ``vanilla``:
    the ok vanilla rows of its group. The speedup (:func:`harness.regress.noise.robust_figure`) uses paired rows
    only (:data:`harness.rows.columns.PAIR_KEYS`), the raw ratio of the two back-to-back timings, and leaves out
    every pair with a side that waited for a CPU longer than ``max_contention`` of its wall time
    (:func:`harness.regress.noise.row_contention`; pairs without the measurement are kept). ``contention``
    (:func:`harness.regress.noise.contention_summary`) counts the pairs (vanilla: its rows) and the ones left
    out. tokens/s: the uncontended rows' figure (reported, not gated)."""
    tps = columns.num(mine["tokens_per_s"]) if "tokens_per_s" in mine else pd.Series(math.nan, index=mine.index)
    tps = tps.where(tps > 0)
    con = row_contention(mine)
    out = {"tokens_per_s": robust_figure(np.log(tps.where(~(con > max_contention))), _sample_key(mine)),
           "contention": contention_summary(con, max_contention)}
    if decoder != "vanilla" and not vanilla.empty and "tokens_per_s" in vanilla:
        keys = [k for k in columns.PAIR_KEYS if k in mine and k in vanilla]
        v = vanilla[keys].copy()
        v["_v"], v["_cv"] = columns.num(vanilla["tokens_per_s"]), row_contention(vanilla)
        v = v.drop_duplicates(subset=keys, keep="last")
        m = mine[keys].copy()
        m["_d"], m["_cd"] = tps, con
        m = m.merge(v, on=keys, how="inner")
        m = m[(m["_v"] > 0) & (m["_d"] > 0)]
        pair = m[["_cd", "_cv"]].max(axis=1)  # the more contended side; NaN only where neither side measured it
        out["contention"] = contention_summary(pair, max_contention)
        m = m[~(pair > max_contention)]
        out["speedup"] = robust_figure(np.log(m["_d"] / m["_v"]), _sample_key(m))
    return out


def _run_meta(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Torch thread counts recorded in the runs' ``meta.json`` (beside each results.jsonl), if any."""
    threads = set()
    for f in find_result_files(paths):
        meta = f.parent / "meta.json"
        try:
            env = json.loads(meta.read_text()).get("environment") or {}
        except (OSError, ValueError):
            continue
        if env.get("torch_num_threads") is not None:
            threads.add(int(env["torch_num_threads"]))
    return {"torch_num_threads": sorted(threads)[0] if len(threads) == 1 else (sorted(threads) or None)}


def _cell(r: pd.Series, ok: pd.DataFrame, max_contention: float) -> dict[str, Any]:
    """The record of the cell of aggregate row ``r`` (:func:`harness.rows.metrics.aggregate`), from the ok rows
    ``ok`` of every cell."""
    mine = ok[(ok["group"] == r["group"]) & (ok["label"] == r["label"])]
    vanilla = ok[(ok["group"] == r["group"]) & (ok["decoder"] == "vanilla")]
    counters = metrics.counters(mine)
    speed = speed_figures(mine, vanilla, r["decoder"], max_contention)
    timed = pd.concat([mine, vanilla]) if r["decoder"] != "vanilla" else mine
    cell = {
        "group": r["group"],
        "task": r["task"],
        "model_pair": r["model_pair"],
        "decoder": r["decoder"],
        "label": r["label"],
        "dtype": columns.fmt_value(r.get("dtype")),
        "device_name": columns.fmt_value(r.get("device_name")),
        **{k: columns.fmt_value(r.get(k)) for k in SETTINGS if k in r},
        **({"sampling_seeds": sorted(columns.fmt_value(v) for v in mine["sampling_seed"].dropna().unique())}
           if "sampling_seed" in mine and mine["sampling_seed"].notna().any() else {}),
        "equality_check": r.get("equality_check") if isinstance(r.get("equality_check"), str) else None,
        "samples": int(r["samples"]),
        "failed": int(r.get("failed", 0) or 0),
        "sample_digest": _sample_digest(mine["sample_id"].astype(str).tolist()),
        "equal_to_vanilla": finite(r.get("equal_to_vanilla")),
        "divergent_samples": list(r["divergent_samples"]) if isinstance(r.get("divergent_samples"), list) else [],
        "accept_length": finite(r.get("accept_length")),
        "counters": counters["totals"],
        "counters_digest": counters["digest"],
        "inconsistent_samples": counters["inconsistent_samples"],
        "load": load_summary(timed),
        "contention": speed["contention"],
    }
    for metric in ("speedup", "tokens_per_s"):
        if metric in speed:
            s = speed[metric]
            cell.update({metric: s["figure"], f"{metric}_noise": s["noise"], f"{metric}_values": s["values"]})
    cell["replicates"] = speed["tokens_per_s"]["replicates"] or 1
    return cell


def summarize_cells(paths: Sequence[str | Path], n_boot: int = 200, seed: int = 0,
                    max_contention: float = MAX_CONTENTION) -> dict[str, Any]:
    """The baseline-shaped summary of the runs under ``paths``: ``{"meta": ..., "cells": {name: stats}}``;
    timed pairs that waited for a CPU longer than ``max_contention`` of their wall time are left out of the
    speed figures (:func:`speed_figures`) and counted in the cell's ``contention``.

    Raises:
        ValueError: no rows, or one cell holds rows of several run identities (gate one identity at a time).
    """
    rows = load_rows(paths)
    if rows.empty:
        raise ValueError(f"no result rows under {', '.join(map(str, paths))}")
    agg = metrics.aggregate(rows, n_boot=n_boot, seed=seed)
    ok = rows[rows["status"] == "ok"]
    cells: dict[str, Any] = {}
    for _, r in agg.iterrows():
        name = _cell_name(r["task"], r["model_pair"], r["label"])
        if name in cells:
            raise ValueError(f"{name}: the rows hold several run identities ({cells[name]['group']} and "
                             f"{r['group']}); give the gate one run identity (one code version, dtype, machine)")
        cells[name] = _cell(r, ok, max_contention)
    first = rows.iloc[0]
    meta = {
        "version": BASELINE_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sources": [str(f) for f in find_result_files(paths)],
        "git_commit": first.get("git_commit") if isinstance(first.get("git_commit"), str) else None,
        "device_name": first.get("device_name") if isinstance(first.get("device_name"), str) else None,
        **_run_meta(paths),
        "load": load_summary(ok),
        "contention": contention_summary(row_contention(ok), max_contention),
    }
    return {"meta": meta, "cells": cells}
