"""Tables as text: the summary's markdown (:func:`to_markdown`: a figure with its interval as one
``x [low, high]`` cell, "n too small" where there are too few samples for an interval, quality at two decimals,
columns that say nothing left out, the warnings above the table and the legend from the rows schema,
:data:`SUMMARY_LEGEND`), and the report's formatted tables as markdown (:func:`markdown`) and booktabs LaTeX
that fits a page (:func:`latex`, :func:`latex_by_group`).
The headers and formats of the report's figures are their declarations' (:class:`harness.rows.columns.Column`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from harness.rows import columns as schema
from harness.rows.columns import EQUALITY_SAMPLED, SUMMARY_MD_COLUMNS, format_value, legend, num, num_value
from harness.rows.stats import MIN_INTERVAL_SAMPLES

log = logging.getLogger(__name__)


def md_intervals() -> list[str]:
    """Figures of ``summary.md`` printed with their interval (``x [low, high]``), besides the quality columns:
    the summary columns declared with ``interval`` (:class:`harness.rows.columns.Column`)."""
    return [c.name for c in schema.SUMMARY.values() if c.interval]


#: What ``samples`` means in every printed table (summary.md and the report's), and ``cells``, printed beside it
#: for a multi-turn task (MT-Bench: a sample has one cell per turn). summary.csv and main.csv keep the counts
#: apart: ``paired_samples`` / ``group_samples`` (and ``samples``: those with an ok row, paired or not).
SAMPLES_MEANING = ("the samples a row's figures are computed over (k/n: k of its run group's n); every figure of a "
                   "decoder, tok/s included, is over its rows paired with an ok vanilla row of the same sample, turn "
                   "and repeat")
CELLS_MEANING = ("the same for (sample, turn) cells, shown for a multi-turn task where a row misses some: a decoder "
                 "that lost a later turn of a sample covers fewer cells of it")


def coverage_cell(r: Mapping[str, Any], unit: str = "samples") -> str:
    """The ``samples`` (or ``cells``) cell of a table row: ``5``, or ``3/5`` when its figures are over 3 of its
    run group's 5 (``paired_<unit>`` of ``group_<unit>``; ``<unit>`` alone for rows without them)."""
    n, total = num(pd.Series([r.get(f"paired_{unit}"), r.get(f"group_{unit}")]))
    if pd.isna(n):
        v = num_value(r.get(unit))
        return "-" if pd.isna(v) else f"{int(v)}"
    return f"{int(n)}/{int(total)}" if not pd.isna(total) and total > n else f"{int(n)}"


def short_of(r: Mapping[str, Any]) -> str:
    """`` (3/5)`` after a figure over fewer samples than its run group has (:func:`coverage_cell`), else empty."""
    cell = coverage_cell(r)
    return f" ({cell})" if "/" in cell else ""


def show_cells(agg: pd.DataFrame) -> bool:
    """Whether a table shows ``cells`` beside ``samples``: a group has more cells than samples (turns) and a
    row's figures miss some of them (where every row covers every cell, ``samples`` says it all)."""
    if not {"group_cells", "group_samples", "paired_cells"} <= set(agg.columns):
        return False
    turns = num(agg["group_cells"]) > num(agg["group_samples"])
    return bool((turns & (num(agg["paired_cells"]) < num(agg["group_cells"]))).any())


