"""Warnings attached to a summary's cells: machine load, bf16 emulated on a CPU without bf16 units,
run-to-run noise over replicates, and lossless decoders whose quality differs from vanilla's. The rule of the
harness is that nothing is silent: a figure that stands on doubtful rows carries a warning that says which and
why (:func:`iter_warnings` lists them for ``summary.md``, ``report.md`` and the runner's log).
"""

from __future__ import annotations

import logging
import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from harness.rows.columns import CORE_COLUMNS, EQUALITY_EXACT, LOAD_COLUMNS, PAIR_KEYS, fmt_value, num
from harness.rows.grouping import ok_rows
from harness.rows.machine import emulated_half_note

log = logging.getLogger(__name__)


#: A row ran on a loaded machine when its load average exceeded the usable cores by more than this: the run's
#: own threads (up to one per core) load the machine up to the core count, anything above is other work.
LOAD_MARGIN = 0.5


def replicate_noise(g: pd.DataFrame, value: str) -> tuple[float, int]:
    """Run-to-run noise of a cell's figure: the standard deviation, over replicates ``(run_id, repeat)``, of
    the replicate's mean ``value``, pooled over replicates that cover the same samples (shards cover
    different samples and are not compared with each other).

    Args:
        g: the cell's rows (with ``value``, ``run_id``, ``repeat``, ``task``, ``sample_id``, ``turn``).
        value: column to average per replicate (``speedup``, ``tokens_per_s``).

    Returns:
        ``(std, replicates)``; std is NaN when no sample set has two replicates; ``replicates`` is how many
        replicates measured each sample, the fewest over the cell's samples (two shards of one run are one
        replicate, three seeds or repeats of every sample are three).
    """
    if g.empty or value not in g:
        return math.nan, 0
    x = num(g[value])
    codes: dict[tuple[str, str], int] = {}  # replicate (run_id, repeat) -> its number, in first-seen order
    rep = [codes.setdefault(k, len(codes)) for k in zip(map(str, g["run_id"]), map(str, g["repeat"]))]
    samples = list(zip(map(str, g["task"]), map(str, g["sample_id"]), map(str, g["turn"])))
    means = x.groupby(np.asarray(rep), sort=False).mean()  # position i: replicate i
    covered: dict[int, set] = {}  # replicate -> the samples it measured
    reps_of: dict[tuple, set] = {}  # sample -> the replicates that measured it
    for r, sample in zip(rep, samples):
        covered.setdefault(r, set()).add(sample)
        reps_of.setdefault(sample, set()).add(r)
    same_samples: dict[frozenset, list[int]] = {}
    for r in range(len(codes)):
        same_samples.setdefault(frozenset(covered[r]), []).append(r)
    ss, dof = 0.0, 0
    for reps in same_samples.values():
        m = means.iloc[reps].dropna()
        if len(m) >= 2:
            ss += float(((m - m.mean()) ** 2).sum())
            dof += len(m) - 1
    return (math.sqrt(ss / dof) if dof else math.nan), min(len(r) for r in reps_of.values())


def load_columns(rows: pd.DataFrame) -> list[str]:
    """The load-average columns ``rows`` carry (:data:`LOAD_COLUMNS`; older names are renamed where rows are read,
    :func:`harness.rows.legacy.upgrade`)."""
    return [c for c in LOAD_COLUMNS if c in rows]


def usable_cores(rows: pd.DataFrame) -> pd.Series:
    """Per row: the cores the run could use (``cpu_affinity``; ``cpu_count`` where that is missing); NaN when
    rows record neither."""
    out = pd.Series(math.nan, index=rows.index, dtype=float)
    for c in reversed(CORE_COLUMNS):  # cpu_affinity wins where both exist
        if c in rows:
            v = num(rows[c])
            out = v.where(v.notna(), out)
    return out


