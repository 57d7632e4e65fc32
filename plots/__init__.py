"""Figures from aggregated frames: one function per figure, each taking the frame(s) it draws, a subtitle and
a :class:`Style`, returning a matplotlib Figure, or None when the frame cannot support that figure (the reason
is logged).

The frames come from :mod:`harness.metrics` through the report (``python -m harness.report RUN --plots``,
which calls :func:`draw_all`); this package imports nothing of the harness, the decoders or torch, and
computes no statistic itself: it draws what it is given. :func:`save` writes PNG and PDF.

Made for a paper: one-column figures are :data:`COLUMN_WIDTH_IN` wide, two-panel ones
:data:`PAGE_WIDTH_IN`; configurations are rows of horizontal bars (their names on the axis, never rotated);
several run groups are stacked panels titled with their group, so a group's name is written once; legends sit
under the axes; every decoder has the same colour in every figure of a report (:data:`FAMILY_COLOURS`,
shades for several configurations of one decoder); integral hyper-parameters print as integers; bars that
stand on different numbers of samples say their ``n``; every figure carries a subtitle (model pair, dtype,
hardware, task size).
"""

from __future__ import annotations

import colorsys
import logging
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

log = logging.getLogger(__name__)

__all__ = [
    "speedup_by_task", "accept_length_by_decoder", "acceptance_by_position", "tokens_per_s_vs_param",
    "accept_length_vs_nodes", "time_breakdown", "warm_vs_cold", "compare_speedups", "Style", "palette", "save",
    "draw_all", "FIGURES",
]

#: Width of a one-column figure and of a two-panel (full-width) figure, inches.
COLUMN_WIDTH_IN = 3.5
PAGE_WIDTH_IN = 7.0
#: Font sizes: text, then tick labels and legends.
FONT, SMALL = 7, 6
#: One colour per decoder family (Okabe-Ito, colour-blind safe, and greys for the references), matched by the
#: longest family name a decoder's name starts with (``speculative_tuned`` -> ``speculative``).
FAMILY_COLOURS = {"vanilla": "#7f7f7f", "hf_greedy": "#3f3f3f", "speculative": "#0072B2", "hf_assisted": "#56B4E9",
                  "prompt_lookup": "#009E73", "lookahead": "#E69F00", "ouroboros": "#D55E00",
                  "opt_tree": "#CC79A7"}
#: Colours of decoders outside the families above, in order of appearance.
OTHER_COLOURS = ("#F0E442", "#000000", "#8c564b", "#17becf", "#bcbd22", "#9467bd")


