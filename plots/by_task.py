"""The papers' speedup figure: tasks along x, one bar per configuration, warm start hatched on its cold bar
(:func:`task_bars`, drawn from :func:`harness.report.figdata.task_bars`). Like every figure of :mod:`plots`, it
computes no statistic and imports nothing of the harness."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from plots.style import COLUMN_WIDTH_IN, FONT, PAGE_WIDTH_IN, SMALL, Style, legend_below, plt, set_titles

log = logging.getLogger(__name__)


def task_bars(bars: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Speedup vs vanilla per task in the papers' shape (Ouroboros' main figure, OPT-Tree's comparison): tasks
    along x, one bar per configuration in its decoder's colour with its 95% interval where the samples allow one,
    short names in the key (settings in the caption), each task's n under its name; a warm-start twin drawn as the
    hatched part above its cold configuration's bar (a warm run slower than its cold twin: a white diamond at its
    value inside the bar). Each bar has its own interval: the cold bar's at its top, the warm start's (black) at
    the warm value.

    Args:
        bars: :func:`harness.report.figdata.task_bars` (``task, bar, warm, label, settings, speedup,
            speedup_low/high, paired_samples``).
    """
    if bars.empty:
        log.info("task_bars skipped: fewer than two tasks of one run group each")
        return None
    style = style or Style.of(bars.assign(label=bars["bar"]))
    tasks = list(dict.fromkeys(bars["task"].astype(str)))
    names = list(dict.fromkeys(bars.loc[~bars["warm"].astype(bool), "bar"].astype(str)))
    slot = 0.84 / max(1, len(names))
    wide = len(tasks) * len(names) > 14
    fig, ax = plt.subplots(layout="constrained", figsize=(PAGE_WIDTH_IN if wide else COLUMN_WIDTH_IN, 2.4))
    x0 = np.arange(len(tasks), dtype=float)
    any_warm = False
    for j, name in enumerate(names):
        x = x0 - 0.42 + slot * (j + 0.5)
        of = bars[bars["bar"].astype(str) == name]
        cold = of[~of["warm"].astype(bool)].drop_duplicates("task").set_index("task").reindex(tasks)
        vals = pd.to_numeric(cold["speedup"], errors="coerce").to_numpy(dtype=float)
        lo = pd.to_numeric(cold.get("speedup_low"), errors="coerce").to_numpy(dtype=float)
        hi = pd.to_numeric(cold.get("speedup_high"), errors="coerce").to_numpy(dtype=float)
        err = np.vstack([np.clip(np.nan_to_num(vals - lo), 0, None), np.clip(np.nan_to_num(hi - vals), 0, None)])
        colour = style.colour(name)
        ax.bar(x, vals, slot * 0.92, yerr=err, capsize=1.2, color=colour, label=name, error_kw={"elinewidth": 0.6})
        warm = of[of["warm"].astype(bool)].drop_duplicates("task").set_index("task").reindex(tasks)
        wvals = pd.to_numeric(warm["speedup"], errors="coerce").to_numpy(dtype=float)
        if np.isfinite(wvals).any():
            extra = np.where(np.isfinite(wvals), np.clip(wvals - vals, 0, None), 0.0)
            ax.bar(x, extra, slot * 0.92, bottom=vals, color=colour, alpha=0.35, hatch="////", edgecolor="black",
                   linewidth=0.3, label=None if any_warm else "warm start (extra)")
            wlo = pd.to_numeric(warm.get("speedup_low"), errors="coerce").to_numpy(dtype=float)
            whi = pd.to_numeric(warm.get("speedup_high"), errors="coerce").to_numpy(dtype=float)
            shown = np.isfinite(wvals) & np.isfinite(wlo) & np.isfinite(whi)
            if shown.any():  # the warm start's own interval, at its value (the hatched part's top, or its diamond)
                ax.errorbar(x[shown], wvals[shown], yerr=np.vstack([np.clip(wvals - wlo, 0, None)[shown],
                                                                    np.clip(whi - wvals, 0, None)[shown]]),
                            fmt="none", ecolor="black", elinewidth=0.6, capsize=1.2, zorder=5,
                            label="_warm start interval")
            below = np.isfinite(wvals) & (wvals < vals)
            ax.scatter(x[below], wvals[below], marker="D", s=12, facecolors="white", edgecolors="black",
                       linewidths=0.7, zorder=4, label=None if any_warm or not below.any() else "warm start (slower)")
            any_warm = True
    ax.axhline(1.0, color="gray", lw=0.6, ls="--")
    counts = {t: sorted({int(n) for n in pd.to_numeric(g["paired_samples"], errors="coerce").dropna()})
              for t, g in bars.groupby(bars["task"].astype(str), sort=False)} if "paired_samples" in bars else {}
    ax.set_xticks(x0)
    ax.set_xticklabels([t + (f"\nn={counts[t][0]}" if len(counts.get(t, [])) == 1 else
                             f"\nn={counts[t][0]}-{counts[t][-1]}" if counts.get(t) else "") for t in tasks],
                       fontsize=SMALL)
    ax.tick_params(axis="y", labelsize=SMALL)
    ax.set_ylabel("speedup vs vanilla", fontsize=FONT)
    legend_below(ax, ncol=min(4, len(names) + any_warm))
    drawn = "speedup_low" in bars and pd.to_numeric(bars["speedup_low"], errors="coerce").notna().any()
    settings = dict.fromkeys(f"{lab}: {st}" for lab, st in zip(bars["label"], bars.get("settings", bars["label"]))
                             if isinstance(st, str) and st)
    set_titles(fig, "Speedup vs vanilla per task (mean of paired per-sample ratios"
               + (", 95% bootstrap CI where n allows" if drawn else ", no interval: too few samples") + ")"
               + ("; hatched: the extra speedup of warm start (n-gram pool kept across the task's samples) over "
                  "the cold bar" if any_warm else "")
               + (f". Settings: {'; '.join(settings)}" if settings else ""), subtitle)
    return fig