def load_stats(g: pd.DataFrame, margin: float = LOAD_MARGIN) -> tuple[float, int | None, float]:
    """``(max load average, rows whose load exceeded their usable cores + margin, usable cores)`` of rows that
    record load (:func:`load_columns`, :func:`usable_cores`); ``(NaN, None, NaN)`` when they do not."""
    cols = load_columns(g)
    cores = usable_cores(g)
    if not cols or cores.isna().all():
        return math.nan, None, math.nan
    load = pd.concat([num(g[c]) for c in cols], axis=1).max(axis=1)
    over = int((load > cores + margin).sum())
    return (float(load.max()) if load.notna().any() else math.nan), over, float(cores.max())


def load_warning(group: str, rows: pd.DataFrame, margin: float) -> str | None:
    """One warning for a group whose rows ran on a loaded machine (None when none did)."""
    peak, over, cores = load_stats(rows, margin)
    if not over:
        return None
    return (f"machine load ({group}): the 1-minute load average reached {peak:.1f} on {fmt_value(cores)} usable "
            f"cores; {over} of {len(rows)} rows were measured above {fmt_value(cores)} + {margin:g} (columns "
            f"{', '.join(load_columns(rows))}): other work shared the machine, so timings and speedups are "
            "unreliable; rerun on a quiet machine")


def emulated_half_warning(group: str, rows: pd.DataFrame) -> str | None:
    """One warning for a group measured in a half-precision dtype its CPU lacks instructions for (rows whose
    ``native_half_precision`` is False, as the runner records it; :func:`harness.rows.machine.emulated_half_note`),
    else None. Older rows without the column get no warning."""
    if "native_half_precision" not in rows:
        return None
    emulated = rows[rows["native_half_precision"].map(lambda v: v is False or v == "False")]
    if emulated.empty:
        return None
    return f"{group}: {emulated_half_note(emulated.iloc[0].to_dict())}"


def run_warnings(agg: pd.DataFrame) -> list[str]:
    """The distinct warnings of an aggregate (machine load, once per group; cross-process pairs and
    disagreeing estimators, per cell), in table order: what ``summary.md``, ``report.md`` and the runner's
    log print."""
    return iter_warnings([agg])


def iter_warnings(frames: Iterable[pd.DataFrame]) -> list[str]:
    """Distinct warnings of aggregates (their ``warnings`` lists), in order."""
    seen: dict[str, None] = {}
    for f in frames:
        if "warnings" in f:
            for ws in f["warnings"]:
                seen.update(dict.fromkeys(ws if isinstance(ws, list) else []))
    return list(seen)


#: Suffix of vanilla's quality columns beside a decoder's in :func:`lossless_quality_flags`.
VANILLA_SUFFIX = " (vanilla)"


def lossless_quality_flags(agg: pd.DataFrame, rows: pd.DataFrame, quality: Sequence[str]) -> None:
    """Warn, per greedy cell, where a decoder's quality differs from vanilla's on the same samples: lossless
    decoders must score what vanilla scores; in bfloat16 they can leave vanilla's tokens (rounding in a wider
    verification), and the score then moves with that divergence, not with the decoder."""
    ok = ok_rows(rows)
    scored = [q for q in dict.fromkeys(quality) if q in ok]
    keys = [k for k in PAIR_KEYS if k in ok]
    if not scored or ok.empty:
        return
    vanilla = ok[ok["decoder"] == "vanilla"].drop_duplicates(keys, keep="last")[[*keys, *scored]]
    if vanilla.empty:
        return
    decoders = ok[ok["decoder"] != "vanilla"][list(dict.fromkeys(["group", "label", *keys, *scored]))]
    paired = decoders.merge(vanilla, on=keys, how="inner", suffixes=("", VANILLA_SUFFIX))  # same sample and repeat
    cells = dict(iter(paired.groupby(["group", "label"], sort=False)))
    for rec in agg[[c for c in ("group", "label", "decoder", "equality_check", "warnings", "divergent_samples",
                                "equal_to_vanilla") if c in agg]].to_dict("records"):  # the lists are agg's own
        g = cells.get((rec["group"], rec["label"]))
        if rec["decoder"] == "vanilla" or rec.get("equality_check") != EQUALITY_EXACT or g is None:
            continue
        for q in scored:
            a, b = num(g[q]), num(g[q + VANILLA_SUFFIX])
            differ = a.notna() & b.notna() & (a != b)
            if differ.any():
                rec["warnings"].append(
                    f"{rec['label']} ({rec['group']}): {q} differs from vanilla's on {int(differ.sum())} of "
                    f"{int((a.notna() & b.notna()).sum())} paired rows ({a.mean():.2f} vs {b.mean():.2f}) although "
                    f"greedy decoding is lossless: its tokens left vanilla's on "
                    f"{len(rec.get('divergent_samples') or [])} samples (equal_to_vanilla "
                    f"{rec.get('equal_to_vanilla', math.nan):.2f}); the difference is numerical divergence, not "
                    "the decoder's quality")


