"""The papers' table (``tasks.{md,tex,csv}``): decoder configurations as rows, tasks as columns, each task with its
speedup vs vanilla (with the 95 % bootstrap interval where the samples allow one) and its accept length tau -- the
shape of Ouroboros' Table 1 (arXiv 2402.13720) and of OPT-Tree's main comparison (arXiv 2406.17276). The main
table (:mod:`harness.report.main_table`) keeps one block of rows per run group; this one sets the tasks of one
setup side by side.

A setup is a run identity less the task (:data:`SETUP_FIELDS`: model pair, dtype, machine, code, token budget,
sampling): the cells of one row come from groups of one setup, each cell from exactly one group. The table is
written when the rows hold two or more tasks of one setup; it is left out, with the reason logged, when one task
holds two groups of one setup (two runs that only a hidden setting tells apart: the main table shows them).
The csv is long (one line per setup, task and configuration) and adds tokens/s and each cell's sample counts.
"""

from __future__ import annotations

import logging
import re

import pandas as pd

from harness.rows import columns
from harness.report.tables import (COLUMN_PT, FONT_PT, TEXT_PT, has_interval, interval_cell, tex_escape, tex_header,
                                   width_pt)

log = logging.getLogger(__name__)

#: The run-identity fields a setup is made of: all but the task's own (name and version), the hash of the other
#: settings (it covers the task's) and the rows' source.
SETUP_FIELDS = tuple(f for f in columns.RUN_IDENTITY_FIELDS
                     if f not in ("task", "task_version", "group_identity", "source"))
#: The csv's columns, in order (those the aggregate has).
CSV_COLUMNS = ("setup", "task", "group", "label", "decoder", "settings", "paired_samples", "group_samples",
               "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high", "speedup", "speedup_low", "speedup_high",
               "accept_length", "accept_length_low", "accept_length_high", "equal_to_vanilla")


def setups(agg: pd.DataFrame) -> pd.Series:
    """The setup of each aggregate row: the values of :data:`SETUP_FIELDS` that differ between rows, as
    ``field=value`` text (empty when every row shares one setup)."""
    fields = [f for f in SETUP_FIELDS if f in agg and agg[f].map(columns.fmt_value).nunique() > 1]
    return pd.Series([", ".join(f"{f}={columns.fmt_value(r[f])}" for f in fields) for _, r in agg.iterrows()],
                     index=agg.index, dtype=object)


