"""The gate's noise model: how busy the machine was, how much a timing moves by itself, and how far a run must
move before the gate calls it slower.

The statistics behind it (paired ratios, medians over many timings, sigma from repeats, the margin, contention
measured per call) are explained in docs/measurement.md, "The regression gate's statistics". Everything here
reads result rows (:mod:`harness.rows.columns`) or plain numbers; nothing times anything.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

import numpy as np
import pandas as pd

from harness.rows import columns
from harness.rows import flags

#: median |x_i - x_j| of two independent N(0, sigma^2) draws, in units of sigma (0.6745 x sqrt(2)).
_PAIR_DIFF_MEDIAN = 0.9538725524

#: Default of ``--max-contention``: a timed call whose threads waited for a CPU longer than this share of its
#: wall time (``run_delay_s / wall_time_s``) was contended, and a pair with a contended side is left out.
MAX_CONTENTION = 0.05
#: A cell's speed is judged only when at least this share of its timed pairs was not contended.
MIN_CLEAN_SHARE = 0.5


def finite(v: Any) -> float | None:
    """``v`` as a float, or None when it is not a finite number (None, text, NaN, +-inf)."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


# ------------------------------------------------------------------------------------------------ load
def row_load(rows: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per row: ``(load, usable cores)``, load = the larger of the 1-minute load averages recorded before and
    after the timed call (:func:`harness.rows.flags.load_columns`), cores from :func:`harness.rows.flags.usable_cores`;
    NaN where the rows record neither."""
    cols = flags.load_columns(rows)
    load = (pd.concat([columns.num(rows[c]) for c in cols], axis=1).max(axis=1) if cols
            else pd.Series(math.nan, index=rows.index, dtype=float))
    return load, flags.usable_cores(rows)


def load_summary(rows: pd.DataFrame) -> dict[str, Any]:
    """``{"peak", "cores", "rows_over"}`` of rows: peak load, usable cores, and how many rows ran above
    ``cores + flags.LOAD_MARGIN`` (other work shared the machine); peak/cores None when not recorded."""
    load, cores = row_load(rows)
    over = int((load > cores + flags.LOAD_MARGIN).sum())
    return {"peak": finite(load.max()) if load.notna().any() else None,
            "cores": finite(cores.max()) if cores.notna().any() else None,
            "rows_over": over}


# ------------------------------------------------------------------------------------------------ contention
def row_contention(rows: pd.DataFrame) -> pd.Series:
    """Per row: the contention its timed call met, ``run_delay_s / wall_time_s`` (seconds its threads waited on a
    run queue per second of the call, :func:`harness.job.cell.contention_columns`); NaN where not recorded (rows of
    an older runner, an OS without schedstat)."""
    if "run_delay_s" not in rows or "wall_time_s" not in rows:
        return pd.Series(math.nan, index=rows.index, dtype=float)
    delay, wall = columns.num(rows["run_delay_s"]), columns.num(rows["wall_time_s"])
    return (delay / wall).where((wall > 0) & (delay >= 0) & np.isfinite(delay) & np.isfinite(wall))


def contention_summary(values: pd.Series, limit: float) -> dict[str, Any]:
    """``{"timed", "measured", "over", "median", "limit"}`` of per-pair (or per-row) contention ``values``:
    how many timings, how many with a measured contention, how many above ``limit``, the median measured."""
    measured = values.dropna()
    return {"timed": int(len(values)), "measured": int(len(measured)), "over": int((measured > limit).sum()),
            "median": float(measured.median()) if len(measured) else None, "limit": float(limit)}


# ------------------------------------------------------------------------------------------------ figures
def robust_figure(values: pd.Series, samples: pd.Series) -> dict[str, Any]:
    """The gate's figure of ln-values (ln tokens/s or ln speedup) grouped by sample.

    Returns ``{"figure": exp(mean over samples of the per-sample median), "noise": sigma or None,
    "values": {sample: sorted ln values, rounded to 1e-6}, "replicates": fewest values of a sample}``; sigma
    is ``median |x_i - x_j| / 0.954`` over pairs of values of the same sample (None when no sample has two).
    Empty input gives ``figure`` None.
    """
    keep = values.notna() & np.isfinite(values)
    values, samples = values[keep], samples[keep]
    if values.empty:
        return {"figure": None, "noise": None, "values": {}, "replicates": 0}
    groups = {str(k): np.sort(v.to_numpy(dtype=float)) for k, v in values.groupby(samples, sort=True)}
    medians = [float(np.median(v)) for v in groups.values()]
    diffs = [np.abs(v[:, None] - v[None, :])[np.triu_indices(len(v), 1)] for v in groups.values() if len(v) >= 2]
    noise = float(np.median(np.concatenate(diffs))) / _PAIR_DIFF_MEDIAN if diffs else None
    return {"figure": math.exp(sum(medians) / len(medians)), "noise": noise,
            "values": {k: [round(float(x), 6) for x in v] for k, v in groups.items()},
            "replicates": min(len(v) for v in groups.values())}


def shift(base_values: dict[str, list[float]], cur_values: dict[str, list[float]]) -> tuple[float | None, int]:
    """How far the run moved from the baseline, in ln units, and over how many values: the median over ALL the
    run's values ``x`` of ``x - (the baseline's median of x's sample)``. One median over every timing of the
    cell (210 on the CI gate) instead of one per sample: a burst of load has to hit most of the cell's timings
    to move it, not those of one prompt."""
    diffs = [x - float(np.median(base_values[k])) for k, xs in cur_values.items() if base_values.get(k) for x in xs]
    return (float(np.median(diffs)) if diffs else None), len(diffs)


# ------------------------------------------------------------------------------------------------ margin
class MarginSettings(Protocol):
    """The thresholds :func:`speed_margin` reads (:class:`harness.regress.checks.Tolerances` has them)."""

    k: float              # margin in standard errors of the baseline-vs-run difference
    assumed_noise: float  # relative noise of a figure assumed where no repeats measured it
    min_margin: float     # the smallest relative margin
    max_margin: float     # a larger relative margin needed: the check cannot be judged


def _se_medians(noise: float, counts: Sequence[int]) -> float:
    """Standard error of the mean over samples of per-sample medians of ``counts`` values each."""
    counts = [n for n in counts if n > 0]
    if not counts:
        return math.inf
    return noise * math.sqrt(sum((math.pi / 2 if n >= 3 else 1.0) / n for n in counts)) / len(counts)


def _se_median(noise: float, n: int) -> float:
    """Standard error of the median of ``n`` values."""
    return math.inf if n < 1 else noise * math.sqrt((math.pi / 2 if n >= 3 else 1.0) / n)


def speed_margin(b: dict[str, Any], c: dict[str, Any], tol: MarginSettings, floor: float | None = None
                 ) -> tuple[float | None, str]:
    """The relative margin of a speed check and how it was obtained; None when the margin needed exceeds
    ``tol.max_margin`` (the check cannot be judged).

    ``b`` and ``c``: ``{"noise": sigma of one ln value or None, "counts": values per sample, "replicates": R}``
    of baseline and run. The run's shift is one median over all its values (:func:`shift`), the baseline's
    reference the per-sample medians: ``se_c = sigma_c sqrt(c / N_c)``, ``se_b = sigma_b sqrt(sum_s c_s / n_s) / S``
    (``c = pi/2`` for a median of 3 or more values, else 1). ``m = k x sqrt(se_b^2 + se_c^2)`` (ln units),
    relative margin ``1 - exp(-m)``, raised to ``floor`` (default ``tol.min_margin``). Without repeats on
    either side: ``se = assumed_noise / sqrt(replicates)`` per side.
    """
    floor = tol.min_margin if floor is None else floor
    nb, nc = b.get("noise"), c.get("noise")
    cb, cc = list(b.get("counts") or [1]), list(c.get("counts") or [1])
    if nb is None and nc is None:
        rb, rc = max(int(b.get("replicates") or 1), 1), max(int(c.get("replicates") or 1), 1)
        se_b, se_c = tol.assumed_noise / math.sqrt(rb), tol.assumed_noise / math.sqrt(rc)
        how = f"k={tol.k:g} x noise {tol.assumed_noise:.1%} ASSUMED (no repeats) x sqrt(1/{rb}+1/{rc})"
    else:
        borrowed = ""
        if nb is None or nc is None:
            borrowed = f"; {'baseline' if nb is None else 'run'} without repeats: the other's sigma"
        nb, nc = (nb if nb is not None else nc), (nc if nc is not None else nb)
        if nc < nb:  # a run is not taken to be quieter than its baseline: sigma from 15 values is itself noisy
            nc, borrowed = nb, borrowed + "; run's sigma raised to the baseline's"
        se_b, se_c = _se_medians(nb, cb), _se_median(nc, sum(cc))
        how = (f"k={tol.k:g} x se {math.sqrt(se_b ** 2 + se_c ** 2):.1%}; sigma per timing measured over repeats: "
               f"baseline {nb:.1%} over {sum(cb)}, run {nc:.1%} over {sum(cc)}{borrowed}")
    margin = 1.0 - math.exp(-tol.k * math.sqrt(se_b ** 2 + se_c ** 2))
    if margin > tol.max_margin:
        return None, (how + f"; margin needed {margin:.0%} > max {tol.max_margin:.0%}: noise too large to tell a "
                            f"{margin:.0%} slowdown from noise")
    if margin < floor:
        margin, how = floor, how + f"; raised to the {floor:.0%} floor"
    return margin, how
