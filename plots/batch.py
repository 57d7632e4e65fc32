"""Speculation under load (:func:`speedup_vs_batch`): speedup and throughput against the static batch size
(``runner.batch_size``), where speculation stops paying marked. Speculation spends spare compute and batching spends
the same compute, so a decoder's speedup over vanilla at the same batch size falls as the batch grows; the crossover
is the first batch size measured where it is below 1. Like every figure of :mod:`plots`, it computes no statistic and
imports nothing of the harness."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from plots.style import FAMILY_COLOURS, FONT, OTHER_COLOURS, PAGE_WIDTH_IN, SMALL, Style, family, fmt_tick, \
    legend_below, plt, set_titles

log = logging.getLogger(__name__)


def crossover(points: pd.DataFrame) -> float | None:
    """The smallest batch size whose speedup is below 1 after one at or above 1 (``points``: ``batch_size``,
    ``speedup``), ``None`` when the speedup never falls below 1 (or is below 1 from the start: no crossover seen)."""
    s = points.sort_values("batch_size")
    above = False
    for b, v in zip(s["batch_size"], s["speedup"]):
        if v >= 1:
            above = True
        elif above:
            return float(b)
    return None


def speedup_vs_batch(agg: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Throughput (left: the batch calls' tokens per second, ``batch_tokens_per_s``; ``tokens_per_s`` at batch size 1)
    and speedup vs vanilla at the same batch size with its interval (right), against the batch size, one line per
    decoder configuration; the crossover of each (:func:`crossover`) as a dotted line on the right panel, named in the
    caption, which says when the interval there still reaches 1x (the crossover is then not resolved). Skipped unless
    the rows hold two batch sizes or more.

    Args:
        agg: :func:`harness.rows.metrics.aggregate` over runs at several ``runner.batch_size`` (each its own group):
            ``label, batch_size, speedup, speedup_low, speedup_high, batch_tokens_per_s, tokens_per_s``.
    """
    if "batch_size" not in agg or agg["batch_size"].dropna().nunique() < 2:
        log.info("speedup_vs_batch skipped: fewer than two batch sizes in the rows")
        return None
    style = style or Style()
    rows = agg[agg["batch_size"].notna()].copy()
    rows["batch_size"] = pd.to_numeric(rows["batch_size"], errors="coerce")
    throughput = pd.to_numeric(rows.get("batch_tokens_per_s"), errors="coerce") if "batch_tokens_per_s" in rows \
        else pd.Series(np.nan, index=rows.index)
    rows["_throughput"] = throughput.fillna(pd.to_numeric(rows["tokens_per_s"], errors="coerce"))
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(PAGE_WIDTH_IN, 2.8))
    others = iter(OTHER_COLOURS * 4)
    crossings = []
    for label, s in rows.groupby("label", sort=False):
        s = s.sort_values("batch_size")
        colour = FAMILY_COLOURS.get(family(str(label))) or next(others)
        axes[0].plot(s["batch_size"], s["_throughput"], marker="o", ms=2.5, lw=0.9, color=colour, label=str(label))
        if str(label) == "vanilla":
            continue
        yerr = np.vstack([(s["speedup"] - s["speedup_low"]).fillna(0).clip(lower=0),
                          (s["speedup_high"] - s["speedup"]).fillna(0).clip(lower=0)])
        axes[1].errorbar(s["batch_size"], s["speedup"], yerr=yerr, marker="o", ms=2.5, lw=0.9, capsize=2,
                         color=colour)
        b = crossover(s)
        if b is not None:
            axes[1].axvline(b, color=colour, lw=0.7, ls=":")
            high = pd.to_numeric(s.loc[s["batch_size"] == b, "speedup_high"], errors="coerce").max()
            unsure = f" (its interval reaches 1x: {high:.2f})" if pd.notna(high) and high >= 1 else ""
            crossings.append(f"{label} at batch size {fmt_tick(b)}{unsure}")
        elif (s["speedup"] < 1).all():
            crossings.append(f"{label} below 1x at every batch size")
    sizes = sorted(rows["batch_size"].dropna().unique())
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([fmt_tick(b) for b in sizes])
        ax.set_xlabel("batch size (requests decoded together)", fontsize=FONT)
        ax.tick_params(labelsize=SMALL)
    axes[0].set_ylabel("throughput (tokens / s)", fontsize=FONT)
    axes[1].axhline(1.0, color="gray", lw=0.6, ls="--")
    axes[1].set_ylabel("speedup vs vanilla at the same batch size", fontsize=FONT)
    legend_below(axes[0], ncol=2, where="center")
    where = ("speculation stops paying (first batch size below 1x): " + "; ".join(crossings)) if crossings else \
        f"no crossover up to batch size {fmt_tick(sizes[-1])}"
    set_titles(fig, f"Throughput and speedup against the batch size; {where}", subtitle)
    return fig