#: The legend under the summary's table (and the report's definitions): each printed column's meaning from
#: the rows schema, then how to read the intervals.
SUMMARY_LEGEND = "; ".join([f"samples = {SAMPLES_MEANING}", f"cells = {CELLS_MEANING}", legend(
    [c for c in SUMMARY_MD_COLUMNS if c not in ("samples", "paired_samples")])]) + (
    f"; [low, high] = 95% bootstrap interval over samples and repeats (quality: Wilson over samples for a 0/1 "
    f"score, Student-t over seeds for sampled runs); no interval below {MIN_INTERVAL_SAMPLES} samples ("
    "n too small)")


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f", columns: Sequence[str] | None = None,
                notes: Sequence[str] = ()) -> str:
    """Markdown table (numbers right-aligned; pandas' ``to_markdown`` needs tabulate, this does not).

    For a :func:`summarize` frame: the columns of :data:`SUMMARY_MD_COLUMNS` plus the quality means, a
    figure with an interval printed as one ``x [low, high]`` cell, ``equal_to_vanilla`` as ``n/a`` for
    sampled cells; columns that say nothing here are left out (the group when there is one, repeats and
    rows without repeats, seeds of greedy runs, prefill columns the rows do not record, cross-process
    pairs when there are none, load when not recorded). ``notes`` and ``attrs["warnings"]`` precede the
    table as a list.
    """
    warnings = list(dict.fromkeys([*notes, *df.attrs.get("warnings", [])]))
    if columns is None and "quality" in df.attrs:
        df, columns = _summary_md_frame(df)
    elif columns is None:
        columns = [c for c in df.columns if c != "warnings"]
    cells = [[_md_cell(v, floatfmt) for v in df[c]] for c in columns]
    numeric = [c != "label" and c != "group" and (pd.api.types.is_numeric_dtype(df[c])
                                                   or c in _md_interval_columns(df.attrs))
               and not pd.api.types.is_bool_dtype(df[c]) for c in columns]
    text = md_table(columns, numeric, zip(*cells))
    if warnings:
        text = "Warnings:\n" + "\n".join(f"- {w}" for w in warnings) + "\n\n" + text
    return text


def _md_interval_columns(attrs: Mapping[str, Any]) -> list[str]:
    return list(attrs.get("_interval_columns", []))


def _summary_md_frame(summary: pd.DataFrame, floatfmt: str = ".3f") -> tuple[pd.DataFrame, list[str]]:
    """The frame and columns :func:`to_markdown` prints for a :func:`summarize` frame."""
    df = summary.copy()
    quality = list(summary.attrs.get("quality", []))

    def blank(c: str) -> bool:
        return c not in df or num(df[c]).isna().all()

    columns = [c for c in SUMMARY_MD_COLUMNS if c in df] + [q for q in quality if q in df]
    intervals: list[str] = []  # columns printed as text but aligned as numbers
    drop = {"group"} if "group" in df and df["group"].nunique() <= 1 else set()
    if "repeats" in df and (num(df["repeats"]).fillna(1) <= 1).all():
        drop.add("repeats")
    if {"rows", "paired_samples"} <= set(df.columns) and (num(df["rows"]) == num(df["paired_samples"])).all():
        drop.add("rows")
    drop.add("paired_samples")  # printed in samples: k/n, as the report prints it
    if "samples" in df:
        df["samples"] = [coverage_cell(r) for r in df.to_dict("records")]
        intervals.append("samples")
        if show_cells(df):
            df["cells"] = [coverage_cell(r, "cells") for r in df.to_dict("records")]
            columns.insert(columns.index("samples") + 1, "cells")
            intervals.append("cells")
    if "unpaired" in df and (num(df["unpaired"]).fillna(0) == 0).all():
        drop.add("unpaired")
    if "failed" in df and "failed_statuses" in df:  # how many and why: "2 error, 1 prompt_too_long"
        df["failed"] = [s if isinstance(s, str) and s else _md_cell(n, "g") for n, s in
                        zip(df["failed"], df["failed_statuses"])]
        intervals.append("failed")
    if "seeds" in df and (num(df["seeds"]).fillna(0) <= 1).all():
        drop.add("seeds")
    if "paired_across_processes" in df and (num(df["paired_across_processes"]).fillna(0) == 0).all():
        drop.add("paired_across_processes")
    drop |= {c for c in ("decode_speedup", "ttft_s", "tpot_s", "prefill_share", "load_max") if blank(c)}
    columns = [c for c in columns if c not in drop]
    n = num(df["paired_samples"] if "paired_samples" in df else df.get("samples", pd.Series(0, index=df.index)))
    shown_intervals = md_intervals()
    for c in columns:
        if (c in shown_intervals or c in quality) and f"{c}_low" in df:
            fmt = ".2f" if c in quality else floatfmt  # a score over tens of problems has two digits, not three

            def cell(v: Any, lo: float, hi: float, k: float, fmt: str = fmt) -> str:
                if pd.isna(v):
                    return ""
                if not pd.isna(lo):
                    return f"{_md_cell(v, fmt)} [{lo:{fmt}}, {hi:{fmt}}]"
                return _md_cell(v, fmt) + (" (n too small)" if k < MIN_INTERVAL_SAMPLES else "")

            df[c] = [cell(v, lo, hi, k) for v, lo, hi, k in
                     zip(df[c], num(df[f"{c}_low"]), num(df[f"{c}_high"]), n.fillna(0))]
            intervals.append(c)
    if "equal_to_vanilla" in df and "equality_check" in df:
        sampled = df["equality_check"].astype(str) == EQUALITY_SAMPLED
        df["equal_to_vanilla"] = [("n/a" if s else v) for s, v in zip(sampled, df["equal_to_vanilla"])]
        intervals.append("equal_to_vanilla")
    df.attrs["_interval_columns"] = intervals
    return df, columns


