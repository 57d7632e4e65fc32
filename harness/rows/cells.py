"""Which cells every figure stands on: coverage, pairing with vanilla and duplicate cells.

:mod:`harness.rows.metrics` computes the figures; this module decides and says which rows they are computed over,
so that a failed, skipped, unpaired or duplicated cell never changes a published number without a word.
Pure pandas; no torch. The rules (stated once; ``harness.rows.metrics``' docstring points here):

* **Figure rows.** A decoder's ``ok`` row is *paired* when an ``ok`` vanilla row of the same run, task, sample,
  turn and repeat exists (:data:`harness.rows.columns.PAIR_KEYS`). In a group that holds vanilla rows (of any
  status), every figure of a configuration -- tokens/s, both speedup estimators, decode speedup, TTFT,
  prefill share, tau, alpha, equality, quality, the theory columns and the figures' frames -- is computed over
  its paired rows only. An ``ok`` row without an ``ok`` vanilla pair (vanilla failed, was skipped, or has no
  row there) is *unpaired*: counted (``unpaired``), named in a warning, in no figure. Tokens/s follows the
  same rule as speedup on purpose: a tokens/s over five samples beside a speedup over three is how the table
  came to print 126 tok/s against vanilla's 105 as a speedup of 0.63. A group without any vanilla row (a run of
  decoders alone) has nothing to pair with: its figures use every ``ok`` row and its speedups are empty.
* **Coverage columns** of each cell (one group and configuration): ``group_samples`` = distinct samples among
  all rows of the group (any decoder, any status); ``samples`` = distinct samples with an ``ok`` row of the
  cell; ``paired_samples`` = distinct samples its figures are computed over; ``unpaired`` = its ``ok`` rows
  left out; ``failed`` = its rows without a measurement (``error``, and skips such as ``prompt_too_long``,
  ``empty_prompt``, and ``invalid``: a row read from a file that failed the rows schema,
  :func:`harness.rows.columns.row_problem`); ``failed_statuses`` = those counted by status (``2 error, 1
  prompt_too_long``); ``group_cells`` / ``cells`` / ``paired_cells`` = the same for (sample, turn) cells (a
  multi-turn task has several per sample). Failed cells and unpaired rows are each named in a warning with the
  rows' ``reason``; configurations of one group whose figures cover different (sample, turn) cells -- not only
  different samples: a decoder that lost turn 2 of a question -- are named in one warning per group.
* **Duplicate cells.** Two ``ok`` rows of one cell (same ``run_id``, task, sample, turn, repeat, seed and
  decoder configuration) are one measurement counted twice: :func:`collapse_duplicates` keeps the last ``ok``
  row and warns. A non-``ok`` row followed by another row of its cell is a retry (a resumed run) and is
  dropped quietly, as :func:`harness.rows.identity.latest_rows` does. Folders holding the same cells of one run (a run
  and a copy of it, whole or partial) are read as one run (:func:`fold_copies`), with a warning per copy; a
  folder holding a cell's ``ok`` row twice is named too (:func:`repeated_cells`), and so is a run read in part,
  some of its shards only (:func:`shard_warnings`).
* **Two runs compared** (:func:`on_common_samples`): figures on the samples both sides cover, their number
  said, and a note when the sides cover different samples.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from harness.rows.columns import norm
from harness.rows.identity import cell_key

log = logging.getLogger(__name__)

#: Columns that identify one measured cell in a prepared frame (those present are used).
CELL_KEYS = ("group", "run_id", "task", "sample_id", "turn", "repeat", "sampling_seed", "decoder", "decoder_params")
#: How many sample ids a warning names before it says how many there are.
SHOWN_IDS = 5
#: Longest ``reason`` a warning quotes.
REASON_CHARS = 160
#: Coverage columns of an aggregate, in table order (see the module docstring).
COVERAGE_COLUMNS = ("group_samples", "samples", "paired_samples", "group_cells", "cells", "paired_cells", "unpaired",
                    "failed", "failed_statuses")


# ------------------------------------------------------------------------------------------------ helpers
def _ok(rows: pd.DataFrame) -> pd.Series:
    return rows["status"] == "ok" if "status" in rows else pd.Series(True, index=rows.index, dtype=bool)


def samples_of(rows: pd.DataFrame) -> set[tuple[str, str]]:
    """The distinct ``(task, sample_id)`` of ``rows``."""
    if rows.empty:
        return set()
    task = rows["task"].astype(str) if "task" in rows else pd.Series("", index=rows.index)
    return set(zip(task, rows["sample_id"].astype(str)))


def cells_of(rows: pd.DataFrame) -> set[tuple[str, str, Any]]:
    """The distinct ``(task, sample_id, turn)`` of ``rows``: the cells a figure stands on (a sample of a
    multi-turn task such as MT-Bench has one per turn; ``turn`` 0 where the rows have none)."""
    if rows.empty:
        return set()
    task = rows["task"].astype(str) if "task" in rows else pd.Series("", index=rows.index)
    turn = rows["turn"].map(norm).fillna(0) if "turn" in rows else pd.Series(0, index=rows.index)
    return set(zip(task, rows["sample_id"].astype(str), turn))


def name_cells(cells: Iterable[tuple]) -> str:
    """Cells for a warning: ``mt_bench/81 turn 2`` (turns counted from 1), the first :data:`SHOWN_IDS` in
    natural order, then how many there are."""
    ids = sorted({f"{c[1]} turn {int(c[2]) + 1}" for c in cells}, key=_natural)
    shown = ", ".join(ids[:SHOWN_IDS])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > SHOWN_IDS else "")


def _natural(s: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


def name_samples(samples: Iterable[Any]) -> str:
    """Sample ids for a warning: the first :data:`SHOWN_IDS` in natural order, then how many there are."""
    ids = sorted({str(s[1]) if isinstance(s, tuple) else str(s) for s in samples}, key=_natural)
    shown = ", ".join(ids[:SHOWN_IDS])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > SHOWN_IDS else "")


def plural(n: int, noun: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def count_values(values: Iterable[Any], missing: str = "no row") -> str:
    """``"2 error, 1 prompt_too_long"``: the values counted, in first-seen order (None/NaN as ``missing``)."""
    counts = Counter(missing if norm(v) is None else str(v) for v in values)
    return ", ".join(f"{n} {v}" for v, n in counts.items())


def reasons(rows: pd.DataFrame) -> str:
    """The first ``reason`` of each status among ``rows`` (``status: reason``), each cut to
    :data:`REASON_CHARS` characters; empty when the rows carry none."""
    if "reason" not in rows:
        return ""
    out = []
    for status, g in rows.groupby(rows["status"].astype(str), sort=False):
        why = next((str(r) for r in g["reason"] if norm(r) is not None), "")
        if why:
            out.append(f"{status}: " + (why if len(why) <= REASON_CHARS else why[:REASON_CHARS - 3] + "..."))
    return "; ".join(out)


# ------------------------------------------------------------------------------------------------ pairing
def mark_pairs(merged: pd.DataFrame, rows: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Add ``in_figures`` and ``vanilla_status`` to :func:`harness.rows.metrics.paired_speedups`' frame.

    Args:
        merged: the ``ok`` rows left-merged with vanilla's ``ok`` rows on ``keys``, with the merge indicator
            ``_vanilla`` (``both`` where a vanilla row was found).
        rows: all rows (any status), to tell groups with vanilla rows and what vanilla did where it left a
            decoder row unpaired.
        keys: the pairing keys.

    Returns:
        ``merged`` without ``_vanilla``, with ``in_figures`` (paired, or in a group without vanilla rows) and
        ``vanilla_status`` (``ok`` where paired, else the status of vanilla's row there, NaN: no row).
    """
    paired = (merged["_vanilla"] == "both").to_numpy()
    scope = "group" if "group" in rows else "task" if "task" in rows else None
    vanilla = rows[rows["decoder"] == "vanilla"]
    if scope is None:
        attempted = pd.Series(not vanilla.empty, index=merged.index)
    else:
        attempted = merged[scope].isin(set(vanilla[scope]))
    merged = merged.drop(columns="_vanilla")
    merged["in_figures"] = paired | ~attempted.to_numpy()
    bad = vanilla[~_ok(vanilla)]
    if len(bad):
        bad = bad[[*keys, "status"]].drop_duplicates(list(keys), keep="last")
        bad = bad.rename(columns={"status": "vanilla_status"})
        merged = merged.merge(bad, on=list(keys), how="left")
    else:
        merged["vanilla_status"] = None
    merged["vanilla_status"] = merged["vanilla_status"].astype(object).where(~paired, "ok")
    return merged


