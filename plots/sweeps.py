"""Figures of swept settings: tokens/s and speedup against a decoder's hyper-parameter
(:func:`tokens_per_s_vs_param`), and a draft tree's accept length and speedup against its node budget
(:func:`accept_length_vs_nodes`) and its growth threshold (:func:`accept_length_vs_threshold`): OPT-Tree's scaling
study. Two panels each (the figure's value on the left, speedup with its CI on the right), one line per series of
configurations in its decoder's colour, run groups by line style. Like every figure of :mod:`plots`, they compute no
statistic."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import fields
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from decoders.settings import OptTreeSettings
from plots.style import (FAMILY_COLOURS, FONT, OTHER_COLOURS, PAGE_WIDTH_IN, SMALL, Style, family, fmt_tick,
                         legend_below, plt, set_titles, shade, short_groups, wrap_text)

log = logging.getLogger(__name__)


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
    colours = {n: shade(FAMILY_COLOURS.get(fam) or next(others), i, len(ns))
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
    legend_below(axes[0], ncol=1 if several else 2, handles=list(seen.values()), labels=list(seen),
                  where="left" if several else "center")
    if several:
        group_handles = [plt.Line2D([], [], color="black", lw=0.9, ls=GROUP_STYLES[i % len(GROUP_STYLES)])
                         for i in range(len(groups))]
        legend_below(axes[1], ncol=1, title="run group", handles=group_handles,
                      labels=[wrap_text(short_groups(groups)[g], PAGE_WIDTH_IN / 3) for g in groups], where="right")
    axes[1].axhline(1.0, color="gray", lw=0.6, ls="--")
    axes[1].set_ylabel("speedup vs vanilla", fontsize=FONT)
    for ax in axes:
        ax.tick_params(labelsize=SMALL)


#: Settings that vary between configurations but are no axis: cold and warm pools are warm_vs_cold's.
NOT_AN_AXIS = ("pool_scope",)


def tokens_per_s_vs_param(agg: pd.DataFrame, swept: Mapping[str, Sequence[str]], param: str | None = None,
                          subtitle: str = "", style: Style | None = None) -> Any:
    """Tokens/s (left) and speedup with its CI (right) against a swept hyper-parameter (e.g. gamma), one line
    per decoder and per value of the other swept parameters (named `lookahead (ngram_size=3)`, as the tree figures
    name theirs); run groups by line style.

    Args:
        agg: :func:`harness.rows.metrics.aggregate` (one column per hyper-parameter).
        swept: decoder class -> its swept hyper-parameters (:func:`harness.rows.grouping.swept_by_class`; rows
            without a ``decoder_class`` column: decoder name).
        param: the x axis; None = the swept parameter with the most values (ties: gamma, window_size,
            ngram_size, guess_set_size, then first seen).
    """
    candidates = [p for p in dict.fromkeys(p for ps in swept.values() for p in ps) if p not in NOT_AN_AXIS]
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
            shown = ", ".join(f"{k}={fmt_tick(v)}" for k, v in zip(keys, key))  # as the tree figures name lines
            series.append((_class_name(dec) + (f" ({shown})" if shown else ""), str(grp), s))
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(PAGE_WIDTH_IN, _lines_height(series)))
    _lines(axes, series, param, "tokens_per_s", list(dict.fromkeys(str(g) for g in agg["group"])))
    for ax in axes:
        ax.set_xlabel(param, fontsize=FONT)
        if (pd.to_numeric(agg[param], errors="coerce").dropna() % 1 == 0).all():
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("tokens / s", fontsize=FONT)
    set_titles(fig, f"Tokens/s and speedup against {param}", subtitle)
    return fig


#: Options of a draft tree that make separate lines in :func:`accept_length_vs_nodes`: every OPT-Tree setting but
#: the node budget (decoders/settings.py), so a new setting gets its lines without a second list.
TREE_OPTIONS = tuple(f.name for f in fields(OptTreeSettings) if f.name != "num_nodes")


def _tree_series(trees: pd.DataFrame, keys: Sequence[str], x: str, min_points: int = 1,
                 note: Callable[[pd.DataFrame], str] | None = None) -> list[tuple[str, str, pd.DataFrame]]:
    """The lines of the two tree figures, for :func:`_lines`: one per run group and combination of the ``keys``
    columns, named ``opt_tree (key=value, ...)`` (``num_nodes`` shown as ``nodes``; ``note(rows)`` added where it
    says something), those with fewer than ``min_points`` values of ``x`` left out."""
    series = []
    for key, s in trees.groupby(["group", *keys], sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        if s[x].nunique() < min_points:
            continue
        shown = [f"{'nodes' if k == 'num_nodes' else k}={fmt_tick(v)}" for k, v in zip(keys, key[1:])]
        said = note(s) if note else ""
        shown += [said] if said else []
        series.append((f"opt_tree ({', '.join(shown)})" if shown else "opt_tree", str(key[0]), s))
    return series


def accept_length_vs_nodes(agg: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Accept length (left) and speedup with its CI (right) against the draft tree's node budget
    (``num_nodes``): OPT-Tree's scaling figure. Points are the aggregate's rows with a ``num_nodes`` (each its
    own decoder config, as in a tuning grid); one line per combination of the tree's other options
    (:data:`TREE_OPTIONS`), run groups by line style. A cost-aware tree (``cost_aware``) sizes each tree below
    its budget: it stands at the nodes it verified per step (``target_tokens_fed_per_step``), not at its budget,
    and says its budget beside it. Skipped unless ``num_nodes`` takes two values or more."""
    if "num_nodes" not in agg or agg["num_nodes"].dropna().astype(str).nunique() < 2:
        log.info("accept_length_vs_nodes skipped: fewer than two node budgets in the rows")
        return None
    trees = agg[agg["num_nodes"].notna()].copy()
    budget = pd.to_numeric(trees["num_nodes"], errors="coerce").astype(float)
    sized = (trees["cost_aware"].map(lambda v: str(v).lower() == "true") if "cost_aware" in trees
             else pd.Series(False, index=trees.index))
    fed = pd.to_numeric(trees.get("target_tokens_fed_per_step", pd.Series(np.nan, index=trees.index)),
                        errors="coerce")
    sized &= fed.notna()
    trees["_nodes"] = budget.where(~sized, fed)
    options = [c for c in TREE_OPTIONS if c in trees and trees[c].astype(str).nunique() > 1]
    series = _tree_series(trees, options, "_nodes", note=lambda s: "at nodes verified" if sized[s.index].any() else "")
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(PAGE_WIDTH_IN, _lines_height(series)))
    _lines(axes, series, "_nodes", "accept_length", list(dict.fromkeys(str(g) for g in trees["group"])))
    for x, y, b in zip(trees.loc[sized, "_nodes"], trees.loc[sized, "accept_length"], budget[sized]):
        axes[0].annotate(f"budget {fmt_tick(b)}", (x, y), xytext=(3, -8), textcoords="offset points",
                         fontsize=SMALL - 1)
    for ax in axes:
        ax.set_xlabel("draft tree nodes (budget; cost-aware: verified per step)" if sized.any()
                      else "node budget (num_nodes)", fontsize=FONT)
        ax.set_xticks(sorted(budget[~sized].dropna().unique()))  # the budgets measured, not an even scale
    axes[0].set_ylabel("accept length (tokens / target forward)", fontsize=FONT)
    set_titles(fig, "Accept length and speedup against the node budget"
               + ("; a cost-aware tree at the nodes it verified per step (its budget beside it)" if sized.any()
                  else ""), subtitle)
    return fig


