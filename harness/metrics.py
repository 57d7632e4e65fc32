"""The one aggregation module: every number in ``summary.csv``, the paper report, the regression gate, the
run comparison and the figures is computed here, from result rows. Pure functions of DataFrames (pandas and
numpy only; no torch, no decoders, no tasks). Loading files, formatting tables and drawing live elsewhere
(:mod:`harness.report`, :mod:`plots`).

Definitions (stated once, used everywhere):

* ``tokens_per_s`` of a row: new tokens / wall seconds of the whole ``generate`` call (prefill included);
  a cell's ``tokens_per_s`` is the mean over its rows, ``tokens_per_s_total`` the ratio of totals.
* ``speedup`` of a decoder: the mean over rows of the paired ratio
  ``tokens_per_s(decoder) / tokens_per_s(vanilla)`` on the same sample, turn and repeat in the same run
  (``run_id``); ``speedup_total`` is the ratio of totals (vanilla seconds per token summed over the same
  rows / the decoder's). Spec-Bench's ``speed.py`` uses a ratio of mean tokens/s, a third estimator.
* ``accept_length`` (tau): total new tokens / total target forwards (prefill included; vanilla = 1.0).
* ``acceptance_rate`` (alpha): total accepted draft tokens / total drafted tokens.
* Intervals: percentile bootstrap (default 95 %, 2000 resamples, seeded) that resamples samples and, within
  each drawn sample, its observations (repeats, turns, several runs of the same identity). ``*_low`` /
  ``*_high`` are its bounds, ``*_std`` the bootstrap standard error.
* Run-to-run noise: the standard deviation of a cell's figure over *replicates* (one replicate = one
  ``(run_id, repeat)``) that cover the same samples -- what the regression gate's speed margin is built from.

Runs that differ are never pooled: a *group* is one run identity (:data:`RUN_IDENTITY_FIELDS`: task and its
version, model pair, dtype, machine, code version, generation budget, ...); rows of different identities
land in different groups (and different table rows) unless ``pool=True`` is asked for, which logs what was
pooled. Within a group a *cell* is one decoder configuration (``label``). Shards and repeated runs of one
identity merge into one group.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------ constants
#: Row columns that make a run identity. Rows that differ in any of them (where present) are different runs
#: and are never pooled (``pool=True`` keeps only task and model pair).
RUN_IDENTITY_FIELDS = ("task", "task_version", "model", "target_model", "draft_model", "dtype", "device_name",
                       "git_commit", "git_dirty", "max_new_tokens", "config_digest", "source")
#: Identity fields kept when pooling (``pool=True``).
POOLED_IDENTITY_FIELDS = ("task", "target_model", "draft_model")
#: Keys pairing a decoder's row with vanilla's (same run, sample, turn and repeat).
PAIR_KEYS = ("run_id", "task", "sample_id", "turn", "repeat")
#: Score columns recognised when neither the caller nor the rows declare a task's quality columns.
KNOWN_QUALITY_COLUMNS = ("pass@1", "accuracy", "exact_match", "rouge1", "rouge2", "rougeL", "rougeLsum")
#: Load columns the runner may record per row (load averages before/after the cell) and the core count.
LOAD_COLUMNS = ("load_avg_1m_before", "load_avg_1m_after")
CPU_COUNT_COLUMN = "cpu_count"
#: Hyper-parameter keys of a decoder config that are not hyper-parameters.
NON_PARAM_KEYS = ("_target_", "_partial_", "uses_draft")
#: Columns of a tidy summary row that say which run and configuration it belongs to.
SUMMARY_ID_COLUMNS = ["task", "task_version", "model", "target_model", "draft_model", "dtype", "device_name",
                      "git_commit", "max_new_tokens", "group", "label", "decoder", "decoder_params"]
SUMMARY_COLUMNS = [
    "samples", "observations", "replicates", "failed", "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high",
    "tokens_per_s_total", "speedup", "speedup_low", "speedup_high", "speedup_total", "speedup_total_low",
    "speedup_total_high", "accept_length", "accept_length_low", "accept_length_high", "acceptance_rate",
    "target_tokens_fed_per_step", "draft_forwards_per_step", "equal_to_vanilla", "speedup_repeat_std",
    "tokens_per_s_repeat_std", "load_max", "rows_over_load", "warnings",
]
#: Columns of ``summary.md`` (the CSV has them all): the label, the headline numbers and their intervals.
SUMMARY_MD_COLUMNS = ["group", "label", "samples", "replicates", "tokens_per_s", "speedup", "speedup_low",
                      "speedup_high", "speedup_total", "accept_length", "acceptance_rate",
                      "target_tokens_fed_per_step", "draft_forwards_per_step", "equal_to_vanilla", "load_max"]
#: Counters that are deterministic for a given code, model, data and float32 (the gate checks them exactly).
COUNTER_COLUMNS = ("new_tokens", "num_steps", "draft_forwards", "num_drafted", "num_accepted")


# ------------------------------------------------------------------------------------------------ helpers
def num(s: Any) -> pd.Series:
    """``s`` as floats (non-numbers -> NaN)."""
    return pd.to_numeric(s, errors="coerce")


def norm(value: Any) -> Any:
    """Canonical form of a cell value for keys: NaN/None -> None, integral floats -> int, numpy scalars ->
    Python, lists -> tuples."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(norm(v) for v in value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


def fmt_value(value: Any) -> str:
    """A parameter value as a person writes it: ``3`` not ``3.0``, ``None`` as ``null``."""
    v = norm(value)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return format(v, "g")
    return str(v)


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"] == "ok"] if "status" in rows else rows


def _params(s: Any) -> dict[str, Any]:
    if isinstance(s, str):
        try:
            p = json.loads(s)
            return p if isinstance(p, dict) else {}
        except json.JSONDecodeError:
            return {}
    return {}


