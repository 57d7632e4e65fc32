"""Figures from aggregated frames: one function per figure, each taking the frame(s) it draws, a subtitle and
a :class:`Style`, returning a matplotlib Figure, or None when the frame cannot support that figure (the reason
is logged).

The frames come from :mod:`harness.rows.metrics` through the report (``python -m harness.report RUN --plots``,
which calls :func:`draw_all`); this package imports nothing of the harness or torch (of the decoders only their
torch-free settings, for a draft tree's options), and computes no statistic itself: it draws what it is given.
:func:`save` writes PNG and PDF. The figures of the bars live here, those of swept settings in :mod:`plots.sweeps`,
and one module each holds the batch, per-task, per-sample and step-cost figures.

Made for a paper: one-column figures are :data:`COLUMN_WIDTH_IN` wide, two-panel ones
:data:`PAGE_WIDTH_IN`; configurations are rows of horizontal bars (their names on the axis, never rotated);
several run groups are stacked panels titled with their group, so a group's name is written once; legends sit
under the axes; every decoder has the same colour in every figure of a report (:data:`FAMILY_COLOURS`,
shades for several configurations of one decoder); integral hyper-parameters print as integers; bars that
stand on different numbers of samples say their ``n``. Titles stay out of the images, as a paper sets them: each
figure's caption (what it shows, then the model pair, dtype, hardware and task size) goes to ``captions.md``
beside the files (:func:`plots.style.set_titles`, :func:`save`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from plots.style import (COLUMN_WIDTH_IN, FONT, PAGE_WIDTH_IN, SMALL, Style, bar_rows, caption,  # noqa: F401
                         group_panels, legend_below, palette, plt, record_caption, save, set_titles, stacked_axes,
                         wrap_text)

from plots.batch import speedup_vs_batch  # speculation under load: against the static batch size
from plots.by_task import task_bars  # the papers' grouped bars per task, a module of its own
from plots.costs import insitu_vs_bare  # step costs in situ against the bare models' cost curves
from plots.per_sample import speedup_per_sample  # the spread of speedups over samples
from plots.sweeps import (accept_length_vs_nodes, accept_length_vs_threshold,  # swept settings, OPT-Tree's scaling
                          tokens_per_s_vs_param)

log = logging.getLogger(__name__)

__all__ = [
    "speedup_by_task", "accept_length_by_decoder", "acceptance_by_position", "tokens_per_s_vs_param",
    "accept_length_vs_nodes", "accept_length_vs_threshold",
    "time_breakdown", "warm_vs_cold", "compare_speedups", "task_bars",
    "speedup_per_sample", "speedup_vs_batch", "insitu_vs_bare", "Style", "palette",
    "save", "caption",
    "draw_all", "FIGURES",
]


def _hbars(ax: Any, sub: pd.DataFrame, value: str, style: Style, low: str | None = None,
           high: str | None = None, counts: bool = False) -> None:
    """One horizontal bar per configuration (top to bottom in table order), with its interval when given and
    ``n=k`` when the bars stand on different numbers of samples."""
    sub = sub.drop_duplicates("label")
    labels = sub["label"].astype(str).tolist()
    y = bar_rows(ax, labels, style)
    vals = pd.to_numeric(sub[value], errors="coerce").to_numpy(dtype=float)
    err = None
    if low and high and low in sub and sub[low].notna().any():
        lo = np.nan_to_num(vals - pd.to_numeric(sub[low], errors="coerce").to_numpy(dtype=float), nan=0.0)
        hi = np.nan_to_num(pd.to_numeric(sub[high], errors="coerce").to_numpy(dtype=float) - vals, nan=0.0)
        err = np.vstack([np.clip(lo, 0, None), np.clip(hi, 0, None)])
    ax.barh(y, vals, 0.9, xerr=err, capsize=1.5, color=[style.colour(lab) for lab in labels],
            error_kw={"elinewidth": 0.6})
    ax.tick_params(axis="x", labelsize=SMALL)
    if counts and "paired_samples" in sub:
        for yy, v, n in zip(y, vals, pd.to_numeric(sub["paired_samples"], errors="coerce")):
            if np.isfinite(v) and np.isfinite(n):
                ax.annotate(f"n={int(n)}", (v, yy), xytext=(2, 0), textcoords="offset points", va="center",
                            fontsize=SMALL - 1)


def _bar_figure(agg: pd.DataFrame, value: str, xlabel: str, title: str, subtitle: str, style: Style | None,
                reference: float | None = 1.0) -> Any:
    panels = group_panels(agg)
    style = style or Style.of(agg)
    uneven = "paired_samples" in agg and pd.to_numeric(agg["paired_samples"], errors="coerce").nunique() > 1
    fig, axes = stacked_axes(panels, COLUMN_WIDTH_IN, style)
    for ax, (group, sub) in zip(axes, panels):
        _hbars(ax, sub, value, style, f"{value}_low", f"{value}_high", counts=uneven)
        if reference is not None:
            ax.axvline(reference, color="gray", lw=0.6, ls="--")
        if group:
            ax.set_title(wrap_text(group, COLUMN_WIDTH_IN / 2), fontsize=SMALL, loc="left")
    axes[-1].set_xlabel(xlabel, fontsize=FONT)
    low = f"{value}_low"
    drawn = pd.to_numeric(agg[low], errors="coerce").notna() if low in agg else pd.Series(False, index=agg.index)
    if not drawn.all():  # the aggregation gives no interval on too few samples: the title must not promise one
        title = title.replace(", 95% bootstrap CI", ", 95% bootstrap CI where n allows" if drawn.any()
                              else ", no interval (too few samples)")
    set_titles(fig, title, subtitle)
    return fig


def speedup_by_task(agg: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Speedup vs vanilla per configuration with its bootstrap CI, one panel per run group (vanilla omitted).

    Args:
        agg: :func:`harness.rows.metrics.aggregate` (``group, label, decoder, speedup, speedup_low/high``).
    """
    agg = agg[(agg["decoder"] != "vanilla") & agg["speedup"].notna()] if not agg.empty else agg
    if agg.empty:
        log.info("speedup_by_task skipped: no decoder other than vanilla has paired rows")
        return None
    return _bar_figure(agg, "speedup", "speedup vs vanilla",
                       "Speedup vs vanilla: mean of paired per-sample ratios, 95% bootstrap CI", subtitle, style)


