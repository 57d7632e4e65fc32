"""How a configuration's speedup spreads over the task's samples (:func:`speedup_per_sample`, drawn from
:func:`harness.report.figdata.per_sample_speedups` and the aggregate). The tables give one mean per configuration;
per problem the speedup of one decoder can range from ~1x to 4x, and the two estimators (mean of per-sample
ratios, ratio of totals) part where long and short answers differ. Like every figure of :mod:`plots`, it computes
no statistic and imports nothing of the harness."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from plots.style import COLUMN_WIDTH_IN, FONT, SMALL, Style, bar_rows, group_panels, legend_below, set_titles, \
    stacked_axes

log = logging.getLogger(__name__)

#: Fewest samples of one configuration for the figure to be drawn (fewer dots show no distribution).
MIN_SAMPLES = 3


def speedup_per_sample(per_sample: pd.DataFrame, agg: pd.DataFrame, subtitle: str = "",
                       style: Style | None = None) -> Any:
    """One dot per sample (its paired speedup, averaged over its turns and repeats) per configuration, in the
    decoder's colour; a black tick at the configuration's mean of per-sample ratios (the tables' speedup) and a
    white diamond at its ratio of totals (``speedup_total``: vanilla's seconds per token over the decoder's, over
    the same rows); one panel per run group. Skipped unless some configuration has :data:`MIN_SAMPLES` samples.

    Args:
        per_sample: ``group, label, sample_id, speedup, rows``
            (:func:`harness.report.figdata.per_sample_speedups`).
        agg: :func:`harness.rows.metrics.aggregate` (``group, label, speedup, speedup_total``), for the markers
            and the configurations' order.
    """
    if per_sample.empty or per_sample.groupby(["group", "label"]).size().max() < MIN_SAMPLES:
        log.info("speedup_per_sample skipped: no configuration has %d paired samples", MIN_SAMPLES)
        return None
    style = style or Style.of(agg)
    order = {(str(g), str(lab)): i for i, (g, lab) in enumerate(zip(agg.get("group", []), agg.get("label", [])))}
    frame = per_sample.assign(_order=[order.get((str(g), str(lab)), len(order))
                                      for g, lab in zip(per_sample["group"], per_sample["label"])])
    frame = frame.sort_values("_order", kind="stable")
    cells = {(str(g), str(lab)): r for g, lab, r in zip(agg.get("group", []), agg.get("label", []),
                                                         agg.to_dict("records"))}
    panels = group_panels(frame)
    fig, axes = stacked_axes(panels, COLUMN_WIDTH_IN, style)
    rng = np.random.default_rng(0)  # the dots' vertical jitter only: the same picture every time
    for ax, (title, sub) in zip(axes, panels):
        group = str(sub["group"].iloc[0])
        labels = list(dict.fromkeys(sub["label"].astype(str)))
        y = bar_rows(ax, labels, style)
        for yy, lab in zip(y, labels):
            vals = pd.to_numeric(sub.loc[sub["label"].astype(str) == lab, "speedup"], errors="coerce").dropna()
            ax.scatter(vals, yy + rng.uniform(-0.3, 0.3, len(vals)), s=9, color=style.colour(lab), alpha=0.75,
                       linewidths=0, zorder=2)
            cell = cells.get((group, lab), {})
            mean, total = cell.get("speedup"), cell.get("speedup_total")
            if mean is not None and np.isfinite(mean):
                ax.plot([mean, mean], [yy - 0.45, yy + 0.45], color="black", lw=1.1, zorder=3)
            if total is not None and np.isfinite(total):
                ax.scatter([total], [yy], marker="D", s=14, facecolors="white", edgecolors="black",
                           linewidths=0.7, zorder=4)
        ax.axvline(1.0, color="gray", lw=0.6, ls="--")
        ax.tick_params(axis="x", labelsize=SMALL)
        if title:
            ax.set_title(title, fontsize=SMALL, loc="left")
    axes[-1].set_xlabel("speedup vs vanilla, per sample", fontsize=FONT)
    handles = [Line2D([], [], marker="o", ls="", color="gray", markersize=3),
               Line2D([], [], color="black", lw=1.1),
               Line2D([], [], marker="D", ls="", markerfacecolor="white", markeredgecolor="black", markersize=4)]
    legend_below(axes[-1], ncol=3, handles=handles,
                 labels=["one sample", "mean of ratios", "ratio of totals"])
    n = per_sample.groupby(["group", "label"]).size()
    counts = f"{n.min()}" if n.min() == n.max() else f"{n.min()}-{n.max()}"
    set_titles(fig, f"Speedup vs vanilla per sample ({counts} samples per configuration; each dot one sample's "
                    "paired ratio of tok/s, averaged over its turns and repeats); tick: the mean of per-sample "
                    "ratios (the tables' speedup); diamond: the ratio of totals (vanilla's seconds per token over "
                    "the configuration's)", subtitle)
    return fig