# ------------------------------------------------------------------------------------------------ labels
def decoder_param_columns(rows: pd.DataFrame) -> list[str]:
    """Hyper-parameter names found in the rows' ``decoder_params`` JSON, in first-seen order."""
    names: dict[str, None] = {}
    if "decoder_params" not in rows:
        return []
    for s in rows["decoder_params"].dropna().unique():
        names.update(dict.fromkeys(_params(s)))
    return list(names)


def swept_params(rows: pd.DataFrame) -> dict[str, list[str]]:
    """decoder -> the hyper-parameters that take more than one value among its rows."""
    out: dict[str, list[str]] = {}
    if "decoder_params" not in rows:
        return {d: [] for d in dict.fromkeys(rows["decoder"])}
    for decoder, g in rows.groupby("decoder", sort=False):
        params = [_params(s) for s in g["decoder_params"].dropna().unique()]
        keys = dict.fromkeys(k for p in params for k in p)
        out[decoder] = [k for k in keys if len({json.dumps(norm(p.get(k))) for p in params}) > 1]
    return out


def config_labels(rows: pd.DataFrame) -> pd.Series:
    """Label of each row's decoder configuration: the decoder name, plus ``(k=v, ...)`` for its
    hyper-parameters that vary among the rows (a gamma sweep gives ``speculative (gamma=2)``, ...). Integral
    values print as integers."""
    varying = swept_params(rows)
    params = rows["decoder_params"] if "decoder_params" in rows else pd.Series([None] * len(rows), index=rows.index)
    labels = []
    for dec, ps in zip(rows["decoder"], params):
        keys = varying.get(dec) or []
        if not keys:
            labels.append(str(dec))
            continue
        p = _params(ps)
        labels.append(f"{dec} (" + ", ".join(f"{k}={fmt_value(p.get(k))}" for k in keys) + ")")
    return pd.Series(labels, index=rows.index, dtype=object)


def model_pair(rows: pd.DataFrame) -> pd.Series:
    """``target / draft`` per row (``target`` alone without a draft)."""
    target = rows["target_model"] if "target_model" in rows else pd.Series([None] * len(rows), index=rows.index)
    if "model" in rows:
        target = target.where(target.notna(), rows["model"])
    draft = rows["draft_model"] if "draft_model" in rows else pd.Series([None] * len(rows), index=rows.index)
    return pd.Series([str(t) if d is None or (isinstance(d, float) and math.isnan(d)) else f"{t} / {d}"
                      for t, d in zip(target, draft)], index=rows.index, dtype=object)


def identity_fields(rows: pd.DataFrame, pool: bool = False) -> list[str]:
    """The run-identity columns present in ``rows`` (:data:`RUN_IDENTITY_FIELDS`, or
    :data:`POOLED_IDENTITY_FIELDS` when pooling)."""
    fields = POOLED_IDENTITY_FIELDS if pool else RUN_IDENTITY_FIELDS
    return [f for f in fields if f in rows]


def _short(field: str, value: Any) -> str:
    v = fmt_value(value)
    return v[:7] if field == "git_commit" and len(v) > 12 else v


def run_groups(rows: pd.DataFrame, pool: bool = False) -> tuple[pd.Series, list[str]]:
    """Group label of each row (one group per run identity) and the identity fields that vary.

    The label is ``task: target / draft``, plus ``(field=value, ...)`` for the identity fields that differ
    between the groups (``git_commit`` shortened to 7 characters). With ``pool=True`` only task and model pair
    separate groups, and a warning names the identity fields that were pooled.

    Returns:
        ``(labels, varying)``: a Series aligned with ``rows`` and the varying identity fields.
    """
    fields = identity_fields(rows, pool)
    keys = [tuple(norm(v) for v in t) for t in rows[fields].itertuples(index=False, name=None)] if fields else \
        [()] * len(rows)
    shown = {"task", "model", "target_model", "draft_model"}
    varying = [f for i, f in enumerate(fields) if len({k[i] for k in keys}) > 1]  # None counts as a value
    extra = [(i, f) for i, f in enumerate(fields) if f in varying and f not in shown]
    task = rows["task"].astype(str) if "task" in rows else pd.Series(["-"] * len(rows), index=rows.index)
    base = task + ": " + model_pair(rows)
    if extra:
        base = base + [" (" + ", ".join(f"{f}={_short(f, k[i])}" for i, f in extra) + ")" for k in keys]
    if pool:
        hidden = [f for f in identity_fields(rows) if f not in fields and len({norm(v) for v in rows[f]}) > 1]
        if hidden:
            log.warning("POOLING rows that differ in %s (pool=True): the numbers mix runs that are not the same "
                        "experiment", ", ".join(hidden))
    return base.astype(object), varying


def prepare(rows: pd.DataFrame, pool: bool = False) -> pd.DataFrame:
    """``rows`` with the columns every aggregate needs: ``model_pair``, ``label`` (decoder configuration),
    ``group`` (run identity) and defaults for missing bookkeeping columns. Idempotent."""
    rows = rows.copy()
    for c, default in (("status", "ok"), ("decoder_params", "{}"), ("turn", 0), ("repeat", 0), ("run_id", "run")):
        if c not in rows:
            rows[c] = default
    for c in ("tokens_per_s", "wall_time_s", "new_tokens", "num_steps"):  # rows that never ran (no ok row)
        if c not in rows:
            rows[c] = math.nan
    rows["turn"] = rows["turn"].fillna(0)
    rows["repeat"] = rows["repeat"].fillna(0)
    rows["model_pair"] = model_pair(rows)
    if "label" not in rows:
        rows["label"] = config_labels(rows)
    if "group" not in rows or pool:
        rows["group"], _ = run_groups(rows, pool)
    return rows