def save(fig: Any, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` (300 dpi) and ``.pdf``; closes the figure. Returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=300, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def palette(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` distinct colours for series that are not decoders (``tab10`` up to 10, ``tab20`` up to 20, else
    evenly spaced along ``turbo``)."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [tuple(c) for c in plt.get_cmap("turbo")(np.linspace(0.03, 0.97, n))]


def family(name: str) -> str | None:
    """The decoder family of a configuration's name or label (longest prefix in :data:`FAMILY_COLOURS`)."""
    hits = [f for f in FAMILY_COLOURS if str(name).startswith(f)]
    return max(hits, key=len) if hits else None


def _shade(colour: str, i: int, n: int) -> tuple[float, float, float]:
    """The ``i``-th of ``n`` shades of ``colour``: the colour itself first, then darker and lighter ones."""
    if n == 1 or i == 0:
        return mcolors.to_rgb(colour)
    h, lum, sat = colorsys.rgb_to_hls(*mcolors.to_rgb(colour))
    steps = [-0.18, 0.18, -0.3, 0.3, -0.09, 0.09, -0.38, 0.38]
    return colorsys.hls_to_rgb(h, min(0.92, max(0.08, lum + steps[(i - 1) % len(steps)])), sat)


@dataclass
class Style:
    """How a report draws its configurations, the same in every figure: a colour and a display name per label.

    Attributes:
        colours: label -> colour (:meth:`of` builds them: a decoder family's colour, shaded per configuration).
        names: label -> display name (the label with its settings: ``speculative_tuned (gamma=8)``).
    """

    colours: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, agg: pd.DataFrame) -> "Style":
        """The style of an aggregate's labels (its ``label``, ``decoder`` and ``settings`` columns)."""
        if agg is None or agg.empty or "label" not in agg:
            return cls()
        labels = list(dict.fromkeys(agg["label"].astype(str)))
        decoders = dict(zip(agg["label"].astype(str), agg["decoder"].astype(str))) if "decoder" in agg else {}
        by_family: dict[str, list[str]] = {}
        for lab in labels:
            by_family.setdefault(family(decoders.get(lab, lab)) or decoders.get(lab, lab), []).append(lab)
        colours, others = {}, iter(OTHER_COLOURS * 4)
        for fam, labs in by_family.items():
            base = FAMILY_COLOURS.get(fam) or next(others)
            for i, lab in enumerate(labs):
                colours[lab] = _shade(base, i, len(labs))
        names = {}
        settings = dict(zip(agg["label"].astype(str), agg["settings"])) if "settings" in agg else {}
        for lab in labels:
            s = settings.get(lab)
            names[lab] = f"{lab} ({s})" if isinstance(s, str) and s and "(" not in lab else lab
        return cls(colours, names)

    def colour(self, label: str) -> Any:
        if label not in self.colours:  # a label the report's aggregate did not have: a stable fallback
            fam = family(label)
            self.colours[label] = mcolors.to_rgb(FAMILY_COLOURS[fam]) if fam else \
                OTHER_COLOURS[len(self.colours) % len(OTHER_COLOURS)]
        return self.colours[label]

    def name(self, label: str, width: int = 44) -> str:
        """The display name, wrapped to lines of ``width`` characters (an axis label in a one-column figure)."""
        return "\n".join(textwrap.wrap(self.names.get(label, label), width, break_long_words=False,
                                        subsequent_indent="  ")) or label


def _fmt(v: Any) -> str:
    """A hyper-parameter value as written in a config: ``3`` not ``3.0``."""
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "null"
        if float(v).is_integer():
            return str(int(v))
    return str(v)


def _wrap(text: str, width_in: float, size: float = SMALL) -> str:
    """``text`` wrapped to fit ``width_in`` inches at font ``size`` (about 0.55 em per character)."""
    chars = max(20, int(width_in * 72 / (0.55 * size)))
    return "\n".join(textwrap.wrap(text, chars, break_long_words=False)) if text else ""


def _titles(fig: Any, title: str, subtitle: str, width_in: float) -> None:
    fig.suptitle(_wrap(title, width_in, FONT) + (f"\n{_wrap(subtitle, width_in, SMALL)}" if subtitle else ""),
                 fontsize=SMALL)


def _legend_below(ax: Any, ncol: int = 2, title: str | None = None, handles: Any = None, labels: Any = None,
                  where: str = "center") -> Any:
    """A legend under the figure's axes (``where``: center, left or right), placed by the constrained layout:
    never over the data, never widening the figure."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.figure.legend(handles, labels, loc=f"outside lower {where}", ncol=ncol, fontsize=SMALL, title=title,
                            title_fontsize=SMALL, frameon=False)


def short_groups(groups: Sequence[str]) -> dict[str, str]:
    """What tells run groups apart: each label without the words all of them start and end with
    (``humaneval: A / B (temperature=0)`` and ``... (temperature=0.7)`` -> ``temperature=0`` and
    ``temperature=0.7``); the whole label where nothing is shared."""
    words = [str(g).split(" ") for g in groups]
    if len(words) < 2:
        return {str(g): str(g) for g in groups}
    head = 0
    while all(len(w) > head + 1 for w in words) and len({w[head] for w in words}) == 1:
        head += 1
    tail = 0
    while all(len(w) > head + tail + 1 for w in words) and len({w[-1 - tail] for w in words}) == 1:
        tail += 1
    out = {}
    for g, w in zip(groups, words):
        short = " ".join(w[head:len(w) - tail]).strip(" :")
        if short.startswith("(") and short.endswith(")"):
            short = short[1:-1]
        out[str(g)] = short or str(g)
    return out


def _panels(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One panel per run group, in order, titled with what tells the groups apart (:func:`short_groups`; the
    full labels are in the report); a single group: one untitled panel."""
    if "group" not in frame or frame["group"].nunique() <= 1:
        return [("", frame)]
    titles = short_groups(list(dict.fromkeys(frame["group"].astype(str))))
    return [(titles[str(g)], sub) for g, sub in frame.groupby("group", sort=False)]


