"""Regression gate: compare a run against a small JSON baseline; exit 1 on a regression, 3 when the timed calls
met too much contention (or the timings were too noisy) to judge speed.

Usage::

    python -m harness.regress --write-baseline RUN [RUN ...] --out baseline.json   # baseline from run(s)
    python -m harness.regress --baseline baseline.json --current RUN [RUN ...]

A *cell* is (task, model pair, decoder configuration). Per cell the gate checks:

1. **Equality with vanilla.** float32: no sample that matched vanilla in the baseline may diverge now. Half
   precision (where batched verification may flip near-ties): the equality rate may drop by at most
   ``--equality-tolerance``. Sampled runs (``equality_check = "n/a (sampled)"``) make no token claim: the
   check says ``n/a`` and is not gated (their losslessness is a distribution property, tested in CI).
2. **Deterministic counters.** float32: the totals of new tokens, target forwards, draft forwards, drafted
   and accepted tokens over the samples, and a digest of their per-sample values, must equal the
   baseline's EXACTLY (so accept length, target forwards per token and draft forwards per token are gated
   exactly); repeats of one greedy sample that disagree fail too. Sampled rows count once per (sample, seed,
   repeat): each draw is deterministic given its seed, and baseline and run must use the same seeds. Half
   precision: accept length may drop by ``--accept-length-tolerance`` (relative). Counters do not depend on
   machine load: they are gated whatever the load was, and a counter regression exits 1 even on a busy
   machine.
3. **Speed, as paired ratios.** For every decoder but vanilla its speedup over vanilla, measured in the same
   run, must stay above ``baseline x (1 - margin)``, or the check says it could not be judged. tokens/s is
   reported and never gated: absolute speed differs between processes (nine quiet runs of the CI job had
   vanilla at 690-1074 tok/s, their speedups within +-6 %) and under load, which is what failed unchanged code.

Why timings of small models are noisy, and what the speed figures are
-----------------------------------------------------------------------
A tiny model's forward is tens of microseconds of arithmetic; a decode step is dominated by host overhead
(Python, dispatch, allocation) and a whole 48-token generate call lasts ~50-100 ms. Two things then decide the
timing rather than the decoder: (a) *scheduling*: on a shared 2-core machine at load 3 our process gets the
CPU in slices of a few ms, so one call can absorb several preemptions and another none; (b) *intra-op
threads*: with 2 torch threads every op needs BOTH threads on a core at once (an OpenMP team), so one
preempted thread stalls every op for a scheduler slice, and a ~0.1 ms forward takes milliseconds. Measured on
the project's 2-core runner at load 2-3: vanilla at 22-94 tok/s with 2 threads against 450-660 with one,
paired speedups from 0.13 to 19.7 with 2 threads against 0.8-2.2 with one. Hence a single mean of a few
ratios (the old gate's figure) swings by 2x under load: an unchanged speculative read 1.555 against 0.816.

The gate therefore never trusts one timing, and uses statistics that survive the outliers load produces:

* **Paired, interleaved ratios.** A *pair* is a decoder's row and vanilla's row of the same run, sample, turn
  and repeat (:data:`harness.rows.columns.PAIR_KEYS`); the runner times them back to back in a rotating order
  (``runner.order=rotate``), so slow phases of the machine hit both sides alike and cancel in the ratio
  (interleaved A/B timing). The speedup figure is built from ``ln(tokens/s decoder / tokens/s vanilla)`` of
  pairs only; an unpaired row never enters it.
* **Medians, over many timings.** Per sample, the baseline keeps every ln value (all repeats,
  ``runner.repeats``, of all runs given); its figure is ``exp(mean over samples of the per-sample medians)``
  (a geometric mean, which one sample cannot dominate). The run is placed against it by ONE median over all
  of the cell's timings (210 on the CI gate: 3 prompts x 70 repeats) of ``x - (baseline median of x's
  sample)`` (:func:`shift`): the run's figure is ``baseline x exp(shift)``. A burst of load must hit most of
  the cell's timings to move it, not those of one prompt.
* **Noise measured, robustly.** ``sigma`` (of one ln-timing or ln-ratio) is
  ``median |x_i - x_j| / 0.954`` over pairs of repeats ``i < j`` of the same sample (for normal noise
  ``|x_i - x_j|`` has median ``0.6745 x sqrt(2) x sigma``): it ignores how samples differ and shrugs off a
  good share of outlier timings. Standard errors (ln units): baseline ``sigma_b x sqrt(sum_s c_s / n_s) / S``
  (``n_s`` values of sample ``s``, ``S`` samples), run ``sigma_c x sqrt(c / N)`` (``N`` values), with
  ``c = pi/2`` for a median of 3 or more values, 1 otherwise. Each side uses its own sigma (a run measured
  under load is noisier than a quiet baseline), the run's never below the baseline's (estimated from a third
  as many values, it comes out low by chance: in simulation that was the one source of false alarms); a side
  without repeats borrows the other's, and with repeats on neither side the figure's noise is
  ``--assumed-noise`` per replicate and the output says ASSUMED.
* **Margin.** ``m = k x sqrt(se_baseline^2 + se_current^2)`` in ln units; the relative margin
  ``1 - exp(-m)`` is raised to ``--min-margin``. When the margin would exceed ``--max-margin`` the gate could
  not tell a slowdown that large from noise: the check is UNGATED (exit 3), never passed.
* **Contention, measured per call.** Each row records the seconds the process's threads waited on a run queue
  during its timed call (``run_delay_s``, from ``/proc/self/task/*/schedstat``) and its CPU seconds
  (``cpu_time_s``): :func:`harness.job.cell.contention_columns`. A pair whose decoder or vanilla side waited longer
  than ``--max-contention`` (5 %) of its wall time is left out of the figures, of the baseline's as of the
  run's: other work took the CPU from it, and the ratio says more about the scheduler than the code. A cell
  with fewer than half its pairs left (:data:`MIN_CLEAN_SHARE`) is UNGATED (exit 3: "contended", with the
  median run delay). On 2 cores: one CPU-bound process beside the run leaves its thread a core (no wait: the
  pairs are judged), two or three make every call wait ~1/3-1/2 of its wall time (not judged). The 1-minute
  load average, which lags the contention a cell saw by a minute, decides only for rows that lack
  ``run_delay_s`` (older runs, an OS without schedstat): a cell above ``--max-load-per-core x usable cores``
  is UNGATED, and a loaded run without repeats too (no measured noise).

What the speed checks deliberately do not do: gate on sample-to-sample spread (the same samples are compared),
or pass a run because its margin was capped.

Alternatives weighed for the tiny CI gate: gating counters only (exact in float32, immune to load; already
done, but a 2x slower implementation with the same counters would pass); a model big enough for forwards to
dominate (a download or minutes of conversion, and minutes per run on 2 cores); tokens/s scaled by the CPU
share the 1-minute load promised (the previous gate: the load average lags, and with two or three CPU-bound
processes beside it unchanged code failed 4-5 of 38 checks); tokens/s per CPU second (SMT siblings and caches
still move it between processes). Chosen: one torch thread (removes the 2-thread stalls), paired interleaved
ratios, contention measured per call, medians over many timings (``benchmarks/ci_regress.sh``: 3 prompts x 70
repeats) and measured noise. ``benchmarks/gate_under_load.py`` runs the real gate under real load: unchanged
code beside 0-3 CPU-bound processes, and one decoder made 10 % slower on a quiet machine.

A cell of the baseline missing from the run fails (``--allow-missing`` to accept); a new cell is listed.
Runs over a different sample set, budget, task version, sampling settings or seeds than the baseline's are
refused (exit 2). ``--write-baseline`` refuses a cell whose pairs were mostly contended (rows without the
measurement: rows above ``cores + LOAD_MARGIN``); a baseline must be quiet; ``--allow-busy`` overrides.

Exit status: 0 no regression and every speed check judged; 1 regression (counters, equality, failed or missing
cells, or speed); 2 usage error or incomparable runs; 3 no regression found but at least one speed check could
not be judged (contended, or noise too large): NOT a pass. Reads result files only (no torch).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.rows import columns
from harness.rows import flags
from harness.rows import metrics
from harness.report.build import find_result_files, load_rows

BASELINE_VERSION = 3

#: Exit status of a gate that found no regression but could not judge every speed check (busy or noisy).
EXIT_UNJUDGED = 3

#: median |x_i - x_j| of two independent N(0, sigma^2) draws, in units of sigma (0.6745 x sqrt(2)).
_PAIR_DIFF_MEDIAN = 0.9538725524


def _sample_digest(sample_ids: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(sorted(set(map(str, sample_ids)))).encode()).hexdigest()[:12]


def _cell_name(task: str, model_pair: str, label: str) -> str:
    return f"{task} | {model_pair} | {label}"


#: Per-cell settings that must agree between baseline and run for the numbers to be comparable (checked where
#: both sides record them; baselines written before the sampling settings existed were greedy).
SETTINGS = ("max_new_tokens", "task_version", *columns.SAMPLING, "sampling_seeds")


def _finite(v: Any) -> float | None:
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
    return {"peak": _finite(load.max()) if load.notna().any() else None,
            "cores": _finite(cores.max()) if cores.notna().any() else None,
            "rows_over": over}


# ------------------------------------------------------------------------------------------------ contention
#: Default of ``--max-contention``: a timed call whose threads waited for a CPU longer than this share of its
#: wall time (``run_delay_s / wall_time_s``) was contended, and a pair with a contended side is left out.
MAX_CONTENTION = 0.05
#: A cell's speed is judged only when at least this share of its timed pairs was not contended.
MIN_CLEAN_SHARE = 0.5


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


# ------------------------------------------------------------------------------------------------ speed figures
def _sample_key(rows: pd.DataFrame) -> pd.Series:
    turn = rows["turn"].astype(str) if "turn" in rows else "0"
    return rows["task"].astype(str) + "/" + rows["sample_id"].astype(str) + "#" + turn


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


def speed_figures(mine: pd.DataFrame, vanilla: pd.DataFrame, decoder: str,
                  max_contention: float = MAX_CONTENTION) -> dict[str, dict[str, Any]]:
    """``{"tokens_per_s": ..., "speedup": ..., "contention": ...}`` of one cell's ok rows ``mine``; ``vanilla``:
    the ok vanilla rows of its group. The speedup (:func:`robust_figure`) uses paired rows only
    (:data:`harness.rows.columns.PAIR_KEYS`), the raw ratio of the two back-to-back timings, and leaves out every
    pair with a side that waited for a CPU longer than ``max_contention`` of its wall time
    (:func:`row_contention`; pairs without the measurement are kept). ``contention``
    (:func:`contention_summary`) counts the pairs (vanilla: its rows) and the ones left out. tokens/s: the
    uncontended rows' figure (reported, not gated)."""
    tps = columns.num(mine["tokens_per_s"]) if "tokens_per_s" in mine else pd.Series(math.nan, index=mine.index)
    tps = tps.where(tps > 0)
    con = row_contention(mine)
    out = {"tokens_per_s": robust_figure(np.log(tps.where(~(con > max_contention))), _sample_key(mine)),
           "contention": contention_summary(con, max_contention)}
    if decoder != "vanilla" and not vanilla.empty and "tokens_per_s" in vanilla:
        keys = [k for k in columns.PAIR_KEYS if k in mine and k in vanilla]
        v = vanilla[keys].copy()
        v["_v"], v["_cv"] = columns.num(vanilla["tokens_per_s"]), row_contention(vanilla)
        v = v.drop_duplicates(subset=keys, keep="last")
        m = mine[keys].copy()
        m["_d"], m["_cd"] = tps, con
        m = m.merge(v, on=keys, how="inner")
        m = m[(m["_v"] > 0) & (m["_d"] > 0)]
        pair = m[["_cd", "_cv"]].max(axis=1)  # the more contended side; NaN only where neither side measured it
        out["contention"] = contention_summary(pair, max_contention)
        m = m[~(pair > max_contention)]
        out["speedup"] = robust_figure(np.log(m["_d"] / m["_v"]), _sample_key(m))
    return out