#: A decoder's first timed cell of a process is flagged when its tokens/s lies more than this many median
#: absolute deviations from the median of the decoder's other cells of that process ...
FIRST_CELL_MADS = 3.0
#: ... and more than this factor above or below that median (cells that vary little are not flagged for
#: ordinary sample-to-sample differences) ...
FIRST_CELL_FACTOR = 2.0
#: ... given at least this many other cells to compare with.
FIRST_CELL_MIN_OTHERS = 3


def first_cell_flags(rows: pd.DataFrame, value: str = "tokens_per_s") -> list[str]:
    """One warning per decoder whose first timed cell of a process (``attempt_id``; the whole run for rows
    without it) lies far off its other cells of that process: ``value`` more than :data:`FIRST_CELL_MADS` median
    absolute deviations and a factor :data:`FIRST_CELL_FACTOR` from their median (at least
    :data:`FIRST_CELL_MIN_OTHERS` of them). A slow first cell is one-off cost the warm-up did not absorb (lazy
    set-up, ``runner.warmup=0``) or a machine busy at the start; either way its speedup is not the decoder's.

    Args:
        rows: a run's rows in the order they were written (columns ``decoder``, ``status``, ``value``;
            ``attempt_id``, ``sample_id``, ``turn``, ``repeat`` when present).
        value: the column compared.

    Returns:
        Warning lines (empty when no first cell stands out, or ``rows`` lack the columns).
    """
    ok = ok_rows(rows)
    if ok.empty or value not in ok or "decoder" not in ok:
        return []
    keys = ["decoder", "attempt_id"] if "attempt_id" in ok else ["decoder"]
    out = []
    for key, g in ok.groupby(keys, sort=False, dropna=False):
        x = num(g[value])
        first, others = x.iloc[0], x.iloc[1:].dropna()
        if len(others) < FIRST_CELL_MIN_OTHERS or not math.isfinite(first) or first <= 0:
            continue
        med = float(others.median())
        mad = float((others - med).abs().median())
        ratio = first / med if med > 0 else math.nan
        near = abs(first - med) <= FIRST_CELL_MADS * mad or 1 / FIRST_CELL_FACTOR < ratio < FIRST_CELL_FACTOR
        if not ratio > 0 or near:
            continue
        cell = g.iloc[0]
        where = ", ".join(f"{c} {cell[c]}" for c in ("sample_id", "turn", "repeat") if c in g)
        name = key[0] if isinstance(key, tuple) else key
        out.append(f"first cell off ({name}): its first timed cell ({where}) ran at {first:.3g} {value} against a "
                   f"median of {med:.3g} over its {len(others)} other cells ({ratio:.2f}x; more than "
                   f"{FIRST_CELL_MADS:g} median deviations, {mad:.3g}): one-off costs the warm-up did not absorb "
                   "(runner.warmup) or a machine busy at the start; its paired speedup on that sample is doubtful")
    return out