def _stacked(panels: Sequence[tuple[str, pd.DataFrame]], width_in: float, style: Style, per_row: float = 0.13,
             extra: float = 0.5) -> tuple[Any, Any]:
    """A figure of stacked panels, each as tall as its bars' labels (a wrapped name takes several lines)."""
    heights = [max(1.5, sum(max(1.3, style.name(str(lab)).count("\n") + 1.0)
                            for lab in dict.fromkeys(sub["label"]))) for _, sub in panels]
    fig, axes = plt.subplots(len(panels), 1, layout="constrained", squeeze=False, sharex=True,
                             figsize=(width_in, 0.9 + sum(extra + per_row * h for h in heights)),
                             gridspec_kw={"height_ratios": [extra / per_row + h for h in heights]})
    return fig, axes[:, 0]


def _rows(ax: Any, labels: Sequence[str], style: Style) -> np.ndarray:
    """y positions of one bar per label, top to bottom, each row as tall as its (wrapped) name; sets the ticks
    and their labels. Returns the positions."""
    names = [style.name(lab) for lab in labels]
    heights = np.array([max(1.3, n.count("\n") + 1.0) for n in names])
    total = float(heights.sum())
    y = total - (np.cumsum(heights) - heights / 2)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=SMALL)
    ax.set_ylim(0, total)
    return y


def _hbars(ax: Any, sub: pd.DataFrame, value: str, style: Style, low: str | None = None,
           high: str | None = None, counts: bool = False) -> None:
    """One horizontal bar per configuration (top to bottom in table order), with its interval when given and
    ``n=k`` when the bars stand on different numbers of samples."""
    sub = sub.drop_duplicates("label")
    labels = sub["label"].astype(str).tolist()
    y = _rows(ax, labels, style)
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
    panels = _panels(agg)
    style = style or Style.of(agg)
    uneven = "paired_samples" in agg and pd.to_numeric(agg["paired_samples"], errors="coerce").nunique() > 1
    fig, axes = _stacked(panels, COLUMN_WIDTH_IN, style)
    for ax, (group, sub) in zip(axes, panels):
        _hbars(ax, sub, value, style, f"{value}_low", f"{value}_high", counts=uneven)
        if reference is not None:
            ax.axvline(reference, color="gray", lw=0.6, ls="--")
        if group:
            ax.set_title(_wrap(group, COLUMN_WIDTH_IN / 2), fontsize=SMALL, loc="left")
    axes[-1].set_xlabel(xlabel, fontsize=FONT)
    low = f"{value}_low"
    drawn = pd.to_numeric(agg[low], errors="coerce").notna() if low in agg else pd.Series(False, index=agg.index)
    if not drawn.all():  # the aggregation gives no interval on too few samples: the title must not promise one
        title = title.replace(", 95% bootstrap CI", ", 95% bootstrap CI where n allows" if drawn.any()
                              else ", no interval (too few samples)")
    _titles(fig, title, subtitle, COLUMN_WIDTH_IN)
    return fig