def quality_columns(rows: pd.DataFrame, declared: Sequence[str] | None = None) -> list[str]:
    """The quality (score) columns to report, in this order of preference:

    1. ``declared``: a task's ``quality_columns`` (the runner passes them), those present in ``rows``;
    2. a ``quality_columns`` column in the rows (a list, or JSON text of one);
    3. the score columns of the project's tasks found in the rows (:data:`KNOWN_QUALITY_COLUMNS`).
    """
    if declared is not None:
        return [c for c in declared if c in rows]
    if "quality_columns" in rows:
        names: dict[str, None] = {}
        for v in rows["quality_columns"].dropna():
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    v = [v]
            names.update(dict.fromkeys(str(x) for x in v))
        return [c for c in names if c in rows]
    return [c for c in KNOWN_QUALITY_COLUMNS if c in rows and num(rows[c]).notna().any()]


_find_quality = quality_columns  # summarize()'s argument shadows the name


# ------------------------------------------------------------------------------------------------ pairing
def paired_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-row speedup of every decoder against vanilla in the same run.

    Args:
        rows: result rows with ``run_id, task, sample_id, decoder, tokens_per_s, wall_time_s, new_tokens,
            status`` (``turn`` / ``repeat`` where present).

    Returns:
        ``rows`` (status ``ok`` only) with ``vanilla_tokens_per_s``, ``vanilla_wall_time_s``,
        ``vanilla_new_tokens`` and ``speedup`` columns; NaN where vanilla has no row.
    """
    ok = _ok(rows).copy()
    keys = [k for k in PAIR_KEYS if k in ok.columns]
    vanilla = ok[ok["decoder"] == "vanilla"][keys + ["tokens_per_s", "wall_time_s", "new_tokens"]]
    vanilla = vanilla.drop_duplicates(keys, keep="last").rename(columns={
        "tokens_per_s": "vanilla_tokens_per_s", "wall_time_s": "vanilla_wall_time_s",
        "new_tokens": "vanilla_new_tokens"})
    merged = ok.merge(vanilla, on=keys, how="left")
    merged["speedup"] = num(merged["tokens_per_s"]) / num(merged["vanilla_tokens_per_s"])
    return merged


# ------------------------------------------------------------------------------------------------ bootstrap
def bootstrap_weights(clusters: Sequence[Any], n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """Two-level bootstrap weights: ``W[b, i]`` = how often observation ``i`` is drawn in resample ``b``.

    Each resample draws as many clusters (samples) as there are, with replacement, and within each drawn
    cluster as many of its observations (repeats, turns, runs) as it has, with replacement. Statistics are
    then weighted sums (``W @ x``). With one observation per cluster this is the ordinary bootstrap.

    Args:
        clusters: cluster id of each observation (length N).
        n_boot: resamples B.
        seed: RNG seed (the weights are reproducible).

    Returns:
        float64 array of shape (B, N).
    """
    codes, uniq = pd.factorize(pd.Series(list(clusters), dtype=object))
    n_obs, n_cl = len(codes), len(uniq)
    rng = np.random.default_rng(seed)
    w = np.zeros((n_boot, n_obs))
    if n_obs == 0:
        return w
    counts = rng.multinomial(n_cl, np.full(n_cl, 1.0 / n_cl), size=n_boot)  # (B, clusters)
    for c in range(n_cl):
        idx = np.flatnonzero(codes == c)
        if len(idx) == 1:
            w[:, idx[0]] = counts[:, c]
        else:
            w[:, idx] = rng.multinomial(counts[:, c] * len(idx), np.full(len(idx), 1.0 / len(idx)))
    return w


def _interval(draws: np.ndarray, level: float) -> tuple[float, float, float]:
    d = draws[np.isfinite(draws)]
    if len(d) < 2:
        return math.nan, math.nan, math.nan
    a = (1.0 - level) / 2.0
    return float(np.quantile(d, a)), float(np.quantile(d, 1.0 - a)), float(d.std(ddof=1))


def bootstrap_mean_ci(values: Sequence[float], n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                      clusters: Sequence[Any] | None = None) -> dict[str, float]:
    """Mean of ``values`` with a percentile bootstrap interval (two-level when ``clusters`` is given).

    Returns:
        ``{"mean", "low", "high", "std"}``; ``std`` is the bootstrap standard error. With fewer than two
        values (or one cluster) the interval and std are NaN.
    """
    x = np.asarray([np.nan if v is None else v for v in values], dtype=float)
    cl = list(range(len(x))) if clusters is None else list(clusters)
    keep = ~np.isnan(x)
    x, cl = x[keep], [c for c, k in zip(cl, keep) if k]
    if len(x) == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "std": math.nan}
    mean = float(x.mean())
    if len(x) < 2 or len(set(cl)) < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "std": math.nan}
    w = bootstrap_weights(cl, n_boot, seed)
    lo, hi, sd = _interval((w @ x) / w.sum(axis=1), level)
    return {"mean": mean, "low": lo, "high": hi, "std": sd}


# ------------------------------------------------------------------------------------------------ theory
def expected_accept_length(alpha: float, gamma: float) -> float:
    """Leviathan et al. 2023, eq. 1: E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha) (gamma + 1 at alpha=1)."""
    if alpha is None or gamma is None or math.isnan(alpha) or math.isnan(gamma):
        return math.nan
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def theory_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """Leviathan et al. 2023 (Thm 3.8): S = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    Assumes i.i.d. acceptance with probability ``alpha`` and that verifying gamma+1 tokens costs one target
    step. Worked numbers (ALGORITHMS.md section 6): alpha=0.8, gamma=4, c=0.1 -> 2.40.
    """
    if cost_ratio is None or math.isnan(cost_ratio):
        return math.nan
    return expected_accept_length(alpha, gamma) / (gamma * cost_ratio + 1.0)


def cost_ratio_of(g: pd.DataFrame, override: float | None = None) -> tuple[float, str]:
    """Draft/target forward cost ratio c of one cell's paired rows, and where it came from.

    In order of preference: ``override`` (``"option"``); per-phase timers ``draft_time_s`` /
    ``verify_time_s`` (``"timers"``): ``c = (draft_time_s / draft_forwards) / (verify_time_s / num_steps)``;
    a wall-time fit under the theory's assumption that one verification costs one vanilla step
    (``"wall-time fit"``): ``c = (wall_time_s - num_steps * t_ar) / (draft_forwards * t_ar)``, ``t_ar`` =
    vanilla's seconds per token on the same sample, clipped at 0.
    """
    if override is not None:
        return float(override), "option"
    draft_fwd = num(g["draft_forwards"]).sum() if "draft_forwards" in g else 0.0
    if not draft_fwd:
        return 0.0, "no draft forwards"
    if {"draft_time_s", "verify_time_s"} <= set(g.columns):
        d, v = num(g["draft_time_s"]), num(g["verify_time_s"])
        if d.notna().all() and v.notna().all() and v.sum() > 0:
            return float((d.sum() / draft_fwd) / (v.sum() / num(g["num_steps"]).sum())), "timers"
    t_ar = num(g["vanilla_wall_time_s"]) / num(g["vanilla_new_tokens"])
    ok = t_ar.notna() & num(g["wall_time_s"]).notna()
    if not ok.any():
        return math.nan, "unmeasured"
    spare = (num(g["wall_time_s"]) - num(g["num_steps"]) * t_ar)[ok].sum()
    return max(0.0, float(spare / (num(g["draft_forwards"]) * t_ar)[ok].sum())), "wall-time fit"


# ------------------------------------------------------------------------------------------------ noise
def replicate_noise(g: pd.DataFrame, value: str) -> tuple[float, int]:
    """Run-to-run noise of a cell's figure: the standard deviation, over replicates ``(run_id, repeat)``, of
    the replicate's mean ``value``, pooled over replicates that cover the same samples (shards cover
    different samples and are not compared with each other).

    Args:
        g: the cell's rows (with ``value``, ``run_id``, ``repeat``, ``task``, ``sample_id``, ``turn``).
        value: column to average per replicate (``speedup``, ``tokens_per_s``).

    Returns:
        ``(std, replicates)``; std is NaN when no sample set has two replicates.
    """
    if g.empty or value not in g:
        return math.nan, 0
    x = num(g[value])
    rep = g["run_id"].astype(str) + "#" + g["repeat"].astype(str)
    sample = g["task"].astype(str) + "/" + g["sample_id"].astype(str) + "#" + g["turn"].astype(str)
    means = x.groupby(rep, sort=False).mean()
    sets = sample.groupby(rep, sort=False).agg(lambda s: hash(frozenset(s)))
    ss, dof = 0.0, 0
    for _, reps in sets.groupby(sets, sort=False):
        m = means[reps.index].dropna()
        if len(m) >= 2:
            ss += float(((m - m.mean()) ** 2).sum())
            dof += len(m) - 1
    return (math.sqrt(ss / dof) if dof else math.nan), int(rep.nunique())


def load_stats(g: pd.DataFrame, load_factor: float = 1.0) -> tuple[float, int | None, float]:
    """``(max load average, rows whose load exceeded load_factor x cores, cores)`` of rows that record load
    (:data:`LOAD_COLUMNS`, :data:`CPU_COUNT_COLUMN`); ``(NaN, None, NaN)`` when they do not."""
    cols = [c for c in LOAD_COLUMNS if c in g]
    if not cols or CPU_COUNT_COLUMN not in g:
        return math.nan, None, math.nan
    load = pd.concat([num(g[c]) for c in cols], axis=1).max(axis=1)
    cores = num(g[CPU_COUNT_COLUMN])
    over = int((load > load_factor * cores).sum())
    return (float(load.max()) if load.notna().any() else math.nan), over, (
        float(cores.max()) if cores.notna().any() else math.nan)


# ------------------------------------------------------------------------------------------------ aggregate
def _order(agg: pd.DataFrame) -> pd.DataFrame:
    """Table order: groups first-seen; within a group vanilla, then decoders first-seen, configurations by
    hyper-parameter values (numbers numerically)."""
    if agg.empty:
        return agg
    dec_order = list(dict.fromkeys(["vanilla", *agg["decoder"]]))
    groups = {g: i for i, g in enumerate(dict.fromkeys(agg["group"]))}
    params = decoder_param_columns(agg)

    def natural(v: Any) -> tuple:
        n = num(pd.Series([v])).iloc[0]
        return (0, float(n), "") if not pd.isna(n) else (1, 0.0, str(v))

    def key(i: int) -> tuple:
        r = agg.iloc[i]
        p = _params(r.get("decoder_params"))
        return (groups[r["group"]], dec_order.index(r["decoder"]), *[natural(p.get(k)) for k in params],
                str(r["label"]))

    return agg.iloc[sorted(range(len(agg)), key=key)].reset_index(drop=True)


def ordered_labels(agg: pd.DataFrame) -> list[str]:
    """Configuration labels in table order (see :func:`aggregate`)."""
    return list(dict.fromkeys(_order(agg)["label"])) if not agg.empty else []


def aggregate(rows: pd.DataFrame, *, quality: Sequence[str] | None = None, cost_ratio: float | None = None,
              n_boot: int = 2000, level: float = 0.95, seed: int = 0, pool: bool = False,
              by: Sequence[str] = (), disagree_rel: float = 0.10, load_factor: float = 1.0) -> pd.DataFrame:
    """One row per (group, extra keys ``by``, decoder configuration) with every reported number.

    Args:
        rows: result rows (any of :func:`prepare`'s columns may be missing; they are added).
        quality: the task's quality columns; None = :func:`quality_columns` of the rows.
        cost_ratio: c for every theory prediction; None = :func:`cost_ratio_of`.
        n_boot, level, seed: the bootstrap (see the module docstring).
        pool: pool run identities that differ (only task and model pair separate groups); logged loudly.
        by: further columns to split cells by (e.g. ``("category",)`` for per-category tables).
        disagree_rel: warn when the two speedup estimators differ by more than this fraction and beyond
            their bootstrap noise.
        load_factor: warn when a row's load average exceeds ``load_factor`` x its CPU count.

    Returns:
        Columns: group, the identity fields, ``by``, label, decoder, decoder_params, the hyper-parameters,
        samples (distinct samples), observations (rows), replicates, failed, tokens_per_s[_low/_high/_std],
        tokens_per_s_total, speedup[_low/_high/_std], speedup_total[_low/_high], accept_length[_low/_high],
        acceptance_rate, target_tokens_fed_per_step, draft_forwards_per_step, equal_to_vanilla,
        divergent_samples, gamma_used, cost_ratio, cost_ratio_source, theory_accept_length, theory_speedup,
        efficiency, speedup_repeat_std, tokens_per_s_repeat_std, load_max, rows_over_load, cpu_count,
        warnings (a list of strings), and the quality means.
    """
    if rows.empty:
        return pd.DataFrame()
    rows = prepare(rows, pool)
    quality = _find_quality(rows, quality)
    params = decoder_param_columns(rows)
    ident = [f for f in RUN_IDENTITY_FIELDS if f in rows]
    keys = ["group", *by, "label"]
    merged = paired_speedups(rows)
    paired = {k: g for k, g in merged.groupby(keys, sort=False, dropna=False)}
    out = []
    for key, all_g in rows.groupby(keys, sort=False, dropna=False):
        g = paired.get(key, merged.iloc[0:0])
        first = all_g.iloc[0]
        rec: dict[str, Any] = dict(zip(keys, key))
        for f in ident:
            vals = {norm(v) for v in all_g[f]}
            rec[f] = norm(first[f]) if len(vals) == 1 else ", ".join(sorted(map(fmt_value, vals)))
        rec["model_pair"] = first["model_pair"]
        rec["decoder"] = first["decoder"]
        rec["decoder_params"] = first["decoder_params"]
        p = _params(first["decoder_params"])
        for k in params:
            rec[k] = norm(p.get(k))
        rec["failed"] = int((all_g["status"] != "ok").sum())
        rec["samples"] = int(g[["task", "sample_id"]].drop_duplicates().shape[0]) if len(g) else 0
        rec["observations"] = len(g)
        warnings: list[str] = []
        if g.empty:
            rec["warnings"] = warnings
            out.append(rec)
            continue
        rec.update(_cell_stats(g, n_boot, level, seed, disagree_rel, warnings))
        drafted = num(g["num_drafted"]).sum() if "num_drafted" in g else 0.0
        decode_steps = (num(g["num_steps"]) - 1).clip(lower=0).sum()
        alpha = num(g["num_accepted"]).sum() / drafted if drafted else math.nan
        gamma = num(pd.Series([p.get("gamma")])).iloc[0]
        if pd.isna(gamma):
            gamma = drafted / decode_steps if drafted and decode_steps else math.nan
        chain = "gamma" in p or (num(g["draft_forwards"]).sum() > 0 if "draft_forwards" in g else False)
        c, c_src = cost_ratio_of(g, cost_ratio) if drafted and chain else (math.nan, "n/a (no chain draft)")
        rec.update({
            "acceptance_rate": alpha,
            "target_tokens_fed_per_step": num(g["target_tokens_fed_per_step"]).mean()
            if "target_tokens_fed_per_step" in g else math.nan,
            "draft_forwards_per_step": num(g["draft_forwards_per_step"]).mean()
            if "draft_forwards_per_step" in g else math.nan,
            "equal_to_vanilla": g["matches_vanilla"].astype(float).mean() if "matches_vanilla" in g else math.nan,
            "divergent_samples": sorted(map(str, g.loc[~g["matches_vanilla"].fillna(False).astype(bool),
                                                       "sample_id"].unique())) if "matches_vanilla" in g else [],
            "gamma_used": gamma,
            "cost_ratio": c,
            "cost_ratio_source": c_src,
            "theory_accept_length": expected_accept_length(alpha, gamma) if drafted and chain else math.nan,
            "theory_speedup": theory_speedup(alpha, gamma, c) if drafted and chain else math.nan,
        })
        rec["efficiency"] = rec["speedup"] / rec["accept_length"] if rec["accept_length"] else math.nan
        for q in quality:
            rec[q] = num(g[q]).mean()
        rec["speedup_repeat_std"], rec["replicates"] = replicate_noise(g, "speedup")
        rec["tokens_per_s_repeat_std"], _ = replicate_noise(g, "tokens_per_s")
        rec["load_max"], rec["rows_over_load"], rec["cpu_count"] = load_stats(all_g, load_factor)
        if rec["rows_over_load"]:
            warnings.append(f"load: {rec['rows_over_load']} of {len(all_g)} rows ran with a load average above "
                            f"{load_factor:g} x the {fmt_value(rec['cpu_count'])} cores (max {rec['load_max']:.2f}); "
                            f"other work competed for the machine, timings are not trustworthy")
        rec["warnings"] = warnings
        out.append(rec)
    agg = _order(pd.DataFrame(out))
    for k in params:  # integral hyper-parameters stay integers (gamma=4, not 4.0)
        vals = agg[k].dropna()
        if len(vals) and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                             and float(v).is_integer() for v in vals):
            agg[k] = agg[k].astype("Int64")
    for w in (w for ws in agg["warnings"] for w in ws):
        log.warning("%s", w)
    return agg


def _cell_stats(g: pd.DataFrame, n_boot: int, level: float, seed: int, disagree_rel: float,
                warnings: list[str]) -> dict[str, Any]:
    """Point estimates and bootstrap intervals of one cell's paired rows."""
    tps, new, steps, wall = (num(g[c]).to_numpy(float) for c in ("tokens_per_s", "new_tokens", "num_steps",
                                                                   "wall_time_s"))
    ratio = num(g["speedup"]).to_numpy(float)
    v_wall, v_new = num(g["vanilla_wall_time_s"]).to_numpy(float), num(g["vanilla_new_tokens"]).to_numpy(float)
    paired = np.isfinite(ratio) & np.isfinite(v_wall) & np.isfinite(v_new) & np.isfinite(wall)
    fin = np.isfinite(tps)
    clusters = (g["task"].astype(str) + "/" + g["sample_id"].astype(str)).tolist()
    w = bootstrap_weights(clusters, n_boot, seed)
    one = np.ones((1, len(g)))

    def stats(weights: np.ndarray) -> dict[str, np.ndarray]:
        wp, wf = weights * paired, weights * fin
        with np.errstate(invalid="ignore", divide="ignore"):
            sp = (wp @ np.nan_to_num(ratio)) / wp.sum(axis=1)
            spt = ((wp @ np.nan_to_num(v_wall)) / (wp @ np.nan_to_num(v_new))) / (
                (wp @ np.nan_to_num(wall)) / (wp @ np.nan_to_num(new)))
            return {
                "speedup": sp, "speedup_total": spt,
                "tokens_per_s": (wf @ np.nan_to_num(tps)) / wf.sum(axis=1),
                "accept_length": (weights @ np.nan_to_num(new)) / (weights @ np.nan_to_num(steps)),
            }

    point = {k: float(v[0]) for k, v in stats(one).items()}
    draws = stats(w)
    rec: dict[str, Any] = dict(point)
    for k, d in draws.items():
        lo, hi, sd = _interval(d, level) if len(set(clusters)) > 1 else (math.nan, math.nan, math.nan)
        rec[f"{k}_low"], rec[f"{k}_high"], rec[f"{k}_std"] = lo, hi, sd
    with np.errstate(invalid="ignore", divide="ignore"):
        rec["tokens_per_s_total"] = float(np.nansum(new[fin]) / np.nansum(wall[fin])) if fin.any() else math.nan
    sp, spt = point["speedup"], point["speedup_total"]
    if paired.sum() >= 2 and np.isfinite(sp) and np.isfinite(spt) and spt > 0:
        lo, hi, _ = _interval(draws["speedup"] - draws["speedup_total"], level)
        if abs(sp - spt) > disagree_rel * spt and np.isfinite(lo) and (lo > 0 or hi < 0):
            warnings.append(f"estimators disagree for {g['label'].iloc[0]} ({g['group'].iloc[0]}): mean of per-sample "
                            f"speedups {sp:.2f} vs ratio of totals {spt:.2f} (difference {level:.0%} CI "
                            f"[{lo:.2f}, {hi:.2f}]); per-sample speedups vary with sample length or over time "
                            f"(load, order effects): report both")
    return rec


def summarize(rows: pd.DataFrame, quality_columns: Sequence[str] | None = None, **kwargs: Any) -> pd.DataFrame:
    """The tidy per-run summary (``summary.csv``): one row per (group, decoder configuration) carrying the
    identity (task, task version, model pair, dtype, hardware, code version, budget), each hyper-parameter as
    its own column, then the numbers of :data:`SUMMARY_COLUMNS` and the quality means.

    ``summary.attrs["warnings"]`` lists the warnings (estimator disagreement, load);
    :func:`to_markdown` prints them under the table. Keyword arguments go to :func:`aggregate`.
    """
    if rows.empty:
        return pd.DataFrame(columns=SUMMARY_ID_COLUMNS + SUMMARY_COLUMNS)
    agg = aggregate(rows, quality=quality_columns, **kwargs)
    params = decoder_param_columns(agg)
    qual = [q for q in _find_quality(rows, quality_columns) if q in agg]
    cols = [c for c in SUMMARY_ID_COLUMNS if c in agg] + [p for p in params if p in agg] + \
        [c for c in SUMMARY_COLUMNS if c in agg] + qual
    summary = agg[cols].copy()
    summary["warnings"] = ["; ".join(w) for w in agg["warnings"]]
    summary.attrs["warnings"] = list(dict.fromkeys(w for ws in agg["warnings"] for w in ws))
    summary.attrs["quality"] = qual
    summary.attrs["params"] = params
    return summary


# ------------------------------------------------------------------------------------------------ tables
def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f", columns: Sequence[str] | None = None) -> str:
    """Markdown table (numbers right-aligned; pandas' ``to_markdown`` needs tabulate, this does not).

    For a :func:`summarize` frame: the columns of :data:`SUMMARY_MD_COLUMNS` plus the quality means (the
    group only when there are several, replicates only when repeated, load only when recorded), and
    ``attrs["warnings"]`` follow the table as a list.
    """
    warnings = list(df.attrs.get("warnings", []))
    if columns is None:
        columns = [c for c in df.columns if c != "warnings"]
        if "quality" in df.attrs:
            columns = [c for c in SUMMARY_MD_COLUMNS if c in df] + list(df.attrs["quality"])
            columns = [c for c in columns if not (c == "group" and df[c].nunique() <= 1)
                       and not (c == "replicates" and (num(df[c]).fillna(1) <= 1).all())
                       and not (c == "load_max" and num(df[c]).isna().all())]
    cells = [[_md_cell(v, floatfmt) for v in df[c]] for c in columns]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in columns]
    lines = ["| " + " | ".join(map(str, columns)) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for i in range(len(df)):
        lines.append("| " + " | ".join(col[i] for col in cells) + " |")
    text = "\n".join(lines)
    if warnings:
        text += "\n\nWarnings:\n" + "\n".join(f"- {w}" for w in warnings)
    return text


def _md_cell(v: Any, floatfmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (float, np.floating)):
        return format(float(v), floatfmt)
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v).replace("|", "\\|").replace("\n", " ")