def accept_length_by_decoder(agg: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Accept length tau (new tokens per target forward) per configuration with its bootstrap CI, one panel per
    run group; vanilla = 1."""
    agg = agg[agg["accept_length"].notna()] if not agg.empty else agg
    if agg.empty:
        log.info("accept_length_by_decoder skipped: no ok rows")
        return None
    return _bar_figure(agg, "accept_length", "tokens per target forward",
                       "Accept length tau: new tokens per target forward, 95% bootstrap CI", subtitle, style)


def acceptance_by_position(positions: pd.DataFrame, subtitle: str = "", max_positions: int = 16,
                           style: Style | None = None) -> Any:
    """Per-position acceptance rate (solid) and conditional acceptance (dashed) per configuration, one panel
    per run group.

    Args:
        positions: :func:`harness.report.figdata.acceptance_per_position`.
    """
    if positions.empty:
        log.info("acceptance_by_position skipped: no linear-draft rows with per-step draft lists (accepted_per_step)")
        return None
    style = style or Style.of(positions)
    panels = group_panels(positions)
    legend_lines = sum(style.name(str(lab)).count("\n") + 1 for lab in dict.fromkeys(positions["label"]))
    fig, axes = plt.subplots(len(panels), 1, layout="constrained", squeeze=False, sharex=True,
                             figsize=(COLUMN_WIDTH_IN, 0.8 + 2.1 * len(panels) + 0.12 * legend_lines))
    for ax, (group, sub) in zip(axes[:, 0], panels):
        for lab, g in sub.groupby("label", sort=False):
            g = g[g["position"] < max_positions]
            colour = style.colour(str(lab))
            ax.plot(g["position"] + 1, g["rate"], marker="o", ms=2, lw=0.9, label=style.name(str(lab)), color=colour)
            ax.plot(g["position"] + 1, g["conditional"], ls="--", lw=0.6, color=colour)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("acceptance rate", fontsize=FONT)
        ax.tick_params(labelsize=SMALL)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if group:
            ax.set_title(wrap_text(group, COLUMN_WIDTH_IN / 2), fontsize=SMALL, loc="left")
    handles = {}
    for ax in axes[:, 0]:  # one legend for every panel: a configuration has one colour throughout
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_below(axes[-1, 0], ncol=1, handles=list(handles.values()), labels=list(handles))
    axes[-1, 0].set_xlabel("draft position", fontsize=FONT)
    set_titles(fig, "Acceptance by draft position, linear drafts (solid: accepted / drafted; dashed: given the "
                 "earlier ones accepted)", subtitle)
    return fig


#: Stacked phases of :func:`time_breakdown`: (column, legend, grey level); greys, so that no phase takes a
#: decoder's colour (the decoders are the rows here).
PHASES = (("prefill_ms", "prefill (both models)", "#e0e0e0"), ("draft_ms", "drafting", "#8c8c8c"),
          ("verify_ms", "verifying", "#404040"), ("decode_ms", "decode (phases not timed)", "#b8b8b8"),
          ("other_ms", "other (host, bookkeeping)", "#f7f7f7"))


def time_breakdown(breakdown: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Where the time goes, as milliseconds per generated token: both prefills, then drafting vs verifying
    (decoders that time their phases) or the undivided decode, one horizontal stacked bar per configuration,
    one panel per run group.

    Args:
        breakdown: :func:`harness.report.figdata.time_breakdown` (``group, label, prefill_ms, draft_ms, verify_ms,
            decode_ms, other_ms``).
    """
    if breakdown.empty:
        log.info("time_breakdown skipped: rows have neither ttft_s nor draft_time_s / verify_time_s columns")
        return None
    style = style or Style()
    # a phase is drawn (and in the legend) when it is visible: at least 1 % of some bar
    total = breakdown[[p[0] for p in PHASES if p[0] in breakdown]].fillna(0).sum(axis=1)
    phases = [p for p in PHASES if p[0] in breakdown and (breakdown[p[0]].fillna(0) > 0.01 * total).any()]
    panels = group_panels(breakdown)
    fig, axes = stacked_axes(panels, COLUMN_WIDTH_IN, style)
    for ax, (group, sub) in zip(axes, panels):
        sub = sub.drop_duplicates("label")
        y = bar_rows(ax, [str(lab) for lab in sub["label"]], style)
        left = np.zeros(len(sub))
        for col, name, colour in phases:
            vals = sub[col].fillna(0).to_numpy(dtype=float)
            ax.barh(y, vals, 0.9, left=left, label=name, color=colour, edgecolor="black", linewidth=0.3)
            left += vals
        ax.tick_params(axis="x", labelsize=SMALL)
        ax.set_xlim(0, max(1e-9, float(left.max())) * 1.05)  # the tallest bar inside the axes
        if group:
            ax.set_title(wrap_text(group, COLUMN_WIDTH_IN / 2), fontsize=SMALL, loc="left")
    axes[-1].set_xlabel("ms per generated token", fontsize=FONT)
    legend_below(axes[-1], ncol=2)
    set_titles(fig, "Time per generated token by phase", subtitle)
    return fig


def warm_vs_cold(warm_cold: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Warm start (n-gram pool kept across a task's samples, ``pool_scope=task``) vs cold start
    (``pool_scope=sample``): speedup and accept length per configuration.

    Args:
        warm_cold: :func:`harness.report.figdata.warm_cold` (``config`` = the configuration, ``label`` = cold/warm).
    """
    if warm_cold.empty or warm_cold["label"].nunique() < 2:
        log.info("warm_vs_cold skipped: %s", "rows have no pool_scope column" if warm_cold.empty else
                 f"only {warm_cold['label'].iloc[0]} pools in the rows (a warm decoder and its cold twin are "
                 "needed)")
        return None
    agg = warm_cold.copy()
    agg["config"] = agg["config"].astype(str)
    if agg["group"].nunique() > 1:
        agg["config"] = agg["config"] + " [" + agg["group"].astype(str) + "]"
    configs = list(dict.fromkeys(agg["config"]))
    scope_colours = {"cold": "#56B4E9", "warm": "#D55E00"}
    fig, axes = plt.subplots(1, 2, layout="constrained", sharey=True,
                             figsize=(PAGE_WIDTH_IN, 0.9 + 0.32 * len(configs)))
    for ax, value, xlabel in ((axes[0], "speedup", "speedup vs vanilla"), (axes[1], "accept_length",
                                                                           "accept length tau")):
        for j, (scope, sub) in enumerate(agg.groupby("label", sort=False)):
            sub = sub.set_index("config").reindex(configs)
            y = np.arange(len(configs))[::-1] + (0.2 if j == 0 else -0.2)
            vals = pd.to_numeric(sub[value], errors="coerce").to_numpy(dtype=float)
            lo = np.clip(np.nan_to_num(vals - pd.to_numeric(sub[f"{value}_low"], errors="coerce"), nan=0), 0, None)
            hi = np.clip(np.nan_to_num(pd.to_numeric(sub[f"{value}_high"], errors="coerce") - vals, nan=0), 0, None)
            ax.barh(y, vals, 0.38, xerr=np.vstack([lo, hi]), capsize=1.5, label=str(scope),
                    color=scope_colours.get(str(scope)), error_kw={"elinewidth": 0.6})
        ax.set_xlabel(xlabel, fontsize=FONT)
        ax.tick_params(labelsize=SMALL)
    axes[0].axvline(1.0, color="gray", lw=0.6, ls="--")
    axes[0].set_yticks(np.arange(len(configs))[::-1])
    axes[0].set_yticklabels([wrap_text(c, 2.0) for c in configs], fontsize=SMALL)
    legend_below(axes[0], ncol=2)
    set_titles(fig, "warm: n-gram pool kept across the task's samples (pool_scope=task); cold: cleared per sample",
            subtitle)
    return fig


def compare_speedups(cmp: pd.DataFrame, subtitle: str = "") -> Any:
    """Two runs side by side (``harness.report.build --compare``): each configuration's speedup in run A and in run
    B (bars), on the samples both cover.

    Args:
        cmp: :func:`harness.report.compare.compare_runs` (``label, speedup_a, speedup_b``).
    """
    if "decoder" in cmp:  # vanilla's rows have no speedup bar (compare_runs names each row's decoder)
        cmp = cmp[cmp["decoder"] != "vanilla"]
    elif "label" in cmp:
        cmp = cmp[cmp["label"] != "vanilla"]
    if cmp.empty or not {"speedup_a", "speedup_b"} & set(cmp.columns):
        log.info("compare figure skipped: no decoder with a speedup on either side")
        return None
    labels = list(dict.fromkeys(cmp["label"].astype(str)))
    fig, ax = plt.subplots(layout="constrained", figsize=(COLUMN_WIDTH_IN, 0.9 + 0.3 * len(labels)))
    y = np.arange(len(labels))[::-1]
    for j, (side, colour) in enumerate((("a", "#999999"), ("b", "#0072B2"))):
        vals = pd.to_numeric(cmp.set_index("label").reindex(labels).get(f"speedup_{side}"), errors="coerce")
        ax.barh(y + (0.2 if j == 0 else -0.2), vals.to_numpy(dtype=float), 0.38, label=f"run {side.upper()}",
                color=colour)
    ax.axvline(1.0, color="gray", lw=0.6, ls="--")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=SMALL)
    ax.tick_params(axis="x", labelsize=SMALL)
    ax.set_xlabel("speedup vs vanilla", fontsize=FONT)
    legend_below(ax, ncol=2)
    set_titles(fig, "Run A vs run B: speedup vs each run's own vanilla, on the samples both cover", subtitle)
    return fig


#: name -> (figure function, names of the frames it takes from :func:`draw_all`'s ``frames``).
FIGURES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "speedup_by_task": (speedup_by_task, ("agg",)),
    "accept_length": (accept_length_by_decoder, ("agg",)),
    "acceptance_by_position": (acceptance_by_position, ("positions",)),
    "tokens_per_s_vs_param": (tokens_per_s_vs_param, ("agg", "swept")),
    "accept_length_vs_nodes": (accept_length_vs_nodes, ("agg",)),
    "accept_length_vs_threshold": (accept_length_vs_threshold, ("agg",)),
    "time_breakdown": (time_breakdown, ("breakdown",)),
    "warm_vs_cold": (warm_vs_cold, ("warm_cold",)),
    "task_bars": (task_bars, ("task_bars",)),
    "speedup_per_sample": (speedup_per_sample, ("per_sample", "agg")),
    "speedup_vs_batch": (speedup_vs_batch, ("agg",)),
    "insitu_vs_bare": (insitu_vs_bare, ("bare_costs",)),
}


def draw_all(frames: Mapping[str, Any], out_dir: str | Path, only: Sequence[str] | None = None,
             subtitle: str = "") -> dict[str, list[Path]]:
    """Draw every figure of :data:`FIGURES` (or those named in ``only``) from ``frames`` into ``out_dir``, all
    in one :class:`Style` built from ``frames["agg"]`` (a decoder keeps its colour across the figures).

    Args:
        frames: ``agg``, ``positions``, ``breakdown``, ``warm_cold``, ``task_bars``, ``per_sample``,
            ``bare_costs`` (DataFrames) and ``swept`` (a dict), as built by :func:`harness.report.build.figure_frames`.
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
    style = Style.of(frames.get("agg"))
    written: dict[str, list[Path]] = {}
    for name, (fn, needs) in FIGURES.items():
        if only and name not in only:
            continue
        try:
            fig = fn(*[frames[k] for k in needs], subtitle=subtitle, style=style)
        except Exception:  # one broken figure must not cost the others
            log.exception("figure %s failed", name)
            fig = None
        if fig is None:  # an earlier report's file of this figure would now be stale
            for stale in (Path(out_dir) / f"{name}.png", Path(out_dir) / f"{name}.pdf"):
                if stale.exists():
                    stale.unlink()
                    log.info("removed %s: the rows no longer support this figure", stale)
            record_caption(out_dir, name, None)
            continue
        written[name] = save(fig, out_dir, name)
        log.info("wrote %s", written[name][0])
    return written
