"""Step costs in situ against the bare models (:func:`insitu_vs_bare`): what a decoder's verify and draft forwards
cost inside its decode loop, set on the cost curves of the bare models timed on the same machine in the same job.
The gap between a point and its curve is the decoder's own work on top of the forward: cache edits, masks, the
acceptance rule, host round trips. Like every figure of :mod:`plots`, it computes no statistic and imports nothing
of the harness."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd

from plots.style import COLUMN_WIDTH_IN, FONT, SMALL, Style, fmt_tick, legend_below, plt, set_titles

log = logging.getLogger(__name__)

#: Panel -> (its model in words, the x axis).
PANELS = {"verify": ("target", "tokens fed per verify forward"),
          "draft": ("draft model", "tokens fed per draft forward")}


def insitu_vs_bare(costs: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Two panels (verify: the target; draft: the draft model), each the bare model's cost of a forward against the
    tokens it is fed (a line; the unit is the target's bare one-token forward) and one marker per decoder
    configuration at its mean tokens per forward and its in-situ cost per forward. Log-scaled x. Skipped when the
    rows recorded no curve or no decoder has a point.

    Args:
        costs: :func:`harness.report.figdata.bare_costs`: ``panel, kind, label, k, cost, curves``.
    """
    if costs is None or costs.empty or not (costs["kind"] == "decoder").any():
        log.info("insitu_vs_bare skipped: no bare cost curve or no decoder's in-situ cost in the rows")
        return None
    style = style or Style()
    panels = [p for p in PANELS if ((costs["panel"] == p) & (costs["kind"] == "decoder")).any()
              and ((costs["panel"] == p) & (costs["kind"] == "curve")).any()]
    if not panels:
        log.info("insitu_vs_bare skipped: no panel has both a curve and a decoder's point")
        return None
    fig, axes = plt.subplots(len(panels), 1, layout="constrained",
                             figsize=(COLUMN_WIDTH_IN, 1.7 * len(panels) + 0.6), squeeze=False)
    seen: dict[str, Any] = {}
    counts = []
    for ax, panel in zip(axes[:, 0], panels):
        model, xlabel = PANELS[panel]
        curve = costs[(costs["panel"] == panel) & (costs["kind"] == "curve")].sort_values("k")
        ax.plot(curve["k"], curve["cost"], color="gray", lw=0.9, marker=".", ms=3, label="bare model")
        counts.append(int(curve["curves"].max()))
        points = costs[(costs["panel"] == panel) & (costs["kind"] == "decoder")]
        for label, p in points.groupby("label", sort=False):
            handle = ax.scatter(p["k"], p["cost"], s=14, color=style.colour(str(label)), zorder=3,
                                label=style.names.get(str(label), str(label)))
            seen.setdefault(style.names.get(str(label), str(label)), handle)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(curve["k"]))  # the sizes timed, written as numbers (1, 2, 4, ...)
        ax.set_xticklabels([fmt_tick(k) for k in curve["k"]])
        ax.minorticks_off()
        ax.set_xlabel(xlabel, fontsize=FONT)
        ax.set_ylabel(f"{model}: seconds per forward\n/ bare target token", fontsize=FONT)
        ax.tick_params(labelsize=SMALL)
        ax.set_ylim(bottom=0)
    handles = [axes[0, 0].get_legend_handles_labels()[0][0], *seen.values()]
    legend_below(axes[-1, 0], ncol=1, handles=handles, labels=["bare model", *seen])
    many = f" (median of {max(counts)} curves)" if max(counts) > 1 else ""
    set_titles(fig, "In-situ step costs against the bare models' cost curves, in units of the target's bare "
               f"one-token forward timed in the same job{many}: a point above its curve is the decoder's own work "
               "(cache edits, masks, acceptance, host round trips) on top of the forward; one below it, a forward "
               "cheaper in situ than the single bare timing (timing noise, or a shorter context than the job's "
               "first prompt)", subtitle)
    return fig