# ------------------------------------------------------------------------------------------------ comparison
def compare_runs(rows_a: pd.DataFrame, rows_b: pd.DataFrame, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> pd.DataFrame:
    """Side-by-side comparison of two runs, per (task, model pair, decoder configuration).

    For tokens/s, speedup and accept length: the figure in A, in B, the ratio B / A and a bootstrap interval
    for the ratio. Where both runs hold the same samples the bootstrap is paired by sample (one draw of
    samples serves both runs); otherwise A and B are resampled independently (``paired`` says which).

    Raises:
        ValueError: a side holds several run identities for one cell (compare one run with one run).
    """
    out = []
    a, b = prepare(rows_a), prepare(rows_b)
    a["label"], b["label"] = config_labels(a), config_labels(b)
    sides = {}
    for name, rows in (("A", a), ("B", b)):
        m = paired_speedups(rows)
        m["_cell"] = list(zip(m["task"].astype(str), m["model_pair"], m["label"]))
        for cell, g in m.groupby("_cell", sort=False):
            if g["group"].nunique() > 1:
                raise ValueError(f"run {name} holds several run identities for {' | '.join(cell)}: "
                                 f"{sorted(g['group'].unique())}; compare one run identity per side")
        sides[name] = m
    cells = list(dict.fromkeys(list(sides["A"]["_cell"]) + list(sides["B"]["_cell"])))
    for cell in cells:
        ga = sides["A"][sides["A"]["_cell"] == cell]
        gb = sides["B"][sides["B"]["_cell"] == cell]
        rec: dict[str, Any] = {"task": cell[0], "model_pair": cell[1], "label": cell[2],
                               "decoder": (ga if len(ga) else gb)["decoder"].iloc[0],
                               "samples_a": ga["sample_id"].nunique(), "samples_b": gb["sample_id"].nunique()}
        if ga.empty or gb.empty:
            rec["note"] = "only in " + ("B" if ga.empty else "A")
            out.append(rec)
            continue
        sa, sb = set(ga["sample_id"].astype(str)), set(gb["sample_id"].astype(str))
        rec["paired"] = sa == sb
        rec.update(_compare_cell(ga, gb, rec["paired"], n_boot, level, seed))
        out.append(rec)
    return pd.DataFrame(out)


def _side_draws(g: pd.DataFrame, weights: np.ndarray) -> dict[str, np.ndarray]:
    x = {c: np.nan_to_num(num(g[c]).to_numpy(float)) for c in ("tokens_per_s", "speedup", "new_tokens", "num_steps")}
    fin = np.isfinite(num(g["speedup"]).to_numpy(float))
    wp = weights * fin
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"tokens_per_s": (weights @ x["tokens_per_s"]) / weights.sum(axis=1),
                "speedup": (wp @ x["speedup"]) / wp.sum(axis=1),
                "accept_length": (weights @ x["new_tokens"]) / (weights @ x["num_steps"])}


