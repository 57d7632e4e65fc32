"""Figures from aggregated frames: one function per figure, each taking the frame(s) it draws and a subtitle,
returning a matplotlib Figure, or None when the frame cannot support that figure (the reason is logged).

The frames come from :mod:`harness.metrics` through the report (``python -m harness.report RUN --plots``,
which calls :func:`draw_all`); this package imports nothing of the harness, the decoders or torch, and
computes no statistic itself: it draws what it is given. :func:`save` writes PNG and PDF.

Every figure carries a subtitle (model pair, dtype, hardware, task size: ``3 of 5 samples`` when the figures
stand on fewer samples than the task has), keeps its legend outside the axes, gives each configuration its own
colour (:func:`palette` never repeats a colour) and prints integral hyper-parameters as integers; bars that
stand on different numbers of samples say their ``n``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

log = logging.getLogger(__name__)

__all__ = [
    "speedup_by_task", "accept_length_by_decoder", "acceptance_by_position", "tokens_per_s_vs_param",
    "time_breakdown", "warm_vs_cold", "palette", "save", "draw_all", "FIGURES",
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


def palette(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` distinct colours: ``tab10`` up to 10, ``tab20`` up to 20, else evenly spaced along ``turbo``."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [tuple(c) for c in plt.get_cmap("turbo")(np.linspace(0.03, 0.97, n))]


def _fmt(v: Any) -> str:
    """A hyper-parameter value as written in a config: ``3`` not ``3.0``."""
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "null"
        if float(v).is_integer():
            return str(int(v))
    return str(v)


def _titles(fig: Any, title: str, subtitle: str) -> None:
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=8)


def _legend_outside(ax: Any, **kwargs: Any) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False, **kwargs)


def _clusters(agg: pd.DataFrame, group: str) -> pd.Series:
    """x-axis cluster names: the task alone when one run group is shown, else the group label on two lines."""
    if group != "group":
        return agg[group].astype(str)
    if agg["group"].nunique() > 1:
        return agg["group"].astype(str).str.replace(": ", "\n", n=1, regex=False)
    return agg["task"].astype(str) if "task" in agg else agg["group"].astype(str)


def _grouped_bars(ax: Any, agg: pd.DataFrame, value: str, low: str | None = None, high: str | None = None,
                  group: str = "group") -> None:
    """Bars of ``agg[value]``: one cluster per ``group`` value, one bar (own colour) per configuration label,
    error bars from ``low`` / ``high`` when present; legend outside the axes. When the bars stand on different
    numbers of samples (``paired_samples``), each bar says its ``n``."""
    counts = pd.to_numeric(agg["paired_samples"], errors="coerce") if "paired_samples" in agg else None
    uneven = counts is not None and counts.nunique() > 1
    agg = agg.assign(_cluster=_clusters(agg, group))
    groups = list(dict.fromkeys(agg["_cluster"]))
    labels = list(dict.fromkeys(agg["label"]))
    colours = palette(len(labels))
    width = 0.8 / max(1, len(labels))
    x = np.arange(len(groups))
    for i, lab in enumerate(labels):
        sub = agg[agg["label"] == lab].drop_duplicates("_cluster").set_index("_cluster").reindex(groups)
        vals = sub[value].to_numpy(dtype=float)
        err = None
        if low and high and low in sub and sub[low].notna().any():
            lo = np.nan_to_num(vals - sub[low].to_numpy(dtype=float), nan=0.0)
            hi = np.nan_to_num(sub[high].to_numpy(dtype=float) - vals, nan=0.0)
            err = np.vstack([np.clip(lo, 0, None), np.clip(hi, 0, None)])
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width, vals, width, yerr=err, capsize=2, label=lab,
                      color=colours[i])
        if uneven:
            _bar_counts(ax, bars, pd.to_numeric(sub["paired_samples"], errors="coerce").to_numpy(dtype=float))
    ax.set_xticks(x)
    many = len(groups) >= 4
    ax.set_xticklabels(groups, rotation=30 if many else 0, ha="right" if many else "center", fontsize=7 if many else 8)
    _legend_outside(ax)


def _bar_counts(ax: Any, bars: Any, counts: np.ndarray) -> None:
    """``n=k`` above each bar (the samples it stands on)."""
    for rect, n in zip(bars, counts):
        if np.isfinite(n) and np.isfinite(rect.get_height()):
            ax.annotate(f"n={int(n)}", (rect.get_x() + rect.get_width() / 2, rect.get_height()), ha="center",
                        va="bottom", fontsize=5, xytext=(0, 1), textcoords="offset points")


def speedup_by_task(agg: pd.DataFrame, subtitle: str = "") -> Any:
    """Speedup vs vanilla per run group and configuration, with its bootstrap CI (vanilla omitted).

    Args:
        agg: :func:`harness.metrics.aggregate` (``group, task, label, decoder, speedup, speedup_low/high``).
    """
    agg = agg[(agg["decoder"] != "vanilla") & agg["speedup"].notna()] if not agg.empty else agg
    if agg.empty:
        log.info("speedup_by_task skipped: no decoder other than vanilla has paired rows")
        return None
    n = agg["group"].nunique() * agg["label"].nunique()
    fig, ax = plt.subplots(figsize=(max(4.5, 2.0 + 0.35 * n), 3.2))
    _grouped_bars(ax, agg, "speedup", "speedup_low", "speedup_high")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("speedup vs vanilla (mean of paired ratios)", fontsize=8)
    _titles(fig, "Speedup (error bars: 95% bootstrap CI over samples and repeats)", subtitle)
    return fig


def accept_length_by_decoder(agg: pd.DataFrame, subtitle: str = "") -> Any:
    """Accept length tau (new tokens per target forward) per run group and configuration, with its bootstrap
    CI; vanilla = 1."""
    agg = agg[agg["accept_length"].notna()] if not agg.empty else agg
    if agg.empty:
        log.info("accept_length_by_decoder skipped: no ok rows")
        return None
    n = agg["group"].nunique() * agg["label"].nunique()
    fig, ax = plt.subplots(figsize=(max(4.5, 2.0 + 0.35 * n), 3.2))
    _grouped_bars(ax, agg, "accept_length", "accept_length_low", "accept_length_high")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("accept length tau (tokens / target forward)", fontsize=8)
    _titles(fig, "Accept length tau (error bars: 95% bootstrap CI)", subtitle)
    return fig


def acceptance_by_position(positions: pd.DataFrame, subtitle: str = "", max_positions: int = 16) -> Any:
    """Per-position acceptance rate (solid) and conditional acceptance (dashed) per configuration.

    Args:
        positions: :func:`harness.metrics.acceptance_per_position`.
    """
    if positions.empty:
        log.info("acceptance_by_position skipped: no rows with per-step draft lists (accepted_per_step)")
        return None
    several = positions["group"].nunique() > 1
    keys = list(dict.fromkeys(zip(positions["group"], positions["label"])))
    colours = palette(len(keys))
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    for colour, (grp, lab) in zip(colours, keys):
        g = positions[(positions["group"] == grp) & (positions["label"] == lab)]
        g = g[g["position"] < max_positions]
        name = f"{lab} [{grp}]" if several else lab
        ax.plot(g["position"] + 1, g["rate"], marker="o", ms=3, label=name, color=colour)
        ax.plot(g["position"] + 1, g["conditional"], ls="--", lw=0.8, color=colour)
    ax.set_xlabel("draft position", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("acceptance rate", fontsize=8)
    ax.set_ylim(0, 1.05)
    _legend_outside(ax)
    _titles(fig, "Acceptance by draft position (solid: accepted / drafted; dashed: given the earlier ones "
                 "accepted)", subtitle)
    return fig


#: Preferred x axis of :func:`tokens_per_s_vs_param` when several hyper-parameters vary.
PREFERRED_X = ("gamma", "window_size", "ngram_size", "guess_set_size")


def _series_keys(agg: pd.DataFrame, decoder: str, x: str, varying: Sequence[str]) -> list[str]:
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


def tokens_per_s_vs_param(agg: pd.DataFrame, swept: Mapping[str, Sequence[str]], param: str | None = None,
                          subtitle: str = "") -> Any:
    """Tokens/s (left) and speedup with its CI (right) against a swept hyper-parameter (e.g. gamma), one line
    per decoder and per value of the other swept parameters.

    Args:
        agg: :func:`harness.metrics.aggregate` (one column per hyper-parameter).
        swept: decoder -> its swept hyper-parameters (:func:`harness.metrics.swept_params`).
        param: the x axis; None = the swept parameter with the most values (ties: gamma, window_size,
            ngram_size, guess_set_size, then first seen).
    """
    candidates = list(dict.fromkeys(p for ps in swept.values() for p in ps))
    if param is None and candidates:
        counts = {p: agg[p].astype(str).nunique() if p in agg else 0 for p in candidates}
        rank = {p: (PREFERRED_X.index(p) if p in PREFERRED_X else len(PREFERRED_X)) for p in candidates}
        param = max(candidates, key=lambda p: (counts[p], -rank[p]))
    if param is None or param not in candidates:
        log.info("tokens_per_s_vs_param skipped: no hyper-parameter takes more than one value%s",
                 f" ({param} is constant)" if param else "")
        return None
    agg = agg[agg[param].notna()] if param in agg else agg.iloc[0:0]
    if agg.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    others = {d: _series_keys(agg, d, param, ps) for d, ps in swept.items()}
    series = []
    for (grp, dec), g in agg.groupby(["group", "decoder"], sort=False):
        keys = others.get(dec, [])
        for key, s in (g.groupby(keys, sort=False, dropna=False) if keys else [((), g)]):
            key = key if isinstance(key, tuple) else (key,)
            name = dec + "".join(f" {k}={_fmt(v)}" for k, v in zip(keys, key))
            if agg["group"].nunique() > 1:
                name += f" [{grp}]"
            series.append((name, s))
    for colour, (name, s) in zip(palette(len(series)), series):
        s = s.assign(_x=pd.to_numeric(s[param], errors="coerce")).sort_values("_x")
        axes[0].plot(s["_x"], s["tokens_per_s"], marker="o", label=name, color=colour)
        yerr = np.vstack([(s["speedup"] - s["speedup_low"]).fillna(0).clip(lower=0),
                          (s["speedup_high"] - s["speedup"]).fillna(0).clip(lower=0)])
        axes[1].errorbar(s["_x"], s["speedup"], yerr=yerr, marker="o", capsize=3, label=name, color=colour)
    for ax in axes:
        ax.set_xlabel(param, fontsize=8)
        if (pd.to_numeric(agg[param], errors="coerce").dropna() % 1 == 0).all():
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("tokens / s", fontsize=8)
    axes[1].set_ylabel("speedup vs vanilla", fontsize=8)
    axes[1].axhline(1.0, color="gray", lw=0.8, ls="--")
    _legend_outside(axes[1])
    _titles(fig, f"Tokens/s and speedup against {param}", subtitle)
    fig.tight_layout()
    return fig


def accept_length_vs_nodes(agg: pd.DataFrame, subtitle: str = "") -> Any:
    """Accept length (left) and speedup with its CI (right) against the draft tree's node budget
    (``num_nodes``): OPT-Tree's scaling figure. Points are the aggregate's rows with a ``num_nodes`` (each its
    own decoder config, as in a tuning grid); one line per combination of the tree's other options
    (:data:`TREE_OPTIONS`) and run group. Skipped unless ``num_nodes`` takes two values or more."""
    if "num_nodes" not in agg or agg["num_nodes"].dropna().astype(str).nunique() < 2:
        log.info("accept_length_vs_nodes skipped: fewer than two node budgets in the rows")
        return None
    trees = agg[agg["num_nodes"].notna()].copy()
    options = [c for c in TREE_OPTIONS if c in trees and trees[c].astype(str).nunique() > 1]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    series = list(trees.groupby(["group", *options], sort=False, dropna=False)) if options or \
        trees["group"].nunique() > 1 else [((), trees)]
    for colour, (key, s) in zip(palette(len(series)), series):
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={_fmt(v)}" for k, v in zip(options, key[1:])) or "opt_tree"
        if trees["group"].nunique() > 1:
            name += f" [{key[0]}]"
        s = s.assign(_x=pd.to_numeric(s["num_nodes"], errors="coerce")).sort_values("_x")
        axes[0].plot(s["_x"], s["accept_length"], marker="o", label=name, color=colour)
        yerr = np.vstack([(s["speedup"] - s["speedup_low"]).fillna(0).clip(lower=0),
                          (s["speedup_high"] - s["speedup"]).fillna(0).clip(lower=0)])
        axes[1].errorbar(s["_x"], s["speedup"], yerr=yerr, marker="o", capsize=3, label=name, color=colour)
    budgets = sorted(pd.to_numeric(trees["num_nodes"], errors="coerce").dropna().unique())
    for ax in axes:
        ax.set_xlabel("node budget (num_nodes)", fontsize=8)
        ax.set_xticks(budgets)  # the budgets measured, not an evenly spaced (and crowded) scale
    axes[0].set_ylabel("accept length (tokens per target forward)", fontsize=8)
    axes[1].set_ylabel("speedup vs vanilla", fontsize=8)
    axes[1].axhline(1.0, color="gray", lw=0.8, ls="--")
    _legend_outside(axes[1])
    _titles(fig, "Accept length and speedup against the node budget", subtitle)
    fig.tight_layout()
    return fig


#: Options of a draft tree that make separate lines in :func:`accept_length_vs_nodes`.
TREE_OPTIONS = ("threshold", "max_depth", "cost_aware", "copy_tokens", "draft_on_copy")


#: Stacked phases of :func:`time_breakdown`: (column, legend).
PHASES = (("prefill_ms", "prefill (to the first token)"), ("draft_ms", "drafting"), ("verify_ms", "verifying"),
          ("decode_ms", "decode (phases not timed)"), ("other_ms", "other (host, bookkeeping)"))


def time_breakdown(breakdown: pd.DataFrame, subtitle: str = "") -> Any:
    """Where the time goes: prefill (time to the first token), then drafting vs verifying (decoders that time
    their phases) or the undivided decode, per configuration, as milliseconds per generated token.

    Args:
        breakdown: :func:`harness.metrics.time_breakdown` (``group, label, prefill_ms, draft_ms, verify_ms,
            decode_ms, other_ms``).
    """
    if breakdown.empty:
        log.info("time_breakdown skipped: rows have neither ttft_s nor draft_time_s / verify_time_s columns")
        return None
    names = [f"{lab} [{g}]" if breakdown["group"].nunique() > 1 else lab
             for g, lab in zip(breakdown["group"], breakdown["label"])]
    phases = [(c, name) for c, name in PHASES if c in breakdown and (breakdown[c].fillna(0) > 0).any()]
    fig, ax = plt.subplots(figsize=(max(4.8, 1.0 + 0.5 * len(names)), 3.2))
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    colours = dict(zip([c for c, _ in PHASES], palette(len(PHASES))))  # one colour per phase in every figure
    for col, name in phases:
        colour = colours[col]
        vals = breakdown[col].fillna(0).to_numpy(dtype=float)
        ax.bar(x, vals, bottom=bottom, label=name, color=colour)
        bottom += vals
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("ms per generated token", fontsize=8)
    _legend_outside(ax)
    _titles(fig, "Time per generated token by phase", subtitle)
    return fig


def warm_vs_cold(warm_cold: pd.DataFrame, subtitle: str = "") -> Any:
    """Warm start (n-gram pool kept across a task's samples, ``pool_scope=task``) vs cold start
    (``pool_scope=sample``): speedup and accept length per configuration.

    Args:
        warm_cold: :func:`harness.metrics.warm_cold` (``config`` = the configuration, ``label`` = cold/warm).
    """
    if warm_cold.empty:
        log.info("warm_vs_cold skipped: rows have no pool_scope column")
        return None
    agg = warm_cold.copy()
    agg["config"] = agg["config"].astype(str)
    if agg["group"].nunique() > 1:
        agg["config"] = agg["config"] + "\n" + agg["group"].astype(str)
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * agg["config"].nunique()), 3.4))
    _grouped_bars(axes[0], agg, "speedup", "speedup_low", "speedup_high", group="config")
    axes[0].axhline(1.0, color="gray", lw=0.8, ls="--")
    axes[0].set_ylabel("speedup vs vanilla", fontsize=8)
    axes[0].get_legend().remove() if axes[0].get_legend() else None
    _grouped_bars(axes[1], agg, "accept_length", "accept_length_low", "accept_length_high", group="config")
    axes[1].set_ylabel("accept length tau", fontsize=8)
    _titles(fig, "warm: n-gram pool kept across the task's samples (pool_scope=task); cold: cleared per sample",
            subtitle)
    fig.tight_layout()
    return fig


#: name -> (figure function, names of the frames it takes from :func:`draw_all`'s ``frames``).
FIGURES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "speedup_by_task": (speedup_by_task, ("agg",)),
    "accept_length": (accept_length_by_decoder, ("agg",)),
    "acceptance_by_position": (acceptance_by_position, ("positions",)),
    "tokens_per_s_vs_param": (tokens_per_s_vs_param, ("agg", "swept")),
    "accept_length_vs_nodes": (accept_length_vs_nodes, ("agg",)),
    "time_breakdown": (time_breakdown, ("breakdown",)),
    "warm_vs_cold": (warm_vs_cold, ("warm_cold",)),
}


def draw_all(frames: Mapping[str, Any], out_dir: str | Path, only: Sequence[str] | None = None,
             subtitle: str = "") -> dict[str, list[Path]]:
    """Draw every figure of :data:`FIGURES` (or those named in ``only``) from ``frames`` into ``out_dir``.

    Args:
        frames: ``agg``, ``positions``, ``breakdown``, ``warm_cold`` (DataFrames) and ``swept`` (a dict), as
            built by :func:`harness.report.figure_frames`.
        only: figure names; None = all that the frames support.
        subtitle: the line under every title (model pair, dtype, hardware, task size).

    Returns:
        figure name -> written paths (skipped figures are absent).

    Raises:
        ValueError: ``only`` names an unknown figure.
    """
    unknown = sorted(set(only or ()) - set(FIGURES))
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from {sorted(FIGURES)}")
    written: dict[str, list[Path]] = {}
    for name, (fn, needs) in FIGURES.items():
        if only and name not in only:
            continue
        try:
            fig = fn(*[frames[k] for k in needs], subtitle=subtitle)
        except Exception:  # one broken figure must not cost the others
            log.exception("figure %s failed", name)
            continue
        if fig is None:
            continue
        written[name] = save(fig, out_dir, name)
        log.info("wrote %s", written[name][0])
    return written