def speedup_by_task(agg: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Speedup vs vanilla per configuration with its bootstrap CI, one panel per run group (vanilla omitted).

    Args:
        agg: :func:`harness.metrics.aggregate` (``group, label, decoder, speedup, speedup_low/high``).
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
        positions: :func:`harness.figdata.acceptance_per_position`.
    """
    if positions.empty:
        log.info("acceptance_by_position skipped: no rows with per-step draft lists (accepted_per_step)")
        return None
    style = style or Style.of(positions)
    panels = _panels(positions)
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
            ax.set_title(_wrap(group, COLUMN_WIDTH_IN / 2), fontsize=SMALL, loc="left")
    handles = {}
    for ax in axes[:, 0]:  # one legend for every panel: a configuration has one colour throughout
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    _legend_below(axes[-1, 0], ncol=1, handles=list(handles.values()), labels=list(handles))
    axes[-1, 0].set_xlabel("draft position", fontsize=FONT)
    _titles(fig, "Acceptance by draft position (solid: accepted / drafted; dashed: given the earlier ones "
                 "accepted)", subtitle, COLUMN_WIDTH_IN)
    return fig


#: Preferred x axis of :func:`tokens_per_s_vs_param` when several hyper-parameters vary.
PREFERRED_X = ("gamma", "window_size", "ngram_size", "guess_set_size")
#: Line styles that tell run groups apart in the two line figures (the groups are named once, in a legend).
GROUP_STYLES = ("-", "--", ":", "-.")


def _classes(agg: pd.DataFrame) -> pd.Series:
    """The decoder class of each row (``decoder_class``, else the decoder name)."""
    if "decoder_class" in agg:
        return agg["decoder_class"].where(agg["decoder_class"].notna(), agg["decoder"]).astype(str)
    return agg["decoder"].astype(str)


def _class_name(name: str) -> str:
    """``LookaheadDecoder`` -> ``lookahead``, ``HFAssistedDecoder`` -> ``hf_assisted``; other names unchanged."""
    if not name.endswith("Decoder") or name == "Decoder":
        return name
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name[:-len("Decoder")]).lower()


def _series_keys(agg: pd.DataFrame, decoder: str, x: str, varying: Sequence[str]) -> list[str]:
    """Swept parameters other than ``x`` that are not a function of ``x`` (a parameter tied to ``x``, such
    as ``guess_set_size = window_size``, adds no line)."""
    sub = agg[_classes(agg) == decoder]
    keys = []
    for p in varying:
        if p == x or p not in sub or sub.empty:
            continue
        most = sub.groupby(sub[x].astype(str))[p].agg(lambda v: v.astype(str).nunique()).max()
        if pd.notna(most) and most > 1:
            keys.append(p)
    return keys


def _lines_height(series: Sequence[tuple[str, str, pd.DataFrame]]) -> float:
    """Height of a two-panel line figure, inches: the panels plus a legend row per two series (and per group)."""
    names = len(dict.fromkeys(name for name, _, _ in series))
    groups = len(dict.fromkeys(group for _, group, _ in series))
    rows = max(names, groups) if groups > 1 else math.ceil(names / 2)  # one column per legend with groups
    return 2.6 + 0.14 * rows


def _lines(axes: Any, series: list[tuple[str, str, pd.DataFrame]], x: str, left: str, groups: list[str]) -> None:
    """Left panel ``left`` against ``x``; right panel speedup with its CI; colour per series, line style per run
    group; a legend of series and, with several groups, one of groups (each named once)."""
    names = list(dict.fromkeys(name for name, _, _ in series))
    by_family: dict[str, list[str]] = {}
    for name in names:  # a decoder's family colour, as in every other figure; shades for its series
        by_family.setdefault(family(name.split(" ")[0]) or name, []).append(name)
    others = iter(OTHER_COLOURS * 4)
    colours = {n: _shade(FAMILY_COLOURS.get(fam) or next(others), i, len(ns))
               for fam, ns in by_family.items() for i, n in enumerate(ns)}
    for name, group, s in series:
        ls = GROUP_STYLES[groups.index(group) % len(GROUP_STYLES)]
        s = s.assign(_x=pd.to_numeric(s[x], errors="coerce")).sort_values("_x")
        axes[0].plot(s["_x"], s[left], marker="o", ms=2.5, lw=0.9, ls=ls, label=name, color=colours[name])
        yerr = np.vstack([(s["speedup"] - s["speedup_low"]).fillna(0).clip(lower=0),
                          (s["speedup_high"] - s["speedup"]).fillna(0).clip(lower=0)])
        axes[1].errorbar(s["_x"], s["speedup"], yerr=yerr, marker="o", ms=2.5, lw=0.9, ls=ls, capsize=2,
                         color=colours[name])
    handles, labels = axes[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    several = len(groups) > 1
    _legend_below(axes[0], ncol=1 if several else 2, handles=list(seen.values()), labels=list(seen),
                  where="left" if several else "center")
    if several:
        group_handles = [plt.Line2D([], [], color="black", lw=0.9, ls=GROUP_STYLES[i % len(GROUP_STYLES)])
                         for i in range(len(groups))]
        _legend_below(axes[1], ncol=1, title="run group", handles=group_handles,
                      labels=[_wrap(short_groups(groups)[g], PAGE_WIDTH_IN / 3) for g in groups], where="right")
    axes[1].axhline(1.0, color="gray", lw=0.6, ls="--")
    axes[1].set_ylabel("speedup vs vanilla", fontsize=FONT)
    for ax in axes:
        ax.tick_params(labelsize=SMALL)


def tokens_per_s_vs_param(agg: pd.DataFrame, swept: Mapping[str, Sequence[str]], param: str | None = None,
                          subtitle: str = "", style: Style | None = None) -> Any:
    """Tokens/s (left) and speedup with its CI (right) against a swept hyper-parameter (e.g. gamma), one line
    per decoder and per value of the other swept parameters; run groups by line style.

    Args:
        agg: :func:`harness.metrics.aggregate` (one column per hyper-parameter).
        swept: decoder class -> its swept hyper-parameters (:func:`harness.grouping.swept_by_class`; rows
            without a ``decoder_class`` column: decoder name).
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
    others = {d: _series_keys(agg, d, param, ps) for d, ps in swept.items()}
    series = []
    for (grp, dec), g in agg.groupby([agg["group"], _classes(agg)], sort=False):
        keys = others.get(dec, [])
        for key, s in (g.groupby(keys, sort=False, dropna=False) if keys else [((), g)]):
            key = key if isinstance(key, tuple) else (key,)
            series.append((_class_name(dec) + "".join(f" {k}={_fmt(v)}" for k, v in zip(keys, key)), str(grp), s))
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(PAGE_WIDTH_IN, _lines_height(series)))
    _lines(axes, series, param, "tokens_per_s", list(dict.fromkeys(str(g) for g in agg["group"])))
    for ax in axes:
        ax.set_xlabel(param, fontsize=FONT)
        if (pd.to_numeric(agg[param], errors="coerce").dropna() % 1 == 0).all():
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("tokens / s", fontsize=FONT)
    _titles(fig, f"Tokens/s and speedup against {param}", subtitle, PAGE_WIDTH_IN)
    return fig