def _compare_cell(ga: pd.DataFrame, gb: pd.DataFrame, paired: bool, n_boot: int, level: float,
                  seed: int) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    pa = _side_draws(ga, np.ones((1, len(ga))))
    pb = _side_draws(gb, np.ones((1, len(gb))))
    if paired:
        # one draw of samples for both sides; within a drawn sample each side resamples its own observations
        samples = sorted(set(ga["sample_id"].astype(str)))
        rng = np.random.default_rng(seed)
        counts = rng.multinomial(len(samples), np.full(len(samples), 1.0 / len(samples)), size=n_boot)
        wa, wb = (_weights_from_counts(g, samples, counts, rng) for g in (ga, gb))
    else:
        wa = bootstrap_weights(ga["sample_id"].astype(str).tolist(), n_boot, seed)
        wb = bootstrap_weights(gb["sample_id"].astype(str).tolist(), n_boot, seed + 1)
    da, db = _side_draws(ga, wa), _side_draws(gb, wb)
    for k in ("tokens_per_s", "speedup", "accept_length"):
        a, b = float(pa[k][0]), float(pb[k][0])
        rec[f"{k}_a"], rec[f"{k}_b"] = a, b
        rec[f"{k}_ratio"] = b / a if a else math.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            lo, hi, _ = _interval(db[k] / da[k], level)
        rec[f"{k}_ratio_low"], rec[f"{k}_ratio_high"] = lo, hi
    return rec


