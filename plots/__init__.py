"""Figures from result rows: one function per figure, each taking a DataFrame of rows (from
:func:`harness.report.load_rows`) and returning a matplotlib Figure, or None when the rows cannot support
that figure (the reason is logged). :func:`save` writes PNG and PDF. ``plots/make_all.py`` draws them all.

Reads result files only: never imports torch or the decoders. Uses matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import re
import logging
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness.report import aggregate, swept_params  # noqa: E402

log = logging.getLogger(__name__)

__all__ = [
    "speedup_by_task", "accept_length_by_decoder", "acceptance_by_position", "tokens_per_s_vs_param",
    "time_breakdown", "warm_vs_cold", "acceptance_per_position", "save", "FIGURES",
]


def save(fig: Any, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` and ``.pdf``; closes the figure. Returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"] == "ok"] if "status" in rows else rows


def _grouped_bars(ax: Any, agg: pd.DataFrame, value: str, low: str | None = None, high: str | None = None,
                  group: str = "task") -> None:
    """Bars of ``agg[value]``: one cluster per ``group`` value, one bar per configuration label."""
    groups = list(dict.fromkeys(agg[group]))
    labels = list(dict.fromkeys(agg["label"]))
    width = 0.8 / max(1, len(labels))
    x = np.arange(len(groups))
    for i, lab in enumerate(labels):
        sub = agg[agg["label"] == lab].set_index(group).reindex(groups)
        vals = sub[value].to_numpy(dtype=float)
        err = None
        if low and high and low in sub and sub[low].notna().any():
            lo = np.nan_to_num(vals - sub[low].to_numpy(dtype=float), nan=0.0)
            hi = np.nan_to_num(sub[high].to_numpy(dtype=float) - vals, nan=0.0)
            err = np.vstack([np.clip(lo, 0, None), np.clip(hi, 0, None)])
        ax.bar(x + (i - (len(labels) - 1) / 2) * width, vals, width, yerr=err, capsize=3, label=lab)
    ax.set_xticks(x)
    ax.set_xticklabels(groups, rotation=0 if len(groups) < 4 else 30, ha="center" if len(groups) < 4 else "right",
                       fontsize=8 if len(groups) < 4 else 7)
    ax.legend(fontsize=8)


def _group_label(agg: pd.DataFrame) -> pd.DataFrame:
    """``task`` alone when one model pair is shown, else ``task\\nmodel pair``."""
    agg = agg.copy()
    if agg["model_pair"].nunique() > 1:
        agg["task"] = agg["task"].astype(str) + "\n" + agg["model_pair"].astype(str)
    return agg


def speedup_by_task(rows: pd.DataFrame, agg: pd.DataFrame | None = None) -> Any:
    """Speedup vs vanilla per task and decoder, with 95 % bootstrap CI error bars (vanilla omitted)."""
    agg = aggregate(rows) if agg is None else agg
    agg = _group_label(agg[(agg["decoder"] != "vanilla") & agg["speedup"].notna()])
    if agg.empty:
        log.info("speedup_by_task skipped: no decoder other than vanilla has paired rows")
        return None
    fig, ax = plt.subplots(figsize=(max(4.5, 2.0 + 0.45 * agg["task"].nunique() * agg["label"].nunique()), 3.2))
    _grouped_bars(ax, agg, "speedup", "speedup_low", "speedup_high")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("speedup vs vanilla (mean of paired ratios)")
    ax.set_title("Speedup (error bars: 95% bootstrap CI over samples)", fontsize=9)
    return fig


def accept_length_by_decoder(rows: pd.DataFrame, agg: pd.DataFrame | None = None) -> Any:
    """Accept length tau (new tokens per target forward) per task and decoder; vanilla = 1."""
    agg = aggregate(rows) if agg is None else agg
    agg = _group_label(agg[agg["accept_length"].notna()])
    if agg.empty:
        log.info("accept_length_by_decoder skipped: no ok rows")
        return None
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    _grouped_bars(ax, agg, "accept_length")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("accept length tau (tokens / target forward)")
    return fig


def acceptance_per_position(rows: pd.DataFrame) -> pd.DataFrame:
    """Acceptance by draft position, from the per-step ``accepted_per_step`` / ``drafted_per_step`` lists.

    For position ``i`` (0-based) over all decode steps of a configuration: ``drafted`` = steps that drafted
    more than ``i`` tokens, ``accepted`` = steps that accepted more than ``i`` tokens; ``rate`` =
    accepted / drafted (vLLM's per-position acceptance), ``conditional`` = P(position i accepted | positions
    < i accepted and position i drafted), which is constant (= alpha) under the i.i.d. model of Leviathan et
    al. 2023.

    Example: steps (accepted, drafted) = (2, 4), (0, 4), (4, 4) give at position 0 rate 2/3, at position 2
    rate 1/3 (only the third step got past position 1) and conditional 1/2 at position 2.

    Returns:
        Columns ``label, position, drafted, accepted, rate, conditional``.
    """
    out = []
    ok = _ok(rows)
    if "accepted_per_step" not in ok or "drafted_per_step" not in ok:
        return pd.DataFrame(columns=["label", "position", "drafted", "accepted", "rate", "conditional"])
    for lab, g in ok.groupby("label", sort=False):
        acc, dr = [], []
        for a, d in zip(g["accepted_per_step"], g["drafted_per_step"]):
            if isinstance(a, (list, tuple)) and isinstance(d, (list, tuple)):
                acc.extend(a)
                dr.extend(d)
        if not dr or max(dr) == 0:
            continue
        acc_a, dr_a = np.asarray(acc), np.asarray(dr)
        for i in range(int(dr_a.max())):
            drafted = int((dr_a > i).sum())
            accepted = int((acc_a > i).sum())
            reached = int(((dr_a > i) & (acc_a >= i)).sum())
            out.append({"label": lab, "position": i, "drafted": drafted, "accepted": accepted,
                        "rate": accepted / drafted if drafted else math.nan,
                        "conditional": accepted / reached if reached else math.nan})
    return pd.DataFrame(out, columns=["label", "position", "drafted", "accepted", "rate", "conditional"])


def acceptance_by_position(rows: pd.DataFrame, max_positions: int = 16) -> Any:
    """Per-position acceptance rate (solid) and conditional acceptance (dashed) per decoder configuration."""
    table = acceptance_per_position(rows)
    if table.empty:
        log.info("acceptance_by_position skipped: no rows with per-step draft lists (accepted_per_step)")
        return None
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    for lab, g in table.groupby("label", sort=False):
        g = g[g["position"] < max_positions]
        line, = ax.plot(g["position"] + 1, g["rate"], marker="o", ms=3, label=lab)
        ax.plot(g["position"] + 1, g["conditional"], ls="--", lw=0.8, color=line.get_color())
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_title("solid: accepted / drafted at position; dashed: given the earlier ones accepted", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    return fig


def _param_values(rows: pd.DataFrame, param: str) -> pd.Series:
    return rows["decoder_params"].map(lambda s: json.loads(s).get(param) if isinstance(s, str) else None)


#: Preferred x axis of :func:`tokens_per_s_vs_param` when several hyper-parameters vary.
PREFERRED_X = ("gamma", "window_size", "ngram_size", "guess_set_size")


def _series_keys(agg: pd.DataFrame, decoder: str, x: str, varying: list[str]) -> list[str]:
    """Swept parameters other than ``x`` that are not a function of ``x`` (a parameter tied to ``x``, such
    as ``guess_set_size = window_size``, adds no line)."""
    sub = agg[agg["decoder"] == decoder]
    keys = []
    for p in varying:
        if p == x or p not in sub:
            continue
        if sub.groupby(sub[x].astype(str))[p].agg(lambda v: v.astype(str).nunique()).max() > 1:
            keys.append(p)
    return keys


def tokens_per_s_vs_param(rows: pd.DataFrame, param: str | None = None, agg: pd.DataFrame | None = None) -> Any:
    """Tokens/s (left) and speedup with 95 % CI (right) against a swept hyper-parameter (e.g. gamma), one
    line per decoder and per value of the other swept parameters.

    Args:
        param: the x axis; None = the swept parameter with the most values (ties: gamma, window_size,
            ngram_size, guess_set_size, then first seen).
    """
    varying = swept_params(_ok(rows))
    candidates = list(dict.fromkeys(p for ps in varying.values() for p in ps))
    if param is None and candidates:
        counts = {p: _param_values(rows, p).astype(str).nunique() for p in candidates}
        rank = {p: (PREFERRED_X.index(p) if p in PREFERRED_X else len(PREFERRED_X)) for p in candidates}
        param = max(candidates, key=lambda p: (counts[p], -rank[p]))
    if param is None or param not in candidates:
        log.info("tokens_per_s_vs_param skipped: no hyper-parameter takes more than one value%s",
                 f" ({param} is constant)" if param else "")
        return None
    agg = aggregate(rows) if agg is None else agg
    agg = agg[agg[param].notna()] if param in agg else agg.iloc[0:0]
    if agg.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    others = {d: _series_keys(agg, d, param, ps) for d, ps in varying.items()}
    for (task, pair, dec), g in agg.groupby(["task", "model_pair", "decoder"], sort=False):
        series_keys = others.get(dec, [])
        for key, s in (g.groupby(series_keys, sort=False, dropna=False) if series_keys else [((), g)]):
            key = key if isinstance(key, tuple) else (key,)
            s = s.assign(_x=pd.to_numeric(s[param], errors="coerce")).sort_values("_x")
            name = dec + "".join(f" {k}={v}" for k, v in zip(series_keys, key))
            where = [str(v) for v, col in ((task, "task"), (pair, "model_pair")) if agg[col].nunique() > 1]
            if where:
                name += f" [{', '.join(where)}]"
            axes[0].plot(s["_x"], s["tokens_per_s"], marker="o", label=name)
            yerr = np.vstack([(s["speedup"] - s["speedup_low"]).fillna(0).clip(lower=0),
                              (s["speedup_high"] - s["speedup"]).fillna(0).clip(lower=0)])
            axes[1].errorbar(s["_x"], s["speedup"], yerr=yerr, marker="o", capsize=3, label=name)
    axes[0].set_xlabel(param)
    axes[0].set_ylabel("tokens / s")
    axes[1].set_xlabel(param)
    axes[1].set_ylabel("speedup vs vanilla")
    axes[1].axhline(1.0, color="gray", lw=0.8, ls="--")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def time_breakdown(rows: pd.DataFrame) -> Any:
    """Where the time goes: drafting vs verifying (vs the rest) per decoder configuration, as seconds per
    generated token. Needs per-phase timer columns ``draft_time_s`` and ``verify_time_s``."""
    ok = _ok(rows)
    if not {"draft_time_s", "verify_time_s"} <= set(ok.columns):
        log.info("time_breakdown skipped: rows have no draft_time_s / verify_time_s columns (decoders do not "
                 "record per-phase timers)")
        return None
    ok = ok[ok["draft_time_s"].notna() & ok["verify_time_s"].notna()]
    if ok.empty:
        log.info("time_breakdown skipped: draft_time_s / verify_time_s are empty")
        return None
    per = ok.groupby("label", sort=False)[["draft_time_s", "verify_time_s", "wall_time_s", "new_tokens"]].sum()
    ms = 1000.0 / per["new_tokens"]
    draft, verify = per["draft_time_s"] * ms, per["verify_time_s"] * ms
    other = (per["wall_time_s"] * ms - draft - verify).clip(lower=0)
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    x = np.arange(len(per))
    ax.bar(x, draft, label="drafting")
    ax.bar(x, verify, bottom=draft, label="verifying")
    ax.bar(x, other, bottom=draft + verify, label="other (host, prefill, bookkeeping)")
    ax.set_xticks(x)
    ax.set_xticklabels(per.index, rotation=20, fontsize=8)
    ax.set_ylabel("ms per generated token")
    ax.legend(fontsize=8)
    return fig


def _scope_free_names(rows: pd.DataFrame) -> dict[str, str]:
    """decoder name -> one name per configuration that ignores ``pool_scope`` (for cold/warm pairing)."""
    def key(row: pd.Series) -> str:
        try:
            params = json.loads(row["decoder_params"]) if isinstance(row.get("decoder_params"), str) else {}
        except ValueError:
            params = {}
        params.pop("pool_scope", None)
        return json.dumps(params, sort_keys=True) if params else str(row["decoder"])

    first = rows.drop_duplicates("decoder")
    keys = {str(r["decoder"]): key(r) for _, r in first.iterrows()}
    scopes = dict(zip(first["decoder"].astype(str), first.get("pool_scope", pd.Series(dtype=object))))
    names: dict[str, str] = {}
    for k in dict.fromkeys(keys.values()):
        members = [d for d, kk in keys.items() if kk == k]
        cold = [d for d in members if scopes.get(d) == "sample"]
        base = (cold or members)[0]
        names.update({d: re.sub(r"_warm$", "", base) for d in members})
    return names


def warm_vs_cold(rows: pd.DataFrame) -> Any:
    """Warm start (n-gram pool kept across a task's samples, ``pool_scope=task``) vs cold start
    (``pool_scope=sample``): speedup and accept length per decoder. Needs the ``pool_scope`` column."""
    if "pool_scope" not in rows or rows["pool_scope"].dropna().empty:
        log.info("warm_vs_cold skipped: rows have no pool_scope column")
        return None
    scoped = rows["pool_scope"].notna() & (rows["decoder"] != "vanilla")
    rows = rows.copy()
    # one aggregate per (decoder, scope); vanilla rows stay in for the pairing
    rows.loc[scoped, "label"] = rows.loc[scoped, "decoder"] + " | " + rows.loc[scoped, "pool_scope"].astype(str)
    agg = aggregate(rows)
    agg = agg[agg["label"].str.contains(" | ", regex=False)].copy()
    scope = agg["label"].str.split(" | ", regex=False).str[-1]
    # cold and warm of one configuration side by side: decoders whose hyper-parameters differ only in pool_scope
    # share a cluster, named after the cold one (else the name without `_warm`); one decoder name run with both
    # scopes (experiment=warm_cold) pairs with itself
    agg["config"] = agg["decoder"].map(_scope_free_names(rows))
    agg = _group_label(agg)
    if agg["task"].nunique() > 1:
        agg["config"] = agg["config"] + "\n" + agg["task"].astype(str)
    agg["label"] = scope.map({"sample": "cold", "task": "warm"}).fillna(scope)
    agg = agg.sort_values("label", kind="stable")
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * agg["config"].nunique()), 3.4))
    fig.suptitle("warm: n-gram pool kept across the task's samples (pool_scope=task); cold: cleared per sample",
                 fontsize=8)
    _grouped_bars(axes[0], agg, "speedup", "speedup_low", "speedup_high", group="config")
    axes[0].axhline(1.0, color="gray", lw=0.8, ls="--")
    axes[0].set_ylabel("speedup vs vanilla")
    _grouped_bars(axes[1], agg, "accept_length", group="config")
    axes[1].set_ylabel("accept length tau")
    fig.tight_layout()
    return fig


#: name -> figure function (all take the rows; make_all passes a shared aggregate where accepted).
FIGURES = {
    "speedup_by_task": speedup_by_task,
    "accept_length": accept_length_by_decoder,
    "acceptance_by_position": acceptance_by_position,
    "tokens_per_s_vs_param": tokens_per_s_vs_param,
    "time_breakdown": time_breakdown,
    "warm_vs_cold": warm_vs_cold,
}
