"""The papers' table (``tasks.{md,tex,csv}``): decoder configurations as rows, tasks as columns, each task with its
speedup vs vanilla (with the 95 % bootstrap interval where the samples allow one) and its accept length tau -- the
shape of Ouroboros' Table 1 (arXiv 2402.13720) and of OPT-Tree's main comparison (arXiv 2406.17276). The main
table (:mod:`harness.report.main_table`) keeps one block of rows per run group; this one sets the tasks of one
setup side by side.

A setup is a run identity less the task and its token budget (:data:`SETUP_FIELDS`: model pair, dtype, machine,
code, sampling): the cells of one row come from groups of one setup, each cell from exactly one group. The table is
written when the rows hold two or more tasks of one setup; it is left out, with the reason logged, when one task
holds two groups of one setup (two runs that only a hidden setting tells apart: the main table shows them).
The csv is long (one line per setup, task and configuration) and adds tokens/s and each cell's sample counts.
"""

from __future__ import annotations

import logging
import re

import pandas as pd

from harness.rows import columns
from harness.report.tables import (COLUMN_GAP_PT, EM_PT, FITS, fit_width, has_interval, interval_cell,
                                   scaled_to_text, short_of, tex_escape, tex_header, text_width_em, width_pt)
from harness.report.tables import markdown as md

log = logging.getLogger(__name__)

#: The run-identity fields a setup is made of: all but the task's own (name, version and token budget: at the papers'
#: full size each task has its own, 512 for code, 256 for GSM8K, 128 for CNN/DM), the hash of the other settings (it
#: covers the task's) and the rows' source. A task whose budget differs from the others' names it in its head.
SETUP_FIELDS = tuple(f for f in columns.RUN_IDENTITY_FIELDS
                     if f not in ("task", "task_version", "max_new_tokens", "group_identity", "source"))
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
    spans two tasks or a task holds two groups of one setup (logged). Tasks run at different token budgets are
    headed with theirs (``gsm8k (256 tokens)``).

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
    spans = agg.groupby("setup", sort=False)["task"].nunique()
    spanning = [s for s, n in spans.items() if n > 1]
    if not spanning:
        log.info("tasks table left out: no setup spans two tasks")
        return None
    if len(spanning) < len(spans):
        log.info("tasks table: setups of one task left out (%s; main.md shows them)",
                 "; ".join(s or "-" for s, n in spans.items() if n < 2))
    agg = agg[agg["setup"].isin(spanning)]
    budgets = agg.groupby(agg["task"].astype(str), sort=False)["max_new_tokens"].agg(
        lambda b: ", ".join(dict.fromkeys(columns.fmt_value(v) for v in b))) if "max_new_tokens" in agg else None
    named = budgets is not None and budgets.nunique() > 1
    agg = agg.assign(task=[f"{t} ({budgets[str(t)]} tokens)" if named else str(t) for t in agg["task"]])
    tasks = list(dict.fromkeys(agg["task"].astype(str)))
    keys = list(dict.fromkeys(zip(agg["setup"], agg["label"].astype(str))))
    many = len(spanning) > 1
    index = pd.MultiIndex.from_tuples(keys) if many else pd.Index([k[1] for k in keys])
    heads = {t: ("speedup [95% CI]" if has_interval(agg[agg["task"].astype(str) == t], "speedup") else "speedup")
             for t in tasks}
    text = pd.DataFrame("-", index=index, dtype=object,
                        columns=pd.MultiIndex.from_tuples([(t, h) for t in tasks for h in (heads[t], "τ")]))
    cells = {(s, str(lab), str(t)): r for (_, r), s, lab, t in zip(agg.iterrows(), agg["setup"], agg["label"],
                                                                    agg["task"])}
    for i, key in enumerate(keys):
        for t in tasks:
            if (r := cells.get((*key, t))) is not None:
                text.iloc[i, text.columns.get_loc((t, heads[t]))] = \
                    interval_cell(r, "speedup", ".2f", note_few=False) + short_of(r)
                text.iloc[i, text.columns.get_loc((t, "τ"))] = columns.format_value(r["accept_length"], ".2f",
                                                                                     missing="-")
    text.columns.names = ["task", "decoder"]
    numeric = agg[[c for c in CSV_COLUMNS if c in agg]].reset_index(drop=True)
    return numeric, text