# ------------------------------------------------------------------------------------------------ coverage
def group_coverage(rows: pd.DataFrame, figures: pd.DataFrame,
                   keys: Sequence[str]) -> dict[tuple, tuple[int, int, list]]:
    """Per group (``keys``: the group and any split columns): its number of samples and of (sample, turn) cells
    (any decoder, any status), and a warning when its configurations' figures cover different cells -- a
    decoder that lost turn 2 of a sample covers that sample still, but on half its cells.

    Returns:
        ``{key tuple: (group_samples, group_cells, [warning] or [])}``.
    """
    out: dict[tuple, tuple[int, int, list]] = {}
    fig = {k if isinstance(k, tuple) else (k,): g for k, g in figures.groupby(list(keys), sort=False, dropna=False)}
    for key, all_g in rows.groupby(list(keys), sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        universe, cells = samples_of(all_g), cells_of(all_g)
        f = fig.get(key, figures.iloc[0:0])
        by_label = {lab: cells_of(fl) for lab, fl in f.groupby("label", sort=False)}
        per = {lab: by_label.get(lab, set()) for lab in dict.fromkeys(all_g["label"])}
        warn = []
        if len({frozenset(s) for s in per.values()}) > 1:
            turns = len(cells) > len(universe)  # a multi-turn task: say cells, not samples
            unit = "(sample, turn) cells" if turns else "samples"

            def missing(s: set) -> str:
                return name_cells(cells - s) if turns else name_samples({c[:2] for c in cells - s})

            parts = [f"{lab} {len(s if turns else {c[:2] for c in s})}" + (f" (not {missing(s)})" if cells - s else "")
                     for lab, s in per.items()]
            where = " | ".join(map(str, key))
            total = len(cells) if turns else len(universe)
            warn.append(f"{where}: the decoders' figures cover different {unit} ({total} in all): "
                        f"{'; '.join(parts)}. Each row is computed over its own {unit} (speedups stay paired "
                        f"per sample and turn): compare rows on the {unit} they share (the "
                        f"{'cells' if turns else 'samples'} column)")
        out[key] = (len(universe), len(cells), warn)
    return out


def cell_coverage(all_g: pd.DataFrame, g: pd.DataFrame, unpaired: pd.DataFrame | None) -> tuple[dict, list[str]]:
    """Coverage columns (see the module docstring, but ``group_samples``) and warnings of one cell.

    Args:
        all_g: the cell's rows, any status.
        g: its figure rows (:func:`mark_pairs`' ``in_figures``).
        unpaired: its ``ok`` rows left out of the figures (with ``vanilla_status``), or None.
    """
    unpaired = unpaired if unpaired is not None else g.iloc[0:0]
    ok = _ok(all_g)
    measured, bad = (all_g, all_g.iloc[0:0]) if ok.all() else (all_g[ok], all_g[~ok])
    rec = {"samples": len(samples_of(measured)), "paired_samples": len(samples_of(g)),
           "cells": len(cells_of(measured)), "paired_cells": len(cells_of(g)),
           "unpaired": len(unpaired), "failed": len(bad),
           "failed_statuses": count_values(bad["status"]) if len(bad) else ""}
    where = f"{all_g['label'].iloc[0]} ({all_g['group'].iloc[0]})" if "group" in all_g else str(all_g["label"].iloc[0])
    turns = "turn" in all_g and bool((all_g["turn"].map(norm).fillna(0) != 0).any())

    def on(rows: pd.DataFrame) -> str:  # where rows lie: cells of a multi-turn task, else samples
        return name_cells(cells_of(rows)) if turns else name_samples(samples_of(rows))

    cover = (f"{rec['paired_cells']} (sample, turn) {'cell' if rec['paired_cells'] == 1 else 'cells'} of "
             f"{plural(rec['paired_samples'], 'sample')}"
             if turns else plural(rec["paired_samples"], "sample"))
    warnings = []
    if len(bad):
        why = reasons(bad)
        warnings.append(f"{where}: {len(bad)} of {plural(len(all_g), 'cell')} not measured "
                        f"({rec['failed_statuses']}{'; ' + why if why else ''}) on {on(bad)}; "
                        f"its figures cover {cover}")
    if len(unpaired):
        verb = "has" if len(unpaired) == 1 else "have"
        warnings.append(f"{where}: {plural(len(unpaired), 'ok row')} on {on(unpaired)} {verb} "
                        f"no ok vanilla row on the same sample, turn and repeat (vanilla: "
                        f"{count_values(unpaired['vanilla_status'])}): left out of every figure of this row (tok/s, "
                        f"speedup, tau, equality, quality), which cover "
                        f"{cover if turns else plural(rec['paired_samples'], 'paired sample')}")
    return rec, warnings


# ------------------------------------------------------------------------------------------------ duplicates
def _keys(rows: pd.DataFrame, columns: Sequence[str]) -> list[tuple]:
    cols = [c for c in columns if c in rows]
    return [tuple(norm(v) for v in t) for t in rows[cols].itertuples(index=False, name=None)]


def collapse_duplicates(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per cell (:data:`CELL_KEYS`): the last ``ok`` row, else the last row. Two ``ok`` rows of one cell
    (a measurement counted twice) give a warning (returned, for the caller to show with its others); a
    superseded non-``ok`` row (a retry) goes quietly.

    Returns:
        ``(rows, warnings)``; ``rows`` is returned unchanged when every cell has one row.
    """
    if rows.empty:
        return rows, []
    keys = _keys(rows, CELL_KEYS)
    ok = _ok(rows).to_numpy()
    chosen: dict[tuple, int] = {}
    n_ok: Counter = Counter()
    for i, (k, is_ok) in enumerate(zip(keys, ok)):
        n_ok[k] += bool(is_ok)
        prev = chosen.get(k)
        if prev is None or is_ok or not ok[prev]:
            chosen[k] = i
    if len(chosen) == len(rows):
        return rows, []
    doubled = [k for k, n in n_ok.items() if n > 1]
    warnings = []
    if doubled:
        cols = [c for c in CELL_KEYS if c in rows]
        example = ", ".join(f"{c}={v}" for c, v in zip(cols, doubled[0]) if c in ("run_id", "sample_id", "decoder"))
        warnings.append(f"duplicate cells: {sum(n_ok[k] - 1 for k in doubled)} ok rows repeat a cell already "
                        f"measured ({len(doubled)} cells with the same run_id, task, sample, turn, repeat and decoder "
                        f"configuration, e.g. {example}): each cell is counted once (its last ok row)")
    kept = rows.iloc[sorted(chosen.values())].reset_index(drop=True)
    kept.attrs = dict(rows.attrs)
    return kept, warnings


def fold_copies(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Folders holding the same cells of one run (same ``run_id`` and cell, :func:`harness.rows.identity.cell_key`:
    a run and a copy of it, whole or partial) are one run: their rows get the first such folder's ``run_dir``, so
    the caller's one-row-per-cell rule counts each cell once; each copy is named in a warning. Folders of one run
    that share no cell (shards) are left apart.

    Returns:
        ``(rows, warnings)``.
    """
    if rows.empty or not {"run_dir", "run_id"} <= set(rows.columns):
        return rows, []
    first: dict[tuple, str] = {}
    copies: dict[tuple[str, Any], str] = {}
    shared: Counter = Counter()
    for r in rows.to_dict("records"):
        rid = norm(r.get("run_id"))
        home = first.setdefault((rid, *cell_key(r)), r["run_dir"])
        if home != r["run_dir"]:
            copies.setdefault((r["run_dir"], rid), home)
            shared[(r["run_dir"], rid)] += 1
    if not copies:
        return rows, []

    def root(folder: str, rid: Any) -> str:
        seen = {folder}
        while (folder, rid) in copies and copies[(folder, rid)] not in seen:
            folder = copies[(folder, rid)]
            seen.add(folder)
        return folder

    warnings = [f"duplicate cells: {d} repeats {shared[(d, rid)]} cells of run {rid} that {root(d, rid)} holds too "
                f"(a copy of the same run?): the folders are read as one run, each cell counted once"
                for d, rid in copies]
    for w in warnings:
        log.warning("%s", w)
    rows = rows.copy()
    rows["run_dir"] = [root(d, norm(rid)) if (d, norm(rid)) in copies else d
                       for d, rid in zip(rows["run_dir"], rows["run_id"])]
    return rows, warnings


def repeated_cells(rows: pd.DataFrame, extra_keys: Sequence[str] = ()) -> list[str]:
    """A warning per folder whose rows measure one cell twice (two ``ok`` rows of one run, cell and
    ``extra_keys``, :func:`harness.rows.identity.cell_key`: the rows appended again, or a copy of them pasted into
    the file), for the caller to show: one row per cell is then kept (the last ``ok`` one), never both."""
    if rows.empty or "run_dir" not in rows:
        return []
    ok = _ok(rows).to_numpy()
    counts: Counter = Counter()
    for r, is_ok in zip(rows.to_dict("records"), ok):
        if is_ok:
            counts[(r["run_dir"], norm(r.get("run_id")), *(norm(r.get(k)) for k in extra_keys), *cell_key(r))] += 1
    per_dir: Counter = Counter()
    for k, n in counts.items():
        if n > 1:
            per_dir[k[0]] += n - 1
    return [f"duplicate cells: {d} holds {plural(n, 'ok row')} repeating a cell of the same run already measured "
            "(rows appended twice, or a copy of the run's rows added to its file?): each cell is counted once "
            "(its last ok row)" for d, n in per_dir.items()]


def _shard(spec: Any) -> tuple[int, int] | None:
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        return None
    return (i, n) if 0 <= i < n else None


def shard_warnings(rows: pd.DataFrame) -> list[str]:
    """A warning per run read in part: its rows carry ``shard`` ``i/n`` (``runner.shard``) and not every one of
    the ``n`` shards is among them, so its figures cover those shards' samples only -- the report must say so,
    as the shard's own ``summary.md`` does."""
    if rows.empty or "shard" not in rows:
        return []
    run = rows["run_identity"] if "run_identity" in rows else rows["run_id"] if "run_id" in rows else \
        pd.Series("run", index=rows.index)
    out = []
    for rid, specs in rows["shard"].groupby(run.astype(str), sort=False):
        shards = {s for s in map(_shard, specs.dropna().unique()) if s}
        for n in sorted({n for _, n in shards}):
            have = sorted(i for i, m in shards if m == n)
            if len(have) < n:
                out.append(f"run {rid[:12]} is read in part: shard{'s' if len(have) > 1 else ''} "
                           f"{', '.join(f'{i}/{n}' for i in have)} only ({len(have)} of {n} shards, runner.shard): "
                           f"its figures cover those shards' samples, not the run's; give every shard's folder to "
                           f"report the whole run")
    return out


# ------------------------------------------------------------------------------------------------ comparison
def on_common_samples(ga: pd.DataFrame, gb: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Two runs' figure rows of one configuration restricted to the samples both cover.

    Returns:
        ``(ga, gb, info)``; ``info`` has ``samples_a``, ``samples_b``, ``common_samples`` and ``coverage_note``
        (empty when both sides cover the same samples).
    """
    sa, sb = samples_of(ga), samples_of(gb)
    common = sa & sb
    note = ""
    if sa != sb:
        only = [f"only in {side}: {name_samples(s)}" for side, s in (("A", sa - sb), ("B", sb - sa)) if s]
        note = (f"A covers {len(sa)} samples, B {len(sb)}: compared on the {len(common)} both cover "
                f"({'; '.join(only)})")

    def keep(g: pd.DataFrame) -> pd.DataFrame:
        mask = [k in common for k in zip(g["task"].astype(str), g["sample_id"].astype(str))]
        return g[pd.Series(mask, index=g.index, dtype=bool)]

    return keep(ga), keep(gb), {"samples_a": len(sa), "samples_b": len(sb), "common_samples": len(common),
                                "coverage_note": note}


def side_note(side: str, counts: Mapping[str, Any]) -> str:
    """``"B: 2 cells without a measurement (2 error), 1 ok row without a vanilla pair (left out)"`` for one side
    of a comparison; empty when the side lost nothing."""
    parts = []
    if counts.get("failed"):
        parts.append(f"{plural(counts['failed'], 'cell')} without a measurement ({counts.get('failed_statuses')})")
    if counts.get("unpaired"):
        parts.append(f"{plural(counts['unpaired'], 'ok row')} without a vanilla pair (left out)")
    return f"{side}: " + ", ".join(parts) if parts else ""