def _weights_from_counts(g: pd.DataFrame, samples: list[str], counts: np.ndarray,
                         rng: np.random.Generator) -> np.ndarray:
    sid = g["sample_id"].astype(str).to_numpy()
    w = np.zeros((counts.shape[0], len(g)))
    for j, s in enumerate(samples):
        idx = np.flatnonzero(sid == s)
        w[:, idx] = rng.multinomial(counts[:, j] * len(idx), np.full(len(idx), 1.0 / len(idx)))
    return w


# ------------------------------------------------------------------------------------------------ figures' frames
def acceptance_per_position(rows: pd.DataFrame) -> pd.DataFrame:
    """Acceptance by draft position, from the per-step ``accepted_per_step`` / ``drafted_per_step`` lists.

    For position ``i`` (0-based) over all decode steps of a configuration: ``drafted`` = steps that drafted
    more than ``i`` tokens, ``accepted`` = steps that accepted more than ``i`` tokens; ``rate`` =
    accepted / drafted (vLLM's per-position acceptance), ``conditional`` = P(position i accepted | positions
    < i accepted and position i drafted), which is constant (= alpha) under the i.i.d. model of Leviathan et
    al. 2023.

    Example: steps (accepted, drafted) = (2, 4), (0, 4), (4, 4) give at position 0 rate 2/3, at position 2
    rate 1/3 (only the third step got past position 1) and conditional 1/2 at position 2.

    Returns:
        Columns ``group, label, position, drafted, accepted, rate, conditional``.
    """
    cols = ["group", "label", "position", "drafted", "accepted", "rate", "conditional"]
    out = []
    ok = _ok(rows)
    if "accepted_per_step" not in ok or "drafted_per_step" not in ok:
        return pd.DataFrame(columns=cols)
    if "group" not in ok:
        ok = ok.assign(group="")
    for (grp, lab), g in ok.groupby(["group", "label"], sort=False):
        acc, dr = [], []
        for a, d in zip(g["accepted_per_step"], g["drafted_per_step"]):
            if isinstance(a, (list, tuple, np.ndarray)) and isinstance(d, (list, tuple, np.ndarray)):
                acc.extend(a)
                dr.extend(d)
        if not dr or max(dr) == 0:
            continue
        acc_a, dr_a = np.asarray(acc), np.asarray(dr)
        for i in range(int(dr_a.max())):
            drafted = int((dr_a > i).sum())
            accepted = int((acc_a > i).sum())
            reached = int(((dr_a > i) & (acc_a >= i)).sum())
            out.append({"group": grp, "label": lab, "position": i, "drafted": drafted, "accepted": accepted,
                        "rate": accepted / drafted if drafted else math.nan,
                        "conditional": accepted / reached if reached else math.nan})
    return pd.DataFrame(out, columns=cols)


