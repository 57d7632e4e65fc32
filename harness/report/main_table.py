"""The report's main table (``main.{md,tex,csv}``): decoders as rows with their settings and the figures the rows
schema places in it (:func:`harness.rows.columns.main_table_columns`), each with the samples it is over and, when
any row has some, the failed or skipped cells and the unpaired rows (:func:`coverage_columns`); and its caption,
which defines the columns shown (:func:`main_caption`). :mod:`harness.report.build` writes it; the category and
theory tables reuse its row index and coverage columns.
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from harness.rows import cells as coverage
from harness.rows import columns
from harness.rows import grouping
from harness.report.tables import (CELLS_MEANING, SAMPLES_MEANING, coverage_cell, fmt_cell, has_interval,
                                   interval_cell, show_cells)
from harness.rows.stats import MIN_INTERVAL_SAMPLES


def row_index(agg: pd.DataFrame) -> pd.Index:
    """Row index of a table: the decoder configuration, under its run group when there are several."""
    if agg["group"].nunique() > 1:
        return pd.MultiIndex.from_arrays([agg["group"].tolist(), agg["label"].tolist()])
    return pd.Index(agg["label"].tolist())


def has_prefill(agg: pd.DataFrame) -> bool:
    """Whether the rows recorded time to first token / decode-only tokens/s (the prefill columns are shown)."""
    return any(c in agg and agg[c].notna().any() for c in ("decode_speedup", "ttft_s"))


def _equality_cell(r: pd.Series) -> str:
    if str(r.get("equality_check")) == columns.EQUALITY_SAMPLED:
        return "n/a"
    return fmt_cell(r.get("equal_to_vanilla"))


def _seeds(agg: pd.DataFrame) -> int:
    return int(columns.num(agg["seeds"]).max()) if "seeds" in agg and columns.num(agg["seeds"]).notna().any() else 0


def _samples_cell(r: pd.Series) -> str:
    """The samples a row's figures are over: ``5``, or ``3/5`` when the group has more
    (:func:`harness.report.tables.coverage_cell`, which summary.md prints too)."""
    return coverage_cell(r)


def coverage_columns(agg: pd.DataFrame) -> dict[str, list[str]]:
    """The coverage cells of a formatted table (one per row of ``agg``), header -> cells: ``samples`` always
    (:func:`_samples_cell`), ``cells`` ((sample, turn) cells, the same way) for a multi-turn task, ``failed``
    (cells without a measurement, by status) and ``unpaired`` (ok rows without a vanilla pair) when any row
    has some."""
    out = {"samples": [_samples_cell(r) for _, r in agg.iterrows()]}
    if show_cells(agg):
        out["cells"] = [coverage_cell(r, "cells") for _, r in agg.iterrows()]
    if "failed" in agg and columns.num(agg["failed"]).fillna(0).any():
        why = agg["failed_statuses"] if "failed_statuses" in agg else agg["failed"]
        out["failed"] = [str(s) if isinstance(s, str) and s else fmt_cell(n, "g") if n else "-"
                         for s, n in zip(why, columns.num(agg["failed"]).fillna(0))]
    if "unpaired" in agg and columns.num(agg["unpaired"]).fillna(0).any():
        out["unpaired"] = [fmt_cell(int(v), "g") if v else "-" for v in columns.num(agg["unpaired"]).fillna(0)]
    return out


def main_table(agg: pd.DataFrame, quality: Sequence[str] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper table: decoders as rows, metrics as columns: the samples the row's figures are over
    (``3/5``: 3 of the group's 5), tokens/s, end-to-end speedup [95% CI], tau, alpha, equality (``n/a`` for
    sampled runs), then -- when rows record them -- decode-only speedup [95% CI], mean time to first token (ms)
    and the prefill share, the sampling seeds when several, the quality columns (``mean [low, high]`` over
    seeds when there are several), and -- when any row has some -- the failed or skipped cells by status and
    the unpaired rows (:func:`coverage_columns`). Every figure is over the row's figure rows
    (:mod:`harness.rows.cells`).

    Returns:
        ``(numeric, text)``: ``numeric`` is tidy (group, label, each metric with its interval bounds, the
        quality means) for CSV; ``text`` has formatted cells, indexed by (group,) label, for markdown/LaTeX.
    """
    quality = [q for q in quality if q in agg]
    agg = with_figures(agg)
    prefill = has_prefill(agg)
    seeds = _seeds(agg)
    params = [p for p in grouping.decoder_param_columns(agg) if p in agg]
    figures = main_figures(agg, prefill)
    cols = ["group", "task", "model_pair", "dtype", "device_name", "git_commit", "max_new_tokens", "label",
            "decoder", "settings", *params, *coverage.COVERAGE_COLUMNS, "rows", "repeats",
            "seeds", "temperature", "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high", "speedup", "speedup_low",
            "speedup_high", "speedup_total", "decode_speedup", "decode_speedup_low", "decode_speedup_high",
            "ttft_s", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s", "tpot_s_p50", "tpot_s_p90", "tpot_s_p99",
            "prefill_share", "peak_memory_mb", "accept_length", "accept_length_low", "accept_length_high",
            "acceptance_rate", "equality_check", "equal_to_vanilla", *[c.name for c in figures],
            *[c for q in quality for c in (q, f"{q}_low", f"{q}_high", f"{q}_seed_std")]]
    numeric = agg[[c for c in dict.fromkeys(cols) if c in agg]].copy()
    text = pd.DataFrame(index=row_index(agg))
    cover = coverage_columns(agg)
    if "settings" in agg and agg["settings"].fillna("").astype(str).str.len().any():
        text["settings"] = [s if isinstance(s, str) and s else "-" for s in agg["settings"]]
    text["samples"] = cover.pop("samples")
    if "cells" in cover:
        text["cells"] = cover.pop("cells")
    for col in figures:
        shown = not col.interval or has_interval(agg, col.name)
        text[col.header if shown else col.display or col.name] = figure_cells(agg, col, note_few=shown)
    if seeds > 1:
        text["seeds"] = [fmt_cell(int(v)) if not pd.isna(v) else "-" for v in columns.num(agg["seeds"])]
    for q in quality:  # two decimals: a score over tens of problems has no third
        text[q] = [interval_cell(r, q, ".2f") for _, r in agg.iterrows()]
    for name, cells in cover.items():
        text[name] = cells
    text.columns.name = "decoder"
    return numeric, text


