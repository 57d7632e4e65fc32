"""Data frames the figures draw: acceptance by draft position, time per token by phase, warm vs cold
n-gram pools, and the per-sample category column. Pure functions of result rows.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any, Mapping

import numpy as np
import pandas as pd

from harness.rows.cell_figures import cost_curve
from harness.rows.columns import num
from harness.rows.grouping import draft_shape, params_of, prepare
from harness.rows.metrics import aggregate, figure_rows

log = logging.getLogger(__name__)


#: Draft shapes whose draft is one line of tokens, so that "position i" is the i-th drafted token
#: (:class:`decoders.types.Decoder`): a tree of 16 nodes and depth 10, or G guesses of N - 1 tokens, would
#: show acceptance falling to 0 at positions no accepted path can reach.
LINEAR_DRAFT_SHAPES = ("chain", "dynamic chain", "copy")


def acceptance_per_position(rows: pd.DataFrame) -> pd.DataFrame:
    """Acceptance by draft position, from the per-step ``accepted_per_step`` / ``drafted_per_step`` lists, for
    the configurations whose draft is linear (:data:`LINEAR_DRAFT_SHAPES`; :func:`harness.rows.grouping.draft_shape`,
    so rows written before the column count only ``speculative*`` as a chain).

    For position ``i`` (0-based) over all decode steps of a configuration: ``drafted`` = steps that drafted
    more than ``i`` tokens, ``accepted`` = steps that accepted more than ``i`` tokens; ``rate`` =
    accepted / drafted (vLLM's per-position acceptance), ``conditional`` = P(position i accepted | positions
    < i accepted and position i drafted), which is constant (= alpha) under the i.i.d. model of Leviathan et
    al. 2023.

    Example: steps (accepted, drafted) = (2, 4), (0, 4), (4, 4) give at position 0 rate 2/3, at position 2
    rate 1/3 (only the third step got past position 1) and conditional 1/2 at position 2.

    Returns:
        Columns ``group, label, position, drafted, accepted, rate, conditional``.
    """
    cols = ["group", "label", "position", "drafted", "accepted", "rate", "conditional"]
    out = []
    ok = figure_rows(rows)
    if "accepted_per_step" not in ok or "drafted_per_step" not in ok:
        return pd.DataFrame(columns=cols)
    if "group" not in ok:
        ok = ok.assign(group="")
    for (grp, lab), g in ok.groupby(["group", "label"], sort=False):
        if draft_shape(g) not in LINEAR_DRAFT_SHAPES:
            continue
        acc, dr = [], []
        for a, d in zip(g["accepted_per_step"], g["drafted_per_step"]):
            if isinstance(a, (list, tuple, np.ndarray)) and isinstance(d, (list, tuple, np.ndarray)):
                acc.extend(a)
                dr.extend(d)
        if not dr or max(dr) == 0:
            continue
        acc_a, dr_a = np.asarray(acc), np.asarray(dr)
        for i in range(int(dr_a.max())):
            drafted = int((dr_a > i).sum())
            accepted = int((acc_a > i).sum())
            reached = int(((dr_a > i) & (acc_a >= i)).sum())
            out.append({"group": grp, "label": lab, "position": i, "drafted": drafted, "accepted": accepted,
                        "rate": accepted / drafted if drafted else math.nan,
                        "conditional": accepted / reached if reached else math.nan})
    return pd.DataFrame(out, columns=cols)


def per_sample_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Each sample's paired speedup, for the distribution figure (:func:`plots.per_sample.speedup_per_sample`):
    one row per (group, configuration, sample) but vanilla, ``speedup`` = the mean over the sample's paired rows
    (turns, repeats, seeds) of ``tokens_per_s / vanilla's`` (so the tables' ``speedup``, the mean over rows, is
    the mean of these where samples have equally many rows), ``rows`` = how many.

    Returns:
        Columns ``group, label, sample_id, speedup, rows`` (empty where nothing is paired).
    """
    cols = ["group", "label", "sample_id", "speedup", "rows"]
    ok = figure_rows(rows)
    if ok.empty or "speedup" not in ok or "sample_id" not in ok:
        return pd.DataFrame(columns=cols)
    ok = ok[(ok["decoder"] != "vanilla") & num(ok["speedup"]).notna()]
    if "group" not in ok:
        ok = ok.assign(group="")
    out = (ok.assign(speedup=num(ok["speedup"]))
           .groupby(["group", "label", "sample_id"], sort=False)["speedup"].agg(["mean", "size"]).reset_index()
           .rename(columns={"mean": "speedup", "size": "rows"}))
    return out[cols]