def _md_cell(v: Any, floatfmt: str) -> str:
    """A markdown cell: :func:`harness.rows.columns.format_value` (blank when missing), lists joined, one line
    (:func:`md_table` escapes pipes)."""
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return format_value(v, floatfmt, missing="").replace("\n", " ")


# ------------------------------------------------------------------------------------------------ report tables
def fmt_cell(v: Any, fmt: str = ".2f") -> str:
    """A table cell: ``-`` for a missing value, booleans in lower case, floats in ``fmt``
    (:func:`harness.rows.columns.format_value`)."""
    return format_value(v, fmt, missing="-")


def interval_cell(r: pd.Series, col: str, fmt: str = ".2f", note_few: bool = True) -> str:
    """``x [low, high]``; ``x (n too small)`` where the row's samples are too few for an interval (``note_few``;
    off in a column where no row has one: its header then claims no interval, :func:`has_interval`)."""
    if pd.isna(r.get(col)):
        return "-"
    if pd.isna(r.get(f"{col}_low")):
        n = num_value(r.get("paired_samples", r.get("samples")))
        few = note_few and not pd.isna(n) and n < MIN_INTERVAL_SAMPLES and f"{col}_low" in r
        return format(r[col], fmt) + (" (n too small)" if few else "")
    return f"{r[col]:{fmt}} [{r[f'{col}_low']:{fmt}}, {r[f'{col}_high']:{fmt}}]"


def has_interval(frame: pd.DataFrame, col: str) -> bool:
    """Whether some row of ``frame`` has an interval for ``col`` (a ``<col>_low`` value)."""
    return f"{col}_low" in frame and num(frame[f"{col}_low"]).notna().any()


def tex_label(kind: str, source: Path, out: Path) -> str:
    r"""A LaTeX label unique to one report: ``tab:<kind>:<name>`` in letters, digits and hyphens, ``name`` being the
    report folder's (``out``), or, for a folder called ``report`` (the default, inside the runs it reads), the
    runs folder ``source`` with its parent; so the tables of two reports can be input into one paper without a
    clash, and a report written again into a folder of the same name reads the same."""
    src = source.resolve()
    name = out.name if out.name != "report" else f"{src.parent.name}-{src.name}"
    return f"tab:{kind}:{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-') or 'report'}"


#: LaTeX spellings of the Greek letters of the tables' headers (the declared display names: τ, α, γ).
TEX_GREEK = {"τ": r"$\tau$", "α": r"$\alpha$", "γ": r"$\gamma$"}


def tex_header(header: str) -> str:
    """A (LaTeX-escaped) table header with its Greek letters in math mode (``E[τ] theory`` -> ``E[$\\tau$]
    theory``)."""
    return "".join(TEX_GREEK.get(ch, ch) for ch in header)


def markdown(text: pd.DataFrame, index_name: str = "run") -> str:
    """Markdown of a formatted table: index columns left-aligned, values right-aligned; a two-level index's outer
    level headed ``index_name`` and written once per run of equal values (blank below it, as in a grouped
    LaTeX table; the CSV repeats it on every row)."""
    idx = text.index
    n_idx = idx.nlevels
    head = ([index_name, text.columns.name or ""] if n_idx == 2 else [text.columns.name or ""]) + list(
        map(str, text.columns))
    body, previous = [], None
    for key, row in zip(idx, text.itertuples(index=False)):
        keys = list(key) if n_idx > 1 else [key]
        if n_idx > 1:
            keys[0], previous = ("" if keys[0] == previous else keys[0]), keys[0]
        body.append([*keys, *row])
    return md_table(head, [False] * n_idx + [True] * len(text.columns), body)