def main_figures(agg: pd.DataFrame, prefill: bool) -> list[columns.Column]:
    """The figures of the main table, in order: the summary columns declared ``report="main"``, then -- when
    the rows record the runner's stopwatch (``prefill``) -- those declared ``"prefill"`` and the ``"recorded"``
    ones some row has a value of (:class:`harness.rows.columns.Column`)."""
    shown = columns.main_table_columns("main")
    if prefill:
        shown += [c for c in columns.main_table_columns("prefill", "recorded")
                  if c.report == "prefill" or (c.name in agg and agg[c.name].notna().any())]
    return shown


def figure_cells(agg: pd.DataFrame, col: columns.Column, note_few: bool = True) -> list[str]:
    """The cells of one figure of the main table in its declared format: with its interval when declared so
    (:func:`harness.report.tables.interval_cell`; ``note_few``: "n too small" where a row has too few samples),
    ``n/a`` for the equality of a sampled run, ``-`` where missing."""
    if col.interval:
        return [interval_cell(r, col.name, col.fmt, note_few) for _, r in agg.iterrows()]
    if col.name == "equal_to_vanilla":
        return [_equality_cell(r) for _, r in agg.iterrows()]
    return [col.cell(v) for v in agg.get(col.name, pd.Series([math.nan] * len(agg)))]

#: The figures every formatted table reads: blank (``-``) in a table of cells none of which was measured.
FIGURE_COLUMNS = ("tokens_per_s", "speedup", "speedup_total", "accept_length", "acceptance_rate", "equal_to_vanilla")