#: Options of a draft tree that make separate lines in :func:`accept_length_vs_nodes`.
TREE_OPTIONS = ("threshold", "max_depth", "cost_aware", "copy_tokens", "draft_on_copy")


def accept_length_vs_nodes(agg: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Accept length (left) and speedup with its CI (right) against the draft tree's node budget
    (``num_nodes``): OPT-Tree's scaling figure. Points are the aggregate's rows with a ``num_nodes`` (each its
    own decoder config, as in a tuning grid); one line per combination of the tree's other options
    (:data:`TREE_OPTIONS`), run groups by line style. Skipped unless ``num_nodes`` takes two values or more."""
    if "num_nodes" not in agg or agg["num_nodes"].dropna().astype(str).nunique() < 2:
        log.info("accept_length_vs_nodes skipped: fewer than two node budgets in the rows")
        return None
    trees = agg[agg["num_nodes"].notna()].copy()
    options = [c for c in TREE_OPTIONS if c in trees and trees[c].astype(str).nunique() > 1]
    series = []
    for key, s in (trees.groupby(["group", *options], sort=False, dropna=False)):
        key = key if isinstance(key, tuple) else (key,)
        series.append((", ".join(f"{k}={_fmt(v)}" for k, v in zip(options, key[1:])) or "opt_tree", str(key[0]), s))
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(PAGE_WIDTH_IN, _lines_height(series)))
    _lines(axes, series, "num_nodes", "accept_length", list(dict.fromkeys(str(g) for g in trees["group"])))
    budgets = sorted(pd.to_numeric(trees["num_nodes"], errors="coerce").dropna().unique())
    for ax in axes:
        ax.set_xlabel("node budget (num_nodes)", fontsize=FONT)
        ax.set_xticks(budgets)  # the budgets measured, not an evenly spaced (and crowded) scale
    axes[0].set_ylabel("accept length (tokens / target forward)", fontsize=FONT)
    _titles(fig, "Accept length and speedup against the node budget", subtitle, PAGE_WIDTH_IN)
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
        breakdown: :func:`harness.figdata.time_breakdown` (``group, label, prefill_ms, draft_ms, verify_ms,
            decode_ms, other_ms``).
    """
    if breakdown.empty:
        log.info("time_breakdown skipped: rows have neither ttft_s nor draft_time_s / verify_time_s columns")
        return None
    style = style or Style()
    # a phase is drawn (and in the legend) when it is visible: at least 1 % of some bar
    total = breakdown[[p[0] for p in PHASES if p[0] in breakdown]].fillna(0).sum(axis=1)
    phases = [p for p in PHASES if p[0] in breakdown and (breakdown[p[0]].fillna(0) > 0.01 * total).any()]
    panels = _panels(breakdown)
    fig, axes = _stacked(panels, COLUMN_WIDTH_IN, style)
    for ax, (group, sub) in zip(axes, panels):
        sub = sub.drop_duplicates("label")
        y = _rows(ax, [str(lab) for lab in sub["label"]], style)
        left = np.zeros(len(sub))
        for col, name, colour in phases:
            vals = sub[col].fillna(0).to_numpy(dtype=float)
            ax.barh(y, vals, 0.9, left=left, label=name, color=colour, edgecolor="black", linewidth=0.3)
            left += vals
        ax.tick_params(axis="x", labelsize=SMALL)
        ax.set_xlim(0, max(1e-9, float(left.max())) * 1.05)  # the tallest bar inside the axes
        if group:
            ax.set_title(_wrap(group, COLUMN_WIDTH_IN / 2), fontsize=SMALL, loc="left")
    axes[-1].set_xlabel("ms per generated token", fontsize=FONT)
    _legend_below(axes[-1], ncol=2)
    _titles(fig, "Time per generated token by phase", subtitle, COLUMN_WIDTH_IN)
    return fig


def warm_vs_cold(warm_cold: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Warm start (n-gram pool kept across a task's samples, ``pool_scope=task``) vs cold start
    (``pool_scope=sample``): speedup and accept length per configuration.

    Args:
        warm_cold: :func:`harness.figdata.warm_cold` (``config`` = the configuration, ``label`` = cold/warm).
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
    axes[0].set_yticklabels([_wrap(c, 2.0) for c in configs], fontsize=SMALL)
    _legend_below(axes[0], ncol=2)
    _titles(fig, "warm: n-gram pool kept across the task's samples (pool_scope=task); cold: cleared per sample",
            subtitle, PAGE_WIDTH_IN)
    return fig


def compare_speedups(cmp: pd.DataFrame, subtitle: str = "") -> Any:
    """Two runs side by side (``harness.report --compare``): each configuration's speedup in run A and in run
    B (bars), on the samples both cover.

    Args:
        cmp: :func:`harness.compare.compare_runs` (``label, speedup_a, speedup_b``).
    """
    cmp = cmp[cmp["label"] != "vanilla"] if "label" in cmp else cmp
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
    _legend_below(ax, ncol=2)
    _titles(fig, "Run A vs run B: speedup vs each run's own vanilla, on the samples both cover", subtitle,
            COLUMN_WIDTH_IN)
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
    """Draw every figure of :data:`FIGURES` (or those named in ``only``) from ``frames`` into ``out_dir``, all
    in one :class:`Style` built from ``frames["agg"]`` (a decoder keeps its colour across the figures).

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
            continue
        written[name] = save(fig, out_dir, name)
        log.info("wrote %s", written[name][0])
    return written