def markdown(text: pd.DataFrame) -> str:
    """The table as markdown, one column per (task, figure): ``humaneval speedup``, ``humaneval τ``."""
    flat = text.copy()
    flat.columns = [f"{t} {h}" for t, h in text.columns]
    flat.columns.name = "decoder"
    return md(flat, index_name="setup")


def latex(text: pd.DataFrame, caption: str, label: str) -> str:
    """The table as booktabs LaTeX that fits the page: each task a two-column head (``\\multicolumn``) over
    speedup and tau; a one-column ``table`` where it fits
    :data:`harness.report.tables.COLUMN_PT`, else ``table*`` (both columns of a
    two-column page) at ``\\small``, else ``\\footnotesize``, else without the intervals (main.md and tasks.md keep
    them; the caption says so), else ``\\scriptsize``, else scaled to the text width (``\\resizebox``, package
    graphicx). ``caption`` is plain text (escaped here)."""
    tasks = list(dict.fromkeys(text.columns.get_level_values(0)))
    many = text.index.nlevels > 1
    names = [" / ".join(map(str, k)) if many else str(k) for k in text.index]

    def bare(cell: str) -> str:  # the speedup without its interval
        return re.sub(r" \[[^]]*\]", "", cell)

    def head(h: str, intervals: bool) -> str:
        return h if intervals else h.replace(" [95% CI]", "")

    def width(body: pd.DataFrame, intervals: bool, pt: float) -> float:
        """The names' column, then per task its two columns, or its name over them where that is wider."""
        total = width_pt([[*names, "decoder"]], pt)
        for t in tasks:
            pair = width_pt([[*body[c].astype(str), head(c[1], intervals)] for c in body.columns if c[0] == t], pt)
            total += max(pair, text_width_em(t) * pt + 2 * COLUMN_GAP_PT)
        return total

    # with intervals down to \footnotesize, then without them in \footnotesize and \scriptsize
    body, intervals = text, True
    env, size, fits = fit_width(lambda pt: width(body, True, pt), FITS[:3])
    if not fits:
        body, intervals = text.apply(lambda col: col.map(bare) if "speedup" in col.name[1] else col), False
        env, size, fits = fit_width(lambda pt: width(body, False, pt), FITS[2:])
    wide = width(body, intervals, EM_PT[size])
    if not intervals:
        caption += " Intervals: tasks.md and main.md (left out here to fit the page)."
    lines = [rf"\begin{{{env}}}[t]", r"\centering", size, rf"\caption{{{tex_header(tex_escape(caption))}}}",
             rf"\label{{{label}}}",
             r"\begin{tabular}{l" + "rr" * len(tasks) + "}", r"\toprule",
             " & ".join(["", *[rf"\multicolumn{{2}}{{c}}{{{tex_escape(t)}}}" for t in tasks]]) + r" \\",
             " ".join(rf"\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(tasks))),
             " & ".join(["decoder", *[tex_header(tex_escape(head(h, intervals))) for _, h in body.columns]])
             + r" \\", r"\midrule"]
    for name, (_, row) in zip(names, body.iterrows()):
        lines.append(" & ".join([tex_escape(name), *[tex_escape(v) for v in row]]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\end{{{env}}}", ""]
    log.debug("tasks.tex: %s at %s, estimated %.0f pt wide", env, size, wide)
    tex = "\n".join(lines)
    return tex if fits else scaled_to_text(tex)  # too wide even in the smallest size: scaled to the page


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