def task_table(agg: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The decoders x tasks table of an aggregate (:func:`harness.rows.metrics.aggregate`), or None when no setup
    spans two tasks or a task holds two groups of one setup (logged).

    Returns:
        ``(numeric, text)``: ``numeric`` long for CSV (:data:`CSV_COLUMNS`); ``text`` with formatted cells,
        indexed by configuration (``(setup, configuration)`` when there are several setups), columns
        ``(task, "speedup" | "speedup [95% CI]" | "τ")``.
    """
    if agg.empty or "task" not in agg:
        return None
    agg = agg.assign(setup=setups(agg))
    groups = agg.groupby(["setup", "task"], sort=False)["group"].nunique()
    if (groups > 1).any():
        setup, task = groups[groups > 1].index[0]
        log.info("tasks table left out: task %s has %d run groups of one setup%s (main.md shows them apart)", task,
                 int(groups.max()), f" ({setup})" if setup else "")
        return None
    spanning = [s for s, n in agg.groupby("setup", sort=False)["task"].nunique().items() if n > 1]
    if not spanning:
        return None
    agg = agg[agg["setup"].isin(spanning)]
    tasks = list(dict.fromkeys(agg["task"].astype(str)))
    keys = list(dict.fromkeys(zip(agg["setup"], agg["label"].astype(str))))
    many = len(spanning) > 1
    index = pd.MultiIndex.from_tuples(keys) if many else pd.Index([k[1] for k in keys])
    heads = {t: ("speedup [95% CI]" if has_interval(agg[agg["task"].astype(str) == t], "speedup") else "speedup")
             for t in tasks}
    text = pd.DataFrame("-", index=index, dtype=object,
                        columns=pd.MultiIndex.from_tuples([(t, h) for t in tasks for h in (heads[t], "τ")]))
    for i, key in enumerate(keys):
        for t in tasks:
            m = agg[(agg["setup"] == key[0]) & (agg["label"].astype(str) == key[1]) & (agg["task"].astype(str) == t)]
            if len(m):
                text.iloc[i, text.columns.get_loc((t, heads[t]))] = _speedup_cell(m.iloc[0])
                text.iloc[i, text.columns.get_loc((t, "τ"))] = columns.format_value(m["accept_length"].iloc[0],
                                                                                     ".2f", missing="-")
    text.columns.names = ["task", "decoder"]
    numeric = agg[[c for c in CSV_COLUMNS if c in agg]].reset_index(drop=True)
    return numeric, text


def _speedup_cell(r: pd.Series) -> str:
    """Speedup with its interval where it has one, and ``(k/n)`` when its figures are over k of the group's n
    samples."""
    cell = interval_cell(r, "speedup", ".2f", note_few=False)
    n, total = columns.num(pd.Series([r.get("paired_samples"), r.get("group_samples")]))
    return cell + (f" ({int(n)}/{int(total)})" if not pd.isna(n) and not pd.isna(total) and n < total else "")


def markdown(text: pd.DataFrame) -> str:
    """The table as markdown, one column per (task, figure): ``humaneval speedup``, ``humaneval τ``."""
    flat = text.copy()
    flat.columns = [f"{t} {h}" for t, h in text.columns]
    flat.columns.name = "decoder"
    from harness.report.tables import markdown as md

    return md(flat)


def latex(text: pd.DataFrame, caption: str, label: str) -> str:
    """The table as booktabs LaTeX that fits the page: each task a two-column head (``\\multicolumn``) over
    speedup and tau; a one-column ``table`` where it fits
    :data:`harness.report.tables.COLUMN_PT`, else ``table*`` (both columns of a
    two-column page) at ``\\small``, else ``\\footnotesize``, else without the intervals (main.md and tasks.md keep
    them; the caption says so). ``caption`` is plain text (escaped here)."""
    tasks = list(dict.fromkeys(text.columns.get_level_values(0)))
    many = text.index.nlevels > 1
    names = [" / ".join(map(str, k)) if many else str(k) for k in text.index]

    def bare(cell: str) -> str:  # the speedup without its interval
        return re.sub(r" \[[^]]*\]", "", cell)

    choice = None
    for env, size, intervals in (("table", r"\small", True), ("table*", r"\small", True),
                                 ("table*", r"\footnotesize", True), ("table*", r"\footnotesize", False)):
        body = text if intervals else text.apply(lambda col: col.map(bare) if "speedup" in col.name[1] else col)
        cols = [[*names, "decoder"]] + [[*body[c].astype(str), c[1].replace(" [95% CI]", "") if not intervals
                                         else c[1], c[0]] for c in body.columns]
        width = width_pt(cols, FONT_PT[size])
        choice = (env, size, intervals, body, width)
        if width <= (COLUMN_PT if env == "table" else TEXT_PT):
            break
    env, size, intervals, body, width = choice
    if not intervals:
        caption += " Intervals: tasks.md and main.md (left out here to fit the page)."
    lines = [rf"\begin{{{env}}}[t]", r"\centering", size, rf"\caption{{{tex_header(tex_escape(caption))}}}",
             rf"\label{{{label}}}",
             r"\begin{tabular}{l" + "rr" * len(tasks) + "}", r"\toprule",
             " & ".join(["", *[rf"\multicolumn{{2}}{{c}}{{{tex_escape(t)}}}" for t in tasks]]) + r" \\",
             " ".join(rf"\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(tasks))),
             " & ".join(["decoder", *[tex_header(tex_escape(h.replace(" [95% CI]", "" if not intervals else
                                                                        " [95% CI]"))) for _, h in body.columns]])
             + r" \\", r"\midrule"]
    for name, (_, row) in zip(names, body.iterrows()):
        lines.append(" & ".join([tex_escape(name), *[tex_escape(v) for v in row]]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\end{{{env}}}", ""]
    log.debug("tasks.tex: %s at %s, estimated %.0f pt wide", env, size, width)
    return "\n".join(lines)


def caption(measured: str, settings: str, any_interval: bool) -> str:
    """The table's caption, opening with what was measured (``measured``: model pair, dtype, machine, tasks with
    their samples, token budget)."""
    ci = " [95% bootstrap CI over samples]" if any_interval else ""
    return (f"Measured: {measured}. Speedup vs vanilla{ci} (mean of per-sample ratios of tok/s, paired with vanilla "
            "in the same run) and accept length τ (new tokens per target forward) per task; (k/n): over k of the "
            f"task's n samples; tok/s in tasks.csv.{settings}")


def any_interval(text: pd.DataFrame) -> bool:
    """Whether some task's speedup column has intervals."""
    return any("[95% CI]" in h for _, h in text.columns)