def with_figures(agg: pd.DataFrame) -> pd.DataFrame:
    """``agg`` with every :data:`FIGURE_COLUMNS` column (NaN where no cell had a figure row: a run whose every
    cell failed is a table of its failures, not a KeyError)."""
    missing = [c for c in FIGURE_COLUMNS if c not in agg]
    return agg.assign(**{c: math.nan for c in missing}) if missing else agg


def settings_caption(agg: pd.DataFrame) -> str:
    """`` Settings: speculative_tuned: gamma=8; ...`` for the configurations that have settings."""
    if "settings" not in agg:
        return ""
    pairs = dict.fromkeys((str(lab), str(s)) for lab, s in zip(agg["label"], agg["settings"])
                          if isinstance(s, str) and s)
    return (" Settings: " + "; ".join(f"{lab}: {s}" for lab, s in pairs) + ".") if pairs else ""


MAIN_CAPTION = ("tok/s: mean new tokens per second of the whole generate call (prefill included). speedup: mean "
                "over samples of the paired ratio tok/s(decoder) / tok/s(vanilla) in the same run{interval}. tau: new "
                "tokens per target forward (prefill included; vanilla = 1). alpha: accepted / drafted tokens. eq.: "
                "fraction of samples whose tokens equal vanilla's (n/a: sampled run, whose outputs are compared in "
                "distribution, not token by token).")
#: How the caption speaks of the speedup's interval: shown (some row has one), or none at all.
INTERVAL_CAPTION = ", with a 95% bootstrap CI over samples and repeats"
NO_INTERVAL_CAPTION = f" (no interval: every row has fewer than {MIN_INTERVAL_SAMPLES} samples)"
PREFILL_CAPTION = (" decode speedup: the same paired mean for decode-only tok/s (tokens after the first emission / "
                   "seconds after both models' prefills, the draft's prefill counted as prefill for every decoder). "
                   "TTFT: mean time to the first new token; TPOT: mean time per output token after it. prefill: "
                   "mean share of a call's wall time spent in both prefills.")
SEEDS_CAPTION = (" Sampled runs over several seeds (runner.seed): speedups paired within each seed's run; quality = "
                 "mean over seeds of each seed's mean, [95% Student-t interval over seeds].")


COVERAGE_CAPTION = f" samples: {SAMPLES_MEANING}."
CELLS_CAPTION = f" cells: {CELLS_MEANING}."
FAILED_CAPTION = " failed: cells without a measurement, by status (the reasons are in report.md's warnings)."
UNPAIRED_CAPTION = " unpaired: ok rows left out of every figure for want of an ok vanilla row to pair with."
CLEAN_CAPTION = " Every cell was measured and paired with vanilla."


def coverage_caption(agg: pd.DataFrame) -> str:
    """What the coverage columns of :func:`coverage_columns` mean, for the columns shown; or that every cell
    was measured and paired."""
    shown = coverage_columns(agg)
    text = COVERAGE_CAPTION + (CELLS_CAPTION if "cells" in shown else "") + \
        (FAILED_CAPTION if "failed" in shown else "") + (UNPAIRED_CAPTION if "unpaired" in shown else "")
    whole = not any("/" in c for c in [*shown["samples"], *shown.get("cells", [])])  # no row short of its group
    return text + (CLEAN_CAPTION if whole and not {"failed", "unpaired"} & set(shown) else "")


def main_caption(agg: pd.DataFrame) -> str:
    """The main table's caption: the definitions of the columns it shows."""
    interval = INTERVAL_CAPTION if has_interval(agg, "speedup") else NO_INTERVAL_CAPTION
    return (MAIN_CAPTION.format(interval=interval) + (PREFILL_CAPTION if has_prefill(agg) else "")
            + (SEEDS_CAPTION if _seeds(agg) > 1 else "")
            + coverage_caption(agg))