def accept_length_vs_threshold(agg: pd.DataFrame, subtitle: str = "", style: Style | None = None) -> Any:
    """Accept length (left) and speedup with its CI (right) against OPT-Tree's growth threshold (``threshold``: a
    tree stops growing when a layer adds less than it to the expected accept length) at a fixed node budget: the
    other axis of OPT-Tree's scaling study. One line per node budget (and per combination of the tree's other
    options, :data:`TREE_OPTIONS`) measured at two thresholds or more; run groups by line style. A cost-aware tree
    ignores the threshold and is left out. Skipped when no budget was measured at two thresholds."""
    if not {"threshold", "num_nodes"} <= set(agg.columns):
        log.info("accept_length_vs_threshold skipped: the rows have no draft tree with a threshold and a node budget")
        return None
    trees = agg[agg["threshold"].notna() & agg["num_nodes"].notna()].copy()
    if "cost_aware" in trees:
        trees = trees[~trees["cost_aware"].map(lambda v: str(v).lower() == "true")]
    trees["_threshold"] = pd.to_numeric(trees["threshold"], errors="coerce")
    options = [c for c in TREE_OPTIONS if c not in ("threshold", "cost_aware") and c in trees
               and trees[c].astype(str).nunique() > 1]
    series = _tree_series(trees, ["num_nodes", *options], "_threshold", min_points=2)
    if not series:
        log.info("accept_length_vs_threshold skipped: no node budget measured at two thresholds or more")
        return None
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(PAGE_WIDTH_IN, _lines_height(series)))
    _lines(axes, series, "_threshold", "accept_length", list(dict.fromkeys(group for _, group, _ in series)))
    ticks = sorted({float(t) for _, _, s in series for t in s["_threshold"].dropna()})
    for ax in axes:
        ax.set_xlabel("growth threshold (stop when a layer adds less to E(accept length))", fontsize=FONT)
        ax.set_xticks(ticks)
        ax.set_xticklabels([fmt_tick(t) for t in ticks])
    axes[0].set_ylabel("accept length (tokens / target forward)", fontsize=FONT)
    set_titles(fig, "Accept length and speedup against OPT-Tree's growth threshold at a fixed node budget",
               subtitle)
    return fig