def time_breakdown(rows: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per generated token spent drafting, verifying and elsewhere, per (group, configuration),
    from the per-phase timer columns ``draft_time_s`` / ``verify_time_s``; empty when rows have none."""
    cols = ["group", "label", "draft_ms", "verify_ms", "other_ms"]
    ok = _ok(rows)
    if not {"draft_time_s", "verify_time_s"} <= set(ok.columns):
        return pd.DataFrame(columns=cols)
    ok = ok[num(ok["draft_time_s"]).notna() & num(ok["verify_time_s"]).notna()]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    if "group" not in ok:
        ok = ok.assign(group="")
    per = ok.groupby(["group", "label"], sort=False)[["draft_time_s", "verify_time_s", "wall_time_s",
                                                      "new_tokens"]].sum()
    ms = 1000.0 / per["new_tokens"]
    out = pd.DataFrame({"draft_ms": per["draft_time_s"] * ms, "verify_ms": per["verify_time_s"] * ms})
    out["other_ms"] = (per["wall_time_s"] * ms - out["draft_ms"] - out["verify_ms"]).clip(lower=0)
    return out.reset_index()[cols]


def scope_free_names(rows: pd.DataFrame) -> dict[str, str]:
    """decoder name -> one name per configuration that ignores ``pool_scope`` (to pair cold and warm runs of
    one configuration): decoders whose hyper-parameters differ only in ``pool_scope`` share a name, that of
    the cold one (else the name without ``_warm``)."""

    def key(row: Mapping[str, Any]) -> str:
        params = _params(row.get("decoder_params"))
        params.pop("pool_scope", None)
        return json.dumps(params, sort_keys=True) if params else str(row["decoder"])

    first = rows.drop_duplicates("decoder")
    keys = {str(r["decoder"]): key(r) for r in first.to_dict("records")}
    scopes = dict(zip(first["decoder"].astype(str), first["pool_scope"] if "pool_scope" in first else
                      [None] * len(first)))
    names: dict[str, str] = {}
    for k in dict.fromkeys(keys.values()):
        members = [d for d, kk in keys.items() if kk == k]
        cold = [d for d in members if scopes.get(d) == "sample"]
        base = (cold or members)[0]
        names.update({d: re.sub(r"_warm$", "", base) for d in members})
    return names


def warm_cold(rows: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
    """Aggregate for the warm-vs-cold figure: one row per (group, configuration, scope), ``config`` = the
    scope-free configuration name, ``label`` = ``cold`` / ``warm``. Empty when rows have no ``pool_scope``.
    Keyword arguments go to :func:`aggregate`."""
    if "pool_scope" not in rows or rows["pool_scope"].dropna().empty:
        return pd.DataFrame()
    rows = prepare(rows)
    scoped = rows["pool_scope"].notna() & (rows["decoder"] != "vanilla")
    # one aggregate per (decoder, scope); vanilla rows stay in for the pairing
    rows.loc[scoped, "label"] = rows.loc[scoped, "decoder"].astype(str) + " | " + \
        rows.loc[scoped, "pool_scope"].astype(str)
    agg = aggregate(rows, **kwargs)
    agg = agg[agg["label"].astype(str).str.contains(" | ", regex=False)].copy()
    scope = agg["label"].str.split(" | ", regex=False).str[-1]
    agg["config"] = agg["decoder"].map(scope_free_names(rows))
    agg["label"] = scope.map({"sample": "cold", "task": "warm"}).fillna(scope)
    return agg.sort_values("label", kind="stable").reset_index(drop=True)


def category_column(rows: pd.DataFrame) -> str | None:
    """The column per-category tables split by: ``subtask`` (Spec-Bench's six) when rows carry it, else
    ``category`` (MT-Bench's eight); None when neither varies."""
    for c in ("subtask", "category"):
        if c in rows and rows[c].dropna().nunique() >= 1 and rows[c].notna().any():
            return c
    return None


def counters(g: pd.DataFrame) -> dict[str, Any]:
    """Deterministic counters of one cell's ok rows, one observation per (sample, turn): totals of
    :data:`COUNTER_COLUMNS`, a digest of the per-sample values, and whether repeats of a sample disagree.

    Returns:
        ``{"totals": {col: int}, "digest": str, "inconsistent_samples": [sample ids]}``.
    """
    g = _ok(g)
    cols = [c for c in COUNTER_COLUMNS if c in g]
    key = g["sample_id"].astype(str) + "#" + (g["turn"].astype(str) if "turn" in g else "0")
    per: dict[str, tuple] = {}
    bad: list[str] = []
    for k, vals in zip(key, g[cols].itertuples(index=False, name=None)):
        v = tuple(norm(x) for x in vals)
        if k in per and per[k] != v and k not in bad:
            bad.append(k)
        per.setdefault(k, v)
    totals = {c: int(sum((v[i] or 0) for v in per.values())) for i, c in enumerate(cols)}
    text = "\n".join(f"{k}:{per[k]}" for k in sorted(per))
    return {"totals": totals, "digest": hashlib.sha1(text.encode()).hexdigest()[:12], "inconsistent_samples": bad}


def iter_warnings(frames: Iterable[pd.DataFrame]) -> list[str]:
    """Distinct warnings of aggregates (their ``warnings`` lists), in order."""
    seen: dict[str, None] = {}
    for f in frames:
        if "warnings" in f:
            for ws in f["warnings"]:
                seen.update(dict.fromkeys(ws if isinstance(ws, list) else []))
    return list(seen)