def _run_meta(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Torch thread counts recorded in the runs' ``meta.json`` (beside each results.jsonl), if any."""
    threads = set()
    for f in find_result_files(paths):
        meta = f.parent / "meta.json"
        try:
            env = json.loads(meta.read_text()).get("environment") or {}
        except (OSError, ValueError):
            continue
        if env.get("torch_num_threads") is not None:
            threads.add(int(env["torch_num_threads"]))
    return {"torch_num_threads": sorted(threads)[0] if len(threads) == 1 else (sorted(threads) or None)}


def summarize_cells(paths: Sequence[str | Path], n_boot: int = 200, seed: int = 0,
                    max_contention: float = MAX_CONTENTION) -> dict[str, Any]:
    """The baseline-shaped summary of the runs under ``paths``: ``{"meta": ..., "cells": {name: stats}}``;
    timed pairs that waited for a CPU longer than ``max_contention`` of their wall time are left out of the
    speed figures (:func:`speed_figures`) and counted in the cell's ``contention``.

    Raises:
        ValueError: no rows, or one cell holds rows of several run identities (gate one identity at a time).
    """
    rows = load_rows(paths)
    if rows.empty:
        raise ValueError(f"no result rows under {', '.join(map(str, paths))}")
    agg = metrics.aggregate(rows, n_boot=n_boot, seed=seed)
    ok = rows[rows["status"] == "ok"]
    cells: dict[str, Any] = {}
    for _, r in agg.iterrows():
        name = _cell_name(r["task"], r["model_pair"], r["label"])
        if name in cells:
            raise ValueError(f"{name}: the rows hold several run identities ({cells[name]['group']} and "
                             f"{r['group']}); give the gate one run identity (one code version, dtype, machine)")
        mine = ok[(ok["group"] == r["group"]) & (ok["label"] == r["label"])]
        vanilla = ok[(ok["group"] == r["group"]) & (ok["decoder"] == "vanilla")]
        counters = metrics.counters(mine)
        speed = speed_figures(mine, vanilla, r["decoder"], max_contention)
        timed = pd.concat([mine, vanilla]) if r["decoder"] != "vanilla" else mine
        cell = {
            "group": r["group"],
            "task": r["task"],
            "model_pair": r["model_pair"],
            "decoder": r["decoder"],
            "label": r["label"],
            "dtype": columns.fmt_value(r.get("dtype")),
            "device_name": columns.fmt_value(r.get("device_name")),
            **{k: columns.fmt_value(r.get(k)) for k in SETTINGS if k in r},
            **({"sampling_seeds": sorted(columns.fmt_value(v) for v in mine["sampling_seed"].dropna().unique())}
               if "sampling_seed" in mine and mine["sampling_seed"].notna().any() else {}),
            "equality_check": r.get("equality_check") if isinstance(r.get("equality_check"), str) else None,
            "samples": int(r["samples"]),
            "failed": int(r.get("failed", 0) or 0),
            "sample_digest": _sample_digest(mine["sample_id"].astype(str).tolist()),
            "equal_to_vanilla": _finite(r.get("equal_to_vanilla")),
            "divergent_samples": list(r["divergent_samples"]) if isinstance(r.get("divergent_samples"), list) else [],
            "accept_length": _finite(r.get("accept_length")),
            "counters": counters["totals"],
            "counters_digest": counters["digest"],
            "inconsistent_samples": counters["inconsistent_samples"],
            "load": load_summary(timed),
            "contention": speed["contention"],
        }
        for metric in ("speedup", "tokens_per_s"):
            if metric in speed:
                s = speed[metric]
                cell.update({metric: s["figure"], f"{metric}_noise": s["noise"], f"{metric}_values": s["values"]})
        cell["replicates"] = speed["tokens_per_s"]["replicates"] or 1
        cells[name] = cell
    first = rows.iloc[0]
    meta = {
        "version": BASELINE_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sources": [str(f) for f in find_result_files(paths)],
        "git_commit": first.get("git_commit") if isinstance(first.get("git_commit"), str) else None,
        "device_name": first.get("device_name") if isinstance(first.get("device_name"), str) else None,
        **_run_meta(paths),
        "load": load_summary(ok),
        "contention": contention_summary(row_contention(ok), max_contention),
    }
    return {"meta": meta, "cells": cells}


@dataclass
class Tolerances:
    """Thresholds of the gate (see the module docstring)."""

    accept_length: float = 0.01       # relative accept-length drop allowed outside float32
    equality: float = 0.02            # equality-rate drop allowed outside float32
    k: float = 2.0                    # margin in standard errors of the baseline-vs-run difference
    assumed_noise: float = 0.03       # relative noise of a figure assumed where no repeats measured it
    min_margin: float = 0.02          # the margin is at least this fraction of the baseline ...
    max_margin: float = 0.5           # ... and a larger margin needed means the check cannot be judged
    allow_missing: bool = False
    max_load_per_core: float = 2.5   # rows without measured contention, above this load x cores: not judged
    max_contention: float = MAX_CONTENTION  # pairs that waited longer for a CPU (share of wall) are left out


@dataclass
class Check:
    cell: str
    metric: str
    baseline: str
    current: str
    limit: str
    verdict: str  # ok | REGRESSION | UNGATED | improved | new | note
    reason: str = ""  # UNGATED: why, in a few words (for the gate's last line)

    @property
    def failed(self) -> bool:
        return self.verdict == "REGRESSION"

    @property
    def unjudged(self) -> bool:
        """A speed check the gate could not judge (machine busy or noise too large): not a pass."""
        return self.verdict == "UNGATED"


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _se_medians(noise: float, counts: Sequence[int]) -> float:
    """Standard error of the mean over samples of per-sample medians of ``counts`` values each."""
    counts = [n for n in counts if n > 0]
    if not counts:
        return math.inf
    return noise * math.sqrt(sum((math.pi / 2 if n >= 3 else 1.0) / n for n in counts)) / len(counts)


def _se_median(noise: float, n: int) -> float:
    """Standard error of the median of ``n`` values."""
    return math.inf if n < 1 else noise * math.sqrt((math.pi / 2 if n >= 3 else 1.0) / n)


def speed_margin(b: dict[str, Any], c: dict[str, Any], tol: Tolerances, floor: float | None = None
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


def compare(baseline: dict[str, Any], current: dict[str, Any], tol: Tolerances) -> list[Check]:
    """All checks of ``current`` against ``baseline`` (both as returned by :func:`summarize_cells`).

    Raises:
        ValueError: when a cell was measured on a different sample set, budget or task version.
    """
    checks: list[Check] = []
    base_cells, cur_cells = baseline["cells"], current["cells"]
    threads = (baseline.get("meta", {}).get("torch_num_threads"), current.get("meta", {}).get("torch_num_threads"))
    for name, b in base_cells.items():
        c = cur_cells.get(name)
        if c is None:
            checks.append(Check(name, "present", "yes", "missing", "-", "note" if tol.allow_missing else "REGRESSION"))
            continue
        for k in SETTINGS:
            if k in b and _setting(c, k) != _setting(b, k):
                raise ValueError(f"{name}: {k} is {_setting(c, k)} in the run but {_setting(b, k)} in the baseline; the "
                                 f"numbers are not comparable (rerun with the baseline's settings or write a "
                                 f"new baseline)")
        if c["sample_digest"] != b["sample_digest"] or c["samples"] != b["samples"]:
            raise ValueError(f"{name}: the run covers {c['samples']} samples (digest {c['sample_digest']}), the "
                             f"baseline {b['samples']} (digest {b['sample_digest']}); compare runs over the same "
                             f"samples (task.limit, max_new_tokens) or write a new baseline")
        if c.get("failed"):
            checks.append(Check(name, "failed cells", str(b.get("failed", 0)), str(c["failed"]), "0", "REGRESSION"))
        fp32 = (c.get("dtype") or b.get("dtype")) == "float32"
        checks += _equality(name, b, c, fp32, tol)
        checks += _counters(name, b, c, fp32, tol)
        checks += _speed(name, b, c, tol, threads)
    for name in cur_cells.keys() - base_cells.keys():
        checks.append(Check(name, "present", "no", "yes", "-", "new"))
    return checks


def _setting(cell: dict, key: str) -> Any:
    """A cell's setting, with the greedy default for sampling settings a cell (or an older baseline) lacks."""
    if key not in cell and key in columns.SAMPLING_DEFAULTS:
        return columns.fmt_value(columns.SAMPLING_DEFAULTS[key])
    return cell.get(key)


def _equality(name: str, b: dict, c: dict, fp32: bool, tol: Tolerances) -> list[Check]:
    if b["decoder"] == "vanilla":
        return []
    if columns.EQUALITY_SAMPLED in (b.get("equality_check"), c.get("equality_check")):
        # sampled rows make no token-for-token claim (matches_vanilla is null); their counters are still gated
        return [Check(name, "equal_to_vanilla", "n/a", "n/a", "not gated: sampled run (lossless in distribution, "
                      "checked by the distribution tests)", "note")]
    be, ce = b.get("equal_to_vanilla") or 0.0, c.get("equal_to_vanilla") or 0.0
    if fp32:
        new = sorted(set(c.get("divergent_samples", [])) - set(b.get("divergent_samples", [])))
        chk = Check(name, "equal_to_vanilla", _f(be), _f(ce), "no new divergence (float32)",
                    "REGRESSION" if new else ("improved" if ce > be else "ok"))
        if new:
            chk.current += f" (new: {', '.join(new[:5])}{' ...' if len(new) > 5 else ''})"
        return [chk]
    limit = be - tol.equality
    return [Check(name, "equal_to_vanilla", _f(be), _f(ce), f">= {limit:.3f}",
                  "REGRESSION" if ce < limit - 1e-12 else "ok")]


def _counters(name: str, b: dict, c: dict, fp32: bool, tol: Tolerances) -> list[Check]:
    if fp32:
        out = []
        bt, ct = b.get("counters") or {}, c.get("counters") or {}
        for k in bt:
            out.append(Check(name, k, str(bt[k]), str(ct.get(k, "-")), "== (float32)",
                             "ok" if ct.get(k) == bt[k] else "REGRESSION"))
        if all(ct.get(k) == bt[k] for k in bt) and c.get("counters_digest") != b.get("counters_digest"):
            out.append(Check(name, "per-sample counters", b.get("counters_digest", "-"), c.get("counters_digest", "-"),
                             "== (float32)", "REGRESSION"))
        if c.get("inconsistent_samples"):
            out.append(Check(name, "repeats agree", "yes", "no: " + ", ".join(c["inconsistent_samples"][:5]),
                             "== (float32)", "REGRESSION"))
        return out
    if b.get("accept_length") is None:
        return []
    limit = b["accept_length"] * (1.0 - tol.accept_length)
    cur = c.get("accept_length")
    bad = cur is None or cur < limit - 1e-12
    better = cur is not None and cur > b["accept_length"] * (1.0 + tol.accept_length)
    return [Check(name, "accept_length", _f(b["accept_length"]), _f(cur), f">= {limit:.3f}",
                  "REGRESSION" if bad else ("improved" if better else "ok"))]


def _contended(c: dict) -> str | None:
    """Why a cell's timed pairs met too much contention to judge its speed (fewer than :data:`MIN_CLEAN_SHARE`
    of them uncontended), or None; None where contention was not measured."""
    con = c.get("contention") or {}
    if not con.get("measured"):
        return None
    clean = con["timed"] - con["over"]
    if clean > 0 and clean >= MIN_CLEAN_SHARE * con["timed"]:
        return None
    return (f"contended: {con['over']} of {con['timed']} timed pairs waited > {con['limit']:.0%} of their wall "
            f"time for a CPU (median {con['median']:.0%}); re-measure on a quieter machine")


def _busy(c: dict, tol: Tolerances) -> str | None:
    """Why the run's rows of a cell ran on too busy a machine to judge speed, or None: measured contention
    (:func:`_contended`), else (rows that did not measure it) the 1-minute load average."""
    if (c.get("contention") or {}).get("measured"):
        return _contended(c)
    load = c.get("load") or {}
    peak, cores = load.get("peak"), load.get("cores")
    if peak is not None and cores and peak > tol.max_load_per_core * cores:
        return (f"machine busy: load {peak:.1f} on {cores:g} usable cores > {tol.max_load_per_core:g} x cores; "
                f"re-measure on a quieter machine")
    return None


def _contention_text(con: dict | None) -> str:
    """The rows' measured contention in words (``contention not measured`` for older rows)."""
    if not con or not con.get("measured"):
        return "contention not measured"
    return (f"run delay median {con['median']:.1%} of wall, {con['over']} of {con['timed']} timed calls over "
            f"{con['limit']:.0%}")


def _load_text(c: dict) -> str:
    """The conditions a cell was timed in: its measured contention, else its 1-minute load."""
    con = c.get("contention") or {}
    if con.get("measured"):
        return (f"contention: median run delay {con['median']:.1%} of wall, {con['over']} of {con['timed']} "
                f"pairs over {con['limit']:.0%}")
    load = c.get("load") or {}
    return (f"load {load['peak']:.1f} on {load['cores']:g} cores" if load.get("peak") is not None and load.get("cores")
            else "load not recorded")


def _speed(name: str, b: dict, c: dict, tol: Tolerances, threads: tuple[Any, Any] = (None, None)) -> list[Check]:
    """The speed checks of a cell: its speedup over paired timings, gated unless contention (or, for rows
    that did not measure it, the load) says it cannot be judged; its tokens/s, reported and not gated (absolute
    speed differs between processes and with load in ways no paired ratio does)."""
    out = []
    other = None
    if b.get("device_name") != c.get("device_name"):
        other = f"other machine ({c.get('device_name')} vs {b.get('device_name')})"
    elif None not in threads and threads[0] != threads[1]:
        other = f"other torch thread count ({threads[1]} vs {threads[0]})"
    if b.get("tokens_per_s") is not None:
        out.append(Check(name, "tokens_per_s", _f(b["tokens_per_s"]), _f(c.get("tokens_per_s")),
                         f"not gated: {other or 'absolute speed differs between processes and with load'}; "
                         f"speed is gated as paired speedups", "note"))
    base, cur = b.get("speedup"), c.get("speedup")
    if base is None or b["decoder"] == "vanilla":
        return out
    busy = _busy(c, tol)
    if busy:
        return out + [Check(name, "speedup", _f(base), _f(cur), busy, "UNGATED", busy.split("; ")[0])]
    if cur is None:
        return out + [Check(name, "speedup", _f(base), "-", "no figure: no timed (paired) rows", "REGRESSION")]
    bv, cv = b.get("speedup_values") or {}, c.get("speedup_values") or {}
    bs = {"noise": b.get("speedup_noise"), "counts": [len(v) for v in bv.values()], "replicates": b.get("replicates")}
    cs = {"noise": c.get("speedup_noise"), "counts": [len(v) for v in cv.values()], "replicates": c.get("replicates")}
    moved, n = shift(bv, cv)
    if moved is not None:  # the run's figure on the baseline's footing (see shift)
        cur = base * math.exp(moved)
    con = c.get("contention") or {}
    if not con.get("measured") and (c.get("load") or {}).get("rows_over") and cs["noise"] is None:
        why = f"machine loaded ({_load_text(c)}) and the run has no repeats to measure its noise"
        return out + [Check(name, "speedup", _f(base), _f(cur), f"{why}: re-measure with runner.repeats>=3 or on "
                            f"a quiet machine", "UNGATED", why)]
    margin, how = speed_margin(bs, cs, tol)
    if moved is not None:
        how = f"run = baseline x exp(median shift over {n} timings); " + how
    if con.get("over"):
        how += f"; {con['over']} of {con['timed']} pairs left out (waited > {con['limit']:.0%} for a CPU)"
    if margin is None:
        return out + [Check(name, "speedup", _f(base), _f(cur), f"{how} ({_load_text(c)})", "UNGATED",
                            f"timing noise too large, {_load_text(c)}")]
    limit = base * (1.0 - margin)
    better = cur > base * (1.0 + margin)
    return out + [Check(name, "speedup", _f(base), _f(cur), f">= {limit:.3f} (margin {margin:.1%}: {how})",
                        "REGRESSION" if cur < limit else ("improved" if better else "ok"))]


def format_checks(checks: Sequence[Check]) -> str:
    """A readable table, regressions first, then unjudged speed checks."""
    order = {"REGRESSION": 0, "UNGATED": 1, "improved": 2, "new": 3, "note": 4, "ok": 5}
    checks = sorted(checks, key=lambda c: (order.get(c.verdict, 6), c.cell, c.metric))
    head = ("cell", "metric", "baseline", "current", "verdict", "limit")
    table = [head] + [(c.cell, c.metric, c.baseline, c.current, c.verdict, c.limit) for c in checks]
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    lines = ["  ".join([*(v.ljust(w) for v, w in zip(r[:-1], widths)), r[-1]]).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  -----")
    return "\n".join(lines)


def verdict(checks: Sequence[Check]) -> tuple[int, str]:
    """The gate's exit status and its last line: 1 on any regression, else 3 (:data:`EXIT_UNJUDGED`) when a
    speed check could not be judged, else 0."""
    failed = [c for c in checks if c.failed]
    unjudged = [c for c in checks if c.unjudged]
    why = ""
    if unjudged:
        reasons = list(dict.fromkeys(c.reason or c.limit for c in unjudged))
        why = (f"{len(unjudged)} speed check(s) NOT JUDGED ({'; '.join(reasons[:2])}"
               f"{'; ...' if len(reasons) > 2 else ''})")
    if failed:
        return 1, f"{len(failed)} regression(s) in {len(checks)} checks" + (f"; {why}" if why else "")
    if unjudged:
        return EXIT_UNJUDGED, (f"NOT A PASS: {why}; no regression in the {len(checks) - len(unjudged)} checks "
                               f"that could be judged. Re-measure on a quieter machine (exit {EXIT_UNJUDGED})")
    return 0, f"no regression ({len(checks)} checks)"


def write_baseline(paths: Sequence[str | Path], out: str | Path, n_boot: int = 200, seed: int = 0,
                   allow_busy: bool = False, max_contention: float = MAX_CONTENTION) -> Path:
    """Write the baseline JSON of the runs under ``paths`` to ``out`` (several runs of one identity, and
    repeats, are replicates for the noise; pairs that waited longer than ``max_contention`` for a CPU are left
    out, as in the run judged).

    Raises:
        ValueError: a cell's pairs were mostly contended (:func:`_contended`), or, for rows that did not measure
            contention, rows were measured on a loaded machine (above ``cores + flags.LOAD_MARGIN``); unless
            ``allow_busy``.
    """
    data = summarize_cells(paths, n_boot=n_boot, seed=seed, max_contention=max_contention)
    busy = {name: why for name, c in data["cells"].items() if (why := _contended(c))}
    if busy and not allow_busy:
        name, why = next(iter(busy.items()))
        raise ValueError(f"{len(busy)} cell(s) measured under contention ({name}: {why.split('; ')[0]}); a "
                         f"baseline must be quiet: re-measure (or --allow-busy)")
    load = data["meta"]["load"]
    if load["rows_over"] and not data["meta"]["contention"]["measured"] and not allow_busy:
        raise ValueError(f"{load['rows_over']} rows were measured on a loaded machine (load up to "
                         f"{load['peak']:.1f} on {load['cores']:g} usable cores > cores + {flags.LOAD_MARGIN:g}); "
                         f"a baseline must be quiet: re-measure (or --allow-busy)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.regress", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write-baseline", nargs="+", metavar="RUN", help="write a baseline from these runs "
                      "(several runs of one configuration, and repeats, measure the noise)")
    mode.add_argument("--baseline", help="baseline JSON to compare against")
    parser.add_argument("--out", help="with --write-baseline: the JSON to write")
    parser.add_argument("--allow-busy", action="store_true", help="with --write-baseline: accept rows measured "
                        "on a loaded machine")
    parser.add_argument("--current", nargs="+", metavar="RUN", help="with --baseline: the run(s) to judge")
    parser.add_argument("--accept-length-tolerance", type=float, default=0.01,
                        help="relative accept-length drop allowed outside float32 (float32: counters exact)")
    parser.add_argument("--equality-tolerance", type=float, default=0.02,
                        help="equality-rate drop allowed outside float32 (float32: no new divergence)")
    parser.add_argument("--k", type=float, default=2.0, help="speed margin in standard errors of the difference")
    parser.add_argument("--assumed-noise", type=float, default=0.03,
                        help="relative noise of a figure assumed when no repeats measured it")
    parser.add_argument("--min-margin", type=float, default=0.02, help="smallest speed margin (fraction)")
    parser.add_argument("--max-margin", type=float, default=0.5, help="largest speed margin (fraction); a larger "
                        "one needed leaves the check unjudged (exit 3)")
    parser.add_argument("--max-contention", type=float, default=MAX_CONTENTION, help="a timed pair whose side "
                        "waited longer than this share of its wall time for a CPU (run_delay_s / wall_time_s) is "
                        "left out; a cell with fewer than half its pairs left is unjudged (exit 3)")
    parser.add_argument("--max-load-per-core", type=float, default=2.5, help="rows without measured contention "
                        "(older rows) measured above this load x usable cores leave speed unjudged (exit 3)")
    parser.add_argument("--allow-missing", action="store_true", help="a baseline cell missing from the run is "
                        "not a regression")
    args = parser.parse_args(argv)
    try:
        if args.write_baseline:
            if not args.out:
                parser.error("--write-baseline needs --out")
            path = write_baseline(args.write_baseline, args.out, allow_busy=args.allow_busy,
                                  max_contention=args.max_contention)
            data = json.loads(path.read_text())
            cells, load = data["cells"], data["meta"]["load"]
            reps = sorted({c["replicates"] for c in cells.values()})
            print(f"baseline with {len(cells)} cells ({'/'.join(map(str, reps))} replicates per sample, rows' "
                  f"peak load {_f(load['peak'], '.2f')} on {_f(load['cores'], 'g')} cores) written to {path}")
            return 0
        if not args.current:
            parser.error("--baseline needs --current RUN")
        baseline = json.loads(Path(args.baseline).read_text())
        if baseline.get("meta", {}).get("version") != BASELINE_VERSION:
            raise ValueError(f"{args.baseline}: baseline version {baseline.get('meta', {}).get('version')} != "
                             f"{BASELINE_VERSION}; write a new baseline (--write-baseline)")
        current = summarize_cells(args.current, max_contention=args.max_contention)
        tol = Tolerances(args.accept_length_tolerance, args.equality_tolerance, args.k, args.assumed_noise,
                         args.min_margin, args.max_margin, args.allow_missing, args.max_load_per_core,
                         args.max_contention)
        checks = compare(baseline, current, tol)
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for side, path, data in (("baseline", args.baseline, baseline), ("current", ", ".join(args.current), current)):
        m = data["meta"]
        load = m.get("load") or {}
        print(f"{side + ':':9s} {path} (commit {m.get('git_commit')}, {m.get('device_name')}, torch threads "
              f"{m.get('torch_num_threads', '-')}; rows' peak 1-minute load {_f(load.get('peak'), '.2f')} on "
              f"{_f(load.get('cores'), 'g')} cores, {load.get('rows_over', '-')} rows above cores + "
              f"{flags.LOAD_MARGIN:g}; {_contention_text(m.get('contention'))})")
    print()
    print(format_checks(checks))
    status, line = verdict(checks)
    print(f"\n{line}")
    return status


if __name__ == "__main__":
    sys.exit(main())