def time_breakdown(rows: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per generated token by phase, per (group, configuration): ``prefill_ms`` (both models'
    prefills: ``prefill_s``, i.e. to the first new token plus a draft prefill run after it; ``ttft_s`` for rows
    without it), ``draft_ms`` / ``verify_ms`` (the per-phase timers ``draft_time_s`` / ``verify_time_s`` of
    decoders that lap them; a target prefill lapped as ``verify`` and a draft prefill lapped as ``draft`` are
    taken out: they are in ``prefill_ms``), ``decode_ms`` (the rest of the decode when the phases are not
    split) and ``other_ms`` (the rest of a split decode: host work, bookkeeping). Rows need ``ttft_s`` or both
    timers; empty when none has them.

    Example: a row of 10 new tokens, 1.0 s wall, ttft 0.2 s, no timers -> prefill 20 ms, decode 80 ms per
    token; with draft 0.3 s and verify 0.6 s (prefill included) -> prefill 20, draft 30, verify 40, other 10;
    with a draft prefill of 0.1 s after the first token (prefill_s 0.3) -> prefill 30, draft 20, verify 40.
    """
    cols = ["group", "label", "prefill_ms", "draft_ms", "verify_ms", "decode_ms", "other_ms"]
    ok = figure_rows(rows)
    timers = {"draft_time_s", "verify_time_s"} <= set(ok.columns)
    if not timers and "ttft_s" not in ok:
        return pd.DataFrame(columns=cols)
    ok = ok.assign(
        _ttft=num(ok["ttft_s"]) if "ttft_s" in ok else math.nan,
        _draft=num(ok["draft_time_s"]) if timers else math.nan,
        _verify=num(ok["verify_time_s"]) if timers else math.nan)
    split = ok["_draft"].notna() & ok["_verify"].notna()
    ok = ok[split | ok["_ttft"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    if "group" not in ok:
        ok = ok.assign(group="")
    ttft = ok["_ttft"].fillna(0.0)
    prefill = (num(ok["prefill_s"]) if "prefill_s" in ok else ok["_ttft"]).fillna(ttft)
    wall = num(ok["wall_time_s"])
    ok = ok.assign(
        _prefill=prefill,
        _draft=(ok["_draft"] - (prefill - ttft)).clip(lower=0).where(split, 0.0),
        _verify=(ok["_verify"] - ttft).clip(lower=0).where(split, 0.0),
        _decode=(wall - prefill).clip(lower=0).where(~split, 0.0))
    ok = ok.assign(_other=(wall - ok["_prefill"] - ok["_draft"] - ok["_verify"]).clip(lower=0).where(split, 0.0))
    per = ok.groupby(["group", "label"], sort=False)[["_prefill", "_draft", "_verify", "_decode", "_other",
                                                      "new_tokens"]].sum()
    ms = 1000.0 / num(per["new_tokens"])
    out = pd.DataFrame({"prefill_ms": per["_prefill"] * ms, "draft_ms": per["_draft"] * ms,
                        "verify_ms": per["_verify"] * ms, "decode_ms": per["_decode"] * ms,
                        "other_ms": per["_other"] * ms})
    return out.reset_index()[cols]


def bare_costs(rows: pd.DataFrame, agg: pd.DataFrame) -> pd.DataFrame:
    """In-situ step costs beside the bare models' cost curves, in units of the target's bare one-token forward
    (``bare_token_s``): the frame of ``insitu_vs_bare``.

    Returns:
        one row per point: ``panel`` (``verify``: the target; ``draft``: the draft model), ``kind`` (``curve``:
        the bare curve, the median over the distinct curves the rows recorded, ``curves`` saying how many;
        ``decoder``: a configuration's in-situ cost), ``label``, ``k`` (tokens fed per forward), ``cost``.
        Empty when no row recorded a curve (older rows, runs without a warm-up).
    """
    out: list[dict[str, Any]] = []
    for panel, column in (("verify", "target_cost_curve"), ("draft", "draft_cost_curve")):
        if column not in rows:
            continue
        curves = [cost_curve(c) for c in rows[column].dropna().unique()]
        curves = [c for c in curves if c]
        points: dict[float, list[float]] = {}
        for curve in curves:
            for k, r in curve:
                points.setdefault(k, []).append(r)
        out += [{"panel": panel, "kind": "curve", "label": "bare", "k": k, "cost": float(np.median(v)),
                 "curves": len(curves)} for k, v in sorted(points.items())]
    if not out:
        return pd.DataFrame(columns=["panel", "kind", "label", "k", "cost", "curves"])
    for panel, x, y in (("verify", "target_tokens_fed_per_step", "verify_bare"),
                        ("draft", "draft_tokens_per_forward", "draft_bare")):
        if {x, y} <= set(agg.columns):
            for _, r in agg.iterrows():
                if r["label"] != "vanilla" and pd.notna(r[x]) and pd.notna(r[y]):
                    out.append({"panel": panel, "kind": "decoder", "label": r["label"], "k": float(r[x]),
                                "cost": float(r[y]), "curves": math.nan})
    return pd.DataFrame(out)


def scope_free_names(rows: pd.DataFrame) -> dict[str, str]:
    """decoder name -> one name per configuration that ignores ``pool_scope`` (to pair cold and warm runs of
    one configuration): decoders whose hyper-parameters differ only in ``pool_scope`` share a name, that of
    the cold one (else the name without ``_warm``). Decoders with identical settings AND scope are never
    merged: where such twins exist, ``X_warm`` pairs with ``X``, the rest cold with warm in order of
    appearance, and a decoder left without a partner keeps its own name."""

    def key(row: Mapping[str, Any]) -> str:
        params = params_of(row.get("decoder_params"))
        params.pop("pool_scope", None)
        return json.dumps(params, sort_keys=True) if params else str(row["decoder"])

    first = rows.drop_duplicates("decoder")
    keys = {str(r["decoder"]): key(r) for r in first.to_dict("records")}
    scopes = dict(zip(first["decoder"].astype(str), first["pool_scope"] if "pool_scope" in first else
                      [None] * len(first)))
    names: dict[str, str] = {}
    for k in dict.fromkeys(keys.values()):
        members = [d for d, kk in keys.items() if kk == k]
        cold = [d for d in members if scopes.get(d) == "sample"]
        if len({scopes.get(d) for d in members}) == len(members):  # at most one decoder per scope: one config
            base = (cold or members)[0]
            names.update({d: re.sub(r"_warm$", "", base) for d in members})
            continue
        names.update({d: d for d in members})
        warm = [d for d in members if d not in cold]
        for w in list(warm):  # twins of one scope: X_warm with X first, then in order
            partner = re.sub(r"_warm$", "", w)
            if partner != w and partner in cold:
                names[w] = partner
                cold.remove(partner)
                warm.remove(w)
        for c, w in zip(cold, warm):
            names[w] = c
    return names


def warm_cold(rows: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
    """Aggregate for the warm-vs-cold figure: one row per (group, configuration, scope), ``config`` = the
    scope-free configuration name, ``label`` = ``cold`` / ``warm``. Empty when rows have no ``pool_scope``.
    Keyword arguments go to :func:`aggregate`."""
    if "pool_scope" not in rows or rows["pool_scope"].dropna().empty:
        return pd.DataFrame()
    rows = prepare(rows)
    scoped = rows["pool_scope"].notna() & (rows["decoder"] != "vanilla")
    # one aggregate per (decoder, scope); vanilla rows stay in for the pairing
    rows.loc[scoped, "label"] = rows.loc[scoped, "decoder"].astype(str) + " | " + \
        rows.loc[scoped, "pool_scope"].astype(str)
    agg = aggregate(rows, **kwargs)
    agg = agg[agg["label"].astype(str).str.contains(" | ", regex=False)].copy()
    scope = agg["label"].str.split(" | ", regex=False).str[-1]
    agg["config"] = agg["decoder"].map(scope_free_names(rows))
    agg["label"] = scope.map({"sample": "cold", "task": "warm"}).fillna(scope)
    return agg.sort_values("label", kind="stable").reset_index(drop=True)


def category_column(rows: pd.DataFrame) -> str | None:
    """The column per-category tables split by: ``subtask`` (Spec-Bench's six) when rows carry it, else
    ``category`` (MT-Bench's eight); None when neither varies."""
    for c in ("subtask", "category"):
        if c in rows and rows[c].dropna().nunique() >= 1 and rows[c].notna().any():
            return c
    return None


def task_bars(rows: pd.DataFrame, agg: pd.DataFrame) -> pd.DataFrame:
    """Bars of the papers' speedup figure (:func:`plots.task_bars`): one per (task, configuration) but vanilla, with
    ``bar`` = the configuration it is drawn as and ``warm`` = True for a warm-start twin (``pool_scope=task``) of a
    cold configuration in the rows (:func:`scope_free_names`), drawn as the shaded part of the cold one's bar.
    Empty unless the aggregate holds two or more tasks, each of one run group, all of one setup
    (:func:`harness.report.task_table.setups`: runs that differ otherwise would share an axis)."""
    from harness.report.task_table import setups

    if agg.empty or "task" not in agg or agg["task"].nunique() < 2 or \
            agg.groupby("task")["group"].nunique().max() > 1 or setups(agg).nunique() > 1:
        return pd.DataFrame()
    names = scope_free_names(rows)
    out = agg[(agg["decoder"] != "vanilla") & agg["speedup"].notna()].copy()
    scope = {str(d): params_of(p).get("pool_scope") for d, p in zip(out["decoder"], out.get("decoder_params",
                                                                                             out["decoder"]))}
    twin = out["decoder"].astype(str).map(names).fillna(out["decoder"].astype(str))
    cold_label = {(t, str(d)): str(lab) for t, d, lab in zip(out["task"], out["decoder"], out["label"])}
    out["warm"] = [tw != str(d) and (t, tw) in cold_label and scope.get(str(d)) == "task" and scope.get(tw) == "sample"
                   for t, tw, d in zip(out["task"], twin, out["decoder"])]
    out["bar"] = [cold_label.get((t, tw), tw) if w else str(lab)
                  for t, tw, w, lab in zip(out["task"], twin, out["warm"], out["label"])]
    keep = ["task", "group", "bar", "warm", "label", "decoder", "settings", "speedup", "speedup_low", "speedup_high",
            "paired_samples"]
    return out[[c for c in keep if c in out]].reset_index(drop=True)