def md_table(header: Sequence[Any], right: Sequence[bool], rows: Iterable[Sequence[Any]]) -> str:
    """A pipe table, every markdown table of the reports and docs: the header, the alignment rule (``right[i]``:
    column ``i`` right-aligned, for numbers), then ``rows`` (cells as text, ``|`` escaped)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", **TEX_GREEK, "×": r"$\times$",
                "·": r"$\cdot$", "–": "--", "≈": r"$\approx$"}


def tex_escape(s: Any) -> str:
    """LaTeX-escape plain text (captions, labels): the special characters, and the Greek letters and symbols of our
    texts in math mode (pdflatex takes no raw τ)."""
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in str(s))


#: Widths a LaTeX table is fitted to, in points: a column and the text of a two-column page (ACM's sigconf: 241 and
#: 506 pt; the ACL, ICML and IEEE two-column styles lie within a few points of these).
COLUMN_PT, TEXT_PT = 241.0, 505.0
#: The width estimate's em at each font size of a 10 pt document, in points (twice a digit's width), and the
#: tabular's space between columns (2 x \tabcolsep). Computer Modern's smaller optical sizes are set wider than
#: their nominal size: a digit is 0.51 em of cmr9, 0.53 of cmr8, 0.57 of cmr7 against 0.50 of cmr10 (pdflatex), so
#: ``\scriptsize`` (7 pt) counts 7.97 pt per em; a table estimated at 7 pt stuck out of the page by 4 %
#: (``benchmarks/latex_check.py`` typesets the committed tables).
EM_PT = {r"\small": 9.225, r"\footnotesize": 8.5, r"\scriptsize": 7.97}
COLUMN_GAP_PT = 12.0


#: Characters 0.28-0.33 em wide in Computer Modern (punctuation, brackets, spaces; counted as 0.3 em); capitals
#: and ``m``/``w`` are about 0.75 em; every other character, digits included, half an em.
NARROW_CHARS, WIDE_CHARS = frozenset(" .,:;[]()/|'!-ilj"), frozenset("ABCDEFGHKMNOQRUVWXYmw@%")


def text_width_em(text: str) -> float:
    """Estimated width of ``text`` in ems (:data:`NARROW_CHARS`, :data:`WIDE_CHARS`, else half an em)."""
    return sum(0.3 if ch in NARROW_CHARS else 0.75 if ch in WIDE_CHARS else 0.5 for ch in str(text))


def width_pt(cells: Sequence[Sequence[str]], em_pt: float) -> float:
    """Estimated width in points of a tabular whose columns hold ``cells`` (each column's texts, its header
    included) set with an em of ``em_pt`` points (:data:`EM_PT`): each column as wide as its widest text
    (:func:`text_width_em`) plus the gap between columns."""
    return sum(max(text_width_em(t) for t in col) * em_pt + COLUMN_GAP_PT for col in cells)


def frame_width_pt(text: pd.DataFrame, em_pt: float = EM_PT[r"\small"]) -> float:
    """:func:`width_pt` of a formatted table: its index levels and its columns, headers included."""
    index = [[*map(str, text.index.get_level_values(i)), str(text.index.names[i] or "")]
             for i in range(text.index.nlevels)]
    if text.index.nlevels == 1:
        index[0].append(str(text.columns.name or ""))
    return width_pt([*index, *[[*text[c].astype(str), str(c)] for c in text.columns]], em_pt)


#: The ways a table is set, tried in order: (environment, font size): a column (``table``), then both columns of a
#: two-column page (``table*``) in each of :data:`EM_PT` in turn.
FITS = (("table", r"\small"), *(("table*", size) for size in EM_PT))


def fit_width(width: Callable[[float], float], fits: Sequence[tuple[str, str]] = FITS) -> tuple[str, str, bool]:
    """The first ``(environment, size)`` of ``fits`` in which a table ``width(em_pt)`` points wide fits its
    frame (:data:`COLUMN_PT` for ``table``, :data:`TEXT_PT` for ``table*``), and True; else the last one, and
    False (the caller then scales the tabular to the text width)."""
    for env, size in fits:
        if width(EM_PT[size]) <= (COLUMN_PT if env == "table" else TEXT_PT):
            return env, size, True
    return fits[-1][0], fits[-1][1], False


def fit(text: pd.DataFrame) -> tuple[str, str, bool]:
    """Where and how small ``text`` is set (:func:`fit_width` of :func:`frame_width_pt`): ``("table", "\\small",
    True)`` when it fits a column, else ``table*`` in the largest of :data:`EM_PT` that fits the page; the
    smallest and False when none does (:func:`latex` then scales the tabular to the text width)."""
    return fit_width(lambda pt: frame_width_pt(text, pt))


def latex(text: pd.DataFrame, caption: str = "", label: str = "", caption_tex: str = "") -> str:
    r"""A booktabs table of a formatted table, written by pandas' ``Styler.to_latex`` (``hrules=True``):
    index columns left-aligned, value columns right-aligned, cells, headers and ``caption`` LaTeX-escaped;
    ``caption_tex``: a caption written in LaTeX already (math), used as it is instead. Set in a ``table`` where it
    fits a column, else a ``table*`` in the largest font that fits the page (:func:`fit`); a table too wide even in
    ``\scriptsize`` is scaled to the text width (``\resizebox``, package graphicx)."""
    n_idx = text.index.nlevels
    styler = (text.style.format(escape="latex")
              .format_index(escape="latex", axis=0)
              .format_index(tex_header, escape="latex", axis=1))
    kwargs: dict[str, Any] = {"hrules": True, "column_format": "l" * n_idx + "r" * text.shape[1],
                              "position": "t", "position_float": "centering"}
    env, size, fits = fit(text)
    kwargs["environment"] = env
    if n_idx > 1:
        kwargs.update(sparse_index=True, multirow_align="naive")
    if caption or caption_tex:
        kwargs["caption"] = caption_tex or tex_escape(caption)
    if label:
        kwargs["label"] = label
    tex = styler.to_latex(**kwargs).replace("\\centering\n", f"\\centering\n{size}\n", 1)
    return tex if fits else scaled_to_text(tex)  # too wide in the smallest size: scaled to the page


def scaled_to_text(tex: str) -> str:
    """A LaTeX table whose (first) tabular is scaled to the text width: ``\\resizebox{\\textwidth}{!}{...}``
    around it (package graphicx), for a table too wide even in the smallest of :data:`EM_PT`."""
    return tex.replace("\\begin{tabular}", "\\resizebox{\\textwidth}{!}{%\n\\begin{tabular}", 1).replace(
        "\\end{tabular}\n", "\\end{tabular}}\n", 1)


def latex_drop() -> tuple[str, ...]:
    """Headers the LaTeX main table leaves out so that it fits a page: the main-table columns declared with
    ``page=False`` (main.md and main.csv keep them), and the settings (they go to the caption)."""
    off_page = [c for c in schema.SUMMARY.values() if c.report and not c.page]  # headed with or without [95% CI]
    return (*[c.header for c in off_page], *[c.display or c.name for c in off_page], "settings")


def latex_by_group(text: pd.DataFrame, caption: str, label: str, measured: Mapping[str, str] | None = None) -> str:
    """The main table as LaTeX that fits a page: one booktabs table per run group (the group named once, in its
    caption, not in a column), without the columns of :func:`latex_drop` and those empty in its group (another task's
    quality columns). Each caption opens with what its group
    measured (``measured``: run group -> model pair, dtype, hardware, task and samples, token budget); the first
    table carries the column definitions, the others refer to it."""
    drop = latex_drop()
    measured = dict(measured or {})
    off_page = [c for c in text.columns if c in drop and c != "settings"]
    text = text[[c for c in text.columns if c not in drop]]
    if off_page:  # the columns left out, by the names main.md gives them
        caption += f" ({', '.join(c.replace(' [95% CI]', '') for c in off_page)}: main.md and main.csv.)"
    if text.index.nlevels == 1:
        what = " ".join(f"Run group: {g}. Measured: {m}." for g, m in measured.items())
        return latex(text, f"{what} {caption}".strip(), label)
    out = []
    for i, group in enumerate(dict.fromkeys(text.index.get_level_values(0))):
        sub = text.xs(group, level=0)
        sub = sub[[c for c in sub.columns if not sub[c].astype(str).isin(["-", ""]).all()]]  # not this group's
        sub.columns.name = text.columns.name
        what = f"Run group: {group}. " + (f"Measured: {measured[group]}. " if group in measured else "")
        cap = what + (caption if i == 0 else "Columns as defined in the first run group's table (each group shows "
                      "its own task's quality columns).")
        out.append(latex(sub, cap, f"{label}-{i + 1}"))
    return "\n".join(out)

